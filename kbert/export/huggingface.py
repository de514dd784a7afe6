"""A kbert model as a Hugging Face transformers folder (`kbert export --formats huggingface`).

The folder is what transformers' `from_pretrained` reads, for the class that
computes the model's head as kbert does:

| kbert head (`kbert.models.heads`) | transformers class | tasks |
| --- | --- | --- |
| `DenseHead` on the pooled [CLS] | `BertForSequenceClassification` (`problem_type` single-label, multi-label or regression) | text, pair and multi-label classification, pair regression with `--head cross` |
| `DenseHead` on every position | `BertForTokenClassification` | token classification |
| `SpanHead` | `BertForQuestionAnswering` | question answering |
| `FillMaskHead` | `BertForMaskedLM` | fill-mask |
| `PoolingHead` | sentence-transformers: `BertModel`, `1_Pooling`, `2_Normalize` | sentence embedding |

Files: `config.json`, `model.safetensors` (written with `safetensors.numpy`:
no PyTorch here, which crashes beside TensorFlow in one process),
`vocab.txt`, `tokenizer_config.json`, `special_tokens_map.json`, and a
`README.md` that says how to load it and what transformers does not do as
kbert does (which piece of a word carries its tag; a multi-label threshold;
texts cut in the middle). A head with no transformers class (the pair
regressor's cross-cosine) is refused by `check_exportable`, which says what
to do instead. The folder is verified by transformers itself, on PyTorch, in
a process of its own (`kbert.export.huggingface_worker`, `steps.huggingface_step`).
`config.json`'s `kbert` entry keeps the task's settings, with which
`kbert.checkpoints.hf_tasks` reads the folder back as the same model.
"""

import collections
import dataclasses
import importlib.util
import json
import os
import tempfile

import numpy as np

from kbert.checkpoints.huggingface import config_to_hf, encoder_tensors
from kbert.config import PADDING_LOGIT
from kbert.models.heads import HEAD_LAYER, DenseHead, FillMaskHead, PairCosineHead, PoolingHead, SpanHead

# The export folder's sub-folder.
FOLDER = "huggingface"
# sentence-transformers' modules, in its `modules.json`.
ST_MODULES = "sentence_transformers.models"
# What `pip install` a user needs to load and verify the folder.
NEEDS = "pip install transformers torch"


@dataclasses.dataclass(frozen=True)
class Head:
    """What a model's head is in transformers.

    `kind` names the worker's computation (`huggingface_worker.KINDS`);
    `architecture` and `auto_class` are transformers' class names; `pooler`:
    whether that class has BERT's pooler (those reading every position have none).
    """

    kind: str
    architecture: str
    auto_class: str
    pooler: bool


SEQUENCE = Head("sequence", "BertForSequenceClassification", "AutoModelForSequenceClassification", True)
TOKENS = Head("tokens", "BertForTokenClassification", "AutoModelForTokenClassification", False)
SPANS = Head("spans", "BertForQuestionAnswering", "AutoModelForQuestionAnswering", False)
MASKED_LM = Head("masked-lm", "BertForMaskedLM", "AutoModelForMaskedLM", False)
EMBEDDING = Head("embedding", "BertModel", "SentenceTransformer", True)


def head_of(folder):
    """The `Head` of `folder`'s model (a `kbert.modelfolder.ModelFolder`); `ValueError`
    naming what transformers cannot compute, and what to do instead."""
    task, head = folder.task, folder.model.get_layer(HEAD_LAYER)
    check_one_pass(folder, "transformers", SEQUENCE.architecture, FOLDER)
    if isinstance(head, DenseHead):
        return SEQUENCE if head.reads == "pooled_output" else TOKENS
    if isinstance(head, SpanHead):
        return SPANS
    if isinstance(head, FillMaskHead):
        return MASKED_LM
    if isinstance(head, PoolingHead):
        return EMBEDDING
    raise ValueError(f"task {task.name!r}: its head {type(head).__name__} has no transformers class")


def check_one_pass(folder, library, model_class, fmt):
    """`ValueError` for a model that `library`'s `model_class` (and the `fmt`
    export format) cannot compute in one pass of BERT over a row: the pair
    regressor's cross-cosine head, a pair read both ways; it says what to do instead."""
    task, head = folder.task, folder.model.get_layer(HEAD_LAYER)
    if isinstance(head, PairCosineHead):
        raise ValueError(
            f"task {task.name!r} with --head cross-cosine has no {library} class: its score adds the "
            f"cosine of each text's own encoder pass to the pair's [CLS] score, which {model_class} "
            f"does not compute; fine-tune it with --head cross (BERT's recipe) to export it to {fmt}, "
            "or export this model to savedmodel, onnx or tflite"
        )
    if getattr(task, "pair_order", None) == "both":
        owner = f"{library}'" if library.endswith("s") else f"{library}'s"
        raise ValueError(
            f"task {task.name!r} reads each pair both ways and averages the two (pair_order 'both'); "
            f"{owner} {model_class} reads a pair once: export with --pair-order given "
            "(its report gives the figures of the model read that way)"
        )


def check_exportable(folder):
    """`ValueError` unless `folder`'s model has a transformers class (`head_of`) and
    this Python has what verifies the folder (looked for, not imported: PyTorch
    beside TensorFlow crashes)."""
    head = head_of(folder)
    needed = ("transformers", "torch") + (("sentence_transformers",) if head is EMBEDDING else ())
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(
            f"--formats huggingface is verified by transformers on PyTorch, and this Python has no {missing[0]}: "
            f"{NEEDS}" + (" sentence-transformers" if head is EMBEDDING else "")
        )


def write_huggingface(folder, path):
    """Writes `folder`'s model as a transformers folder at `path` (a new folder).

    Args:
        folder: `kbert.modelfolder.ModelFolder`.
        path: str. Where the folder goes; written in place (the exporter
            writes it in its work folder and renames the whole).

    Returns:
        `Head`: what the folder is.

    Example:
    >>> from kbert.modelfolder import ModelFolder
    >>> write_huggingface(ModelFolder.load("runs/debian-minilm"), "hf-debian")  # doctest: +SKIP
    """
    head = head_of(folder)
    os.makedirs(path)
    prefix = "" if head is EMBEDDING else "bert."
    tensors = encoder_tensors(folder.encoder_layer, folder.config, prefix, pooler=head.pooler)
    layer = folder.model.get_layer(HEAD_LAYER)
    hf_config = {**config_to_hf(folder.config), "architectures": [head.architecture],
                 "pad_token_id": folder.tokenizer.pad_id, "torch_dtype": "float32"}
    notes = _notes(folder, head)
    if head is SEQUENCE or head is TOKENS:
        tensors.update(_dense("classifier", layer.dense))
        hf_config.update(_labels(folder, head))
    elif head is SPANS:
        tensors.update(_dense("qa_outputs", layer.dense))
    elif head is MASKED_LM:
        tied = _masked_lm(tensors, layer)
        hf_config["tie_word_embeddings"] = tied
    # Everything kbert reads the folder back with (`kbert.checkpoints.hf_tasks`): the same model.
    hf_config["kbert"] = {"task": folder.task.name, "sequence_length": folder.sequence_length, **notes,
                          "task_settings": folder.task.settings()}
    _save_tensors(tensors, os.path.join(path, "model.safetensors"))
    _write_json(os.path.join(path, "config.json"), hf_config)
    _write_tokenizer(folder, path)
    if head is EMBEDDING:
        _write_sentence_transformers(folder, layer, path)
    with open(os.path.join(path, "README.md"), "w", encoding="utf-8") as f:
        f.write(_readme(folder, head, notes))
    return head


def _dense(name, dense):
    """A Keras Dense `(in, out)` as a torch Linear's `weight` `(out, in)` and `bias`."""
    return {f"{name}.weight": np.ascontiguousarray(_array(dense.kernel).T), f"{name}.bias": _array(dense.bias)}


def _array(variable):
    return np.asarray(variable.numpy(), np.float32)


def _labels(folder, head):
    """`id2label`, `label2id` and `problem_type` of a classifier's or tagger's config."""
    task = folder.task
    field = getattr(task.objective, "field", None)
    if field is None:  # one score (regression)
        return {"id2label": {"0": "score"}, "label2id": {"score": 0}, "problem_type": "regression"}
    labels = list(getattr(task, field))
    values = {"id2label": {str(i): label for i, label in enumerate(labels)},
              "label2id": {label: i for i, label in enumerate(labels)}}
    if head is SEQUENCE:
        multi = hasattr(task, "decision_threshold")
        values["problem_type"] = "multi_label_classification" if multi else "single_label_classification"
    return values


def _masked_lm(tensors, layer):
    """Adds a `FillMaskHead`'s masked LM as `BertForMaskedLM`'s `cls.predictions`;
    returns whether its projection is the token embedding (then tied, as BERT's)."""
    masked_lm = layer.masked_lm
    tensors.update({
        **_dense("cls.predictions.transform.dense", masked_lm.transform_dense),
        "cls.predictions.transform.LayerNorm.weight": _array(masked_lm.transform_layer_norm.gamma),
        "cls.predictions.transform.LayerNorm.bias": _array(masked_lm.transform_layer_norm.beta),
        "cls.predictions.bias": _array(masked_lm.output_bias),
    })
    projection = _array(layer.projection.embeddings)
    tied = np.array_equal(projection, tensors["bert.embeddings.word_embeddings.weight"])
    if not tied:
        tensors["cls.predictions.decoder.weight"] = np.ascontiguousarray(projection)
    return bool(tied)


def _notes(folder, head):
    """What transformers does not do as kbert does, for the config's `kbert` entry and the README."""
    task, notes = folder.task, {}
    if head is TOKENS:
        bioes = getattr(task, "scheme", None) == "BIOES"
        notes["word_rule"] = (
            "a word's tag is read at its first WordPiece; its other pieces' outputs are not read"
            + (" (under BIOES, an entity ends where the word's last part says)" if bioes else "")
            + "; transformers' pipeline(\"token-classification\", aggregation_strategy=\"first\") reads words so"
        )
    if hasattr(task, "decision_threshold"):
        notes["threshold"] = float(task.decision_threshold)
    truncate = getattr(task, "truncate", None)
    if truncate:
        notes["truncate"] = truncate
    if head is EMBEDDING:
        notes.update(pooling=task.pooling, normalize=bool(task.normalize))
    return notes


def _write_tokenizer(folder, path):
    """`vocab.txt`, `tokenizer_config.json` and `special_tokens_map.json` of kbert's WordPiece."""
    tokenizer = folder.tokenizer
    with open(os.path.join(path, "vocab.txt"), "w", encoding="utf-8") as f:
        f.writelines(token + "\n" for token in folder.vocabulary)
    special = {"unk_token": tokenizer.unknown_token, "sep_token": "[SEP]", "pad_token": "[PAD]",
               "cls_token": "[CLS]", "mask_token": "[MASK]"}
    _write_json(os.path.join(path, "tokenizer_config.json"), {
        "tokenizer_class": "BertTokenizer", "do_lower_case": bool(folder.lowercase),
        "tokenize_chinese_chars": True, "strip_accents": None,
        # Texts are cut where kbert's model was: at its sequence length.
        "model_max_length": folder.sequence_length, **special,
    })
    _write_json(os.path.join(path, "special_tokens_map.json"), special)


def _write_sentence_transformers(folder, layer, path):
    """sentence-transformers' modules: the transformer (this folder), pooling, normalisation."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": f"{ST_MODULES}.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": f"{ST_MODULES}.Pooling"}]
    if layer.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": f"{ST_MODULES}.Normalize"})
        os.makedirs(os.path.join(path, "2_Normalize"))
    _write_json(os.path.join(path, "modules.json"), modules)
    _write_json(os.path.join(path, "sentence_bert_config.json"),
                {"max_seq_length": folder.sequence_length, "do_lower_case": False})
    os.makedirs(os.path.join(path, "1_Pooling"))
    _write_json(os.path.join(path, "1_Pooling", "config.json"), {
        "word_embedding_dimension": folder.config.hidden_size,
        "pooling_mode_cls_token": layer.pooling == "cls",
        "pooling_mode_mean_tokens": layer.pooling == "mean",
        "pooling_mode_max_tokens": layer.pooling == "max",
        "pooling_mode_mean_sqrt_len_tokens": False,
    })


def _readme(folder, head, notes):
    """The folder's README: what it is, how to load it, and what transformers does otherwise."""
    task = folder.task
    if head is EMBEDDING:
        load = ("from sentence_transformers import SentenceTransformer\n\n"
                "model = SentenceTransformer(\"PATH\")\nvectors = model.encode([\"A text.\"])")
    else:
        pipeline = task.hf_pipeline
        extra = ", aggregation_strategy=\"first\"" if head is TOKENS else ""
        load = (f"from transformers import AutoTokenizer, {head.auto_class}, pipeline\n\n"
                f"model = {head.auto_class}.from_pretrained(\"PATH\")\n"
                "tokenizer = AutoTokenizer.from_pretrained(\"PATH\")\n"
                f"run = pipeline(\"{pipeline}\", model=\"PATH\"{extra})")
    lines = [
        f"# {task.name}: a kbert model for transformers",
        "",
        f"Written by `kbert export --formats huggingface` as `{head.architecture}`"
        + (" with sentence-transformers' pooling" if head is EMBEDDING else "")
        + f"; texts are cut at {folder.sequence_length} word pieces (`model_max_length`).",
        "",
        "```python",
        load,
        "```",
    ]
    said = {
        "word_rule": "Words: {}.",
        "threshold": "A label is predicted where its sigmoid probability reaches {} (kbert chose it on the dev set; "
                     "transformers' pipeline does not apply it: pass `function_to_apply=\"sigmoid\"` and compare).",
        "truncate": "kbert cuts a text longer than the sequence length by `{}`; transformers' tokenizer keeps its "
                    "start (`longest_first`), so long texts may score otherwise here.",
    }
    for key, sentence in said.items():
        if key in notes and not (key == "truncate" and notes[key] == "longest_first"):
            lines += ["", sentence.format(notes[key])]
    lines += ["", "`config.json`'s `kbert` entry holds these settings."]
    return "\n".join(lines) + "\n"


# === Verification: transformers runs the folder (`huggingface_worker`) ===

# A float32 artefact's metric may move this much either way: 0.1 point
# (a fraction for metrics shown in points, a point for metrics in points already).
METRIC_CHANGE = 0.001
METRIC_CHANGE_IN_POINTS = 0.1
# Heads whose rows are the examples' texts, one each: transformers' own
# tokenizer then gives rows the task decodes as it decodes kbert's. A
# tagger's and a reader's rows are windows that kbert cuts.
ROWS_ARE_TEXTS = (SEQUENCE, EMBEDDING, MASKED_LM)

Ran = collections.namedtuple("Ran", ["outputs", "latency", "extra"])


def run_transformers(folder, path, head, reference, threads):
    """The folder at `path` run by transformers on PyTorch, on the export's rows.

    Args:
        folder: `kbert.modelfolder.ModelFolder` the folder was written from.
        path: str. The transformers folder (`write_huggingface`).
        head: its `Head`.
        reference: `kbert.export.verify.KerasReference`: the rows and the Keras outputs.
        threads: int. PyTorch's threads.

    Returns:
        `Ran(outputs, latency, extra)`: the outputs on kbert's rows under the
        task's output names, batch-1 latency, and the report entry's extra
        fields: what `from_pretrained` found missing or unexpected, the largest
        difference of the raw outputs, and the task's figures with
        transformers' own tokenizer on the texts (`ROWS_ARE_TEXTS`).
    """
    from kbert.export.huggingface_worker import run_worker
    from kbert.export.serving import serving_for

    task, features = folder.task, reference.features
    strings = serving_for(task).strings(reference.examples) if head in ROWS_ARE_TEXTS else None
    rows = len(features["token_ids"])
    if strings and any(len(values) != rows for values in strings.values()):
        strings = None
    with tempfile.TemporaryDirectory(prefix="kbert-hf-") as tmp:
        np.savez(os.path.join(tmp, "features.npz"), **features)
        request = {
            "folder": os.path.abspath(path), "kind": head.kind, "features": os.path.join(tmp, "features.npz"),
            "outputs": os.path.join(tmp, "outputs.npz"), "threads": threads,
            "latency_runs": reference.latency_runs, "max_length": folder.sequence_length,
            "texts": [strings[name] for name in task.text_inputs] if strings else None,
        }
        if head is MASKED_LM:
            request["fill_mask"] = {"mask_id": folder.tokenizer.mask_id, "max_masks": task.max_masks, "top_k": task.top_k}
        reply = run_worker(request)
        with np.load(request["outputs"]) as saved:
            ran = {name: saved[name] for name in saved.files}
    outputs = _kbert_outputs(task, head, {k[7:]: v for k, v in ran.items() if k.startswith("tokens/")}, features)
    extra = {
        "loading_info": reply["loading_info"],
        "max_abs_diff_outputs": _raw_difference(outputs, reference.outputs, features),
        "versions": reply["versions"],
    }
    if strings:
        texts = {k[6:]: v for k, v in ran.items() if k.startswith("texts/")}
        ids = texts.pop("input_ids")
        rows = {"token_ids": ids, "padding_mask": (ids != folder.tokenizer.pad_id).astype(np.int32)}
        figures = reference.figures(outputs=_kbert_outputs(task, head, texts, rows))
        width = min(ids.shape[1], features["token_ids"].shape[1])
        differ = (ids[:, :width] != features["token_ids"][:, :width]).any(axis=1)
        # Rows neither tokenizer cut: where they differ, the tokenizers do, not where they cut.
        uncut = (rows["padding_mask"].sum(axis=1) < ids.shape[1]) & (features["padding_mask"].sum(axis=1) < width)
        extra["transformers_tokenizer"] = {
            "tokenizer": reply["tokenizer"], **figures, "rows": int(len(ids)),
            "rows_whose_token_ids_differ": int(differ.sum()),
            "uncut_rows_whose_token_ids_differ": int((differ & uncut).sum()),
        }
    return Ran(outputs, reply["latency"], extra)


def _kbert_outputs(task, head, ran, features):
    """The worker's outputs under the task's names, as kbert's model gives them."""
    if head is SEQUENCE or head is TOKENS:
        outputs = {task.outputs[0]: ran["logits"]}
        if head is TOKENS:  # compared where both give tags: at the tokens
            outputs["compared"] = np.asarray(features["padding_mask"]) == 1
        return outputs
    if head is SPANS:  # kbert's span head puts padding at PADDING_LOGIT (no answer there)
        padding = np.asarray(features["padding_mask"]) == 0
        return {name: np.where(padding, PADDING_LOGIT, ran[name]).astype(np.float32) for name in task.outputs}
    return {name: ran[name] for name in task.outputs}


def _raw_difference(outputs, reference, features):
    """The largest difference of the float outputs, at the tokens where they have a position axis."""
    mask = np.asarray(features["padding_mask"]) == 1
    largest = 0.0
    for name, value in outputs.items():
        value, expected = np.asarray(value), np.asarray(reference[name])
        if not np.issubdtype(value.dtype, np.floating):
            continue
        difference = np.abs(value.astype(np.float64) - expected)
        if difference.shape[:2] == mask.shape:
            difference = difference[mask]
        largest = max(largest, float(difference.max()) if difference.size else 0.0)
    return largest


def judge(entry, reference):
    """`entry` (judged by the task, `KerasReference.artefact`) held also to what a
    transformers folder must keep: every weight loaded, nothing unexpected; its raw
    outputs within `FLOAT_TOLERANCE` of Keras's; the task's metric within 0.1 point."""
    from kbert.export.serving import serving_for
    from kbert.export.serving_base import FLOAT_TOLERANCE

    task = reference.task
    problems = {key: names for key, names in entry["loading_info"].items() if names}
    in_points = serving_for(task).metric_in_points
    limit = METRIC_CHANGE_IN_POINTS if in_points else METRIC_CHANGE
    change = abs(reference.keras[task.metric] - entry[task.metric])
    scale = 100 if task.metric_scale == 100 else 1
    entry["metric_change"] = round(scale * change, 6)
    texts = ["every weight loaded", f"outputs within {FLOAT_TOLERANCE:g}", f"{task.metric} within 0.1 point"]
    entry["budget"] = ", ".join([entry["budget"], *texts])
    passed = not problems and entry["max_abs_diff_outputs"] <= FLOAT_TOLERANCE and change <= limit + 1e-9
    if problems:
        reference.log(f"{entry['path']}: transformers' from_pretrained reports {problems}")
    entry["passed"] = bool(entry["passed"] and passed)
    return entry


def _save_tensors(tensors, path):
    from safetensors.numpy import save_file

    save_file(tensors, path, metadata={"format": "pt"})


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")
