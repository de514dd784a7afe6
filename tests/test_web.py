"""The page `kbert export` writes into OUT/web/, run by a real browser.

Playwright for Python drives Debian's Chromium (`/usr/bin/chromium`, headless;
no browser download) on `kbert serve-web`'s server. The reference is MediaPipe
in Python (0.10.21, the release the page's `@mediapipe/tasks-text` pins),
run on the same file in its own environment (`kbert.export.mediapipe_env`).
Every request the page makes that is not for 127.0.0.1 is aborted and fails
the test. The models are tiny and untrained (MiniLM's vocabulary): the
scores mean nothing, but they must be the same in both runtimes.
"""

import contextlib
import json
import os
import subprocess
import sys
import threading
import urllib.request
from urllib.parse import urlparse

import numpy as np
import pytest

from kbert.export import mediapipe, web
from kbert.export.mediapipe_env import MEDIAPIPE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBIAN_DEV = os.path.join(ROOT, "data", "debian-packages", "dev.csv")
CHROMIUM = "/usr/bin/chromium"
# The same model and MediaPipe release, run by wasm in the browser and by the
# native library in Python: float32 kernels that may sum in another order.
TOLERANCE = 1e-5
TEXTS = 20
SEQ_LEN = 32
TINY = dict(hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_position_embeddings=64)
DEBIAN_LABELS = ["admin", "database", "editors", "games", "graphics", "mail", "math", "net", "science", "sound",
                 "video", "web"]
# Not the default (0.5), so that the page must read the model's.
MULTI_LABEL_THRESHOLD = 0.6
# How long the page may take to load MediaPipe's wasm and the model, in ms.
LOAD_TIMEOUT_MS = 60_000


def export(model, out, data, *extra):
    """`kbert export --formats mediapipe` on the first TEXTS examples of `data`."""
    from kbert.cli import main

    argv = ["export", "--model", model, "--out", out, "--data", data, "--formats", "mediapipe",
            "--max-examples", str(TEXTS), "--latency-runs", "1", *extra]
    with contextlib.redirect_stdout(sys.stderr):
        assert main(argv) == 0
    return out


def export_tiny(root, task_name, data, **settings):
    """A tiny model of `task_name` with the 12 Debian labels, as `kbert finetune`
    writes one (untrained, its weights spread so that the texts' scores
    differ), exported with its MediaPipe file; `(export folder, data)`."""
    import keras

    from kbert import BertConfig
    from kbert.modelfolder import write_model_folder
    from kbert.tasks import TASKS
    from kbert.text import WordPieceTokenizer
    from tests.task_harness import minilm_vocabulary

    vocabulary = list(minilm_vocabulary())
    task = TASKS[task_name](WordPieceTokenizer(vocabulary), SEQ_LEN, labels=DEBIAN_LABELS, **settings)
    config = BertConfig(vocab_size=len(vocabulary), **TINY)
    keras.utils.set_random_seed(0)
    model = task.build_model(config)
    # Initial weights give every text nearly the same scores (1e-4 apart);
    # perturbed, the 20 texts' scores lie up to 0.17 apart.
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(variable.numpy() + rng.normal(0, 0.2, variable.shape).astype("float32"))
    kernel = model.get_layer("head").dense.kernel
    kernel.assign(rng.normal(0, 1, kernel.shape).astype("float32"))
    folder = str(root / "model")
    write_model_folder(folder, model, vocabulary, task, {"bert_config": config.to_dict(), "sequence_length": SEQ_LEN,
                                                         "lowercase": True}, metrics={})
    return export(folder, str(root / "debian"), data), data


@pytest.fixture(scope="module")
def classifier_export(tmp_path_factory):
    return export_tiny(tmp_path_factory.mktemp("web"), "text-classification", DEBIAN_DEV)


@pytest.fixture(scope="module")
def multi_label_export(tmp_path_factory):
    """The same with sigmoid scores, on the dev texts with their topic as their one label."""
    import csv

    root = tmp_path_factory.mktemp("web-multi-label")
    with open(DEBIAN_DEV, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))[:TEXTS]
    data = root / "dev.csv"
    with open(data, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerows([("text", "labels")] + [(row["text"], row["label"]) for row in rows])
    return export_tiny(root, "multi-label-classification", str(data), threshold=MULTI_LABEL_THRESHOLD)


@pytest.fixture(scope="module")
def embedder_export(tmp_path_factory):
    """A tiny sentence-transformers checkpoint exported as a sentence-embedding model."""
    from tests.test_sentence_embedding import stsb_subset, write_checkpoint

    root = tmp_path_factory.mktemp("web-embedder")
    data = stsb_subset(root / "stsb.tsv", TEXTS // 2)
    return export(write_checkpoint(root / "tiny"), str(root / "embedder"), data, "--task", "sentence-embedding"), data


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # As root, Chromium refuses to start with its sandbox.
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield launched
        launched.close()


@contextlib.contextmanager
def opened(browser, out):
    """The export's page in a new browser tab, served as `kbert serve-web` serves it,
    loaded; yields `(page, left)`, `left` the URLs the page asked for off 127.0.0.1."""
    server = web.serve(out, port=0, quiet=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    left, errors = [], []

    def route(request_route):
        if urlparse(request_route.request.url).hostname == web.HOST:
            request_route.continue_()
        else:
            left.append(request_route.request.url)
            request_route.abort()

    page = browser.new_page(viewport={"width": 900, "height": 700})
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.route("**/*", route)
        page.goto(web.page_url(server))
        page.wait_for_function(
            "() => /^(Ready|Could not)/.test(document.getElementById('status').textContent)",
            timeout=LOAD_TIMEOUT_MS,
        )
        assert page.text_content("#status").startswith("Ready"), (page.text_content("#status"), errors)
        yield page, left
        assert not errors, errors
    finally:
        page.close()
        server.shutdown()
        server.server_close()
        thread.join()


def classify_in_page(page, text):
    """Types `text`, presses Classify; the table's `{label: score}` (every digit)
    and the labels it shows in bold."""
    page.fill("#text", text)
    page.click("#classify")
    page.wait_for_function("text => document.getElementById('scores').dataset.text === text", arg=text)
    rows = page.eval_on_selector_all(
        "#scores tr", "rows => rows.map(r => [r.dataset.label, r.dataset.score, r.classList.contains('chosen')])"
    )
    return {label: float(score) for label, score, _ in rows}, {label for label, _, chosen in rows if chosen}


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["classifier_export", "multi_label_export"])
def test_classifier_page_gives_python_mediapipes_scores(exported, browser, request, tmp_path):
    """Softmax (one label, the top one chosen) and sigmoid scores (any labels, those at
    the model's threshold or above chosen)."""
    from kbert.tasks import TASKS

    out, data = request.getfixturevalue(exported)
    with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
        task = json.load(f)["task"]
    texts = [e.texts[0] for e in TASKS[task].read(data)[:TEXTS]]
    model = os.path.join(out, mediapipe.FOLDER, mediapipe.MEDIAPIPE_FILE)
    expected, _ = mediapipe.classify(model, texts, "mediapipe")
    with opened(browser, out) as (page, left):
        found = [classify_in_page(page, text) for text in texts]
        page.fill("#text", "a mail client for the terminal")
        page.click("#classify")
        shot = tmp_path / "web-demo.png"
        page.screenshot(path=str(shot), full_page=True)
    assert not left, left
    assert all(sorted(scores) == DEBIAN_LABELS for scores, _ in found)
    in_page = np.array([[scores[label] for label in DEBIAN_LABELS] for scores, _ in found])
    assert np.abs(in_page - expected).max() <= TOLERANCE
    # The texts' scores differ by far more than the tolerance: a page that
    # showed another text's scores would fail.
    assert np.abs(expected[1:] - expected[:-1]).max() > 1000 * TOLERANCE
    labels = np.array(DEBIAN_LABELS)
    if task == "multi-label-classification":
        chosen = [set(labels[row >= MULTI_LABEL_THRESHOLD]) for row in expected]
        assert 0 < sum(map(len, chosen)) < expected.size  # some labels chosen, some not
    else:
        chosen = [{labels[row.argmax()]} for row in expected]
    assert [bold for _, bold in found] == chosen
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_embedder_page_gives_python_mediapipes_cosine(embedder_export, browser):
    from kbert.tasks import TASKS

    out, data = embedder_export
    pairs = [e.texts for e in TASKS["sentence-embedding"].read(data)]
    model = os.path.join(out, mediapipe.FOLDER, mediapipe.EMBEDDER_FILE)
    vectors, _ = mediapipe.embed(model, [text for pair in pairs for text in pair])
    vectors = vectors.astype("float64").reshape(len(pairs), 2, -1)
    expected = np.sum(vectors[:, 0] * vectors[:, 1], -1) / np.prod(np.linalg.norm(vectors, axis=-1), -1)
    found = []
    with opened(browser, out) as (page, left):
        for first, second in pairs:
            page.fill("#text-a", first)
            page.fill("#text-b", second)
            page.click("#compare")
            page.wait_for_function(
                "pair => document.getElementById('similarity').dataset.texts === JSON.stringify(pair)",
                arg=[first, second],
            )
            found.append(float(page.get_attribute("#similarity", "data-cosine")))
        assert not left, left
        # The guard itself: a request off 127.0.0.1 is stopped and recorded.
        page.evaluate("() => fetch('https://example.com/ping').catch(() => null)")
    assert left == ["https://example.com/ping"]
    assert len(found) == TEXTS // 2
    assert np.abs(np.array(found) - expected).max() <= TOLERANCE
    assert np.ptp(expected) > 100 * TOLERANCE  # pairs apart: a stale cosine would show


@pytest.mark.slow
def test_server_gives_the_page_s_files_their_mime_types(classifier_export):
    out, _ = classifier_export
    server = web.serve(os.path.join(out, web.FOLDER), port=0, quiet=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert server.server_address[0] == "127.0.0.1"
        url = web.page_url(server)
        types = {}
        for path in ["", "app.mjs", "model.json", f"{web.PACKAGE_PATH}/wasm/text_wasm_internal.wasm",
                     f"../{mediapipe.FOLDER}/{mediapipe.MEDIAPIPE_FILE}"]:
            with urllib.request.urlopen(url + path) as response:
                types[path] = response.headers["Content-Type"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert types[""].startswith("text/html")
    assert types["app.mjs"] == "text/javascript"
    assert types[f"{web.PACKAGE_PATH}/wasm/text_wasm_internal.wasm"] == "application/wasm"
    with open(os.path.join(out, web.FOLDER, web.CONFIG_FILE), encoding="utf-8") as f:
        config = json.load(f)
    assert config == {
        "name": "debian", "task": "text-classification", "kind": "text_classifier", "mediapipe": "0.10.21",
        "model": f"../{mediapipe.FOLDER}/{mediapipe.MEDIAPIPE_FILE}", "threshold": None,
    }


# === Without a browser ===


def test_the_page_pins_mediapipe_tasks_text_at_0_10_21():
    """1.0.x sends usage metrics to a remote endpoint; 0.10.21 is the release of
    kbert's Python and Android runtimes."""
    with open(os.path.join(web.TEMPLATE, "package-lock.json"), encoding="utf-8") as f:
        lock = json.load(f)
    assert web.package_version() == "0.10.21"
    locked = lock["packages"][f"node_modules/{web.PACKAGE}"]
    assert locked["version"] == "0.10.21" and locked["integrity"].startswith("sha512-")
    assert lock["packages"][""]["dependencies"] == {web.PACKAGE: "0.10.21"}
    assert MEDIAPIPE.packages == (f"mediapipe=={web.package_version()}",)  # the Python check's release
    # Only the package: nothing else is installed or copied.
    assert [path for path in lock["packages"] if path] == [f"node_modules/{web.PACKAGE}"]


def test_no_page_without_a_mediapipe_text_file(tmp_path):
    from kbert.tasks import TASKS
    from kbert.text import WordPieceTokenizer
    from tests.task_harness import minilm_vocabulary

    task = TASKS["text-classification"](WordPieceTokenizer(list(minilm_vocabulary())), SEQ_LEN, labels=["a", "b"])
    (tmp_path / "onnx").mkdir()
    assert web.write_page(task, str(tmp_path), "debian", log=pytest.fail) is None
    assert sorted(os.listdir(tmp_path)) == ["onnx"]


def test_serve_web_refuses_a_folder_without_a_page(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kbert.cli", "serve-web", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"kbert: error: {tmp_path} has no web/model.json; expected a folder that kbert export wrote for a "
        "task MediaPipe Tasks for Web runs (text classification, multi-label, sentence embedding)\n"
    )
