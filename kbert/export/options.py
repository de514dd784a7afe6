"""Names and defaults of `kbert export`, importable without TensorFlow (for `--help`)."""

import json
import os

from kbert.fileio import check_distinct, check_output_folder

FORMATS = ("savedmodel", "tflite", "onnx", "mediapipe")
QUANTIZATIONS = ("none", "fp16", "dynamic", "int8", "16x8")
# Which quantizations each format has; ONNX's int8 is dynamic quantization
# (`onnxruntime.quantization.quantize_dynamic`).
SUPPORTED = {
    "savedmodel": ("none",),
    "tflite": QUANTIZATIONS,
    "onnx": ("none", "dynamic"),
    "mediapipe": ("none",),
}
# The formats every task exports to; "mediapipe" only for tasks that name
# the MediaPipe task that runs them (`Serving.on_device`).
COMMON_FORMATS = ("savedmodel", "tflite", "onnx")
REPORT_FILE = "report.json"
# The SavedModel's vocabulary asset and TF Serving's model config, beside `1/`.
VOCAB_ASSET = "vocab.txt"
MODELS_CONFIG = "models.config"
# What an export folder written before manifests holds: kbert's own names
# (`kbert.fileio.foreign_entries`; a sub-folder counts whole).
EXPORT_FOLDER_NAMES = (
    "1", MODELS_CONFIG, "tflite", "onnx", "mediapipe", VOCAB_ASSET, "labels.txt",
    "rest_example.json", "rest_example.md", REPORT_FILE, "report.md",
)
# The quantizations calibrated on example inputs (training texts).
CALIBRATED = ("int8", "16x8")
# Static int8 and 16x8 ranges come from this many calibration texts; on
# MiniLM, 300 gave no better int8 accuracy than 100 (and took three times as
# long to calibrate).
DEFAULT_CALIBRATION_EXAMPLES = 100
# Latency: batch 1, median of at least this many runs after the warm-up ones.
DEFAULT_LATENCY_RUNS = 50
# The machines this project runs on have 2 cores; every runtime gets as many.
DEFAULT_THREADS = 2


def parse_names(value, known, what):
    """A comma-separated string or a sequence -> validated tuple, in `known` order.

    Example:
    >>> parse_names("onnx,savedmodel", FORMATS, "format")
    ('savedmodel', 'onnx')
    """
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else list(value)
    names = [n for n in names if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown[0]!r}; expected some of {', '.join(known)}")
    if not names:
        raise ValueError(f"no {what} given; expected some of {', '.join(known)}")
    return tuple(n for n in known if n in names)


def task_formats(task):
    """The formats `task` (a task or a task class) exports to, in `FORMATS` order."""
    from kbert.export.serving import serving_class

    on_device = serving_class(task if isinstance(task, type) else type(task)).on_device
    return tuple(f for f in FORMATS if f in COMMON_FORMATS or (f == "mediapipe" and on_device))


def is_export_folder(path):
    """Whether `path` is an export folder that `kbert export` wrote."""
    try:
        with open(os.path.join(path, REPORT_FILE), encoding="utf-8") as f:
            return "artefacts" in json.load(f)
    except (OSError, ValueError):
        return False


def check_export(model, out, data, calibration=None, formats=None, quantizations=QUANTIZATIONS, overwrite=False):
    """Refuses an export that no model could make: an unknown format or
    quantization, or an `out` kbert may not write. Cheap: loads nothing.

    Returns:
        tuple. The quantizations, parsed (`parse_names`).
    """
    if formats:
        parse_names(formats, FORMATS, "format")
    quantizations = parse_names(quantizations, QUANTIZATIONS, "quantization")
    name = os.path.basename(os.path.normpath(out))
    if not name or name in (".", ".."):
        raise ValueError(f"out={out!r}; expected a folder path whose base name names the model")
    check_distinct({"--out": out}, {"--model": model, "--data": data, "--calibration": calibration})
    check_output_folder(out, "export", is_export_folder, overwrite, EXPORT_FOLDER_NAMES)
    return quantizations
