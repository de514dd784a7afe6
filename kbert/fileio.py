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
- Every folder kbert writes lists its files and sub-folders in `MANIFEST_FILE`;
  `overwrite` replaces a folder only when it holds nothing else
  (`foreign_entries`), so a note, an export or an empty folder (`.git/`) the
  user added inside is never deleted with it. Folders written before the
  manifest count the names their kind always writes (`known_names`) as kbert's.
- An output is never one of the command's inputs, inside one, or a folder
  holding one (`check_distinct`).
- Everything written honours the user's umask: each output gets the modes
  `open` and `mkdir` would give it (`follow_umask`) before it is renamed into
  place, whatever wrote it (temporary files and folders are private, and some
  libraries, safetensors among them, write files 0600).
"""

import contextlib
import json
import os
import shutil
import socket
import tempfile
import zipfile

# A staging folder's owner file: which process on which host writes it.
OWNER_FILE = ".kbert-owner"
STAGING_PREFIX = ".kbert-staging-"
# The list of what kbert wrote in a folder: what `overwrite` may replace.
MANIFEST_FILE = ".kbert-manifest.json"
MANIFEST_FORMAT = "kbert-manifest"
# Foreign entries named in a refusal, at most.
NAMED_AT_MOST = 3


def decode_utf8(data, path, expected="UTF-8 text", first_line=1):
    """`data`, bytes read from `path`, as text.

    Raises:
        ValueError: one line naming the file, the line (counted from
            `first_line`) and the byte that is not UTF-8, and `expected`.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = first_line + data[: error.start].count(b"\n")
        raise ValueError(
            f"{path}, line {line}: byte 0x{data[error.start]:02x} is not UTF-8; expected {expected}"
        ) from None


def read_json(path, remedy=""):
    """The JSON value held in the UTF-8 file `path`.

    Raises:
        ValueError: one line naming the file, what is wrong, then `remedy`
            (e.g. "; write the records again with --overwrite").
    """
    with open(path, "rb") as f:
        text = decode_utf8(f.read(), path, f"UTF-8 JSON{remedy}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}){remedy}") from None


def check_new_folder(path, leftovers=(), name=None):
    """Refuses a `path` that is a file, a folder holding anything but
    `leftovers` (what a killed run of the same command leaves to resume from),
    or a place kbert cannot write (`check_writable`).

    `name`: how messages name it (default: `path`).
    """
    name = name or path
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"{name}: a file of that name exists; expected a new folder")
    if os.path.isdir(path) and set(os.listdir(path)) - set(leftovers):
        raise ValueError(f"{name} exists and is not empty; choose a new folder")
    check_writable(os.path.abspath(path), name)


def check_writable(path, name):
    """Refuses, before any work, a `path` whose nearest existing folder (itself
    or the closest ancestor) is a file or cannot be written in; `name`: how
    messages name it (`--out runs/x`)."""
    ancestor = path
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(f"{name}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: cannot write in {ancestor} (permission denied)")


def check_output_folder(out, what, is_ours, overwrite=False, known_names=()):
    """Refuses an output folder kbert may not write, before any work starts.

    Args:
        out: str. The folder to write.
        what: str. What kbert writes there ("model", "export"), for messages.
        is_ours: callable(path) -> bool. Whether an existing folder is a kbert
            folder of this kind.
        overwrite: bool. Whether a kbert folder of this kind may be replaced.
        known_names: names a folder of this kind written before the manifest
            holds (`foreign_entries`).

    Raises:
        ValueError: one line naming `out` and what is wrong: a name that is no
            folder name, a file in the way, a folder of the user's, kbert's own
            without `overwrite` or holding files kbert did not write, a folder
            that holds the current one, or a parent that is a file or cannot
            be written.
    """
    if not out or os.path.basename(os.path.normpath(out)) in ("", ".", ".."):
        raise ValueError(f"--out {out!r}: expected the path of a new {what} folder")
    path = os.path.abspath(out)
    if os.path.lexists(path) and not os.path.isdir(path):
        article = "an" if what[0] in "aeiou" else "a"
        raise ValueError(f"--out {out}: a file of that name exists; expected {article} {what} folder")
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
        foreign = foreign_entries(path, known_names)
        if foreign:
            raise ValueError(
                f"--out {out} holds {_name_some(foreign)}, which kbert did not write; --overwrite "
                f"replaces only kbert's own files: move them out of the folder, or choose a new --out"
            )
    check_writable(os.path.dirname(path), f"--out {out}")  # written beside `out`, then renamed


def foreign_entries(folder, known_names=()):
    """The paths in `folder` (relative, sorted; a folder's with a trailing "/")
    that kbert did not write there.

    What kbert wrote is what the folder's manifest lists: its files, and its
    folders (a manifest written before it listed folders: those holding a
    listed file). A folder of the user's counts whole, empty or not. A folder
    without a manifest (written before manifests) is kbert's where its
    top-level names are among `known_names` (a known sub-folder counts whole).
    A manifest that cannot be read counts nothing as kbert's.
    """
    listed = read_manifest(folder)
    if listed is None:
        return sorted(name for name in os.listdir(folder) if name not in set(known_names) | {MANIFEST_FILE})
    ours = listed | {MANIFEST_FILE} | {path[: i + 1] for path in listed for i, c in enumerate(path) if c == "/"}
    foreign = []
    for root, dirs, files in os.walk(folder):
        relative_root = os.path.relpath(root, folder).replace(os.sep, "/")
        prefix = "" if relative_root == "." else relative_root + "/"
        for name in files:
            if prefix + name not in ours:
                foreign.append(prefix + name)
        for name in list(dirs):
            if prefix + name + "/" not in ours:
                foreign.append(prefix + name + "/")
                dirs.remove(name)  # the user's, whole: not walked into
    return sorted(foreign)


def read_manifest(folder):
    """What the manifest of `folder` lists: its files, and its folders with a
    trailing "/"; None without a manifest, empty if unreadable."""
    path = os.path.join(folder, MANIFEST_FILE)
    if not os.path.lexists(path):
        return None
    try:
        manifest = read_json(path)
        return {str(name) for name in manifest["files"]} | {str(name) + "/" for name in manifest.get("folders", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def write_manifest(folder):
    """Lists every file and sub-folder under `folder` (relative paths) in its manifest."""
    files, folders = [], []
    for root, dirs, names in os.walk(folder):
        relative = os.path.relpath(root, folder).replace(os.sep, "/")
        prefix = "" if relative == "." else relative + "/"
        files.extend(prefix + name for name in names if prefix or name not in (MANIFEST_FILE, OWNER_FILE))
        folders.extend(prefix + name for name in dirs)
    with open(os.path.join(folder, MANIFEST_FILE), "w", encoding="utf-8") as f:
        json.dump({"format": MANIFEST_FORMAT, "files": sorted(files), "folders": sorted(folders)}, f, indent=1)


def check_distinct(outputs, inputs):
    """Refuses, before any work, an output that is an input, inside an input folder, or holds one.

    Args:
        outputs, inputs: dict. Option (e.g. "--out") -> path, or None where not
            given; an input that does not exist (a preset name, a glob) is
            skipped.

    Raises:
        ValueError: one line naming both options and paths.
    """
    for out_flag, out in outputs.items():
        if not out:
            continue
        out_path = os.path.realpath(out)
        for in_flag, given in inputs.items():
            if not given or not os.path.exists(given):
                continue
            in_path = os.path.realpath(given)
            if in_path == out_path or (os.path.exists(out) and os.path.samefile(given, out)):  # a hard link too
                raise ValueError(f"{out_flag} {out} is {in_flag} {given}, which this command reads; choose another {out_flag}")
            if os.path.isdir(in_path) and os.path.commonpath([in_path, out_path]) == in_path:
                raise ValueError(
                    f"{out_flag} {out} is inside {in_flag} {given}, which this command reads; "
                    f"choose a {out_flag} outside it"
                )
            if os.path.commonpath([in_path, out_path]) == out_path:
                raise ValueError(
                    f"{out_flag} {out} holds {in_flag} {given}, which this command reads; choose another {out_flag}"
                )


def _name_some(paths):
    named = ", ".join(paths[:NAMED_AT_MOST])
    return named + (f" and {len(paths) - NAMED_AT_MOST} more" if len(paths) > NAMED_AT_MOST else "")


@contextlib.contextmanager
def staged_folder(out, is_ours, overwrite=False, what="output", known_names=()):
    """Yields a new folder beside `out`; renames it to `out` if the block succeeds.

    The staging folder is removed if the block fails (or is interrupted). Its
    files are listed in its manifest (`MANIFEST_FILE`). An older `out` is
    replaced only if `is_ours(out)`, `overwrite` and it holds nothing kbert
    did not write, checked again at the end; it is renamed aside first and
    removed only once the new folder is in place.
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
        write_manifest(staging)
        follow_umask(staging)
        check_output_folder(out, what, is_ours, overwrite, known_names)
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
    with written_aside(path) as tmp:
        with open(tmp, mode, **open_kwargs) as f:
            write(f)


@contextlib.contextmanager
def written_aside(path, suffix=""):
    """Yields the name of a new empty file beside `path` for the block to write
    (a library's `save(name)`); renames it to `path` when the block succeeds,
    removes it if not. `path` is never half-written, and gets the mode a plain
    `open` would give it under the user's umask.

    Args:
        path: str. The file to write; its folder must exist.
        suffix: str. How the temporary name ends, for writers that go by it (".keras").
    """
    fd, tmp = tempfile.mkstemp(prefix=".kbert-", suffix=suffix, dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        yield tmp
        follow_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def follow_umask(path):
    """Gives `path`, and everything under it if it is a folder, the mode that
    `open` (files: 0666, 0777 if executable) and `mkdir` (0777) give under the
    user's umask: what `tempfile` creates is private (0600, 0700), and so is
    what some libraries write (safetensors' files). Links are left alone."""
    mask = current_umask()

    def fix(entry, folder):
        if not os.path.islink(entry):
            executable = folder or os.stat(entry).st_mode & 0o100
            os.chmod(entry, (0o777 if executable else 0o666) & ~mask)

    fix(path, os.path.isdir(path))
    for root, dirs, files in os.walk(path):
        for name in dirs:
            fix(os.path.join(root, name), True)
        for name in files:
            fix(os.path.join(root, name), False)


def keras_archive_class(path):
    """The registered name of the object a Keras `.keras` file holds
    ("kbert>TaskModel"), read from the `config.json` of its zip archive; None
    for anything else (no such file, not a zip, no Keras config)."""
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
        return config.get("registered_name") or None
    except (OSError, KeyError, ValueError, AttributeError, zipfile.BadZipFile):
        return None


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
