"""Figures that hold each exported artefact to the Keras model, and the report.

Every artefact is run on the same verification texts as the Keras model and
judged by `judge`: a float32 artefact must give the Keras model's scores
within `FLOAT_TOLERANCE`; a quantized one may lose at most its
`ACCURACY_BUDGETS` entry in dev accuracy.
"""

import json
import statistics
import time

import numpy as np

from kbert.export.options import DEFAULT_LATENCY_RUNS
from kbert.training.finetune import classification_metrics

# Float32 artefacts compute what the Keras model computes, in another order:
# scores agree to ~1e-6; 1e-4 flags a wrong op, not rounding.
FLOAT_TOLERANCE = 1e-4
# Points of dev accuracy a quantized artefact may lose against the Keras model
# (the budgets). ONNX's dynamic int8 counts as "dynamic".
ACCURACY_BUDGETS = {"fp16": 0.1, "dynamic": 0.5, "int8": 0.5, "16x8": 0.5}
WARMUP_RUNS = 5


def softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)


def compare(scores, reference, label_ids, label_names):
    """Agreement of `scores` with the Keras model's, and dev accuracy and macro-F1.

    Args:
        scores, reference: float `(n, classes)` class probabilities.
        label_ids: int `(n,)` true classes.
        label_names: list of str.
    """
    scores, reference = np.asarray(scores), np.asarray(reference)
    predicted = scores.argmax(axis=-1)
    metrics = classification_metrics(label_ids, predicted, label_names)
    return {
        "max_abs_diff": float(np.abs(scores - reference).max()),
        "top1_agreement": float(np.mean(predicted == reference.argmax(axis=-1))),
        "accuracy": metrics["accuracy"],
        "macro_f1": metrics["macro_f1"],
    }


def measure_latency(call, runs=DEFAULT_LATENCY_RUNS, warmup=WARMUP_RUNS):
    """Median and 90th percentile wall time of `call()` in milliseconds."""
    if runs < 1:
        raise ValueError(f"runs={runs}; expected at least 1")
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return {
        "median_ms": round(statistics.median(times), 3),
        "p90_ms": round(times[min(len(times) - 1, int(0.9 * len(times)))], 3),
        "runs": runs,
    }


def judge(entry, keras_accuracy):
    """Sets `entry["budget"]` and `entry["passed"]` from its figures."""
    quantization = entry["quantization"]
    if quantization == "none":
        entry["budget"] = f"max_abs_diff <= {FLOAT_TOLERANCE:g}"
        entry["passed"] = entry["max_abs_diff"] <= FLOAT_TOLERANCE
    else:
        budget = ACCURACY_BUDGETS[quantization]
        drop = 100.0 * (keras_accuracy - entry["accuracy"])
        entry["accuracy_drop_points"] = round(drop, 3)
        entry["budget"] = f"accuracy drop <= {budget:g} points"
        entry["passed"] = drop <= budget + 1e-9
    return entry


# === Report ===

_COLUMNS = (
    ("artefact", lambda e: f"`{e['path']}`"),
    ("format", lambda e: e["format"]),
    ("quantization", lambda e: e["quantization"]),
    ("input", lambda e: e["input"]),
    ("max abs diff", lambda e: f"{e['max_abs_diff']:.2e}"),
    ("top-1 agree", lambda e: f"{100 * e['top1_agreement']:.2f}%"),
    ("accuracy", lambda e: f"{100 * e['accuracy']:.2f}%"),
    ("macro-F1", lambda e: f"{100 * e['macro_f1']:.2f}"),
    ("size", lambda e: _megabytes(e["size_bytes"])),
    ("latency", lambda e: f"{e['latency']['median_ms']:.2f} ms"),
    ("budget", lambda e: e["budget"]),
    ("ok", lambda e: "yes" if e["passed"] else "**NO**"),
)


def _megabytes(size):
    return f"{size / 2**20:.1f} MiB"


def _as_trained(figures):
    """The sentence on a mixed-precision model's own figures, if it has them."""
    if not figures:
        return "."
    return (
        f" in float32; as trained ({figures['compute_dtype']} compute): accuracy "
        f"{100 * figures['accuracy']:.2f}%, top-1 agreement with float32 "
        f"{100 * figures['top1_agreement']:.2f}%, max abs diff {figures['max_abs_diff']:.2e}."
    )


def markdown_report(report):
    """The report as a Markdown table with a heading line of context."""
    keras_figures = report["keras"]
    lines = [
        f"# Export of `{report['model']}`",
        "",
        f"Verified on {report['examples']} texts of `{report['data']}` at sequence length "
        f"{report['sequence_length']}; latency is batch 1, median of "
        f"{report['latency_runs']} runs on {report['threads']} threads. Keras model: "
        f"accuracy {100 * keras_figures['accuracy']:.2f}%, macro-F1 "
        f"{100 * keras_figures['macro_f1']:.2f}, {keras_figures['latency']['median_ms']:.2f} ms"
        + _as_trained(keras_figures.get("as_trained")),
        "",
        "| " + " | ".join(name for name, _ in _COLUMNS) + " |",
        "| " + " | ".join("---" for _ in _COLUMNS) + " |",
    ]
    for entry in report["artefacts"]:
        lines.append("| " + " | ".join(cell(entry) for _, cell in _COLUMNS) + " |")
    if report.get("onnx_fusions"):
        fusions = ", ".join(f"{op} {count}" for op, count in sorted(report["onnx_fusions"].items()))
        lines += ["", f"onnxruntime fusions: {fusions}."]
    lines += ["", "All artefacts within budget." if report["passed"] else "Some artefacts exceed their budget."]
    return "\n".join(lines) + "\n"


def write_report(report, json_path, markdown_path):
    with open(json_path, "w") as f:
        json.dump(report, f, indent=2)
    markdown = markdown_report(report)
    with open(markdown_path, "w") as f:
        f.write(markdown)
    return markdown
