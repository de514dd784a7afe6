"""The run folder `pretrain` writes (`--out`): its names, and what may be there before it starts.

No TensorFlow here: `kbert pretrain` refuses an `--out` it may not write before
TensorFlow loads.
"""

from kbert.fileio import check_new_folder

ENCODER_FOLDER = "encoder"
WEIGHTS_FILE = "pretrainer.weights.h5"
HISTORY_FILE = "history.json"
# Written while training, inside `out`: TensorBoard event files, and the last
# checkpoints (removed when the run completes).
LOGS_FOLDER = "logs"
BACKUP_FOLDER = "backup"


def check_run_folder(out, resumable, name):
    """Refuses an `out` that is a file or holds anything, but what a killed run
    leaves (`logs/`, `backup/`) when it is `resumable` (checkpointing); `name`
    is how messages name it (`--out PATH`)."""
    check_new_folder(out, (LOGS_FOLDER, BACKUP_FOLDER) if resumable else (), name=name)
