"""Names and defaults of `kbert export`, importable without TensorFlow (for `--help`)."""

import json
import os

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
