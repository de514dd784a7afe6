"""Writing output files and folders without losing anything the user has.

Rules, as git and pip keep them:

- kbert never deletes or replaces a folder it did not create. An output folder
  that exists, is not empty and is not kbert's own of the same kind is refused
  before any work starts (`check_output_folder`); replacing kbert's own needs
  `overwrite=True`.
- Outputs are written beside their final place and renamed into it at the end
  (`staged_folder`, `write_file`), so a folder or file is either the old one or
  the whole new one. A run killed half-way leaves a staging folder that the
  next run for the same output removes (it is kbert's own and marked with its
  owner's process id).
- Everything written honours the user's umask.
"""

import contextlib
import json
import os
import shutil
import socket
import tempfile

# A staging folder's owner file: which process on which host writes it.
OWNER_FILE = ".kbert-owner"
STAGING_PREFIX = ".kbert-staging-"


def check_output_folder(out, what, is_ours, overwrite=False):
    """Refuses an output folder kbert may not write, before any work starts.

    Args:
        out: str. The folder to write.
        what: str. What kbert writes there ("model", "export"), for messages.
        is_ours: callable(path) -> bool. Whether an existing folder is a kbert
            folder of this kind.
        overwrite: bool. Whether a kbert folder of this kind may be replaced.

    Raises:
        ValueError: one line naming `out` and what is wrong: a name that is no
            folder name, a file in the way, a folder of the user's, kbert's own
            without `overwrite`, a folder that holds the current one, or a
            parent that is a file or cannot be written.
    """
    if not out or os.path.basename(os.path.normpath(out)) in ("", ".", ".."):
        raise ValueError(f"--out {out!r}: expected the path of a new {what} folder")
    path = os.path.abspath(out)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"--out {out}: a file of that name exists; expected a {what} folder")
    cwd = os.getcwd()
    if os.path.commonpath([cwd, path]) == path:
        raise ValueError(f"--out {out} holds the current folder; expected a new {what} folder")
    if os.path.isdir(path) and os.listdir(path):
        if not is_ours(path):
            raise ValueError(
                f"--out {out} is not empty and is not a kbert {what} folder; kbert replaces "
                f"only its own {what} folders: choose a new or empty folder"
            )
        if not overwrite:
            raise ValueError(f"--out {out} holds a kbert {what} folder; pass --overwrite to replace it")
    ancestor = os.path.dirname(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(f"--out {out}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: cannot write in {ancestor} (permission denied)")


@contextlib.contextmanager
def staged_folder(out, is_ours, overwrite=False, what="output"):
    """Yields a new folder beside `out`; renames it to `out` if the block succeeds.

    The staging folder is removed if the block fails (or is interrupted). An
    older `out` is replaced only if `is_ours(out)` and `overwrite`, checked
    again at the end; it is renamed aside first and removed only once the new
    folder is in place.
    """
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    remove_stale_staging(out)
    staging = tempfile.mkdtemp(prefix=_staging_prefix(out), dir=parent)
    try:
        with open(os.path.join(staging, OWNER_FILE), "w") as f:
            json.dump({"pid": os.getpid(), "host": socket.gethostname()}, f)
        yield staging
        os.remove(os.path.join(staging, OWNER_FILE))
        os.chmod(staging, 0o777 & ~current_umask())
        check_output_folder(out, what, is_ours, overwrite)
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def remove_stale_staging(out):
    """Removes staging folders for `out` whose owner process on this host is gone.

    Returns the removed paths.
    """
    parent = os.path.dirname(os.path.abspath(out))
    prefix = _staging_prefix(out)
    removed = []
    if not os.path.isdir(parent):
        return removed
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if not name.startswith(prefix) or not os.path.isdir(path):
            continue
        try:
            with open(os.path.join(path, OWNER_FILE)) as f:
                owner = json.load(f)
        except (OSError, ValueError):
            continue  # not a staging folder of this version: leave it
        if owner.get("host") == socket.gethostname() and not _alive(owner.get("pid")):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def replace_folder(staging, out):
    """Renames the finished `staging` folder to `out`, replacing an older `out`.

    The older folder is renamed aside first and removed only once `staging`
    is in place, so `out` is never a mix of the two. Callers check first that
    the older folder is theirs to replace.
    """
    old = None
    if os.path.exists(out):
        old = tempfile.mkdtemp(prefix=".kbert-old-", dir=os.path.dirname(os.path.abspath(out)))
        os.rmdir(old)
        os.rename(out, old)
    os.rename(staging, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def write_file(path, write, mode="wb", **open_kwargs):
    """Calls `write(file)` on a temporary file beside `path`, then renames it to `path`.

    `path` holds either its old content or the whole new one, never a part;
    the temporary file is removed if `write` fails. The file gets the mode a
    plain `open` would give it under the user's umask.

    Args:
        path: str. The file to write; its folder must exist.
        write: callable taking the open file.
        mode, **open_kwargs: how the file is opened ("wb", or "w" with an encoding).
    """
    fd, tmp = tempfile.mkstemp(prefix=".kbert-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            write(f)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def current_umask():
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _staging_prefix(out):
    return f"{STAGING_PREFIX}{os.path.basename(os.path.normpath(out))}-"


def _alive(pid):
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True
