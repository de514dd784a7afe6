"""A run's resume folder beside its output: what identifies the run, and when it starts afresh.

`finetune` and `distill` checkpoint every epoch into `.kbert-resume-NAME`
beside `out` (`resume_folder`); the same call, run again after a crash,
resumes from its last complete epoch (`resume_point`). The folder holds
`run.json`, the fingerprint of the run's settings and files: a run with
other settings removes it and starts afresh. It is removed once `out` is
written.
"""

import hashlib
import json
import os
import shutil

from kbert.fileio import write_file
from kbert.fitting.backup import AtomicBackup
from kbert.pretraining.run_folder import BACKUP_FOLDER, HISTORY_FILE

# Beside `out`, a run keeps its epoch checkpoints here until it has written
# `out`; the same command run again after a crash resumes from them.
RESUME_PREFIX = ".kbert-resume-"
# What identifies a run in its resume folder.
RUN_FILE = "run.json"
# Inside the resume folder: the adaptation's run (`kbert.pretraining.adapt`),
# whose encoder fine-tuning starts from.
ADAPT_FOLDER = "adaptation"


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
