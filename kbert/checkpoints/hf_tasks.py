"""A fine-tuned transformers task folder as a kbert model: `--model HF_FOLDER --task TASK`.

`kbert evaluate`, `predict` and `export` read a folder of these classes, its
head's weights kept (no training), through `kbert.modelfolder.open_model`:

| transformers class | `--task` | settings from `config.json` |
| --- | --- | --- |
| `BertForSequenceClassification` | `text-classification`, `text-pair-classification` | labels from `id2label` |
| `BertForSequenceClassification`, `problem_type` multi-label | `multi-label-classification` | labels from `id2label`; threshold 0.5 |
| `BertForSequenceClassification`, one output | `text-pair-regression` | the `cross` head |
| `BertForTokenClassification` | `token-classification` | tags from `id2label`, their scheme detected |
| `BertForQuestionAnswering` | `question-answering` | run_squad.py's defaults |

A folder that `kbert export --formats huggingface` wrote keeps every kbert
setting in `config.json`'s `kbert` entry, and reads back as the model it was.
Other settings take their `former` values (`TaskConfig.with_formers`), those
of transformers' own recipes: texts cut at their end, a word's tag at its
first piece.
"""

import json
import os

import numpy as np
from safetensors.numpy import load_file

# The head's tensors in each class's file, and the kbert head layer's Dense they fill.
HEAD_TENSORS = {
    "BertForSequenceClassification": "classifier",
    "BertForTokenClassification": "classifier",
    "BertForQuestionAnswering": "qa_outputs",
}
# The packed length of a folder whose tokenizer names none (or an unbounded one).
DEFAULT_SEQUENCE_LENGTH = 512


def task_classes():
    """transformers' task classes and the kbert tasks each is read as (their `Task.hf_architecture`)."""
    from kbert.tasks import TASKS

    classes = {}
    for name, task in TASKS.items():
        if task.hf_architecture:
            classes.setdefault(task.hf_architecture, []).append(name)
    return classes


def task_class_of(path):
    """The transformers task class a folder's `config.json` names (`task_classes`), or None."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            architectures = json.load(f).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    return next((name for name in architectures if name in task_classes()), None)


def load_hf_task_folder(path, task, options=None, sequence_length=None):
    """The transformers task folder at `path` as a `kbert.modelfolder.ModelFolder` of `task`.

    Args:
        path: str. A folder with `config.json` naming a class of `task_classes()`,
            `vocab.txt` and `model.safetensors`.
        task: str. A kbert task that class computes.
        options: dict. Option name -> value given (or None), merged as for a model folder.
        sequence_length: int or None. Packed length; default the folder's
            (`kbert.sequence_length`, else the tokenizer's `model_max_length`).

    Raises:
        ValueError: one line naming the folder and what does not fit `task`.

    Example:
    >>> folder = load_hf_task_folder("bert-base-NER", TokenClassification.name)  # doctest: +SKIP
    """
    from kbert.checkpoints.huggingface import load_hf_checkpoint  # Keras: not for `kbert finetune`'s checks
    from kbert.modelfolder import ModelFolder

    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        hf_config = json.load(f)
    architecture = task_class_of(path)
    readable = task_classes().get(architecture, ())
    if task not in readable:
        kinds = ", ".join(readable) or "none"
        raise ValueError(f"--task {task}: {path} is a transformers {architecture}, which kbert reads as {kinds}")
    checkpoint = load_hf_checkpoint(path)
    stored = hf_config.get("kbert") or {}
    values = _settings(hf_config, task, path)
    if stored.get("task") == task:  # kbert wrote it: its settings, or (older) the few it noted
        noted = {key: stored[key] for key in ("truncate", "threshold") if key in stored}
        values = stored.get("task_settings") or {**values, **noted}
    length = sequence_length or stored.get("sequence_length") or _tokenizer_length(path, checkpoint.config)
    checkpoint.config.check_sequence_length(length)
    settings = {"task": task, "task_settings": values, "bert_config": checkpoint.config.to_dict(),
                "sequence_length": length, "lowercase": checkpoint.lowercase}
    try:
        folder = ModelFolder(path, None, checkpoint.vocabulary, settings)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    folder.model = folder.task.build_model(checkpoint.encoder)
    _load_head(folder.model, os.path.join(path, "model.safetensors"), HEAD_TENSORS[architecture])
    if options:
        folder.use_options(options)
    return folder


def hf_task_settings(path, task):
    """The settings of `task` that the transformers task folder at `path` states in its
    `config.json` (its labels, `Task.settings_from_hf_labels`), read without its weights;
    `ValueError` if its `problem_type` or outputs do not fit `task`."""
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        return _settings(json.load(f), task, path)


def load_head(model, path, order=None):
    """`model`'s head from the transformers task folder at `path` (`task_class_of`);
    `order`: the folder's output rows in the order of `model`'s outputs (None: as stored)."""
    _load_head(model, os.path.join(path, "model.safetensors"), HEAD_TENSORS[task_class_of(path)], order)


def _settings(hf_config, task, path):
    """The task's settings from a transformers config: its labels (or tags), `Task.settings_from_hf_labels`."""
    from kbert.tasks import get_task

    labels, kind = _labels(hf_config, path), get_task(task)
    if kind.hf_problem_types and hf_config.get("problem_type") not in kind.hf_problem_types:
        raise ValueError(
            f"--task {task}: {path}'s problem_type is {hf_config.get('problem_type')!r}; "
            f"{task} needs {kind.hf_problem_types[0]!r}"
        )
    return kind.settings_from_hf_labels(labels, path)


def _labels(hf_config, path):
    """`id2label`'s names in id order; `ValueError` if ids are missing."""
    id2label = {int(key): value for key, value in (hf_config.get("id2label") or {}).items()}
    if sorted(id2label) != list(range(len(id2label))):
        raise ValueError(f"{path}/config.json: id2label's ids are {sorted(id2label)}; expected 0 to {len(id2label) - 1}")
    return [id2label[i] for i in range(len(id2label))]


def _tokenizer_length(path, config):
    """The tokenizer's `model_max_length` where it is a length the encoder has, else up to `DEFAULT_SEQUENCE_LENGTH`."""
    fallback = min(DEFAULT_SEQUENCE_LENGTH, config.max_position_embeddings)
    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            length = json.load(f).get("model_max_length")
    except (OSError, ValueError, AttributeError):
        return fallback
    return length if isinstance(length, int) and 2 < length <= config.max_position_embeddings else fallback


def _load_head(model, weights, name, order=None):
    """The head's Dense from the file's `NAME.weight` (torch's `(out, in)`) and `NAME.bias`,
    their output rows taken in `order` if given."""
    from kbert.models.heads import HEAD_LAYER

    tensors = load_file(weights)
    dense = model.get_layer(HEAD_LAYER).dense
    for suffix, variable, transpose in (("weight", dense.kernel, True), ("bias", dense.bias, False)):
        key = f"{name}.{suffix}"
        if key not in tensors:
            raise ValueError(f"tensor {key!r} is missing from {weights}")
        value = tensors[key]
        if order is not None and len(value) == len(order):  # a shape that differs is refused below
            value = value[np.asarray(order)]
        value = value.T if transpose else value
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"tensor {key!r} has shape {tuple(tensors[key].shape)}; the task's head expects "
                f"{tuple(variable.shape)[::-1] if transpose else tuple(variable.shape)}"
            )
        variable.assign(np.asarray(value, np.float32))
