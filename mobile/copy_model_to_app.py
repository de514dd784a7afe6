"""Copies an exported MediaPipe model and its labels into the Android app's assets.

    kbert export --model runs/debian-minilm --out saved_models/debian \
        --data data/debian-packages/dev.csv --formats mediapipe
    python mobile/copy_model_to_app.py saved_models/debian

The app (`mobile/android`) loads `text_classifier.tflite` and `labels.txt` from
its assets; `MainActivity.kt` names the same files. Before copying, the labels
file is checked against the labels packed in the model's metadata, so the app
never shows one model's scores under another model's labels. The standard
library and kbert's file writing only (`kbert.fileio`: each copy written
aside, renamed, with the user's umask): no TensorFlow needed.
"""

import argparse
import os
import shutil
import sys
import zipfile

from kbert.fileio import write_file, written_aside

MODEL_FILE = "text_classifier.tflite"
LABELS_FILE = "labels.txt"
# A multi-label classifier's threshold (`kbert export` writes it); the app reads
# "none" as one label a text, the likeliest.
THRESHOLD_FILE = "threshold.txt"
ONE_LABEL = "none\n"
# The associated files MediaPipe's metadata writer packs into the model.
PACKED_VOCAB = "vocab.txt"
PACKED_LABELS = "labels.txt"
# Where `kbert export` puts the MediaPipe files inside an export folder.
MEDIAPIPE_FOLDER = "mediapipe"
APP_ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "android", "app", "src", "main", "assets")


def copy_model_to_app(export_folder, assets=APP_ASSETS):
    """Copies `MODEL_FILE` and `LABELS_FILE` from `export_folder` into `assets`.

    `export_folder` is a `kbert export` folder (the files are in its
    `mediapipe/`) or that `mediapipe/` folder itself.

    Returns:
        dict. `{"model": path, "labels": path, "threshold": path}` of the copies;
        the threshold file holds a multi-label classifier's threshold, else "none".

    Raises:
        ValueError: a file is missing, the model carries no MediaPipe metadata
            (no packed vocabulary or labels), or `labels.txt` differs from the
            model's packed labels.
    """
    if os.path.isdir(os.path.join(export_folder, MEDIAPIPE_FOLDER)):
        export_folder = os.path.join(export_folder, MEDIAPIPE_FOLDER)
    model = os.path.join(export_folder, MODEL_FILE)
    labels = os.path.join(export_folder, LABELS_FILE)
    for path in (model, labels):
        if not os.path.isfile(path):
            raise ValueError(f"{path}: no such file; run kbert export --formats mediapipe first")
    packed = packed_files(model)
    missing = [name for name in (PACKED_VOCAB, PACKED_LABELS) if name not in packed]
    if missing:
        raise ValueError(
            f"{model} packs no {', '.join(missing)}: it has no MediaPipe metadata"
        )
    with open(labels, encoding="utf-8") as f:
        label_lines = f.read().splitlines()
    if label_lines != packed[PACKED_LABELS]:
        raise ValueError(
            f"{labels} lists {label_lines}, but {model} was written with "
            f"{packed[PACKED_LABELS]}"
        )
    threshold = _threshold(os.path.join(export_folder, THRESHOLD_FILE))
    os.makedirs(assets, exist_ok=True)
    copies = {name: os.path.join(assets, file) for name, file in
              (("model", MODEL_FILE), ("labels", LABELS_FILE), ("threshold", THRESHOLD_FILE))}
    _copy_atomically(model, copies["model"])
    _copy_atomically(labels, copies["labels"])
    # Written for every model, so that one copied before never leaves its threshold behind.
    write_file(copies["threshold"], lambda f: f.write(threshold), "w", encoding="utf-8")
    return copies


def _threshold(path):
    """The threshold file's text for the app: the export's, or `ONE_LABEL`; `ValueError` for
    one that does not hold a probability."""
    if not os.path.isfile(path):
        return ONE_LABEL
    with open(path, encoding="utf-8") as f:
        text = f.read().strip()
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < 1:
        raise ValueError(f"{path} holds {text[:40]!r}; expected a probability between 0 and 1")
    return f"{text}\n"


def packed_files(model):
    """The text files packed in a `.tflite`'s metadata, as lists of lines.

    MediaPipe's metadata populator appends them to the flatbuffer as a zip
    archive, which `zipfile` reads in place.
    """
    try:
        with zipfile.ZipFile(model) as archive:
            return {
                name: archive.read(name).decode("utf-8").splitlines() for name in archive.namelist()
            }
    except zipfile.BadZipFile:
        return {}


def _copy_atomically(source, destination):
    with written_aside(destination) as tmp:
        shutil.copyfile(source, tmp)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export_folder", help="a kbert export folder (kbert export --formats mediapipe)")
    parser.add_argument("--assets", default=APP_ASSETS, help="the app's assets folder")
    args = parser.parse_args(argv)
    try:
        copies = copy_model_to_app(args.export_folder, args.assets)
    except ValueError as error:
        sys.exit(f"copy_model_to_app: error: {error}")
    for path in copies.values():
        print(f"{path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
