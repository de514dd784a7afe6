"""`AtomicBackup`: Keras's `BackupAndRestore`, with checkpoints that appear whole or not at all.

Pretraining and fine-tuning both resume from it: a run killed (SIGKILL, a
preempted machine) and started again with the same command continues from
its last checkpoint, with the weights, optimizer state, step counter and
dropout seeds it had, so that it ends as an uninterrupted run would.
"""

import json
import os
import shutil
import tempfile

import keras
import numpy as np

from kbert.fileio import follow_umask
from kbert.interrupts import raise_pending
from kbert.fitting.distribute import chief_folder

# Folder names inside the backup folder: the newest complete checkpoint, and
# the one before while the newest is being replaced.
STATE = "latest"
PREVIOUS_STATE = "previous"
# The caller's own state (logged windows, a training curve), written last:
# a checkpoint folder holding it is complete.
STATE_FILE = "windows.json"
SEEDS_FILE = "seed_generators.npz"
# Where a checkpoint is written before it replaces `latest/`; a killed save leaves one.
STAGING_PREFIX = ".state-"


class AtomicBackup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` whose every checkpoint appears whole or not at all.

    Keras's callback writes `latest.weights.h5` (weights, optimizer state and
    step counter) and `training_metadata.json` (epochs done) in place, so a
    kill between or during the two writes leaves a torn state. Here both, and
    the caller's state, are written to a new folder that then replaces
    `latest/`; the one before is kept as `previous/` (Keras's
    `double_checkpoint`) until the new one is in place. The dropout seed
    generators' states, which `save_weights` leaves out, are saved too, so a
    resumed run draws the same dropout masks as an uninterrupted one.

    Under MultiWorkerMirroredStrategy every worker restores from the shared
    `backup_dir` and saves, but only the chief saves there: the others save
    to a scratch folder (`chief_folder`), so the checkpoint has one writer.

    Args:
        backup_dir: str. The backup folder.
        state: callable returning the caller's JSON-able state to checkpoint
            with the weights (e.g. the logged windows); `restored_state` holds
            what the restored checkpoint had (None without one).
        strategy: the `tf.distribute.Strategy` training runs under, or None.

    Attributes:
        restored_epoch: int. Epochs done in the restored checkpoint (0 without one).
        restored_state: the state saved with it, or None.
    """

    def __init__(self, backup_dir, state=lambda: None, strategy=None):
        super().__init__(backup_dir, save_freq="epoch", delete_checkpoint=False)
        self.state = state
        self.strategy = strategy
        # Read once: the epochs done, the state and the weights must come
        # from the same checkpoint.
        restored, self.restored_epoch, self.restored_state = self.restore_point(backup_dir)
        restored = restored or os.path.join(backup_dir, STATE)
        self._weights_path = os.path.join(restored, "latest.weights.h5")
        self._training_metadata_path = os.path.join(restored, "training_metadata.json")
        self._seeds_path = os.path.join(restored, SEEDS_FILE)

    @staticmethod
    def restore_point(backup_dir):
        """(folder, epochs done, saved state) of the last complete checkpoint.

        (None, 0, None) when there is none. Reads only: with several workers,
        each reads while the chief may be writing the next checkpoint.
        """
        for name in (STATE, PREVIOUS_STATE):
            folder = os.path.join(backup_dir, name)
            try:
                with open(os.path.join(folder, STATE_FILE)) as f:
                    state = json.load(f)
                with open(os.path.join(folder, "training_metadata.json")) as f:
                    return folder, json.load(f)["epoch"], state
            except FileNotFoundError:
                continue
        return None, 0, None

    @staticmethod
    def is_own_entry(name):
        """Whether a file or folder named `name` in a backup folder is one this callback
        writes (a checkpoint, or one a killed save left half-written)."""
        return name in (STATE, PREVIOUS_STATE) or name.startswith(STAGING_PREFIX)

    def _seed_states(self):
        return [v for v in self.model.variables if "seed_generator_state" in v.path]

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if os.path.isfile(self._seeds_path):
            with np.load(self._seeds_path) as saved:
                for index, variable in enumerate(self._seed_states()):
                    variable.assign(saved[str(index)])

    def _save_model(self):
        with chief_folder(self.backup_dir, self.strategy) as backup_dir:
            self._save_to(backup_dir)

    def _save_to(self, backup_dir):
        os.makedirs(backup_dir, exist_ok=True)
        latest = os.path.join(backup_dir, STATE)
        previous = os.path.join(backup_dir, PREVIOUS_STATE)
        staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=backup_dir)
        self.model.save_weights(os.path.join(staging, "latest.weights.h5"))
        states = {str(i): keras.ops.convert_to_numpy(v) for i, v in enumerate(self._seed_states())}
        np.savez(os.path.join(staging, SEEDS_FILE), **states)
        with open(os.path.join(staging, "training_metadata.json"), "w") as f:
            json.dump({"epoch": self._current_epoch, "batch": 0}, f)
        # Written last: restore_point() takes a folder holding it as complete.
        with open(os.path.join(staging, STATE_FILE), "w") as f:
            json.dump(self.state(), f)
        follow_umask(staging)
        if os.path.isdir(latest):
            shutil.rmtree(previous, ignore_errors=True)
            os.rename(latest, previous)
        os.rename(staging, latest)
        shutil.rmtree(previous, ignore_errors=True)


class PendingInterrupt(keras.callbacks.Callback):
    """Raises, at the next step, a signal whose handler's raise was lost (`kbert.interrupts`)."""

    def on_train_batch_end(self, batch, logs=None):
        raise_pending()

    on_test_batch_end = on_train_batch_end
