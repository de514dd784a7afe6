"""Knowledge distillation: a smaller student learns a fine-tuned teacher's task.

`distill` reads a teacher model folder (what `kbert finetune` writes), builds
a student (`build_student`), computes the teacher's outputs on the training
rows once, in inference mode, and fits the student with `model.fit` on the
task's distillation loss (`Task.distillation_loss`, `kbert.tasks.distillation`):
the gold targets and the teacher's outputs, softened by a temperature for
the classifiers (Hinton et al., 2015). The student is written as an
ordinary model folder of the teacher's task, settings, vocabulary and
sequence length, which `kbert evaluate`, `predict` and `export` take
unchanged. Like the fine-tuning trainer, it never tests the task's name.

Students (`student=`):

| spec | the student |
| --- | --- |
| `layers:K` | K of the teacher's blocks, evenly spaced, the last always kept (block `(i + 1) * L // K - 1` for i < K), started from the teacher's weights (embeddings, kept blocks, pooler, task head); the default is `layers:1` (`DEFAULT_STUDENT`) |
| `every-other` | the teacher's encoder keeping blocks 1, 3, 5, ... (counting from 0: the 2nd, 4th, 6th of six), started from the teacher's weights |
| a `BertConfig` preset | a fresh encoder of that shape, with the teacher's vocabulary |
| a checkpoint | what `kbert finetune --init` takes (`init_encoder`); its vocabulary must be the teacher's |

Example:
>>> distill("runs/debian-minilm", "train.csv", "dev.csv", "runs/debian-l3")  # doctest: +SKIP
"""

import os
import shutil
import time

import keras
import numpy as np

from kbert.checkpoints.huggingface import init_encoder
from kbert.config import PACKAGED_CHECKPOINTS, PRESETS, BertConfig
from kbert.corpus import iter_documents
from kbert.hardware import log_dtype
from kbert.logs import Waiting, to_stderr
from kbert.modelfolder import (
    MODEL_FILE,
    SETTINGS_FILE,
    ModelFolder,
    check_student_out,
    write_model_folder,
)
from kbert.modelcard import data_files
from kbert.models import bert_encoder
from kbert.recipes import DISTILLATION
from kbert.tasks import Encoded
from kbert.tasks.distillation import distillation_targets
from kbert.training.batching import batched_dataset, training_bucket_width
from kbert.fitting.distribute import compile_for_strategy
from kbert.training.epochs import dev_figures, fit_epochs
from kbert.training.finetune import check_training_numbers, set_seeds
from kbert.training.resume import file_identity, resume_point
from kbert.fitting.optimizers import make_optimizer

# DistilBERT's distillation script (Sanh et al., 2019) softens with T = 2 and
# weighs its soft and hard losses alike.
DEFAULT_TEMPERATURE = 2.0
DEFAULT_ALPHA = 0.5
EVERY_OTHER = "every-other"
LAYERS_PREFIX = "layers:"
# The default student and recipe (`kbert.recipes.DISTILLATION`) are those
# measured on the Debian task (docs/distillation.md, "Figures"): MiniLM-L6's
# last block alone, with the teacher's embeddings and head, is the student that
# runs in under 1 ms batch-1 in TFLite int8 at 128 tokens (0.56 ms; 2 blocks:
# about 1.7 ms), 1.1 points below its teacher over three seeds.
DEFAULT_STUDENT = "layers:1"
BLOCK_PREFIX = "transformer_layer_"


class Distiller(keras.Model):
    """Trains `student` on a distillation loss, whose targets are a dict.

    Keras's compiled losses take one target per output; a model with a
    `compute_loss` of its own takes any structure (the pattern of keras.io's
    "Knowledge Distillation" example). The weights are the student's: save
    the student, not this.

    Args:
        student: keras.Model. The task's model.
        loss: a `keras.losses.Loss` from `Task.distillation_loss`.
    """

    def __init__(self, student, loss, **kwargs):
        super().__init__(**kwargs)
        self.student = student
        self.distillation_loss = loss
        # The student is built, and this wrapper has no weights of its own.
        self.built = True

    def call(self, inputs, training=False):
        return self.student(inputs, training=training)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return self.distillation_loss(y, y_pred, sample_weight)


def kept_layers(spec, num_layers):
    """The teacher's blocks a `every-other` or `layers:K` student keeps, or None for other specs.

    Raises `ValueError` naming `spec` if it keeps no block or more than the teacher has.
    """
    if spec == EVERY_OTHER:
        kept = list(range(1, num_layers, 2))
        if not kept:
            raise ValueError(f"student={spec!r} of a 1-layer teacher keeps no layer; use layers:1")
        return kept
    if not spec.startswith(LAYERS_PREFIX):
        return None
    count = spec[len(LAYERS_PREFIX):]
    if not count.isdigit() or not 1 <= int(count) <= num_layers:
        raise ValueError(
            f"student={spec!r}; expected layers:K with K from 1 to the teacher's {num_layers} layers"
        )
    count = int(count)
    return [(i + 1) * num_layers // count - 1 for i in range(count)]


def check_student(spec, num_layers):
    """Raises `ValueError` naming `spec` unless it names a student (cheap: loads nothing)."""
    if kept_layers(spec, num_layers) is not None or spec in PRESETS:
        return
    if not (os.path.isdir(spec) or spec in PACKAGED_CHECKPOINTS):
        raise ValueError(
            f"student={spec!r} is not {EVERY_OTHER}, layers:K, a BertConfig preset (such as "
            f"bert_tiny, bert_l4_h256) or a checkpoint folder"
        )


def build_student(teacher, spec=DEFAULT_STUDENT, dtype=None):
    """The student `spec` names, for the `teacher` model folder, before training.

    Args:
        teacher: `kbert.modelfolder.ModelFolder`.
        spec: str. See the module docstring.
        dtype: dtype policy of the student.

    Returns:
        `(config, model, kept)`: the student's `BertConfig`, its model
        (`teacher.task.build_model`) and the teacher's blocks it starts from
        (None for a preset or a checkpoint).

    Raises:
        ValueError: one line naming `spec` if it does not fit the teacher
            (too many layers, another vocabulary, too short for the
            teacher's sequence length).
    """
    task = teacher.task
    check_student(spec, teacher.config.num_layers)
    kept = kept_layers(spec, teacher.config.num_layers)
    if kept is not None:
        config = teacher.config.replace(num_layers=len(kept))
        encoder = bert_encoder(config, dtype=dtype)
        _copy_weights(encoder, teacher.encoder_layer, lambda name: _teacher_block(name, kept))
        model = task.build_model(encoder, dtype=dtype)
        # The task's own layers (the head): the same names in both models.
        _copy_weights(model, teacher.model, lambda name: None if name == encoder.name else name)
        return config, model, kept
    if spec in PRESETS:
        config = BertConfig.from_preset(spec, vocab_size=teacher.config.vocab_size)
        _check_length(spec, config, teacher.sequence_length)
        return config, task.build_model(config, dtype=dtype), None
    config, encoder, vocabulary, _ = init_encoder(spec, dtype=dtype)
    if vocabulary != teacher.vocabulary:
        raise ValueError(
            f"student={spec!r} has a vocabulary of {len(vocabulary or ())} tokens other than the "
            f"teacher's ({len(teacher.vocabulary)} tokens); a student reads its teacher's word pieces"
        )
    _check_length(spec, config, teacher.sequence_length)
    return config, task.build_model(encoder, dtype=dtype), None


def _teacher_block(name, kept):
    """The teacher's layer that the student's layer `name` starts from."""
    if name.startswith(BLOCK_PREFIX):
        return f"{BLOCK_PREFIX}{kept[int(name[len(BLOCK_PREFIX):])]}"
    return name


def _copy_weights(model, source, source_name):
    """Each of `model`'s layers with weights takes those of `source`'s layer `source_name(name)` (None: none)."""
    for layer in model.layers:
        name = source_name(layer.name)
        if layer.weights and name is not None:
            layer.set_weights(source.get_layer(name).get_weights())


def _check_length(spec, config, sequence_length):
    try:
        config.check_sequence_length(sequence_length)
    except ValueError as error:
        raise ValueError(f"student={spec!r}: {error}, the teacher's") from None


def unlabelled_examples(task, path, limit=None, known=()):
    """The task's examples of the texts of a corpus, without labels.

    Args:
        task: a `Task` whose `distills_unlabelled_text`.
        path: str. A text file (`.gz` read too) in google-research/bert's
            format: one sentence a line, a blank line between documents. A
            document's lines, joined by spaces, make one text.
        limit: int or None. Most texts taken.
        known: the examples already in training or dev.

    Returns:
        `(examples, dropped)`: texts equal to a known example's or an
        earlier one's (white space folded) are dropped and counted, so that
        no dev text is trained on: the Debian corpus holds every text of
        train.csv and dev.csv.
    """
    if not os.path.isfile(path):
        raise ValueError(f"--unlabelled {path}: no such file")
    seen = {_folded(task, example) for example in known}
    examples, dropped = [], 0
    for document in iter_documents(path):
        if limit is not None and len(examples) >= limit:
            break
        (example,) = task.examples_from_texts([" ".join(document)])
        key = _folded(task, example)
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        examples.append(example)
    if not examples:
        raise ValueError(f"--unlabelled {path} holds no text that is not in the training or dev data")
    return examples, dropped


def _folded(task, example):
    return tuple(" ".join(value.split()) for value in task.serving_request(example).values())


def distill(
    teacher,
    train,
    dev,
    out,
    student=DEFAULT_STUDENT,
    unlabelled=None,
    unlabelled_limit=None,
    temperature=DEFAULT_TEMPERATURE,
    alpha=DEFAULT_ALPHA,
    options=None,
    sequence_length=None,
    batch_size=DISTILLATION.batch_size,
    epochs=DISTILLATION.epochs,
    learning_rate=DISTILLATION.learning_rate,
    warmup_fraction=DISTILLATION.warmup_fraction,
    weight_decay=DISTILLATION.weight_decay,
    jit_compile=False,
    dtype=None,
    seed=0,
    overwrite=False,
    deterministic=False,
    verbose="auto",
    log=None,
):
    """Distills the `teacher` model folder into a student and writes it to `out`; returns its dev figures.

    Args:
        teacher: str. A model folder of a task that can be distilled
            (`Task.distillation_loss`).
        train, dev: str. Labelled data in the task's format.
        out: str. The student's model folder (as `finetune`'s `out`).
        student: str. See the module docstring.
        unlabelled: str or None. Extra texts without labels, trained on the
            teacher's outputs alone (`unlabelled_examples`); only for tasks
            whose `distills_unlabelled_text`.
        unlabelled_limit: int or None. Most unlabelled texts taken.
        temperature: float > 0. Softens the classifiers' distributions.
        alpha: float in [0, 1]. The weight of the gold targets' loss; the
            teacher's outputs take `1 - alpha`.
        options: dict. Data options given (None: as the teacher was trained;
            settings the teacher chose on dev, such as its null threshold or
            the order it reads pairs in, the student chooses on `dev` again).
        sequence_length: int or None. Packed length; default the teacher's.
        batch_size, epochs, learning_rate, warmup_fraction, weight_decay,
        jit_compile, dtype, seed, overwrite, deterministic, verbose, log:
            as for `kbert.training.finetune.finetune`.

    A run checkpoints every epoch beside `out` and resumes as `finetune` does.

    Returns:
        dict. The student's dev figures, the teacher's (`teacher`), the
        distillation's settings and counts, the training time and curve.

    Raises:
        ValueError: bad input, one line naming the value.
    """
    log = log or to_stderr
    check_training_numbers(batch_size, epochs, learning_rate)
    _check_distillation_numbers(temperature, alpha, unlabelled_limit)
    check_student_out(teacher, out, overwrite, train, dev, unlabelled, student)
    teacher_folder = ModelFolder.load(teacher)
    if sequence_length is not None:
        teacher_folder.set_sequence_length(sequence_length)
    given = options
    options = teacher_folder.use_options(given)
    task = teacher_folder.task
    loss = task.distillation_loss(temperature, alpha)
    if unlabelled is not None and not task.distills_unlabelled_text:
        raise ValueError(f"task {task.name!r} takes no --unlabelled texts; only tasks of one text an example do")
    check_student(student, teacher_folder.config.num_layers)
    train_examples, dev_examples, extra, dropped = _read_data(
        task, options, train, dev, unlabelled, unlabelled_limit, log
    )

    set_seeds(seed, deterministic)
    dtype = log_dtype(dtype, log)
    config, model, kept = _student_model(teacher_folder, student, dtype, log)
    run = {
        "command": "distill", "teacher": {name: file_identity(os.path.join(teacher, name))
                                          for name in (SETTINGS_FILE, MODEL_FILE)},
        "student": student, "temperature": temperature, "alpha": alpha, "options": options,
        "train": file_identity(train), "dev": file_identity(dev),
        "unlabelled": file_identity(unlabelled) if unlabelled else None,
        "unlabelled_limit": unlabelled_limit, "sequence_length": task.sequence_length,
        "batch_size": batch_size, "epochs": epochs, "learning_rate": learning_rate,
        "warmup_fraction": warmup_fraction, "weight_decay": weight_decay,
        "jit_compile": jit_compile, "dtype": dtype, "seed": seed,
    }
    resume_dir, first_epoch, curve = resume_point(out, run, log)

    with Waiting(f"teacher: its dev figures on {len(dev_examples):,} examples", log):
        teacher_figures = teacher_folder.evaluate(dev_examples, dev)  # in `kbert evaluate`'s batches
    encoded = teacher_targets(teacher_folder, task, train_examples, extra, batch_size, log)
    train_ds, steps_per_epoch = batched_dataset(
        task, encoded, batch_size, seed, epochs, first_epoch, training_bucket_width(jit_compile)
    )
    total_steps = steps_per_epoch * epochs
    distiller = compile_for_strategy(
        Distiller(model, loss),
        jit_compile=jit_compile,
        optimizer=make_optimizer(
            "adamw",
            learning_rate,
            total_steps,
            warmup_steps=int(warmup_fraction * total_steps),
            weight_decay=weight_decay,
            dtype=dtype,
        ),
    )
    figures = fit_epochs(
        distiller, train_ds, steps_per_epoch, epochs, resume_dir, first_epoch, curve,
        len(train_examples) + len(extra), verbose=verbose, batch_size=batch_size, log=log,
    )
    distillation = {
        "teacher": teacher, "task": task.name, "student": student, "teacher_layers": kept,
        "temperature": temperature, "alpha": alpha,
    }
    # What the teacher chose on its dev predictions (a null threshold, the order
    # pairs are read in; its targets were made with them), the student chooses
    # on its own, unless given.
    task.untune(given)
    metrics = {
        **dev_figures(task, model, dev_examples, task.encode(dev_examples), log),
        "teacher": teacher_figures,
        "distillation": {**distillation, "unlabelled_examples": len(extra), "unlabelled_dropped": dropped},
        **figures,
        "steps_per_epoch": steps_per_epoch,
    }
    settings = {
        "bert_config": config.to_dict(),
        "sequence_length": task.sequence_length,
        "lowercase": teacher_folder.lowercase,
        "init": student,
        "distillation": distillation,
        "dtype": dtype,
        "data": data_files(train=train, dev=dev, unlabelled=unlabelled),  # named on the model card
    }
    write_model_folder(out, model, teacher_folder.vocabulary, task, settings, metrics, overwrite=overwrite)
    shutil.rmtree(resume_dir, ignore_errors=True)
    return metrics


def _check_distillation_numbers(temperature, alpha, unlabelled_limit):
    """Raises `ValueError` naming a temperature, alpha or unlabelled limit out of range."""
    if not (isinstance(alpha, (int, float)) and 0 <= alpha <= 1):
        raise ValueError(f"alpha={alpha!r}; expected a number in [0, 1]")
    if not (isinstance(temperature, (int, float)) and 0 < temperature < float("inf")):
        raise ValueError(f"temperature={temperature!r}; expected a finite number above 0")
    if unlabelled_limit is not None and not (isinstance(unlabelled_limit, int) and unlabelled_limit >= 1):
        raise ValueError(f"unlabelled_limit={unlabelled_limit!r}; expected a positive integer")


def _read_data(task, options, train, dev, unlabelled, unlabelled_limit, log):
    """`(train examples, dev examples, unlabelled examples, unlabelled dropped)`, each file
    checked against the teacher's task (`ValueError` naming the file and line)."""
    train_examples = task.read(train, options)
    task.check(train_examples, train)
    dev_examples = task.read(dev, options)
    task.check(dev_examples, dev)
    extra, dropped = [], 0
    if unlabelled is not None:
        extra, dropped = unlabelled_examples(task, unlabelled, unlabelled_limit, train_examples + dev_examples)
    log(f"{task.name}: {len(train_examples)} training examples from {train}, {len(extra)} unlabelled "
        f"texts ({dropped} dropped as repeats of training, dev or earlier texts), "
        f"{len(dev_examples)} dev examples from {dev}")
    return train_examples, dev_examples, extra, dropped


def _student_model(teacher_folder, student, dtype, log):
    """`build_student`, saying what the student is and warning if it is not smaller than its teacher."""
    config, model, kept = build_student(teacher_folder, student, dtype)
    student_size, teacher_size = model.count_params(), teacher_folder.model.count_params()
    if student_size > teacher_size:
        log(f"warning: student {student} has {student_size:,} parameters, more than the teacher's "
            f"{teacher_size:,}; distillation is for a smaller model: choose a smaller --student")
    log(f"student {student}: num_layers={config.num_layers}, hidden_size={config.hidden_size}"
        + (f", starting from the teacher's blocks {kept} (counting from 0)" if kept else ""))
    return config, model, kept


def teacher_targets(teacher, task, examples, unlabelled, batch_size, log):
    """The rows of `examples` and `unlabelled`, with the task's distillation targets.

    The teacher's outputs are computed once, in inference mode. Unlabelled
    rows get placeholder targets (zeros) of hard-loss weight 0, as do the rows
    the task does not learn from (`Encoded.learned`: question answering's
    windows of questions whose answer cannot be found). The rows are those the task
    trains on, packed (`Task.training_rows`: named entities' document windows too).
    """
    encoded = task.training_rows(examples, packed=True)
    features, targets = encoded.features, encoded.targets
    hard_weight = np.ones(len(encoded), np.float32)
    if encoded.learned is not None:
        hard_weight = encoded.learned.astype(np.float32)
    if unlabelled:
        extra = task.encode(unlabelled, targets=False)
        features = {name: np.concatenate([features[name], extra.features[name]]) for name in features}
        targets = keras.tree.map_structure(
            lambda target: np.concatenate([target, np.zeros((len(extra),) + target.shape[1:], target.dtype)]),
            targets,
        )
        hard_weight = np.concatenate([hard_weight, np.zeros(len(extra), np.float32)])
    start = time.perf_counter()
    with Waiting(f"teacher: outputs on {len(hard_weight):,} rows", log):
        outputs = teacher.outputs(features, batch_size=batch_size)
    log(f"teacher: outputs on {len(hard_weight)} rows in {time.perf_counter() - start:.1f} s")
    # The teacher's outputs as the task's loss reads them: its one output, or
    # several stacked on a last axis (question answering's start and end logits).
    teacher = [outputs[name] for name in task.outputs]
    teacher = teacher[0] if len(teacher) == 1 else np.stack(teacher, axis=-1)
    return Encoded(features, distillation_targets(targets, teacher, hard_weight), group_size=encoded.group_size)
