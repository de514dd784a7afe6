"""The export's work folder: each artefact written and verified in turn, kept
across an interrupt, and reused by the same command run again.

`kbert export --out saved_models/debian` works in
`saved_models/.kbert-export-debian/` and renames it to `saved_models/debian`
once every artefact is verified and the report written. A step (one artefact,
or MediaPipe's files) writes its paths there; once verified it is recorded in
`STEPS_FILE` with the fingerprint of everything that made it (`fingerprint`:
the model's weights and settings, the verification examples, the calibration
examples of a calibrated one, the TF Serving name, the timing options, and
kbert's code and libraries) and the SHA-256 of each of its files.

An interrupted or failed run leaves the folder with its verified steps (or
removes it, if none was verified). The next run reuses a step whose record
has the same fingerprint and whose files are unchanged, and redoes any other;
files no valid record accounts for are removed first. An export that
`--overwrite` replaces keeps its `STEPS_FILE`, so its unchanged steps are
reused too. Only what kbert writes is ever removed here: a work folder
holding anything else is refused.
"""

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil

from kbert.export.options import EXPORT_FOLDER_NAMES, is_export_folder
from kbert.fileio import check_output_folder, follow_umask, read_json, replace_folder, write_file, write_manifest

WORK_PREFIX = ".kbert-export-"
# The records of the verified steps, kept in the finished export too.
STEPS_FILE = ".kbert-steps.json"
STEPS_FORMAT = "kbert-export-steps"
LOCK_FILE = ".kbert-lock"
# Intermediate models (the TFLite converter's SavedModel, an ONNX file the
# plan does not keep); never reused.
SCRATCH = ".scratch"
# The step that is no artefact: the Keras model's outputs, kept for a rerun.
REFERENCE = "keras"
REFERENCE_FILE = ".kbert-reference.npz"
# The card and the report's chart are written last, just before the work folder
# becomes `out`; a run killed in between leaves them here (not among
# EXPORT_FOLDER_NAMES: an export written before them never held them as kbert's).
_OWN_NAMES = (*EXPORT_FOLDER_NAMES, STEPS_FILE, LOCK_FILE, SCRATCH, REFERENCE_FILE, "README.md", "report.png")
# The libraries whose versions an artefact depends on.
_LIBRARIES = (
    "tensorflow", "keras", "tensorflow-text", "tf2onnx", "onnx", "onnxruntime", "ai-edge-litert",
    "ai-edge-quantizer", "tensorflow-serving-api", "numpy",
)
# kbert's code an artefact depends on: the model, its preprocessing, its
# task and everything of the export; not training or the command line.
_CODE = ("export/", "models/", "layers/", "text/", "tasks/", "config.py", "modelfolder.py")
_HASH_CHUNK = 1 << 20


def work_path(out):
    """The work folder of the export folder `out`, beside it."""
    return os.path.join(os.path.dirname(os.path.abspath(out)), WORK_PREFIX + os.path.basename(os.path.normpath(out)))


def kept_artefacts(out):
    """The artefacts verified and kept in `out`'s work folder, by path (none if there is none)."""
    records = _read_records(os.path.join(work_path(out), STEPS_FILE))
    return [entry["path"] for key, record in records.items() if key != REFERENCE for entry in record["entries"]]


def fingerprint(*parts):
    """A SHA-256 hex digest of JSON-able `parts` (dict keys sorted; anything else by `str`)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def code_fingerprint():
    """kbert's code that makes and judges artefacts (`_CODE`), and the versions
    of the libraries an artefact goes through."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for part in _CODE:
        folder = part.endswith("/")
        for root, dirs, files in os.walk(os.path.join(package, part)) if folder else [(package, [], [part])]:
            dirs.sort()
            for name in sorted(n for n in files if n.endswith(".py")):
                path = os.path.join(root, name)
                digest.update(os.path.relpath(path, package).encode("utf-8"))
                digest.update(_file_digest(path).encode("ascii"))
    return fingerprint(digest.hexdigest(), {name: _version(name) for name in _LIBRARIES})


class WorkFolder:
    """The work folder of one export run (see the module's docstring).

    Args:
        out: str. The export folder it becomes.
        overwrite: bool. Whether `out`, an earlier export, may be replaced
            (its unchanged steps are then reused).
        log: callable taking one str.
    """

    def __init__(self, out, overwrite, log):
        self.out = out
        self.path = work_path(out)
        self.overwrite = overwrite
        self.log = log
        self.records = {}
        self.reused = []
        self._lock = None
        earlier = os.path.join(out, STEPS_FILE)
        self._earlier = _read_records(earlier) if overwrite and is_export_folder(out) else {}

    @property
    def scratch(self):
        os.makedirs(os.path.join(self.path, SCRATCH), exist_ok=True)
        return os.path.join(self.path, SCRATCH)

    def open(self):
        """Creates or takes over the work folder: refuses one that holds files
        kbert did not write or that another export is writing; keeps the steps
        whose files are intact and removes everything else."""
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"{self.path} is in the way and kbert did not write it; move it aside")
        if os.path.isdir(self.path):
            foreign = sorted(name for name in os.listdir(self.path) if not _is_own(name))
            if foreign:
                raise ValueError(
                    f"{self.path} holds {', '.join(foreign[:3])}, which kbert did not write; move it aside"
                )
        os.makedirs(self.path, exist_ok=True)
        self._lock = open(os.path.join(self.path, LOCK_FILE), "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise ValueError(f"--out {self.out}: another kbert export is writing it (in {self.path})") from None
        records = _read_records(os.path.join(self.path, STEPS_FILE))
        self.records = {key: r for key, r in records.items() if _intact(self.path, r)}
        self._prune()
        self._save()

    def step(self, key, step_fingerprint, paths, make):
        """The record of step `key`: reused if one with `step_fingerprint` is
        here or in the export being replaced, else made by `make()`.

        Args:
            key: str. The step, e.g. "tflite/int8".
            step_fingerprint: str. `fingerprint` of everything the step depends on.
            paths: list of str. What the step writes, relative to the folder.
            make: callable() -> (entries, extra): writes `paths`, verifies
                them, returns their report entries and what else the report
                needs (JSON).

        Returns:
            dict with `entries` and `extra`.
        """
        record = self.records.get(key)
        if record is None or record["fingerprint"] != step_fingerprint:
            record = self._adopt(key, step_fingerprint)
        if record is not None:
            self.reused.append(key)
            for entry in record["entries"]:
                self.log(f"{entry.get('path', 'Keras reference')}: reused from an earlier run "
                         "of the same model, data and options")
            return record
        self._forget(key, paths)
        try:
            entries, extra = make()
        except BaseException:
            self._remove(paths)
            raise
        self.records[key] = {
            "fingerprint": step_fingerprint, "paths": list(paths), "files": _hashes(self.path, paths),
            "entries": entries, "extra": extra,
        }
        self._save()
        return self.records[key]

    def artefacts(self):
        """The verified artefacts here, by path."""
        return [e["path"] for key, r in self.records.items() if key != REFERENCE for e in r["entries"]]

    def keep_only(self, keys):
        """Removes the steps not in `keys` (an earlier run's, which this one does not ask for)."""
        for key in [k for k in self.records if k not in keys]:
            self._forget(key, [])
        self._save()

    def finish(self, what="export"):
        """Renames the finished folder to `out` (replacing an earlier export
        that `overwrite` allows); the reference and scratch files are removed,
        the steps' records kept, every path listed in the manifest."""
        self._forget(REFERENCE, [])
        self._save()
        shutil.rmtree(os.path.join(self.path, SCRATCH), ignore_errors=True)
        os.remove(os.path.join(self.path, LOCK_FILE))
        write_manifest(self.path)
        follow_umask(self.path)
        check_output_folder(self.out, what, is_export_folder, self.overwrite, EXPORT_FOLDER_NAMES)
        replace_folder(self.path, self.out)
        self._unlock()

    def leave(self):
        """After a failure or an interrupt: keeps the verified steps, removes
        the rest, and the folder itself if no artefact was verified."""
        try:
            shutil.rmtree(os.path.join(self.path, SCRATCH), ignore_errors=True)
            if not self.artefacts():
                shutil.rmtree(self.path, ignore_errors=True)
            else:
                self._prune()
                self.log(
                    f"kept {_count(self.artefacts())} in {self.path}; "
                    "the same command run again reuses them"
                )
        finally:
            self._unlock()

    # === Records and files ===

    def _adopt(self, key, step_fingerprint):
        """The step's record in the export `overwrite` replaces, its files
        linked (or copied) here, if its fingerprint matches and its files are intact."""
        record = self._earlier.get(key)
        if record is None or record["fingerprint"] != step_fingerprint or not _intact(self.out, record):
            return None
        self._forget(key, record["paths"])
        for path in record["paths"]:
            source, target = os.path.join(self.out, path), os.path.join(self.path, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.isdir(source):
                shutil.copytree(source, target, copy_function=_link_or_copy)
            else:
                _link_or_copy(source, target)
        self.records[key] = record
        self._save()
        return record

    def _forget(self, key, paths):
        record = self.records.pop(key, None)
        self._remove(list(paths) + (record["paths"] if record else []))

    def _remove(self, paths):
        for path in paths:
            full = os.path.join(self.path, path)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            elif os.path.lexists(full):
                os.remove(full)

    def _prune(self):
        """Removes every file that no record accounts for (a step cut short),
        then the folders left empty."""
        kept = {path for record in self.records.values() for path in record["files"]}
        for root, dirs, files in os.walk(self.path, topdown=False):
            for name in files:
                relative = os.path.relpath(os.path.join(root, name), self.path).replace(os.sep, "/")
                if relative not in kept and relative not in (STEPS_FILE, LOCK_FILE):
                    os.remove(os.path.join(root, name))
            if root != self.path and not os.listdir(root):
                os.rmdir(root)

    def _save(self):
        state = {"format": STEPS_FORMAT, "steps": self.records}
        write_file(os.path.join(self.path, STEPS_FILE), lambda f: json.dump(state, f, indent=1), mode="w",
                   encoding="utf-8")

    def _unlock(self):
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _is_own(name):
    """Whether a name in the work folder is one kbert writes there (its
    temporary files start with ".kbert-", `kbert.fileio.write_file`)."""
    return name in _OWN_NAMES or name.startswith(".kbert-")


def _read_records(path):
    """The steps recorded in `path`; none if it is missing or unreadable."""
    try:
        state = read_json(path)
        steps = state["steps"] if state.get("format") == STEPS_FORMAT else {}
        return {
            str(key): r for key, r in steps.items()
            if isinstance(r, dict) and {"fingerprint", "paths", "files", "entries", "extra"} <= set(r)
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _intact(folder, record):
    """Whether the files of `record` are in `folder`, unchanged, and nothing else is under its paths."""
    try:
        return _hashes(folder, record["paths"]) == record["files"]
    except OSError:
        return False


def _hashes(folder, paths):
    """SHA-256 of every file under `paths` (files or folders) in `folder`, by relative path."""
    hashes = {}
    for path in paths:
        full = os.path.join(folder, path)
        if not os.path.isdir(full):
            hashes[path] = _file_digest(full)
            continue
        for root, _, files in os.walk(full):
            for name in files:
                file_path = os.path.join(root, name)
                hashes[os.path.relpath(file_path, folder).replace(os.sep, "/")] = _file_digest(file_path)
    return hashes


def _file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _link_or_copy(source, target):
    """A hard link of `source` at `target` (free, and the export it comes from is
    replaced anyway), or a copy where links cannot be made."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
    return target


def _version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _count(paths):
    return f"{len(paths)} verified artefact{'s' if len(paths) != 1 else ''}"
