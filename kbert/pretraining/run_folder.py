"""The run folder `pretrain` writes (`--out`): its names, and what may be there before it starts.

No TensorFlow here: `kbert pretrain` refuses an `--out` it may not write before
TensorFlow loads.
"""

import os

from kbert.fileio import check_new_folder, read_json

ENCODER_FOLDER = "encoder"
WEIGHTS_FILE = "pretrainer.weights.h5"
HISTORY_FILE = "history.json"
# Written while training, inside `out`: TensorBoard event files, and the last
# checkpoints (removed when the run completes).
LOGS_FOLDER = "logs"
BACKUP_FOLDER = "backup"


def check_run_folder(out, resumable, name, init_option="--init"):
    """Refuses an `out` that is a file, that cannot be written, that holds a
    finished run, or that holds anything but what a killed run leaves
    (`logs/`, `backup/`) when it is `resumable` (checkpointing).

    Args:
        out: str. The run folder.
        resumable: bool. Whether the run saves checkpoints to resume from.
        name: str. How messages name it (`--out PATH`).
        init_option: str. How messages name the option a run starts from
            ("--init", or "init" for Python callers).
    """
    if os.path.isfile(os.path.join(out, HISTORY_FILE)):
        encoder = os.path.join(out, ENCODER_FOLDER)
        start = f"--init {encoder}" if init_option.startswith("--") else f"{init_option}={encoder!r}"
        raise ValueError(
            f"{name} holds a finished run{_steps(out)}, with nothing to resume; to pretrain it further, "
            f"run again with {start} and a new folder"
        )
    check_new_folder(out, (LOGS_FOLDER, BACKUP_FOLDER) if resumable else (), name=name)


def _steps(out):
    """" (N steps)" for the finished run in `out`; "" if its history cannot be read."""
    try:
        steps = read_json(os.path.join(out, HISTORY_FILE))["settings"]["num_train_steps"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return f" ({steps} steps)"
