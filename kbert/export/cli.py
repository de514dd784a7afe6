"""The `kbert export` subcommand: `add_export_parser(subparsers)` and `run_export(args)`.

    kbert export --model runs/debian-minilm --out saved_models/debian \\
        --data data/debian-packages/dev.csv --calibration data/debian-packages/train.csv

It prints one JSON line (`report_summary`); progress and the report's table go to stderr.
Exit status (from `kbert.cli.main`): 0 when every artefact is within budget,
1 when one is not (the artefacts and the report are written all the same), 2
for bad input (`ValueError`, one line on stderr, nothing written).
"""

import math
import os
import signal
import sys

from kbert.cliio import print_json
from kbert.export.options import REPORT_FILE

# Exit status when an artefact exceeds its budget.
EXIT_OVER_BUDGET = 1


def add_export_parser(subparsers):
    """Adds the `export` subcommand to an `argparse` subparsers object."""
    from kbert.cliargs import HelpFormatter, add_model_arguments, add_task_options, positive_int
    from kbert.export.options import (
        DEFAULT_CALIBRATION_EXAMPLES,
        DEFAULT_LATENCY_RUNS,
        DEFAULT_THREADS,
        FORMATS,
        QUANTIZATIONS,
        SUPPORTED,
    )
    from kbert.tasks import TASKS

    p = subparsers.add_parser(
        "export",
        help="export a model to TF Serving, TFLite, ONNX and MediaPipe, each verified",
        formatter_class=HelpFormatter,
        usage="kbert export --model MODEL --data FILE --out DIR [options]",
        description=(
            "Writes a SavedModel for TF Serving, TFLite and ONNX models (and the MediaPipe or "
            "TFLite Task Library file of tasks that have one), runs each on --data next to the "
            "Keras model with the runtime that serves it, and writes OUT/report.json and "
            "OUT/report.md. Formats and their quantizations: "
            + "; ".join(f"{f}: {', '.join(SUPPORTED[f])}" for f in FORMATS)
            + ". Exit status 1 when an artefact exceeds its budget.\n\n"
            "What the default costs: every format in every quantization, each artefact run on "
            "every --data example one at a time (16x8 TFLite runs LiteRT's reference kernels, tens "
            "of times slower than dynamic) and timed --latency-runs times; the first mediapipe "
            "export also installs MediaPipe's and the Task Library's own Python environments with "
            "pip (about a minute, needs PyPI). On a dev set of thousands of examples that is a "
            "long run. Ask for less with --formats (e.g. savedmodel,onnx), --quantize (e.g. "
            "none,dynamic), --max-examples N and --latency-runs N."
        ),
        epilog=(
            "examples:\n"
            "  kbert export --model runs/debian-minilm --out saved_models/debian \\\n"
            "      --data data/debian-packages/dev.csv --calibration data/debian-packages/train.csv\n"
            "  kbert export --model runs/debian-minilm --out saved_models/debian-quick \\\n"
            "      --data data/debian-packages/dev.csv --formats savedmodel,onnx --quantize none,dynamic "
            "--max-examples 200\n"
            "  kbert export --model all-minilm-l6-v2 --task sentence-embedding --out saved_models/minilm \\\n"
            "      --data sts-dev.tsv --formats savedmodel,tflite --quantize none,dynamic"
        ),
    )
    add_model_arguments(p)
    p.add_argument(
        "--out", required=True,
        help="export folder, e.g. saved_models/NAME; NAME is the TF Serving model name",
    )
    p.add_argument("--data", required=True, help="labelled data in the task's format to verify on (dev set)")
    p.add_argument(
        "--calibration",
        help="data whose inputs calibrate int8 and 16x8 (training set; default: --data)",
    )
    p.add_argument(
        "--formats", default=None,
        help="comma-separated; default: every format the model's task has",
    )
    p.add_argument(
        "--quantize", default=",".join(QUANTIZATIONS),
        help="comma-separated quantizations; each format gets those it supports (default: %(default)s)",
    )
    p.add_argument(
        "--max-examples", type=positive_int, default=None,
        help="verify on the first N texts only (default: all)",
    )
    p.add_argument(
        "--calibration-examples", type=positive_int, default=DEFAULT_CALIBRATION_EXAMPLES,
        help="calibration texts used at most",
    )
    p.add_argument(
        "--threads", type=positive_int, default=DEFAULT_THREADS, help="threads of every runtime"
    )
    p.add_argument(
        "--latency-runs", type=positive_int, default=DEFAULT_LATENCY_RUNS,
        help="timed batch-1 runs per artefact, after warm-up",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace --out if it is an earlier kbert export"
    )
    p.add_argument(
        "--cache-dir",
        help="where MediaPipe's private environments live (default: $XDG_CACHE_HOME/kbert or ~/.cache/kbert)",
    )
    add_task_options(p, list(TASKS.values()), stored=True)
    p.set_defaults(run=run_export, check=check_export_args, reads=("data", "calibration"))
    return p


def check_export_args(args):
    """export's refusals that need no TensorFlow, made before it loads; `export_model` makes them again."""
    from kbert.cliargs import check_model, check_model_data
    from kbert.export.options import check_export

    check_export(args.model, args.out, args.data, args.calibration, args.formats, args.quantize, args.overwrite)
    check_model(args)
    check_model_data(args, args.data)  # --calibration is read only if a quantization needs it


def run_export(args):
    """Runs the export; returns the exit status (0, or `EXIT_OVER_BUDGET`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # A SIGTERM (a killed CI job) then unwinds like Ctrl-C: the half-written
    # export folder beside OUT is removed. `kbert.cli.main` has its own
    # handler, which also says what was kept (tools/export.py and
    # tools/quantize.py go through it too); this one serves other callers.
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from kbert.export.exporter import export_model
    from kbert.tasks import TASKS

    option_names = {o.name for task in TASKS.values() for o in task.options}
    try:
        report = export_model(
            args.model,
            args.out,
            data=args.data,
            formats=args.formats,
            quantizations=args.quantize,
            calibration=args.calibration,
            max_examples=args.max_examples,
            calibration_examples=args.calibration_examples,
            threads=args.threads,
            latency_runs=args.latency_runs,
            options={name: getattr(args, name) for name in option_names},
            overwrite=args.overwrite,
            cache_dir=args.cache_dir,
            task=args.task,
            sequence_length=args.seq_len,
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_json(report_summary(report, args.out))
    return 0 if report["passed"] else EXIT_OVER_BUDGET


def report_summary(report, out):
    """What `kbert export` prints: the folder, its verdict and each artefact's
    figures against its budget (a NaN or infinite figure as null); the whole
    report is `OUT/report.json`."""
    metric = report["metric"]

    def finite(value):
        return value if isinstance(value, (int, float)) and math.isfinite(value) else None

    return {
        "out": out,
        "task": report["task"],
        "passed": report["passed"],
        "report": os.path.join(out, REPORT_FILE),
        "keras": {metric: finite(report["keras"].get(metric))},
        "artefacts": [
            {
                "path": entry["path"], "format": entry["format"], "quantization": entry["quantization"],
                "max_abs_diff": finite(entry.get("max_abs_diff")), metric: finite(entry.get(metric)),
                "size_bytes": entry.get("size_bytes"), "latency_ms": finite(entry["latency"].get("median_ms")),
                "passed": entry["passed"],
            }
            for entry in report["artefacts"]
        ],
    }


def _exit_on_sigterm(signum, frame):
    sys.exit(128 + signum)
