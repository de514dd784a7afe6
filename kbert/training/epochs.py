"""Fitting epochs as `finetune` and `distill` do, and the dev figures after.

`fit_epochs` is `model.fit` with kbert's callbacks: a diverged run stops
with `TrainingDiverged` (never saved as a result), the training curve is
kept for metrics.json, every epoch is checkpointed in the run's resume
folder (`kbert.training.resume`), and the run says how far it is
(`kbert.training.progress`). `dev_figures` computes the task's figures as
`kbert evaluate` computes them on the saved model.
"""

import math
import shutil
import sys
import time

import keras

from kbert.fitting.backup import AtomicBackup, PendingInterrupt
from kbert.logs import Waiting, to_stderr
from kbert.training.progress import TrainingProgress, fit_steps_line

# Training-curve points kept per epoch in metrics.json.
CURVE_POINTS_PER_EPOCH = 20


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


def fit_epochs(
    model, train_ds, steps_per_epoch, epochs, resume_dir, first_epoch, curve, examples,
    strategy=None, validation_data=None, verbose="auto", callbacks=(), batch_size=None, log=None,
):
    """`model.fit` from epoch `first_epoch`, checkpointing every epoch in `resume_dir`.

    Keeps the training curve, stops with `TrainingDiverged` at the first
    non-finite loss (removing `resume_dir` if it holds no complete epoch) and
    says how far it is (`kbert.training.progress`).

    Args:
        model: a compiled `keras.Model`.
        train_ds: the batches of epochs `first_epoch` .. `epochs - 1`.
        steps_per_epoch: int.
        resume_dir, first_epoch, curve: what `resume_point` returned.
        examples: int. Training examples an epoch, for the throughput.
        strategy: the `tf.distribute.Strategy` training runs under, or None.
        validation_data: passed to `fit`.
        verbose: "auto" (1 on a terminal, else 2), 0, 1 or 2: Keras's bar,
            or its line an epoch and kbert's every `LINE_SECONDS`; 0: neither.
        callbacks: more Keras callbacks, after kbert's own.
        batch_size: int or None. The global batch, for the line that says the steps.
        log: callable taking a str, or None (standard error).

    Returns:
        dict for metrics.json: `train_examples`, `epochs`, `train_seconds`,
        `train_sequences_per_second`, `resumed_from_epoch`, `history` and
        `training_curve`.
    """
    log = log or to_stderr
    if verbose == "auto":
        verbose = 1 if sys.stdout.isatty() else 2
    step_logger = _StepLossLogger(
        every=max(1, steps_per_epoch // CURVE_POINTS_PER_EPOCH),
        curve=curve or (),
        step=first_epoch * steps_per_epoch,
    )
    backup = AtomicBackup(resume_dir, lambda: step_logger.curve, strategy)
    progress = TrainingProgress(
        "training", steps_per_epoch * epochs, first_epoch * steps_per_epoch, steps_per_epoch,
        validation_steps=_batches(validation_data) if verbose else None, lines=verbose == 2, log=log,
    )
    log(fit_steps_line("training", epochs, steps_per_epoch, first_epoch, batch_size))
    start = time.perf_counter()
    try:
        history = model.fit(
            train_ds,
            validation_data=validation_data,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            callbacks=[PendingInterrupt(), _StopOnNonFiniteLoss(resume_dir), step_logger, backup, progress,
                       *callbacks],
            shuffle=False,  # the dataset shuffles itself
            verbose=verbose,
        )
    except TrainingDiverged:
        if AtomicBackup.restore_point(resume_dir)[0] is None:
            shutil.rmtree(resume_dir, ignore_errors=True)  # no epoch to keep
        raise
    finally:
        progress.stop()
    return _fit_figures(history, step_logger.curve, examples, epochs, first_epoch, time.perf_counter() - start)


def _batches(dataset):
    """The batches of a `tf.data` dataset of known size, else None."""
    if dataset is None:
        return None
    count = int(dataset.cardinality())
    return count if count > 0 else None


def _fit_figures(history, curve, examples, epochs, first_epoch, seconds):
    """What `fit_epochs` returns for metrics.json."""
    return {
        "train_examples": examples,
        "epochs": epochs,
        "train_seconds": round(seconds, 1),
        "train_sequences_per_second": round(examples * (epochs - first_epoch) / seconds, 2),
        "resumed_from_epoch": first_epoch,
        "history": {k: [float(v) for v in values] for k, values in history.history.items()},
        "training_curve": curve,
    }


def dev_figures(task, model, examples, encoded, log=None):
    """The task's figures of `model` on the dev `examples`, after `task.tune` on them:
    run as `kbert evaluate` runs the saved model (batches of its size, no XLA),
    so that it gives the same figures: under bfloat16, XLA's fused kernels round
    otherwise and can flip a near tie. `log`: where a pass over the rows that
    takes a while says so (`kbert.logs.Waiting`; None: standard error)."""
    model.jit_compile, model.predict_function = False, None

    def predict():
        with Waiting(f"dev: the model on {len(encoded):,} rows", log):
            outputs = task.run(model, encoded.features)
        return task.decode(examples, encoded, outputs)

    predictions = predict()
    tuned = task.tune(examples, predictions, predict)
    return {**task.evaluate(examples, predictions), **tuned}
