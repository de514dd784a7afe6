"""`pretrain`: masked-LM + next-sentence pretraining with `model.fit`, logged and saved."""

import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import keras

from kbert.checkpoints import load_hf_checkpoint, resolve_checkpoint, save_hf_checkpoint
from kbert.checkpoints.google import load_google_checkpoint
from kbert.config import PRESETS, BertConfig
from kbert.pretraining.pretrainer import bert_pretrainer
from kbert.pretraining.records import make_pretraining_dataset, read_metadata
from kbert.training.optimizers import make_optimizer

# google-research/bert's run_pretraining.py flags: 10,000 warmup steps of
# 1,000,000; with short runs a tenth of the steps warms up more safely.
DEFAULT_WARMUP_FRACTION = 0.1
# LAMB's peak rate for batches of 64..256 (You et al., 2020, scale it up with
# the batch; google's AdamW used 1e-4 at batch 256).
DEFAULT_LAMB_LEARNING_RATE = 1e-3
ENCODER_FOLDER = "encoder"
WEIGHTS_FILE = "pretrainer.weights.h5"
HISTORY_FILE = "history.json"


class _WindowLogger(keras.callbacks.Callback):
    """Adds the learning rate, the step and the training throughput to each window's logs."""

    def __init__(self, batch_size, seq_len):
        super().__init__()
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.windows = []
        self.step = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        self._end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
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


def _build_model(init, vocabulary, dtype):
    """(config, pretrainer, lowercase or None) from a preset, a config or a checkpoint."""
    if isinstance(init, BertConfig) or init in PRESETS:
        config = init if isinstance(init, BertConfig) else PRESETS[init]
        config = config.replace(vocab_size=len(vocabulary))
        return config, bert_pretrainer(config, dtype=dtype), None
    folder = resolve_checkpoint(init)
    if os.path.isfile(os.path.join(folder, "bert_config.json")):
        checkpoint = load_google_checkpoint(folder, dtype=dtype)
        pretrainer = checkpoint.pretrainer
    else:
        checkpoint = load_hf_checkpoint(folder, dtype=dtype)
        pretrainer = bert_pretrainer(checkpoint.encoder, dtype=dtype)
    if checkpoint.vocabulary != list(vocabulary):
        raise ValueError(
            f"the vocabulary of {init!r} differs from the one of the training data; "
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
    verbose="auto",
):
    """Pretrains BERT with masked LM and next-sentence prediction; writes `out`.

    Args:
        train_data: records (glob, folder or list, from `write_pretraining_data`
            or google's script) or a `tf.data.Dataset` of `(features, labels,
            sample_weights)` such as `make_dynamic_masking_dataset`'s; repeated.
        out: str. New folder: `encoder/` (a Hugging Face BERT folder, for
            `load_hf_checkpoint` and fine-tuning), `pretrainer.weights.h5`
            (encoder + heads) and `history.json` (one entry per window of
            `log_every` steps: losses, accuracies, learning rate, throughput).
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
        dtype: dtype policy, e.g. "mixed_bfloat16".
        seed: int. Seeds Keras, the initialisation and the record shuffle.

    Returns:
        The dict written to `history.json`.

    Example:
    >>> pretrain("records", "runs/mini", "records/vocab.txt")  # doctest: +SKIP
    """
    from kbert.text import load_vocab

    for name, value in (
        ("batch_size", batch_size),
        ("num_train_steps", num_train_steps),
        ("log_every", log_every),
        ("eval_steps", eval_steps),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if num_warmup_steps is None:
        num_warmup_steps = int(DEFAULT_WARMUP_FRACTION * num_train_steps)
    if os.path.exists(out) and os.listdir(out):
        raise ValueError(f"{out} exists and is not empty; choose a new folder")
    if isinstance(vocabulary, (str, os.PathLike)):
        vocabulary = load_vocab(vocabulary)

    keras.utils.set_random_seed(seed)
    config, model, checkpoint_lowercase = _build_model(init, vocabulary, dtype)
    if checkpoint_lowercase is not None:
        lowercase = checkpoint_lowercase
    train = _as_dataset(train_data, batch_size, seed, repeat=True)
    evaluation = None if eval_data is None else _as_dataset(eval_data, batch_size, seed, True)
    features = train.element_spec[0]
    seq_len = features["token_ids"].shape[1]
    model.compile(
        optimizer=make_optimizer(
            optimizer,
            learning_rate,
            num_train_steps,
            warmup_steps=num_warmup_steps,
            weight_decay=weight_decay,
        ),
        jit_compile=jit_compile,
    )
    if verbose == "auto":
        verbose = 1 if sys.stdout.isatty() else 2
    logger = _WindowLogger(features["token_ids"].shape[0] or batch_size, seq_len)
    # Windows of log_every steps, then one shorter window for the remainder.
    windows = [(num_train_steps // log_every, log_every), (1, num_train_steps % log_every)]
    start = time.perf_counter()
    for epochs, steps in windows:
        if epochs and steps:
            model.fit(
                train,
                epochs=epochs,
                steps_per_epoch=steps,
                validation_data=evaluation,
                validation_steps=eval_steps if evaluation is not None else None,
                callbacks=[logger],
                shuffle=False,  # the dataset shuffles itself
                verbose=verbose,
            )
    train_seconds = time.perf_counter() - start

    # The first window includes XLA compilation; leave it out when there are others.
    timed = logger.windows[1:] or logger.windows
    sequences_per_second = statistics.median(w["sequences_per_second"] for w in timed)
    history = {
        "settings": {
            "init": init if isinstance(init, str) else "BertConfig",
            "bert_config": config.to_dict(),
            "optimizer": optimizer,
            "learning_rate": learning_rate,
            "num_train_steps": num_train_steps,
            "num_warmup_steps": num_warmup_steps,
            "weight_decay": weight_decay,
            "batch_size": logger.batch_size,
            "seq_len": seq_len,
            "jit_compile": jit_compile,
            "dtype": dtype,
            "seed": seed,
            "backend": keras.backend.backend(),
        },
        "windows": logger.windows,
        "final": logger.windows[-1],
        "throughput": {
            "sequences_per_second": sequences_per_second,
            "tokens_per_second": round(sequences_per_second * seq_len, 1),
            "train_seconds": round(train_seconds, 1),
        },
    }
    if isinstance(train_data, (str, os.PathLike)) and os.path.isdir(train_data):
        try:
            history["data"] = read_metadata(train_data)
        except ValueError:
            pass

    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".kbert-", dir=parent)
    try:
        save_hf_checkpoint(
            model.encoder,
            config,
            vocabulary,
            os.path.join(staging, ENCODER_FOLDER),
            lowercase=lowercase,
        )
        model.save_weights(os.path.join(staging, WEIGHTS_FILE))
        with open(os.path.join(staging, HISTORY_FILE), "w") as f:
            json.dump(history, f, indent=2, default=str)
        if os.path.exists(out):
            os.rmdir(out)
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return history

