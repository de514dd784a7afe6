"""Writing output folders without leaving half-written ones behind."""

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
