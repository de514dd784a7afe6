"""The Android app in mobile/android, as far as it can be checked without building it.

The app cannot be built here (no Android SDK); these tests hold together what
the Python side and the Kotlin side must agree on: asset names and folder, the
labels file, the MediaPipe version and the build settings.
"""

import io
import os
import re
import stat
import zipfile

import pytest

from tests.task_harness import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANDROID = os.path.join(ROOT, "mobile", "android")
APP = os.path.join(ANDROID, "app")
MAIN_ACTIVITY = os.path.join(APP, "src", "main", "java", "org", "kbert", "classifier", "MainActivity.kt")


copy_tool = load_tool("copy_model_to_app", folder="mobile")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def kotlin_constant(name):
    match = re.search(rf'const val {name} = "([^"]+)"', read(MAIN_ACTIVITY))
    assert match, f"MainActivity.kt defines no {name}"
    return match.group(1)


def fake_model(path, labels, vocab=("[PAD]", "[UNK]", "[CLS]", "[SEP]")):
    """Bytes standing in for a flatbuffer, then the zip MediaPipe's populator appends."""
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr("vocab.txt", "".join(t + "\n" for t in vocab))
        archive.writestr("labels.txt", "".join(t + "\n" for t in labels))
    with open(path, "wb") as f:
        f.write(b"TFL3" + bytes(60) + packed.getvalue())


def test_kotlin_asset_names_are_where_the_tool_copies():
    assert kotlin_constant("MODEL_ASSET") == copy_tool.MODEL_FILE
    assert kotlin_constant("LABELS_ASSET") == copy_tool.LABELS_FILE
    assert kotlin_constant("THRESHOLD_ASSET") == copy_tool.THRESHOLD_FILE
    # Android packs src/main/assets into the APK; setModelAssetPath names a file there.
    assert copy_tool.APP_ASSETS == os.path.join(APP, "src", "main", "assets")


def test_tool_names_match_the_exporter():
    from kbert.export import mediapipe

    assert copy_tool.MODEL_FILE == mediapipe.MEDIAPIPE_FILE
    assert copy_tool.LABELS_FILE == mediapipe.LABELS_FILE
    assert copy_tool.PACKED_LABELS == copy_tool.LABELS_FILE
    assert copy_tool.THRESHOLD_FILE == mediapipe.THRESHOLD_FILE


def test_gradle_build_settings():
    app = read(os.path.join(APP, "build.gradle.kts"))
    assert re.search(r"\bminSdk = 24\b", app)
    assert 'noCompress += "tflite"' in app
    assert 'id("org.jetbrains.kotlin.android")' in app
    assert ':app' in read(os.path.join(ANDROID, "settings.gradle.kts"))
    groovy = [f for _, _, files in os.walk(ANDROID) for f in files if f.endswith(".gradle")]
    assert groovy == [], "the project uses the Kotlin DSL only"


def test_app_uses_the_mediapipe_version_the_python_side_checks_with():
    from kbert.export.mediapipe_env import MEDIAPIPE

    (pinned,) = MEDIAPIPE.packages
    version = pinned.split("==")[1]
    app = read(os.path.join(APP, "build.gradle.kts"))
    assert f'implementation("com.google.mediapipe:tasks-text:{version}")' in app


def test_layout_has_the_views_the_activity_finds():
    layout = read(os.path.join(APP, "src", "main", "res", "layout", "activity_main.xml"))
    ids = set(re.findall(r'android:id="@\+id/(\w+)"', layout))
    used = set(re.findall(r"R\.id\.(\w+)", read(MAIN_ACTIVITY)))
    assert used and used <= ids


def test_copy_puts_model_and_labels_into_assets(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    labels = ["admin", "games", "net"]
    fake_model(export / copy_tool.MODEL_FILE, labels)
    (export / copy_tool.LABELS_FILE).write_text("admin\ngames\nnet\n")
    assets = tmp_path / "assets"
    copies = copy_tool.copy_model_to_app(str(export), str(assets))
    assert sorted(os.listdir(assets)) == sorted([copy_tool.MODEL_FILE, copy_tool.LABELS_FILE, copy_tool.THRESHOLD_FILE])
    assert copy_tool.packed_files(copies["model"])["labels.txt"] == labels
    assert read(copies["labels"]).splitlines() == labels
    assert read(copies["threshold"]) == "none\n"  # one label a text
    # A multi-label export's threshold replaces it; a file that holds no probability is refused.
    (export / copy_tool.THRESHOLD_FILE).write_text("0.37\n")
    assert read(copy_tool.copy_model_to_app(str(export), str(assets))["threshold"]) == "0.37\n"
    (export / copy_tool.THRESHOLD_FILE).write_text("high\n")
    with pytest.raises(ValueError, match=r"threshold\.txt holds 'high'; expected a probability between 0 and 1"):
        copy_tool.copy_model_to_app(str(export), str(assets))
    assert read(os.path.join(assets, copy_tool.THRESHOLD_FILE)) == "0.37\n"


def test_copies_follow_the_umask(tmp_path):
    """The copies were 0600 (a temporary file's mode), whatever the umask."""
    export = tmp_path / "export"
    export.mkdir()
    fake_model(export / copy_tool.MODEL_FILE, ["a", "b"])
    (export / copy_tool.LABELS_FILE).write_text("a\nb\n")
    previous = os.umask(0o027)
    try:
        copies = copy_tool.copy_model_to_app(str(export), str(tmp_path / "assets"))
    finally:
        os.umask(previous)
    assert {name: stat.S_IMODE(os.stat(path).st_mode) for name, path in copies.items()} == {
        "model": 0o640, "labels": 0o640, "threshold": 0o640}
    assert sorted(os.listdir(tmp_path / "assets")) == sorted(
        [copy_tool.MODEL_FILE, copy_tool.LABELS_FILE, copy_tool.THRESHOLD_FILE])


def test_copy_refuses_labels_that_differ_from_the_model(tmp_path):
    fake_model(tmp_path / copy_tool.MODEL_FILE, ["admin", "games", "net"])
    (tmp_path / copy_tool.LABELS_FILE).write_text("games\nadmin\nnet\n")
    with pytest.raises(ValueError, match="was written with"):
        copy_tool.copy_model_to_app(str(tmp_path), str(tmp_path / "assets"))
    assert not (tmp_path / "assets").exists()


def test_copy_refuses_a_model_without_metadata(tmp_path):
    (tmp_path / copy_tool.MODEL_FILE).write_bytes(b"TFL3" + bytes(60))
    (tmp_path / copy_tool.LABELS_FILE).write_text("a\nb\n")
    with pytest.raises(ValueError, match="no MediaPipe metadata"):
        copy_tool.copy_model_to_app(str(tmp_path), str(tmp_path / "assets"))


def test_copy_cli_reports_a_missing_export(tmp_path):
    with pytest.raises(SystemExit, match="kbert export --formats mediapipe first"):
        copy_tool.main([str(tmp_path / "nothing"), "--assets", str(tmp_path / "assets")])
