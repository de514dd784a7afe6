"""`OUT/web/`: a page that runs the exported MediaPipe text file in a browser.

For a task whose on-device file MediaPipe Tasks for Web runs (a
`TextClassifier` or `TextEmbedder` file in `OUT/mediapipe/`), `kbert export`
writes beside it:

| path | what |
| --- | --- |
| `web/index.html`, `web/app.mjs` | the page: type a text, see its labels and scores (two texts and their cosine for an embedder) |
| `web/model.json` | which file the page runs, and how (`kind`, `model`, `threshold` of a multi-label classifier) |
| `web/package.json`, `web/package-lock.json` | `@mediapipe/tasks-text`, pinned |
| `web/node_modules/@mediapipe/tasks-text/` | the package's JS bundle and wasm files, where `npm ci` in `web/` puts them |

The page loads nothing from elsewhere: the package is copied from an `npm ci`
of the lock file, made once under kbert's cache folder (beside MediaPipe's
Python environments, `kbert.export.mediapipe_env`), and the model is
`../mediapipe/*.tflite`. Without npm (or the npm registry, the first time)
the export goes on without the page, and says so. `serve` (`kbert serve-web OUT`) serves the export
folder from 127.0.0.1 with the MIME types the page needs.

The template files are `kbert/export/web_page/`. The package stays at 0.10.21,
the version kbert's Python and Android runtimes use: 1.0.x sends usage
metrics to a remote endpoint.
"""

import fcntl
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import tempfile

from kbert.export.mediapipe_env import ToolEnvironmentError, default_cache_dir
from kbert.fileio import follow_umask, replace_folder, write_file

FOLDER = "web"
TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web_page")
# Copied as they are; model.json is written for each export.
TEMPLATE_FILES = ("index.html", "app.mjs", "package.json", "package-lock.json")
CONFIG_FILE = "model.json"
PACKAGE = "@mediapipe/tasks-text"
PACKAGE_PATH = os.path.join("node_modules", *PACKAGE.split("/"))
# What the page loads of the package: its ES module, and the wasm loader and
# binary with SIMD and without (`FilesetResolver` picks by the browser).
PACKAGE_FILES = (
    "package.json", "text_bundle.mjs",
    "wasm/text_wasm_internal.js", "wasm/text_wasm_internal.wasm",
    "wasm/text_wasm_nosimd_internal.js", "wasm/text_wasm_nosimd_internal.wasm",
)
# Only this machine's user sees the page: the server serves the whole export folder.
HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# Browsers compile wasm streaming only when it comes as application/wasm, and
# load modules only with a JavaScript type.
MIME_TYPES = {
    ".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript",
    ".json": "application/json", ".tflite": "application/octet-stream",
}
_STAMP = "kbert-package-lock.sha256"


def package_version():
    """The `@mediapipe/tasks-text` version the template's package.json pins."""
    with open(os.path.join(TEMPLATE, "package.json"), encoding="utf-8") as f:
        return json.load(f)["dependencies"][PACKAGE]


def ensure_package(cache_dir=None):
    """Runs `npm ci` on the template's lock file in the cache folder, unless done already.

    Args:
        cache_dir: str. Parent folder; `mediapipe_env.default_cache_dir()` if None.

    Returns:
        str. The installed package's folder.

    Raises:
        ToolEnvironmentError: npm is missing or failed (it needs the npm
            registry once), quoting its output.
    """
    npm = shutil.which("npm")
    if npm is None:
        raise ToolEnvironmentError("npm not found; kbert installs @mediapipe/tasks-text for the web page with it")
    cache_dir = cache_dir or default_cache_dir()
    folder, package, wanted = _install_paths(cache_dir)
    os.makedirs(cache_dir, exist_ok=True)
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_package_ready(cache_dir):
            return package
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(os.path.join(TEMPLATE, name), os.path.join(folder, name))
        # --ignore-scripts: the package has none, and none should run.
        result = subprocess.run(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=folder, capture_output=True, text=True,
        )
        if result.returncode != 0 or not _has_files(package):
            shutil.rmtree(folder, ignore_errors=True)
            raise ToolEnvironmentError(
                f"npm ci of {PACKAGE} in {folder} failed (it needs the npm registry):\n"
                f"{(result.stderr + result.stdout)[-3000:]}"
            )
        with open(os.path.join(folder, _STAMP), "w") as f:
            f.write(wanted + "\n")
        return package


def write_page(task, export_dir, name, cache_dir=None, log=None):
    """Writes `export_dir/web/` where `export_dir/mediapipe/` holds a file that
    MediaPipe Tasks for Web runs; otherwise writes nothing. A `web/` there
    already is replaced if kbert wrote it (it holds `model.json`), refused if not.

    Args:
        task: the exported `Task`; its `Serving.on_device` kind says which file.
        export_dir: str. The export folder (or its work folder) with `mediapipe/` written.
        name: str. The model's name, the page's title.
        cache_dir: str. Where the npm install lives (`ensure_package`).
        log: callable taking one str; default: standard error.

    Returns:
        str or None. The page's folder, or None where no page is written:
        the task has no such file, or npm is missing or failed (logged).
    """
    from kbert.export import mediapipe
    from kbert.export.serving import serving_for
    from kbert.logs import to_stderr

    log = log or to_stderr

    files = {"text_classifier": mediapipe.MEDIAPIPE_FILE, "text_embedder": mediapipe.EMBEDDER_FILE}
    kind = serving_for(task).on_device
    if kind not in files or not os.path.isfile(os.path.join(export_dir, mediapipe.FOLDER, files[kind])):
        return None
    # The page is a demonstration beside verified artefacts: without npm, or
    # without the registry on a first run, the export goes on without it.
    if shutil.which("npm") is None:
        log(f"{FOLDER}/: skipped: npm not found; install Node.js and npm, then export again for the browser page")
        return None
    if not is_package_ready(cache_dir):
        log(f"{FOLDER}/: installing {PACKAGE} {package_version()} with npm ci in "
            f"{cache_dir or default_cache_dir()} (once; needs the npm registry)")
    try:
        package = ensure_package(cache_dir)
    except ToolEnvironmentError as error:
        log(f"{FOLDER}/: skipped: {str(error).splitlines()[0]}")
        return None
    threshold = None
    threshold_path = os.path.join(export_dir, mediapipe.FOLDER, mediapipe.THRESHOLD_FILE)
    if os.path.isfile(threshold_path):
        with open(threshold_path, encoding="utf-8") as f:
            threshold = float(f.read())
    config = {
        "name": name, "task": task.name, "kind": kind, "mediapipe": package_version(),
        "model": f"../{mediapipe.FOLDER}/{files[kind]}", "threshold": threshold,
    }
    out = os.path.join(export_dir, FOLDER)
    if os.path.lexists(out) and not os.path.isfile(os.path.join(out, CONFIG_FILE)):
        raise ValueError(f"{out} is in the way and kbert did not write it; move it aside")
    staging = tempfile.mkdtemp(prefix=".kbert-web-", dir=export_dir)
    try:
        for file_name in TEMPLATE_FILES:
            shutil.copyfile(os.path.join(TEMPLATE, file_name), os.path.join(staging, file_name))
        for file_name in PACKAGE_FILES:
            target = os.path.join(staging, PACKAGE_PATH, file_name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(os.path.join(package, file_name), target)
        write_file(os.path.join(staging, CONFIG_FILE), lambda f: json.dump(config, f, indent=1), mode="w",
                   encoding="utf-8")
        follow_umask(staging)
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"{FOLDER}/: a page that runs {mediapipe.FOLDER}/{files[kind]} in the browser "
        "(`kbert serve-web` on the export folder serves it)")
    return out


def served_folder(path):
    """The export folder whose page `kbert serve-web` serves: `path`, or the
    parent of `path` where `path` is the page's folder itself.

    Raises:
        ValueError: `path` holds no page, naming it and what was expected.
    """
    root = path
    if os.path.basename(os.path.normpath(path)) == FOLDER and os.path.isfile(os.path.join(path, CONFIG_FILE)):
        root = os.path.dirname(os.path.abspath(path))
    config_path = os.path.join(root, FOLDER, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise ValueError(
            f"{path} has no {FOLDER}/{CONFIG_FILE}; expected a folder that kbert export wrote for a task "
            "MediaPipe Tasks for Web runs (text classification, multi-label, sentence embedding)"
        )
    try:
        with open(config_path, encoding="utf-8") as f:
            model = json.load(f)["model"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{config_path}: unreadable ({error}); export the model again") from None
    if not os.path.isfile(os.path.join(root, FOLDER, model)):
        raise ValueError(f"{config_path} names {model}, which is not there; export the model again")
    return root


class _Handler(http.server.SimpleHTTPRequestHandler):
    """The standard library's file handler, with the page's MIME types; `quiet`
    leaves out its line per request on standard error."""

    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **MIME_TYPES}
    quiet = False

    def end_headers(self):
        # A page exported again is read afresh, not from the browser's cache.
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def log_message(self, format, *args):
        if not self.quiet:
            super().log_message(format, *args)


def serve(path, port=DEFAULT_PORT, quiet=False):
    """An HTTP server of the export folder at `path` on 127.0.0.1 (not started).

    Args:
        path: str. An export folder with `web/` (or that `web/` folder).
        port: int. 0: any free port.
        quiet: bool. No line per request on standard error.

    Returns:
        `http.server.ThreadingHTTPServer`; `page_url(server)` is the page's
        address; `server.serve_forever()` serves it.

    Example:
    >>> server = serve("saved_models/debian")  # doctest: +SKIP
    >>> print(page_url(server)); server.serve_forever()  # doctest: +SKIP
    """
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port={port!r}; expected an integer from 0 to 65535")
    root = served_folder(path)
    handler = type("Handler", (_Handler,), {"quiet": quiet})
    try:
        return http.server.ThreadingHTTPServer((HOST, port), functools.partial(handler, directory=root))
    except OSError as error:
        raise OSError(f"{HOST}:{port}: {error.strerror or error}; choose another port (0: any free one)") from None


def page_url(server):
    """The page's address on `server` (from `serve`)."""
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/{FOLDER}/"


def is_package_ready(cache_dir=None):
    """Whether `ensure_package` has installed the lock file's package already."""
    folder, package, wanted = _install_paths(cache_dir or default_cache_dir())
    try:
        with open(os.path.join(folder, _STAMP)) as f:
            return f.read().strip() == wanted and _has_files(package)
    except OSError:
        return False


def _install_paths(cache_dir):
    """(install folder, package folder in it, SHA-256 of the lock file it installs)."""
    folder = os.path.join(cache_dir, f"npm-mediapipe-tasks-text-{package_version()}")
    with open(os.path.join(TEMPLATE, "package-lock.json"), "rb") as f:
        wanted = hashlib.sha256(f.read()).hexdigest()
    return folder, os.path.join(folder, PACKAGE_PATH), wanted


def _has_files(package):
    return all(os.path.isfile(os.path.join(package, name)) for name in PACKAGE_FILES)
