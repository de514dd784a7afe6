"""Latency, and the report that holds each exported artefact to the Keras model.

What an artefact must reproduce, and how much a quantized one may lose, is
the task's to say (`Serving.agreement`, `Serving.judge`, `kbert.export.serving`); this module times the
artefacts, has the task judge each against the Keras model (`KerasReference`),
and writes `report.json` and `report.md`. `machine()` names the machine a
timing came from, for this report and for every benchmark in tools/benchmarks/.
"""

import dataclasses
import json
import os
import platform
import statistics
import time

import numpy as np

from kbert.export.options import DEFAULT_LATENCY_RUNS
from kbert.export.serving import serving_for
from kbert.hardware import cpu_bfloat16, cpuinfo_field

WARMUP_RUNS = 5


def load_average():
    """The 1, 5 and 15 minute load averages, or None where the system keeps none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine():
    """The machine timings are taken on, for a report: CPU, whether it multiplies bfloat16
    natively, cores, system, Python, load now."""
    return {
        "cpu": cpuinfo_field("model name") or platform.processor() or platform.machine(),
        "cpu_bfloat16": cpu_bfloat16(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": load_average(),
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


def interleaved_latency(calls, runs, warmup=WARMUP_RUNS):
    """Batch-1 timings of several callables, interleaved: each round calls every one once.

    A burst of load on a shared machine then hits every callable alike,
    which sequential timing (`measure_latency` on each in turn) does not.

    Args:
        calls: dict of name -> callable taking no arguments.
        runs: int. Timed rounds.
        warmup: int. Untimed calls of each callable first.

    Returns:
        dict of name -> median, min and max milliseconds and the run count.
    """
    if runs < 1:
        raise ValueError(f"runs={runs}; expected at least 1")
    for call in calls.values():
        for _ in range(warmup):
            call()
    times = {name: [] for name in calls}
    for _ in range(runs):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {
        name: {
            "median_ms": round(statistics.median(values), 3),
            "min_ms": round(min(values), 3),
            "max_ms": round(max(values), 3),
            "runs": len(values),
        }
        for name, values in times.items()
    }


# === Judging ===


@dataclasses.dataclass
class KerasReference:
    """The float32 Keras model on an export's examples, which every artefact is held to.

    `outputs` and `predictions` are the model's on `examples` (`encoded`,
    `one` its first row); `keras` is its report entry, filled by the exporter.
    `artefact` and `judge` turn an artefact's outputs into its report entry,
    judged by the task (`Serving.agreement`, `Serving.judge`, `kbert.export.serving`), and log a line.
    Paths in entries are relative to `staging`, the export folder.
    """

    task: object
    examples: list
    encoded: object
    one: dict
    outputs: dict
    predictions: list
    staging: str
    latency_runs: int
    tf_threads: int
    log: object
    keras: dict = dataclasses.field(default_factory=dict)

    @property
    def features(self):
        return self.encoded.features

    def figures(self, outputs=None, predictions=None):
        """The task's summary figures of `predictions` (or of `outputs`, decoded)."""
        if predictions is None:
            predictions = self.task.decode(self.examples, self.encoded, outputs)
        metrics = self.task.evaluate(self.examples, predictions)
        return {k: v for k, v in self.task.summary(metrics).items() if k != "n"}

    def judged(self, outputs=None, predictions=None):
        """The task's figures and how the predictions agree with the Keras model's."""
        if predictions is None:
            predictions = self.task.decode(self.examples, self.encoded, outputs)
        return {**self.figures(predictions=predictions), **serving_for(self.task).prediction_agreement(predictions, self.predictions)}

    def artefact(self, path, fmt, quantization, input_kind, outputs, latency, **extra):
        """The judged report entry of the artefact at `path` whose outputs are `outputs`."""
        return self.judge({
            "path": os.path.relpath(path, self.staging),
            "format": fmt,
            "quantization": quantization,
            "input": input_kind,
            **serving_for(self.task).agreement(outputs, self.outputs),
            **self.judged(outputs),
            "latency": latency,
            "non_finite": self.non_finite(outputs),
            **extra,
        })

    def non_finite(self, outputs):
        """Where an artefact's numeric `outputs` hold NaN or infinity, or None where nowhere.

        Args:
            outputs: dict of arrays whose rows are the encoded rows, the examples,
                or the examples' texts (the same number each), in order.

        Returns:
            None, or dict: `output` (the first output name that has them), `rows`
            (its rows that have them) and `first_example` (the example of the
            first such row, by id or line).
        """
        rows_of = self.encoded.example_of_row
        for name, value in outputs.items():
            value = np.asarray(value)
            if not np.issubdtype(value.dtype, np.floating) or not value.size:
                continue
            bad = np.flatnonzero(~np.isfinite(value.reshape(len(value), -1)).all(axis=1))
            if not len(bad):
                continue
            row = int(bad[0])
            if len(value) == len(rows_of):
                index = int(rows_of[row])
            else:  # one row per example, or per text of each example
                index = row * len(self.examples) // len(value)
            return {"output": name, "rows": len(bad), "first_example": example_name(self.examples[index], index)}
        return None

    def judge(self, entry):
        """`entry` with its size, judged by the task against the Keras figures; logs a line.

        An artefact whose outputs hold NaN or infinity (`entry["non_finite"]`)
        fails whatever its figures, with a line of its own.
        """
        entry["size_bytes"] = _size(os.path.join(self.staging, entry["path"]))
        result = serving_for(self.task).judge(entry, self.keras)
        bad = entry.get("non_finite")
        if bad:
            result["passed"] = False
            result["budget"] = f"finite outputs, {result['budget']}"
            self.log(f"{entry['path']}: {non_finite_text(bad)}")
        self.log(
            f"{entry['path']}: max abs diff {entry['max_abs_diff']:.2e}, {self.task.metric} "
            f"{entry[self.task.metric]:.4f}, {entry['latency']['median_ms']:.2f} ms"
        )
        return result


def example_name(example, index):
    """An example as a user finds it in their data: a question by its id, else by
    its line, else by its place (1-based)."""
    name = f"question {example.id!r}" if getattr(example, "id", None) else f"example {index + 1}"
    line = getattr(example, "line", None)
    return f"{name} (line {line})" if line else name


def non_finite_text(bad):
    """The sentence on an entry's `non_finite` field."""
    return (
        f"NaN or infinity in {bad['output']} on {bad['rows']} row{'s' if bad['rows'] != 1 else ''}, "
        f"the first from {bad['first_example']}"
    )


def _size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(root, file)) for root, _, files in os.walk(path) for file in files
    )


# === Report ===


def _figure(value, scale):
    if scale == 100:
        return f"{100 * value:.2f}"
    return f"{value:.4f}"


def _columns(report):
    """The table's columns: the artefact, its agreement, the task's figures, cost, verdict."""
    scale = report.get("metric_scale", 1)
    columns = [
        ("artefact", lambda e: f"`{e['path']}`"),
        ("format", lambda e: e["format"]),
        ("quantization", lambda e: e["quantization"]),
        ("input", lambda e: e["input"]),
        ("max abs diff", lambda e: f"{e['max_abs_diff']:.2e}"),
    ]
    if any("top1_agreement" in e for e in report["artefacts"]):
        columns.append(("top-1 agree", lambda e: f"{100 * e['top1_agreement']:.2f}%" if "top1_agreement" in e else "—"))
    for key in ("min_cosine", "mean_cosine"):
        if any(key in e for e in report["artefacts"]):
            columns.append(
                (key.replace("_", " "), lambda e, key=key: f"{e[key]:.6f}" if key in e else "—")
            )
    for name in report["figures"]:
        columns.append(
            (name.replace("_", "-"), lambda e, name=name: _figure(e[name], scale) if name in e else "—")
        )
    columns += [
        ("size", lambda e: _megabytes(e["size_bytes"])),
        ("latency", lambda e: f"{e['latency']['median_ms']:.2f} ms"),
        ("budget", lambda e: e["budget"]),
        ("ok", lambda e: "yes" if e["passed"] else "**NO**"),
    ]
    return columns


def _megabytes(size):
    return f"{size / 2**20:.1f} MiB"


def _as_trained(figures, metric, scale):
    """The sentence on a mixed-precision model's own figures, if it has them."""
    if not figures:
        return "."
    return (
        f" in float32; as trained ({figures['compute_dtype']} compute): {metric} "
        f"{_figure(figures[metric], scale)}, max abs diff from float32 {figures['max_abs_diff']:.2e}."
    )


def markdown_report(report, chart=None):
    """The report as a Markdown table with a heading line of context; `chart`: the
    file name of its picture (`kbert.plots.report_chart`) beside it, shown under the table."""
    keras_figures = report["keras"]
    metric, scale = report["metric"], report.get("metric_scale", 1)
    figures = ", ".join(f"{name} {_figure(keras_figures[name], scale)}" for name in report["figures"])
    columns = _columns(report)
    lines = [
        f"# Export of `{report['model']}` ({report['task']})",
        "",
        f"Verified on {report['examples']} examples of `{report['data']}` at sequence length "
        f"{report['sequence_length']}; latency is batch 1, median of "
        f"{report['latency_runs']} runs on {report['threads']} threads"
        + (f" of {report['machine']['cpu']}" if report.get("machine") else "")
        + ". Keras model: "
        f"{figures}, {keras_figures['latency']['median_ms']:.2f} ms"
        + _as_trained(keras_figures.get("as_trained"), metric, scale),
        "",
        "| " + " | ".join(name for name, _ in columns) + " |",
        "| " + " | ".join("---" for _ in columns) + " |",
    ]
    for entry in report["artefacts"]:
        lines.append("| " + " | ".join(cell(entry) for _, cell in columns) + " |")
    if chart:
        lines += ["", f"![size, latency and {metric} of each file]({chart})"]
    for entry in report["artefacts"]:
        if entry.get("non_finite"):
            lines += ["", f"`{entry['path']}` fails: {non_finite_text(entry['non_finite'])}."]
    for entry in report["artefacts"]:
        if entry.get("transformers_tokenizer"):
            lines += ["", transformers_tokenizer_text(entry, report)]
    if report.get("onnx_fusions"):
        fusions = ", ".join(f"{op} {count}" for op, count in sorted(report["onnx_fusions"].items()))
        lines += ["", f"onnxruntime fusions: {fusions}."]
    if report.get("reused"):
        paths = ", ".join(f"`{path}`" for path in report["reused"])
        lines += ["", f"Reused, as an earlier run of the same model, data and options verified them: {paths}."]
    lines += ["", "All artefacts within budget." if report["passed"] else "Some artefacts exceed their budget."]
    return "\n".join(lines) + "\n"


def transformers_tokenizer_text(entry, report):
    """The sentence on a transformers folder run on texts its own tokenizer cut and packed."""
    seen = entry["transformers_tokenizer"]
    metric, scale = report["metric"], report.get("metric_scale", 1)
    return (
        f"`{entry['path']}` with transformers' own tokenizer on the texts: {metric} "
        f"{_figure(seen[metric], scale)} (kbert's rows: {_figure(entry[metric], scale)}); its token ids differ "
        f"from kbert's on {seen['rows_whose_token_ids_differ']} of {seen['rows']} rows, "
        f"{seen['uncut_rows_whose_token_ids_differ']} of them rows neither tokenizer cut."
    )


def write_report(report, json_path, markdown_path):
    """Writes `report.json`, the chart `report.png` beside `markdown_path` and
    `report.md`, which shows it; returns the Markdown."""
    from kbert.plots import REPORT_PLOT, report_chart

    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, ensure_ascii=False)
    chart = None
    if report["artefacts"]:
        report_chart(report, os.path.join(os.path.dirname(markdown_path), REPORT_PLOT))
        chart = REPORT_PLOT
    markdown = markdown_report(report, chart)
    with open(markdown_path, "w", encoding="utf-8") as f:
        f.write(markdown)
    return markdown
