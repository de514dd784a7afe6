"""Fine-tuning any task with `model.fit`; the task decides data, head, loss and metrics.

`finetune` reads the training and dev files with the task's reader, builds the
task's model on a pretrained (or fresh) encoder, fits it with AdamW on BERT's
schedule and writes a model folder (`kbert.modelfolder`). It never tests the
task's name: everything that differs between tasks is a call into the task.
"""

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time

import keras

from kbert.checkpoints.huggingface import init_encoder, read_init
from kbert.config import check_init
from kbert.fileio import write_file
from kbert.hardware import log_dtype
from kbert.logs import to_stderr
from kbert.modelfolder import check_model_out, write_model_folder
from kbert.pretraining.adapt import adapt, adaptation_text
from kbert.pretraining.run_folder import BACKUP_FOLDER, HISTORY_FILE
from kbert.recipes import check_adaptation, check_probe
from kbert.tasks import DEFAULT_TASK, get_task
from kbert.tasks.inference import NonFiniteOutputs
from kbert.training.batching import eval_dataset, train_dataset, training_bucket_width
from kbert.text import WordPieceTokenizer, load_vocab
from kbert.fitting.distribute import (
    STRATEGIES,
    chief_folder,
    compile_for_strategy,
    get_strategy,
    log_batch_sizes,
)
from kbert.fitting.backup import AtomicBackup, PendingInterrupt
from kbert.fitting.optimizers import layerwise_multipliers, make_optimizer
from kbert.training.probe import probe_head as fit_probe

# Training-curve points kept per epoch in metrics.json.
CURVE_POINTS_PER_EPOCH = 20
# Beside `out`, a run keeps its epoch checkpoints here until it has written
# `out`; the same command run again after a crash resumes from them.
RESUME_PREFIX = ".kbert-resume-"
# What identifies a run in its resume folder.
RUN_FILE = "run.json"
# Inside the resume folder: the adaptation's run (`kbert.pretraining.adapt`),
# whose encoder fine-tuning starts from.
ADAPT_FOLDER = "adaptation"
# What kbert.json records of how the model was trained, besides its
# sequence length and dtype.
TRAINING_SETTINGS = (
    "epochs", "batch_size", "learning_rate", "warmup_fraction", "weight_decay", "layer_decay",
    "ema_momentum", "reinit_pooler", "attention_dropout", "jit_compile", "seed", "adapt_steps",
    "probe_head",
)


class TrainingDiverged(ValueError):
    """The training loss became NaN or infinite."""


class _StepLossLogger(keras.callbacks.Callback):
    """Keeps the training loss every `every` steps, for the curve in metrics.json."""

    def __init__(self, every, curve=(), step=0):
        super().__init__()
        self.every = every
        self.curve = list(curve)
        self._step = step

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self._step % self.every == 0 and logs and "loss" in logs:
            self.curve.append({"step": self._step, "loss": float(logs["loss"])})


class _StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Raises `TrainingDiverged` at the first step whose loss is NaN or infinite.

    Keras's `TerminateOnNaN` only stops training, after which `fit` returns as
    if it had finished; a diverged model must never be saved as a result.
    """

    def __init__(self, kept):
        super().__init__()
        self.kept = kept
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            kept = f"; the last complete epoch is kept in {self.kept} for inspection" if self._epoch else ""
            raise TrainingDiverged(
                f"training diverged: the loss is {float(loss)} at epoch {self._epoch + 1}, "
                f"step {batch + 1}; lower the learning rate (no model was written){kept}"
            )


def finetune(
    train,
    dev,
    init,
    out,
    task=DEFAULT_TASK,
    options=None,
    sequence_length=None,
    batch_size=None,
    epochs=None,
    learning_rate=None,
    warmup_fraction=None,
    weight_decay=None,
    adapt_steps=None,
    probe_head=None,
    layer_decay=1.0,
    ema_momentum=None,
    reinit_pooler=False,
    attention_dropout=None,
    jit_compile=False,
    dtype=None,
    seed=0,
    vocab=None,
    lowercase=None,
    strategy="auto",
    overwrite=False,
    deterministic=False,
    verbose="auto",
    callbacks=(),
    log=None,
):
    """Fine-tunes `task` and writes the model folder `out`; returns the dev figures.

    Args:
        train, dev: str. Data files in the task's format.
        init: str. A Hugging Face checkpoint folder, a packaged checkpoint name
            (e.g. "all-minilm-l6-v2") or a `BertConfig` preset (random init;
            then `vocab` is required).
        out: str. Output folder, written aside and renamed into place; an
            existing kbert model folder is replaced only with `overwrite`, and
            anything else there is refused before training starts.
        task: str. A name in `kbert.tasks.TASKS`.
        options: dict. The task's data options (`Task.options`), e.g.
            `{"text_column": "review"}`.
        sequence_length, batch_size, epochs, learning_rate, warmup_fraction,
            weight_decay: the packed length (longer inputs are truncated, or
            windowed by tasks that window), the global batch, the passes
            over `train`, the peak rate, the share of the steps warming it
            up and AdamW's decoupled weight decay (not on LayerNorm and
            biases); each None (the default) takes the task's recipe
            (`Task.recipe`, a `kbert.recipes.Recipe`).
        adapt_steps: int or None. Masked-LM steps on the training texts
            before fine-tuning (task-adaptive pretraining,
            `kbert.pretraining.adapt`), with the recipe's batch and length;
            0: none; None: the task's recipe (1,200 for
            text-pair-classification, else 0).
        probe_head: bool or None. Start the head as a logistic regression on
            the frozen encoder's vectors of the training texts
            (`kbert.training.probe`); None: the task's recipe (True for
            text-classification).
        layer_decay: float in (0, 1]. Layer-wise learning-rate decay
            (`kbert.training.layerwise_multipliers`); 1 is off.
        ema_momentum: float or None. End on an exponential moving average of
            the weights.
        reinit_pooler: bool. Re-initialise the pooler's dense layer instead of
            keeping the checkpoint's (Zhang et al., 2021, "Revisiting
            few-sample BERT fine-tuning").
        attention_dropout: float in [0, 1) or None. Dropout on the attention
            probabilities while fine-tuning, in place of the checkpoint's
            (BERT's 0.1); 0 also skips drawing its random mask, the largest
            tensor a step draws one for.
        jit_compile: bool. Compile the train step with XLA.
        dtype: str. A dtype policy such as "mixed_bfloat16", or "auto":
            mixed_bfloat16 where the device multiplies bfloat16 natively,
            float32 elsewhere (`kbert.hardware`).
        strategy: str. A `tf.distribute` strategy name (see
            `kbert.fitting.distribute.STRATEGIES`); `batch_size` is global.
        overwrite: bool. Replace `out` if it is a kbert model folder.
        deterministic: bool. TensorFlow op determinism: the same weights,
            bit for bit, from the same command, also across a resume.
        verbose: `fit`'s verbosity: "auto" (1 on a terminal, else 2), 0, 1 or 2.
        callbacks: list of Keras callbacks, given to `fit` after kbert's own (which
            stop a diverged run, keep the training curve and checkpoint
            every epoch).
        log: callable taking a str, for progress lines (default: stderr).

    A run checkpoints every epoch into a folder beside `out`
    (`.kbert-resume-NAME`); if it is killed, the same call resumes from its
    last complete epoch, with the shuffles and dropout an uninterrupted run
    would have used (an adaptation killed on its way, from its last 100
    steps). The folder is removed once `out` is written; a run with other
    settings starts afresh.

    Returns:
        dict. The task's dev figures, the training time and curve.

    Raises:
        ValueError: bad input (named file and line), or `TrainingDiverged`.
    """
    log = log or to_stderr
    task_class = _trainable(task)
    recipe = task_class.recipe.override(
        sequence_length=sequence_length, batch_size=batch_size, epochs=epochs,
        learning_rate=learning_rate, warmup_fraction=warmup_fraction, weight_decay=weight_decay,
        adapt_steps=adapt_steps, probe_head=probe_head,
    )
    check_training_numbers(recipe.batch_size, recipe.epochs, recipe.learning_rate)
    check_adaptation(recipe.adapt_steps)
    check_probe(task_class, recipe.probe_head)
    task_class.check_sequence_length(recipe.sequence_length)
    check_callbacks(callbacks)
    if isinstance(strategy, str) and strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")
    check_init(init, vocab)
    check_model_out(out, overwrite, {"--train": train, "--dev": dev, "--init": init, "--vocab": vocab})
    options, train_examples, dev_examples, task_settings = task_class.read_training(train, dev, options)

    set_seeds(seed, deterministic)
    strategy = get_strategy(strategy)
    log_batch_sizes(strategy, recipe.batch_size)
    dtype = log_dtype(dtype, log)
    vocabulary, lowercase = _vocabulary_and_casing(init, vocab, lowercase, recipe.sequence_length)
    if not recipe.adapt_steps:  # loaded before anything is written: a bad checkpoint is refused
        config, encoder = _encoder(init, dtype, attention_dropout, strategy)
    tokenizer = WordPieceTokenizer(vocabulary, lowercase=lowercase)
    task = task_class(tokenizer, recipe.sequence_length, **task_settings)
    task.use_options(options)
    task.check(dev_examples, dev)
    log(f"{task.name}: {len(train_examples)} training examples from {train}, "
        f"{len(dev_examples)} dev examples from {dev}")
    run = {
        "task": task.name, "task_settings": task.settings(), "options": options,
        "train": file_identity(train), "dev": file_identity(dev), "init": init,
        "vocab": file_identity(vocab) if vocab else None, "lowercase": lowercase,
        **dataclasses.asdict(recipe), "layer_decay": layer_decay, "ema_momentum": ema_momentum,
        "reinit_pooler": reinit_pooler, "attention_dropout": attention_dropout,
        "jit_compile": jit_compile, "dtype": dtype, "seed": seed,
    }
    if recipe.adapt_steps:
        # Refused before anything is written.
        texts, sequences = adaptation_text(task.texts(train_examples), vocabulary, recipe.sequence_length, lowercase)
    resume_dir, first_epoch, curve = resume_point(out, run, log)
    adaptation = None
    if recipe.adapt_steps:
        adapted, adaptation = adapt(
            texts, sequences, os.path.join(resume_dir, ADAPT_FOLDER), init, vocabulary, lowercase,
            recipe.adapt_steps, recipe.batch_size, recipe.sequence_length, seed=seed, dtype=dtype,
            jit_compile=jit_compile, strategy=strategy, verbose=verbose, log=log,
        )
        # Fine-tuning then draws what it would from the adapted encoder alone.
        set_seeds(seed)
        config, encoder = _encoder(adapted, dtype, attention_dropout, strategy)
    train_ds, steps_per_epoch = train_dataset(
        task, train_examples, recipe.batch_size, seed=seed, epochs=recipe.epochs, first_epoch=first_epoch,
        bucket_width=training_bucket_width(jit_compile), replicas=strategy.num_replicas_in_sync,
    )
    dev_encoded = task.encode(dev_examples)
    dev_ds = eval_dataset(task, dev_encoded, recipe.batch_size, strategy.num_replicas_in_sync)

    total_steps = steps_per_epoch * recipe.epochs
    with strategy.scope():
        model = task.build_model(encoder, dtype=dtype)
        if reinit_pooler:
            _reinitialise(encoder.get_layer("pooler"), config.initializer_range)
        optimizer = make_optimizer(
            "adamw",
            recipe.learning_rate,
            total_steps,
            warmup_steps=int(recipe.warmup_fraction * total_steps),
            weight_decay=recipe.weight_decay,
            dtype=dtype,
            lr_multipliers=layerwise_multipliers(config.num_layers, layer_decay) if layer_decay < 1 else None,
            ema_momentum=ema_momentum,
        )
        compile_for_strategy(model, strategy, jit_compile=jit_compile, optimizer=optimizer, **task.compile_args())
    if recipe.probe_head and not first_epoch:  # a resumed run restores its head
        try:
            fit_probe(task, model, train_examples, log)
        except NonFiniteOutputs:
            if not adaptation:  # nothing to keep
                shutil.rmtree(resume_dir, ignore_errors=True)
            raise
    figures = fit_epochs(
        model, train_ds, steps_per_epoch, recipe.epochs, resume_dir, first_epoch, curve, len(train_examples),
        strategy=strategy, validation_data=dev_ds, verbose=verbose, callbacks=callbacks,
    )
    metrics = {**dev_figures(task, model, dev_examples, dev_encoded), **figures}
    if adaptation:
        metrics["adaptation"] = adaptation
    settings = {
        "bert_config": config.to_dict(),
        "sequence_length": recipe.sequence_length,
        "lowercase": lowercase,
        "init": init,
        "dtype": dtype,
        # The recipe as resolved (the task's, or what the caller gave).
        "training": {key: run[key] for key in TRAINING_SETTINGS},
    }
    # Under MultiWorkerMirroredStrategy only the chief writes `out`.
    with chief_folder(out, strategy) as folder:
        write_model_folder(folder, model, vocabulary, task, settings, metrics, overwrite=overwrite)
    shutil.rmtree(resume_dir, ignore_errors=True)
    return metrics


def _trainable(task):
    """The task class named `task`; `ValueError` if it needs no training."""
    task_class = get_task(task)
    if not task_class.trainable:
        raise ValueError(
            f"task {task!r} needs no training: give kbert evaluate, search or export "
            f"--task {task} --model CHECKPOINT"
        )
    return task_class


def _encoder(init, dtype, attention_dropout, strategy):
    """`(config, encoder)` of a checkpoint or preset, built under `strategy`."""
    with strategy.scope():
        config, encoder, _, _ = init_encoder(
            init, dtype=dtype,
            overrides=None if attention_dropout is None else {"attention_dropout": attention_dropout},
        )
    return config, encoder


def _vocabulary_and_casing(init, vocab, lowercase, sequence_length):
    """`(vocabulary, lowercase)` to read text with for fine-tuning from `init`:
    the checkpoint's unless `vocab` or `lowercase` is given, read without its
    weights; `ValueError` if the vocabulary or `sequence_length` does not fit the model."""
    config, vocabulary, init_lowercase = read_init(init)
    if vocab is not None:
        vocabulary = load_vocab(vocab)
    if len(vocabulary) > config.vocab_size:
        raise ValueError(
            f"vocabulary has {len(vocabulary)} tokens but vocab_size={config.vocab_size}"
        )
    config.check_sequence_length(sequence_length)
    return vocabulary, init_lowercase if lowercase is None else lowercase


def check_training_numbers(batch_size, epochs, learning_rate):
    """Raises `ValueError` naming a batch size, epoch count or learning rate out of range."""
    for name, value in (("batch_size", batch_size), ("epochs", epochs)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}; expected a positive integer")
    if not (isinstance(learning_rate, (int, float)) and 0 < learning_rate <= 1):
        raise ValueError(f"learning_rate={learning_rate!r}; expected a number in (0, 1]")


def check_callbacks(callbacks):
    """Raises `ValueError` naming `callbacks` if it is not a list or tuple, or an
    item of it that is not a Keras callback, before any data is read or folder written."""
    if not isinstance(callbacks, (list, tuple)):
        raise ValueError(f"callbacks={callbacks!r}; expected a list of keras.callbacks.Callback instances")
    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.Callback):
            raise ValueError(f"callbacks holds {callback!r}; expected keras.callbacks.Callback instances")


def set_seeds(seed, deterministic=False):
    """Seeds Python, NumPy and the backend; with `deterministic`, TensorFlow op determinism."""
    if deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(seed)


def resume_point(out, run, log):
    """`(resume folder, epochs done, training curve so far)` of a run that writes `out`.

    A folder holding an earlier run with other settings is removed (see
    `_resume_folder`); without a checkpoint, the epochs done are 0.
    """
    resume_dir = _resume_folder(out, run, log)
    _, first_epoch, curve = AtomicBackup.restore_point(resume_dir)
    if first_epoch:
        log(f"resuming from the checkpoint of epoch {first_epoch} in {resume_dir}")
    return resume_dir, first_epoch, curve


def fit_epochs(
    model, train_ds, steps_per_epoch, epochs, resume_dir, first_epoch, curve, examples,
    strategy=None, validation_data=None, verbose="auto", callbacks=(),
):
    """`model.fit` from epoch `first_epoch`, checkpointing every epoch in `resume_dir`.

    Keeps the training curve and stops with `TrainingDiverged` at the first
    non-finite loss (removing `resume_dir` if it holds no complete epoch).

    Args:
        model: a compiled `keras.Model`.
        train_ds: the batches of epochs `first_epoch` .. `epochs - 1`.
        steps_per_epoch: int.
        resume_dir, first_epoch, curve: what `resume_point` returned.
        examples: int. Training examples an epoch, for the throughput.
        strategy: the `tf.distribute.Strategy` training runs under, or None.
        validation_data: passed to `fit`.
        verbose: "auto" (1 on a terminal, else 2), 0, 1 or 2.
        callbacks: more Keras callbacks, after kbert's own.

    Returns:
        dict for metrics.json: `train_examples`, `epochs`, `train_seconds`,
        `train_sequences_per_second`, `resumed_from_epoch`, `history` and
        `training_curve`.
    """
    if verbose == "auto":
        verbose = 1 if sys.stdout.isatty() else 2
    step_logger = _StepLossLogger(
        every=max(1, steps_per_epoch // CURVE_POINTS_PER_EPOCH),
        curve=curve or (),
        step=first_epoch * steps_per_epoch,
    )
    backup = AtomicBackup(resume_dir, lambda: step_logger.curve, strategy)
    start = time.perf_counter()
    try:
        history = model.fit(
            train_ds,
            validation_data=validation_data,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            callbacks=[PendingInterrupt(), _StopOnNonFiniteLoss(resume_dir), step_logger, backup, *callbacks],
            shuffle=False,  # the dataset shuffles itself
            verbose=verbose,
        )
    except TrainingDiverged:
        if AtomicBackup.restore_point(resume_dir)[0] is None:
            shutil.rmtree(resume_dir, ignore_errors=True)  # no epoch to keep
        raise
    seconds = time.perf_counter() - start
    return {
        "train_examples": examples,
        "epochs": epochs,
        "train_seconds": round(seconds, 1),
        "train_sequences_per_second": round(examples * (epochs - first_epoch) / seconds, 2),
        "resumed_from_epoch": first_epoch,
        "history": {k: [float(v) for v in values] for k, values in history.history.items()},
        "training_curve": step_logger.curve,
    }


def dev_figures(task, model, examples, encoded):
    """The task's figures of `model` on the dev `examples`, after `task.tune` on them:
    run as `kbert evaluate` runs the saved model (batches of its size, no XLA),
    so that it gives the same figures: under bfloat16, XLA's fused kernels round
    otherwise and can flip a near tie."""
    model.jit_compile, model.predict_function = False, None

    def predict():
        return task.decode(examples, encoded, task.run(model, encoded.features))

    predictions = predict()
    tuned = task.tune(examples, predictions, predict)
    return {**task.evaluate(examples, predictions), **tuned}


def _reinitialise(dense, stddev):
    """Fresh weights for a Dense layer: truncated normal kernel, zero bias (BERT's init)."""
    dense.kernel.assign(keras.initializers.TruncatedNormal(stddev=stddev)(dense.kernel.shape))
    if dense.use_bias:
        dense.bias.assign(keras.ops.zeros(dense.bias.shape))


def file_identity(path):
    """A file's absolute path, size and modification time: enough to tell a changed file."""
    stat = os.stat(path)
    return {"path": os.path.abspath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def resume_folder(out):
    """The folder beside `out` where a run that writes `out` keeps its checkpoints."""
    return os.path.join(
        os.path.dirname(os.path.abspath(out)), RESUME_PREFIX + os.path.basename(os.path.normpath(out))
    )


def _resume_folder(out, run, log):
    """The resume folder of `out` for `run`; an earlier run's with other settings is removed.

    The folder is kbert's own (named after `out`, holding `run.json`, or
    only what kbert writes there), so removing it loses nothing of the
    user's. One that holds no checkpoint (a run stopped before its first
    epoch ended) is removed whatever its settings.
    """
    folder = resume_folder(out)
    fingerprint = hashlib.sha256(json.dumps(run, sort_keys=True).encode()).hexdigest()
    path = os.path.join(folder, RUN_FILE)
    if os.path.isdir(folder):
        try:
            with open(path) as f:
                earlier = json.load(f).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            earlier = None
        if earlier == fingerprint:
            return folder
        if earlier is None and not _holds_only_kbert_files(folder):
            raise ValueError(f"{folder} is in the way and kbert did not write it; move it aside")
        if _holds_checkpoint(folder):
            log(f"starting afresh: {folder} holds the checkpoints of a run with other settings")
        else:
            log(f"starting afresh: {folder} holds no checkpoint (a run stopped before its first epoch ended)")
        shutil.rmtree(folder)
    os.makedirs(folder)
    write_file(path, lambda f: json.dump({"fingerprint": fingerprint, "run": run}, f, indent=2), mode="w")
    return folder


def _holds_only_kbert_files(folder):
    """Whether every entry of a resume folder is one kbert writes there: `run.json`
    (or its temporary file, `kbert.fileio.write_file`), the adaptation's run,
    the checkpoints (`AtomicBackup.is_own_entry`)."""
    return all(
        name in (RUN_FILE, ADAPT_FOLDER) or name.startswith(".kbert-") or AtomicBackup.is_own_entry(name)
        for name in os.listdir(folder)
    )


def _holds_checkpoint(folder):
    """Whether a resume folder holds what a run resumes from: an epoch's checkpoint,
    or the adaptation's (its last checkpoint, or the adapted encoder)."""
    adaptation = os.path.join(folder, ADAPT_FOLDER)
    return (
        AtomicBackup.restore_point(folder)[0] is not None
        or AtomicBackup.restore_point(os.path.join(adaptation, BACKUP_FOLDER))[0] is not None
        or os.path.isfile(os.path.join(adaptation, HISTORY_FILE))
    )
