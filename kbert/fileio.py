"""Writing output files and folders without leaving half-written ones behind."""

import os
import shutil
import tempfile


def replace_folder(staging, out):
    """Renames the finished `staging` folder to `out`, replacing an older `out`.

    The older folder is renamed aside first and removed only once `staging`
    is in place, so `out` is never a mix of the two.
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
    the temporary file is removed if `write` fails.

    Args:
        path: str. The file to write; its folder must exist.
        write: callable taking the open file.
        mode, **open_kwargs: how the file is opened ("wb", or "w" with an encoding).
    """
    fd, tmp = tempfile.mkstemp(prefix=".kbert-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
