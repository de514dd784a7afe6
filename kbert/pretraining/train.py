"""`pretrain`: masked-LM + next-sentence pretraining with `model.fit`, logged and saved."""

import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import keras
import numpy as np
from absl import logging

from kbert.checkpoints import load_hf_checkpoint, resolve_checkpoint, save_hf_checkpoint
from kbert.checkpoints.huggingface import has_masked_lm, warn_fresh
from kbert.checkpoints.google import load_google_checkpoint
from kbert.config import PRESETS, BertConfig
from kbert.fileio import follow_umask
from kbert.hardware import log_dtype
from kbert.models.pretrainer import NEXT_SENTENCE, bert_pretrainer
from kbert.pretraining.batch_size import check_batch_size, model_shape
from kbert.pretraining.records import make_pretraining_dataset, read_metadata
from kbert.pretraining.run_folder import (
    BACKUP_FOLDER,
    ENCODER_FOLDER,
    HISTORY_FILE,
    LOGS_FOLDER,
    WEIGHTS_FILE,
    check_run_folder,
)
from kbert.fitting.backup import AtomicBackup, PendingInterrupt
from kbert.fitting.distribute import (
    chief_folder,
    compile_for_strategy,
    get_strategy,
    is_chief,
    is_xla_compiled,
    log_batch_sizes,
    wait_for_workers,
)
from kbert.fitting.optimizers import make_optimizer

# google-research/bert's run_pretraining.py flags: 10,000 warmup steps of
# 1,000,000; with short runs a tenth of the steps warms up more safely.
DEFAULT_WARMUP_FRACTION = 0.1
# LAMB's peak rate for batches of 64..256 (You et al., 2020, scale it up with
# the batch; google's AdamW used 1e-4 at batch 256).
DEFAULT_LAMB_LEARNING_RATE = 1e-3


class _ScalarLogs(keras.callbacks.Callback):
    """TensorBoard scalars for each window, for when the `tensorboard` package is absent.

    `keras.callbacks.TensorBoard` needs that package for `tf.summary.scalar`;
    this writes the same `epoch_*` scalars into `train/` and `validation/`
    with TensorFlow's own `tf.summary.write`, which TensorBoard reads alike.
    """

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = log_dir
        self._writers = {}

    def on_epoch_end(self, epoch, logs=None):
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        logs = dict(logs or {})
        logs["learning_rate"] = self.model.optimizer.learning_rate
        for name, value in logs.items():
            split = "validation" if name.startswith("val_") else "train"
            if split not in self._writers:
                self._writers[split] = tf.summary.create_file_writer(
                    os.path.join(self.log_dir, split)
                )
            with self._writers[split].as_default():
                tag = "epoch_" + name.removeprefix("val_")
                tf.summary.write(tag, tf.cast(value, tf.float32), step=epoch, metadata=metadata)
        for writer in self._writers.values():
            writer.flush()

    def on_train_end(self, logs=None):
        # Closed here, as Keras's TensorBoard closes its writers: a writer
        # left open flushes when it is collected, and recreates its folder if
        # that was a worker's scratch folder, deleted by then.
        for writer in self._writers.values():
            writer.close()
        self._writers = {}


def _tensorboard(log_dir):
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        return keras.callbacks.TensorBoard(log_dir)
    return _ScalarLogs(log_dir)


class _WindowProgbar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar, each window headed by the steps it covers
    (`steps 101-200 of 1200`) in place of Keras's `Epoch 2/12`: a window of
    `log_every` steps is not a pass over the data. `fit` takes it for its own
    progress bar (it adds one only when none is given)."""

    def __init__(self, log_every, num_train_steps):
        super().__init__()
        self.log_every = log_every
        self.num_train_steps = num_train_steps

    def on_epoch_begin(self, epoch, logs=None):
        if self.verbose:
            first = epoch * self.log_every + 1
            last = min(first + self.log_every - 1, self.num_train_steps)
            heading = f"steps {first}-{last} of {self.num_train_steps}"
            if keras.config.is_interactive_logging_enabled():
                print(heading, flush=True)
            else:  # where Keras sends its own progress lines then
                logging.info(heading)
        self.epochs = 1  # Keras heads a window with `Epoch k/n` only when there are several
        super().on_epoch_begin(epoch, logs)


class _WindowLogger(keras.callbacks.Callback):
    """Adds the learning rate, the step and the training throughput to each window's logs.

    Without next-sentence data its loss and accuracy (0 throughout: the data
    weighs them by 0) are taken out of the logs before Keras prints them (its
    progress bar comes after every callback given to `fit`) and out of the
    windows; the training itself is unchanged.
    """

    def __init__(self, batch_size, seq_len, next_sentence=True):
        super().__init__()
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.next_sentence = next_sentence
        self.windows = []
        self.step = 0

    def _drop_next_sentence(self, logs):
        if not self.next_sentence:
            for key in [key for key in logs if NEXT_SENTENCE in key]:
                del logs[key]

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        self._end = time.perf_counter()
        self._drop_next_sentence(logs or {})

    def on_epoch_end(self, epoch, logs=None):
        self._drop_next_sentence(logs or {})
        seconds = self._end - self._start
        self.step += self._steps
        window = {name: float(value) for name, value in (logs or {}).items()}
        window.update(
            step=self.step,
            learning_rate=float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)),
            seconds=round(seconds, 3),
            sequences_per_second=round(self._steps * self.batch_size / seconds, 2),
        )
        self.windows.append(window)


def _build_model(init, vocabulary, dtype, name):
    """(config, pretrainer, lowercase or None) from a preset, a config or a checkpoint
    (`name` in messages)."""
    if isinstance(init, BertConfig) or init in PRESETS:
        config = init if isinstance(init, BertConfig) else PRESETS[init]
        config = config.replace(vocab_size=len(vocabulary))
        return config, bert_pretrainer(config, dtype=dtype), None
    folder = resolve_checkpoint(init)
    if os.path.isfile(os.path.join(folder, "bert_config.json")):
        checkpoint = load_google_checkpoint(folder, dtype=dtype)
        pretrainer = checkpoint.pretrainer
    else:
        # A BertForPreTraining or BertForMaskedLM keeps training its heads; a BertModel gets new ones.
        heads = has_masked_lm(folder)
        checkpoint = load_hf_checkpoint(folder, dtype=dtype, heads=heads)
        built = () if heads else ("cls.predictions", "cls.seq_relationship")
        warn_fresh(checkpoint, name, "pretraining", built=built)
        pretrainer = checkpoint.pretrainer or bert_pretrainer(checkpoint.encoder, dtype=dtype)
    if checkpoint.vocabulary != list(vocabulary):
        raise ValueError(
            f"the vocabulary of {name} differs from the one of the training data; "
            "continued pretraining needs records made with the checkpoint's vocab.txt"
        )
    return checkpoint.config, pretrainer, checkpoint.lowercase


def _as_dataset(data, batch_size, seed, repeat):
    if isinstance(data, (str, os.PathLike, list, tuple)):
        return make_pretraining_dataset(data, batch_size, seed=seed, repeat=repeat)
    return data


def pretrain(
    train_data,
    out,
    vocabulary,
    init="bert_mini",
    eval_data=None,
    batch_size=64,
    num_train_steps=10_000,
    num_warmup_steps=None,
    learning_rate=DEFAULT_LAMB_LEARNING_RATE,
    optimizer="lamb",
    weight_decay=0.01,
    log_every=100,
    eval_steps=20,
    lowercase=True,
    jit_compile=True,
    dtype=None,
    seed=0,
    checkpoint_every=None,
    deterministic=False,
    strategy="auto",
    verbose="auto",
    init_name=None,
    next_sentence=True,
    callbacks=(),
):
    """Pretrains BERT with masked LM and next-sentence prediction; writes `out`.

    Args:
        train_data: records (glob, folder or list, from `write_pretraining_data`
            or google's script) or a `tf.data.Dataset` of `(features, labels,
            sample_weights)` such as `make_dynamic_masking_dataset`'s; repeated.
        out: str. New folder: `encoder/` (a Hugging Face `BertForPreTraining`
            folder, heads included, for fine-tuning, `--task fill-mask` and
            transformers), `pretrainer.weights.h5`
            (encoder + heads) and `history.json` (one entry per window of
            `log_every` steps: losses, accuracies, learning rate, throughput);
            `logs/` holds TensorBoard event files, one point per window.
            With `checkpoint_every`, a folder holding `backup/` from an
            interrupted run resumes it.
        vocabulary: list of str or path of the `vocab.txt` the data was made with.
        init: a preset name or `BertConfig` (fresh model, `vocab_size` set to
            the vocabulary's), or a checkpoint folder or packaged name, Hugging
            Face or google-research/bert, to continue pretraining it.
        eval_data: records or dataset held out for evaluation after each window.
        batch_size: int. Sequences per step (records only).
        num_train_steps: int. Optimizer steps.
        num_warmup_steps: int or None (a tenth of the steps).
        learning_rate: float. Peak learning rate.
        optimizer: "lamb" or "adamw".
        weight_decay: float. Not applied to LayerNorm and biases.
        log_every: int. Steps per logged window (a Keras epoch).
        eval_steps: int. Batches of `eval_data` per evaluation.
        lowercase: bool. Recorded in `encoder/` for the tokenizer.
        jit_compile: bool. Compile the train step with XLA.
        dtype: dtype policy, e.g. "mixed_bfloat16", or "auto" (as for
            `kbert.training.finetune.finetune`).
        seed: int. Seeds Keras, the initialisation and the record shuffle.
        checkpoint_every: int or None. Save the training state (weights,
            optimizer state, step) to `out/backup/` every this many steps,
            atomically; the windows are then this long instead of
            `log_every`. Running the same call again after a crash resumes
            from the last checkpoint: the same step, optimizer state and data
            position (the batches already consumed are skipped), so with
            `deterministic` it ends with the same weights as an
            uninterrupted run. Needs records or a deterministic dataset.
        deterministic: bool. `tf.config.experimental.enable_op_determinism()`
            (process-wide): bitwise reproducible runs, somewhat slower.
        strategy: str or `tf.distribute.Strategy`. A name from
            `kbert.fitting.distribute.STRATEGIES` or a strategy made with
            `get_strategy` (make it before any `tf.data` pipeline for
            "multiworker"); the model is built and compiled in its scope, with
            XLA per replica, and `batch_size` is global. With several workers
            every worker runs this same call on the same `out` (shared
            storage): only the chief writes it, and the call returns on every
            worker once it has; a killed cluster restarted with the same calls
            resumes from `backup/`.

        init_name: str or None. How `history.json` and messages name `init`
            (default: `init`, or "BertConfig").
        next_sentence: bool. False for data without sentence pairs, whose
            next-sentence weights are all 0 (`make_dynamic_masking_dataset`'s):
            the next-sentence loss and accuracy, 0 throughout, are left out of
            the progress lines, `history.json` and TensorBoard.
        callbacks: more Keras callbacks for `fit`, after kbert's own (a
            `kbert.training.progress.TrainingProgress`: adaptation's lines).

    Returns:
        The dict written to `history.json`; its "weights_sha256" lets the
        workers of a cluster check that they ended with the same weights.

    Example:
    >>> pretrain("records", "runs/mini", "records/vocab.txt")  # doctest: +SKIP
    """
    from kbert.text import load_vocab

    _check_counts(batch_size=batch_size, num_train_steps=num_train_steps, log_every=log_every,
                  eval_steps=eval_steps, checkpoint_every=1 if checkpoint_every is None else checkpoint_every)
    if num_warmup_steps is None:
        num_warmup_steps = int(DEFAULT_WARMUP_FRACTION * num_train_steps)
    # What a killed run leaves: rerunning resumes it (or restarts it, killed
    # before its first checkpoint).
    check_run_folder(out, resumable=checkpoint_every is not None, name=f"out={out!r}", init_option="init")
    if init_name is None:
        init_name = init if isinstance(init, str) else "BertConfig"
    backup_dir = os.path.join(out, BACKUP_FOLDER)
    if isinstance(vocabulary, (str, os.PathLike)):
        vocabulary = load_vocab(vocabulary)
    if checkpoint_every is not None:
        log_every = checkpoint_every

    if deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    strategy = get_strategy(strategy)
    dtype = log_dtype(dtype)
    keras.utils.set_random_seed(seed)
    train = _distributable(_as_dataset(train_data, batch_size, seed, repeat=True), strategy)
    evaluation = None
    if eval_data is not None:
        evaluation = _distributable(_as_dataset(eval_data, batch_size, seed, True), strategy)
    features = train.element_spec[0]
    seq_len = features["token_ids"].shape[1]
    global_batch_size = features["token_ids"].shape[0] or batch_size
    records = train_data if isinstance(train_data, (str, os.PathLike)) else None
    check_batch_size(global_batch_size, records, model_shape(init, len(vocabulary)), seq_len,
                     features["masked_lm_positions"].shape[1],
                     (f"batch_size={global_batch_size}", f"train_data={os.fspath(records or '')!r}"))
    log_batch_sizes(strategy, global_batch_size)
    with strategy.scope():
        config, model, checkpoint_lowercase = _build_model(init, vocabulary, dtype, init_name)
        optimizer_instance = make_optimizer(
            optimizer,
            learning_rate,
            num_train_steps,
            warmup_steps=num_warmup_steps,
            weight_decay=weight_decay,
            dtype=dtype,
        )
        compile_for_strategy(model, strategy, jit_compile=jit_compile, optimizer=optimizer_instance)
        if checkpoint_every is not None and not model.built:
            # BackupAndRestore restores into built models only.
            model(next(iter(train.take(1)))[0])
    if checkpoint_lowercase is not None:
        lowercase = checkpoint_lowercase
    if verbose == "auto":
        verbose = 1 if sys.stdout.isatty() else 2
    logger = _WindowLogger(global_batch_size, seq_len, next_sentence)
    # Workers other than the chief write everything (logs, checkpoints, the
    # final model) to a scratch folder deleted at the end.
    with chief_folder(out, strategy) as out_folder:
        callbacks = [logger, _tensorboard(os.path.join(out_folder, LOGS_FOLDER)), PendingInterrupt(),
                     _WindowProgbar(log_every, num_train_steps), *callbacks]
        done_windows, backup = 0, None
        if checkpoint_every is not None:
            backup = AtomicBackup(backup_dir, lambda: logger.windows, strategy)
            done_windows, logger.windows = backup.restored_epoch, backup.restored_state or []
            logger.step = done_windows * log_every
        start = time.perf_counter()
        _fit_windows(model, train, evaluation, eval_steps, num_train_steps, log_every, done_windows, callbacks,
                     backup, verbose)
        train_seconds = time.perf_counter() - start
        settings = {
            "init": init_name,
            "bert_config": config.to_dict(),
            "optimizer": optimizer,
            "learning_rate": learning_rate,
            "num_train_steps": num_train_steps,
            "num_warmup_steps": num_warmup_steps,
            "weight_decay": weight_decay,
            "batch_size": logger.batch_size,
            "seq_len": seq_len,
            "jit_compile": jit_compile,
            "xla_compiled": is_xla_compiled(model),
            "dtype": dtype,
            "loss_scaling": isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer),
            "seed": seed,
            "next_sentence": next_sentence,
            "checkpoint_every": checkpoint_every,
            "deterministic": deterministic,
            "strategy": type(strategy).__name__,
            "num_replicas": strategy.num_replicas_in_sync,
            "backend": keras.backend.backend(),
        }
        history = _history(settings, logger.windows, model, seq_len, train_seconds)
        if isinstance(train_data, (str, os.PathLike)) and os.path.isdir(train_data):
            try:
                history["data"] = read_metadata(train_data)
            except ValueError:
                pass
        _write_outputs(out_folder, model, config, vocabulary, lowercase, history)
    if is_chief(strategy):
        shutil.rmtree(backup_dir, ignore_errors=True)
    wait_for_workers(strategy)  # `out` is whole for every worker to read
    return history


def _check_counts(**counts):
    """`ValueError` naming the first of `counts` (name -> value) that is not a positive integer."""
    for name, value in counts.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")


def _fit_windows(model, train, evaluation, eval_steps, num_train_steps, log_every, done_windows, callbacks, backup,
                 verbose):
    """Trains `num_train_steps` steps in windows of `log_every` (Keras epochs), from
    window `done_windows` on, then one shorter window for the remainder. `backup`
    (an `AtomicBackup` or None) saves each full window; a run killed in the
    remainder resumes from the last of them. Each `fit` starts its data where the
    steps before left it, so an interrupted run skips exactly the batches it consumed."""
    full_windows, remainder = divmod(num_train_steps, log_every)
    common = {
        "validation_data": evaluation,
        "validation_steps": eval_steps if evaluation is not None else None,
        "shuffle": False,  # the dataset shuffles itself
        "verbose": verbose,
    }
    if full_windows:
        model.fit(train.skip(done_windows * log_every), epochs=full_windows, steps_per_epoch=log_every,
                  callbacks=callbacks + ([backup] if backup else []), **common)
    if remainder:
        model.fit(train.skip(full_windows * log_every), initial_epoch=full_windows, epochs=full_windows + 1,
                  steps_per_epoch=remainder, callbacks=callbacks, **common)


def _history(settings, windows, model, seq_len, train_seconds):
    """What `history.json` holds: the run's `settings`, each window's figures, the
    final weights' digest and the throughput, the first window (XLA compilation)
    left out when there are others."""
    timed = windows[1:] or windows
    sequences_per_second = statistics.median(w["sequences_per_second"] for w in timed)
    return {
        "settings": settings,
        "windows": windows,
        "final": windows[-1],
        "weights_sha256": _weights_digest(model),
        "throughput": {
            "sequences_per_second": sequences_per_second,
            "tokens_per_second": round(sequences_per_second * seq_len, 1),
            "train_seconds": round(train_seconds, 1),
        },
    }


def _weights_digest(model):
    """SHA-256 of every model weight's bytes: equal on workers that agree bit for bit."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def _distributable(dataset, strategy):
    """`dataset` sharded by batch across workers, so that resuming skips exactly.

    TensorFlow's default (AUTO) gives each worker whole record files when
    there are enough of them; each worker's batches are then halves of
    *its own* global batches, and `skip(n)` on a resume would skip a
    different number of examples per worker than were trained on. With DATA
    sharding every worker reads the same global batches and keeps its part.
    """
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return dataset
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def _write_outputs(out, model, config, vocabulary, lowercase, history):
    """Writes `encoder/`, the pretrainer weights and `history.json` into `out`, atomically."""
    os.makedirs(out, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".kbert-", dir=out)
    try:
        save_hf_checkpoint(
            model.encoder,
            config,
            vocabulary,
            os.path.join(staging, ENCODER_FOLDER),
            lowercase=lowercase,
            pretrainer=model,
        )
        model.save_weights(os.path.join(staging, WEIGHTS_FILE))
        with open(os.path.join(staging, HISTORY_FILE), "w") as f:
            json.dump(history, f, indent=2, default=str)
        follow_umask(staging)
        # history.json last: its presence marks a complete run.
        for name in (ENCODER_FOLDER, WEIGHTS_FILE, HISTORY_FILE):
            target = os.path.join(out, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.replace(os.path.join(staging, name), target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

