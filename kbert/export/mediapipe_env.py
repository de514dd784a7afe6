"""Private Python environments for MediaPipe's and the TFLite Task Library's tools.

MediaPipe's metadata writer and `TextClassifier` cannot be imported next to
TensorFlow 2.21: mediapipe 1.x's writer fails to import (`No module named
'mediapipe.tasks.cc'`), and 0.10.21, whose writer works, pins protobuf < 5 and
numpy < 2. tflite-support 0.4.4 (the Task Library's `BertNLClassifier` and its
metadata writer) pins protobuf < 4. So each gets a virtual environment of its own,
created by pip on first use under a cache folder and reused afterwards, and kbert
talks to it through `mediapipe_worker.py`, run in that environment as a
subprocess with a JSON request and a JSON response.

Creating one needs PyPI: the MediaPipe environment takes about 40 s of pip on a
fresh machine (400 MB), the Task Library one about 20 s (150 MB).
"""

import concurrent.futures
import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mediapipe_worker.py")
_STAMP = "kbert-environment.json"
# Kept of a failing pip's or worker's output in the error message.
_OUTPUT_TAIL_CHARS = 3000


@dataclasses.dataclass(frozen=True)
class ToolEnvironment:
    """A pinned set of wheels installed into a virtual environment of its own.

    Args:
        name: str. Folder name under the cache folder.
        packages: tuple of str. Installed with `--no-deps`: the tool itself,
            whose declared dependencies include things it does not need here.
        requirements: tuple of str. The dependencies it does need, pinned.
        python_versions: tuple of str. `major.minor` versions with wheels.
    """

    name: str
    packages: tuple
    requirements: tuple
    python_versions: tuple


# mediapipe 0.10.21 declares jax, jaxlib, sentencepiece, sounddevice and
# opencv-contrib-python too; the text tasks and the metadata writer use none of
# them, but `import mediapipe` imports cv2 and matplotlib (drawing utilities).
# Leaving jax out halves the install (40 s instead of 70 s, 400 MB instead of
# 1 GB); headless OpenCV needs no libGL.
MEDIAPIPE = ToolEnvironment(
    name="mediapipe-0.10.21",
    packages=("mediapipe==0.10.21",),
    requirements=(
        "absl-py==2.5.1",
        "attrs==26.1.0",
        "flatbuffers==25.12.19",
        "numpy==1.26.4",
        "protobuf==4.25.9",
        "opencv-python-headless==4.11.0.86",
        "matplotlib==3.10.9",
    ),
    python_versions=("3.9", "3.10", "3.11", "3.12"),
)

# tflite-support's native modules link libusb-1.0 (for Edge TPUs), which a
# fresh machine may lack; libusb-package ships it and the worker loads it first.
# Its wheels stop at Python 3.11.
TFLITE_SUPPORT = ToolEnvironment(
    name="tflite-support-0.4.4",
    packages=("tflite-support==0.4.4",),
    requirements=(
        "absl-py==2.5.1",
        "flatbuffers==25.12.19",
        "numpy==1.26.4",
        "protobuf==3.20.3",
        "libusb-package==1.0.30.0",
    ),
    python_versions=("3.8", "3.9", "3.10", "3.11"),
)


class ToolEnvironmentError(OSError):
    """A tool environment could not be created, or its worker failed."""


def default_cache_dir():
    """`$XDG_CACHE_HOME/kbert`, or `~/.cache/kbert`."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "kbert")


def is_ready(spec, cache_dir=None):
    """Whether `spec`'s environment is there already (`ensure_environment` then creates nothing)."""
    folder = os.path.join(cache_dir or default_cache_dir(), spec.name)
    wanted = json.loads(json.dumps(dataclasses.asdict(spec)))
    return _read_stamp(folder) == wanted and os.path.exists(os.path.join(folder, "bin", "python"))


def ensure_environment(spec, cache_dir=None, base_python=None):
    """Creates `spec`'s environment unless it is there already; returns its python.

    Safe to call from several processes at once: creation holds a file lock.

    Args:
        spec: `ToolEnvironment`.
        cache_dir: str. Parent folder; `default_cache_dir()` if None.
        base_python: str. Interpreter that creates the environment (its
            `major.minor` must be one of `spec.python_versions`); this one if None.

    Raises:
        ToolEnvironmentError: pip failed (it needs to reach PyPI), naming the
            folder and quoting pip's output.
    """
    cache_dir = cache_dir or default_cache_dir()
    base_python = base_python or sys.executable
    folder = os.path.join(cache_dir, spec.name)
    python = os.path.join(folder, "bin", "python")
    # Through JSON, as the stamp is read back (tuples become lists).
    wanted = json.loads(json.dumps(dataclasses.asdict(spec)))
    os.makedirs(cache_dir, exist_ok=True)
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_ready(spec, cache_dir):
            return python
        version = _python_version(base_python)
        if version not in spec.python_versions:
            raise ToolEnvironmentError(
                f"{spec.name} has wheels for Python {', '.join(spec.python_versions)}; "
                f"{base_python} is Python {version}"
            )
        shutil.rmtree(folder, ignore_errors=True)
        _run([base_python, "-m", "venv", folder], f"creating {folder}")
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"]
        try:
            _run(pip + ["--no-deps", *spec.packages], f"installing {spec.packages} into {folder}")
            _run(pip + list(spec.requirements), f"installing {spec.requirements} into {folder}")
        except ToolEnvironmentError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        with open(os.path.join(folder, _STAMP), "w") as f:
            json.dump(wanted, f, indent=2)
        return python


def ensure_environments(specs, cache_dir=None):
    """`ensure_environment` for each of `specs` at once (their pip runs overlap).

    Returns:
        list of str. Their pythons, in order.
    """
    with concurrent.futures.ThreadPoolExecutor(max(1, len(specs))) as pool:
        return list(pool.map(lambda spec: ensure_environment(spec, cache_dir), specs))


def run_worker(spec, command, request, cache_dir=None, timeout=1800):
    """Runs `mediapipe_worker.py COMMAND` in `spec`'s environment; returns its reply.

    Args:
        spec: `ToolEnvironment` the command needs (`MEDIAPIPE` or `TFLITE_SUPPORT`).
        command: str. A command of `mediapipe_worker.py`.
        request: dict. JSON-serialisable arguments.
        cache_dir: str. See `ensure_environment`.
        timeout: float. Seconds.

    Raises:
        ToolEnvironmentError: the environment could not be made, or the worker
            failed or crashed; the message quotes its stderr.
    """
    python = ensure_environment(spec, cache_dir)
    with tempfile.TemporaryDirectory(prefix="kbert-worker-") as tmp:
        request_path = os.path.join(tmp, "request.json")
        reply_path = os.path.join(tmp, "reply.json")
        with open(request_path, "w", encoding="utf-8") as f:
            json.dump(request, f)
        # -I: neither this package's folder (whose mediapipe.py would shadow the
        # real mediapipe) nor PYTHON* variables reach the worker.
        env = dict(os.environ, GLOG_minloglevel="2", TF_CPP_MIN_LOG_LEVEL="2")
        result = subprocess.run(
            [python, "-I", WORKER, command, request_path, reply_path],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        if result.returncode != 0:
            how = (
                f"crashed with signal {-result.returncode}"
                if result.returncode < 0
                else f"exited with status {result.returncode}"
            )
            raise ToolEnvironmentError(
                f"mediapipe_worker.py {command} ({spec.name}) {how}:\n"
                f"{_tail(result.stderr + result.stdout)}"
            )
        with open(reply_path, encoding="utf-8") as f:
            return json.load(f)


def _read_stamp(folder):
    try:
        with open(os.path.join(folder, _STAMP)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _python_version(python):
    return subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()


def _run(args, what):
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise ToolEnvironmentError(
            f"{what} failed (pip needs to reach PyPI):\n{_tail(result.stderr + result.stdout)}"
        )


def _tail(text):
    return text if len(text) <= _OUTPUT_TAIL_CHARS else "..." + text[-_OUTPUT_TAIL_CHARS:]
