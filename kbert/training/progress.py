"""What a training run says while it runs, beside Keras's own progress bar.

On a terminal `fit` draws Keras's bar, with the epoch's rate and time left;
where its lines go to a file (`verbose=2`) it prints one line an epoch, and an
epoch of minutes is a long silence there. `TrainingProgress` adds, through
the run's `log`:

- once the first steps are timed (`ESTIMATE_STEPS` of them, or
  `ESTIMATE_SECONDS`), about how long the other steps will take; the first
  step, which traces the model, is left out of the rate;
- after the first epoch, whose dev pass is then timed, the time left again
  with the dev passes counted;
- with `lines` (where Keras prints one line an epoch), a line every
  `kbert.logs.LINE_SECONDS`: the step, the rate, the time left, the loss;
- during each dev pass, which Keras shows no progress of inside `fit`, a
  bar on a terminal or those lines (`kbert.logs.Progress`).

`fit_steps_line` is the line a run says before its first step.
"""

import time

import keras

from kbert.logs import Progress, duration, to_stderr

# The estimate of the time left comes after this many steps, or this many
# seconds if the steps are slow: enough steps for a steady rate, soon enough
# to decide whether to wait.
ESTIMATE_STEPS = 20
ESTIMATE_SECONDS = 30


def fit_steps_line(name, epochs, steps_per_epoch, first_epoch=0, batch_size=None):
    """What a run of `epochs` epochs of `steps_per_epoch` steps says before its first
    step: `training: 3 epochs x 221 steps = 663 steps of 32 examples`."""
    left = epochs - first_epoch
    batch = f" of {batch_size} examples" if batch_size else ""
    resumed = f", resuming after epoch {first_epoch} of {epochs}" if first_epoch else ""
    return f"{name}: {_count(left, 'epoch')} x {steps_per_epoch:,} steps = {left * steps_per_epoch:,} steps{batch}{resumed}"


def _count(n, noun):
    return f"{n:,} {noun}{'s' if n != 1 else ''}"


def _each(seconds):
    """A step's time, as "0.38 s" or "12 ms"."""
    return f"{seconds:.2f} s" if seconds >= 1 else f"{1000 * seconds:.0f} ms"


class TrainingProgress(keras.callbacks.Callback):
    """Reports a `fit` (or several, as pretraining's windows) as the module says.

    Args:
        name: str. What trains ("training", "adaptation"), each line's start.
        total_steps: int. The steps of the whole run, those done included.
        done_steps: int. Steps done before this run (a resumed one).
        steps_per_epoch: int or None. With it, lines name the epoch and the
            time left counts the dev passes once one is timed.
        validation_steps: int or None. Batches of a dev pass, for its progress.
        lines: bool. A line every `LINE_SECONDS` while training (where Keras
            prints one line an epoch).
        log: callable taking a str, or None (standard error).
    """

    def __init__(self, name, total_steps, done_steps=0, steps_per_epoch=None, validation_steps=None,
                 lines=False, log=None):
        super().__init__()
        self.name, self.total, self.done = name, total_steps, done_steps
        self.steps_per_epoch, self.validation_steps = steps_per_epoch, validation_steps
        self.lines, self.log = lines, log or to_stderr
        self.step = done_steps
        self._begin = self._first_step_end = None
        self._dev_begin, self._dev_seconds, self._dev_passes = None, 0.0, 0
        self._estimated = self._dev_estimated = False
        self._progress = self._dev = None

    def on_train_begin(self, logs=None):
        if self._begin is None:  # pretraining fits its windows in more than one call
            self._begin = time.monotonic()
            if self.lines and not self.steps_per_epoch:
                self._progress = Progress(self.name, self.total, "steps", self.log, initial=self.done)

    def on_train_end(self, logs=None):
        if self._progress is not None and self.step >= self.total:
            self._close_progress()

    def on_epoch_begin(self, epoch, logs=None):
        timed = self.step - self.done >= 2  # a step besides the first, which traces
        if self._dev_passes and timed and not self._dev_estimated and self.step < self.total:
            self._dev_estimated = self._estimated = True
            self.log(self._estimate())
        if self.lines and self.steps_per_epoch:
            epochs = -(-self.total // self.steps_per_epoch)
            self._progress = Progress(f"{self.name}: epoch {epoch + 1}/{epochs}", self.steps_per_epoch, "steps",
                                      self.log)

    def on_epoch_end(self, epoch, logs=None):
        if self.steps_per_epoch and self._progress is not None:
            self._close_progress()

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        now = time.monotonic()
        if self._first_step_end is None:
            self._first_step_end = now
        elif not self._estimated and self.step < self.total and (
            self.step - self.done >= ESTIMATE_STEPS or now - self._begin >= ESTIMATE_SECONDS
        ):
            self._estimated = True
            self.log(self._estimate())
        if self._progress is not None:
            loss = (logs or {}).get("loss")
            self._progress.update(postfix="" if loss is None else f"loss {float(loss):.4f}")

    def _estimate(self):
        """The time the other steps will take at the rate since the first step (dev
        passes left out), and once one is timed, their dev passes."""
        steps = self.step - self.done - 1
        per_step = (time.monotonic() - self._first_step_end - self._dev_seconds) / steps
        left = self.total - self.step
        seconds, dev = per_step * left, ", the dev passes aside" if self.validation_steps else ""
        passes = ""
        if self._dev_passes and self.steps_per_epoch:
            epochs_left = -(-left // self.steps_per_epoch)
            each = self._dev_seconds / self._dev_passes
            seconds, dev = seconds + each * epochs_left, ""
            passes = f" and {epochs_left:,} dev pass{'es' if epochs_left != 1 else ''} ({_each(each)} each)"
        return (f"{self.name}: about {duration(seconds)} for the other {_count(left, 'step')} "
                f"({_each(per_step)} a step{dev}){passes}")

    def on_test_begin(self, logs=None):
        self._dev_begin = time.monotonic()
        if self.validation_steps:
            self._dev = Progress(f"{self.name}: dev pass", self.validation_steps, "batches", self.log)

    def on_test_batch_end(self, batch, logs=None):
        if self._dev is not None:
            self._dev.update()

    def on_test_end(self, logs=None):
        self._dev_seconds += time.monotonic() - self._dev_begin
        self._dev_passes += 1
        if self._dev is not None:
            self._dev.close()
            self._dev = None

    def _close_progress(self):
        self._progress.close()
        self._progress = None

    def stop(self):
        """Ends any report still open (a run stopped by an error)."""
        for progress in (self._progress, self._dev):
            if progress is not None:
                progress.close(done=False)
        self._progress = self._dev = None
