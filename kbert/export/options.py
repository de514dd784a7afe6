"""Names and defaults of `kbert export`, importable without TensorFlow (for `--help`)."""

import json
import os

from kbert.fileio import check_distinct, check_output_folder

FORMATS = ("savedmodel", "tflite", "onnx", "mediapipe", "huggingface", "keras-hub")
QUANTIZATIONS = ("none", "fp16", "dynamic", "int8", "16x8")
# `--quantize` by name. "recommended" (the default) is what the docs tell a user
# to ship: float32 files, and int8 ones (dynamic, and full int8 where the task
# has a budget for it); it leaves out fp16 (no faster than float32 on CPUs),
# 16x8 (LiteRT has reference kernels only for it: ~50x slower than dynamic to
# verify) and the string-in TFLite variant. "all" is every quantization
# and the string-in variant.
RECOMMENDED = "recommended"
ALL = "all"
RECOMMENDED_QUANTIZATIONS = ("none", "dynamic", "int8")
# Which quantizations each format has; ONNX's int8 is dynamic quantization
# (`onnxruntime.quantization.quantize_dynamic`).
SUPPORTED = {
    "savedmodel": ("none",),
    "tflite": QUANTIZATIONS,
    "onnx": ("none", "dynamic"),
    "mediapipe": ("none",),
    "huggingface": ("none",),
    "keras-hub": ("none",),
}
# The formats every task exports to; "mediapipe" only for tasks that name
# the MediaPipe task that runs them (`Serving.on_device`).
COMMON_FORMATS = ("savedmodel", "tflite", "onnx")
# Formats made only when `--formats` names them: a transformers folder
# (`kbert.export.huggingface`) is verified by transformers on PyTorch, which
# kbert does not install; a keras-hub preset (`kbert.export.keras_hub_preset`)
# is for keras-hub users, who ask for it.
ON_REQUEST = ("huggingface", "keras-hub")
REPORT_FILE = "report.json"
# The SavedModel's vocabulary asset and TF Serving's model config, beside `1/`.
VOCAB_ASSET = "vocab.txt"
MODELS_CONFIG = "models.config"
# What an export folder written before manifests holds: kbert's own names
# (`kbert.fileio.foreign_entries`; a sub-folder counts whole).
EXPORT_FOLDER_NAMES = (
    "1", MODELS_CONFIG, "tflite", "onnx", "mediapipe", "huggingface", "keras-hub", "web", VOCAB_ASSET, "labels.txt",
    "rest_example.json", "rest_example.md", REPORT_FILE, "report.md",
)
# The quantizations calibrated on example inputs (training texts).
CALIBRATED = ("int8", "16x8")
# Static int8 and 16x8 ranges come from this many calibration texts; on
# MiniLM, 300 gave no better int8 accuracy than 100 (and took three times as
# long to calibrate).
DEFAULT_CALIBRATION_EXAMPLES = 100
# Verification examples read from --data unless --max-examples says otherwise:
# enough for the budgets to mean something (a point of accuracy is 5
# examples), few enough that a dev set of thousands does not set the export's
# length. Every float32 file is still held to the Keras model row by row.
DEFAULT_MAX_EXAMPLES = 500
# Latency: batch 1, median of this many runs after the warm-up ones. On the
# project's shared 2-core machines, repeated medians of 20 runs spread no
# wider than medians of 50 (the machine's load moves them, not the count).
DEFAULT_LATENCY_RUNS = 20
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


def parse_quantizations(value):
    """`--quantize` -> `(quantizations, text_variant)`: the parsed names, and whether
    the string-in TFLite variant is written (any list with "none", or "all"; not
    "recommended").

    Example:
    >>> parse_quantizations("recommended")
    (('none', 'dynamic', 'int8'), False)
    >>> parse_quantizations("dynamic,none")
    (('none', 'dynamic'), True)
    """
    name = value.strip() if isinstance(value, str) else None
    if value is None or name == RECOMMENDED:
        return RECOMMENDED_QUANTIZATIONS, False
    if name == ALL:
        return QUANTIZATIONS, True
    names = parse_names(value, QUANTIZATIONS + (ALL, RECOMMENDED), "quantization")
    if ALL in names or RECOMMENDED in names:
        raise ValueError(f"quantizations={value!r}; {ALL!r} and {RECOMMENDED!r} stand alone, not in a list")
    return names, "none" in names


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


def check_export(model, out, data, calibration=None, formats=None, quantizations=None, overwrite=False):
    """Refuses an export that no model could make: an unknown format or
    quantization, or an `out` kbert may not write. Cheap: loads nothing.

    Returns:
        `(quantizations, text_variant)`, parsed (`parse_quantizations`).
    """
    if formats:
        parse_names(formats, FORMATS, "format")
    quantizations = parse_quantizations(quantizations)
    name = os.path.basename(os.path.normpath(out))
    if not name or name in (".", ".."):
        raise ValueError(f"out={out!r}; expected a folder path whose base name names the model")
    check_distinct({"--out": out}, {"--model": model, "--data": data, "--calibration": calibration})
    check_output_folder(out, "export", is_export_folder, overwrite, EXPORT_FOLDER_NAMES)
    return quantizations
