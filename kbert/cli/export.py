"""The `kbert export` command: `add_export_parser(subparsers)` and `run_export(args)`.

    kbert export --model runs/debian-minilm --out saved_models/debian \\
        --data data/debian-packages/dev.csv --calibration data/debian-packages/train.csv

It prints one JSON line (`report_summary`); progress and the report's table go to stderr.
Exit status (from `kbert.cli.main`): 0 when every artefact is within budget,
1 when one is not (the artefacts and the report are written all the same), 2
for bad input (`ValueError`, one line on stderr, nothing written), 130 or
143 when interrupted (the artefacts verified so far are kept for the same
command to reuse, `interrupted_line`).
"""

import argparse
import math
import os
import signal
import sys

from kbert.cliargs import DEBIAN, add_command, add_model_arguments, add_task_options, positive_int, task_options
from kbert.cliio import print_json
from kbert.export.options import (
    ALL,
    DEFAULT_CALIBRATION_EXAMPLES,
    DEFAULT_LATENCY_RUNS,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_THREADS,
    FORMATS,
    RECOMMENDED,
    RECOMMENDED_QUANTIZATIONS,
    REPORT_FILE,
    SUPPORTED,
)

# Exit status when an artefact exceeds its budget.
EXIT_OVER_BUDGET = 1

_DESCRIPTION = (
    "Writes a SavedModel for TF Serving, TFLite and ONNX models (and the MediaPipe or "
    "TFLite Task Library file of tasks that have one), runs each on --data next to the "
    "Keras model with the runtime that serves it, and writes OUT/report.json and "
    "OUT/report.md. Exit status 1 when an artefact exceeds its budget.\n\n"
    f"By default (--quantize {RECOMMENDED}) it writes the files to ship: float32 and dynamic "
    "int8 everywhere, and TFLite's full int8 where the task has a budget for it; each is "
    f"verified on the first {DEFAULT_MAX_EXAMPLES} examples of --data and timed "
    f"{DEFAULT_LATENCY_RUNS} times. On the Debian MiniLM classifier that takes a few minutes "
    f"on 2 cores. --quantize {ALL} adds fp16, 16x8 (LiteRT has reference kernels only for it: "
    f"slow to verify) and the string-in TFLite file; --max-examples {ALL} verifies on every "
    "example. Formats and their quantizations: "
    + "; ".join(f"{f}: {', '.join(SUPPORTED[f])}" for f in FORMATS)
    + ".\n\n"
    "Each artefact is written and verified in turn. Interrupted (Ctrl-C), the export keeps "
    "those verified in a folder beside OUT, and the same command run again reuses them; so "
    "does --overwrite, for the artefacts of the export it replaces that were made from the "
    "same model, data and options. The first mediapipe export also installs MediaPipe's and "
    "the Task Library's own Python environments with pip (a few minutes, needs PyPI)."
)


def add_export_parser(subparsers):
    """Adds the `export` subcommand to an `argparse` subparsers object."""
    from kbert.tasks import TASKS

    p = add_command(
        subparsers, "export",
        "export a model to TF Serving, TFLite, ONNX and MediaPipe, each verified",
        [
            "kbert export --model runs/debian-minilm --out saved_models/debian \\\n"
            f"      --data {DEBIAN}/dev.csv --calibration {DEBIAN}/train.csv",
            "kbert export --model runs/debian-minilm --out saved_models/debian-all \\\n"
            f"      --data {DEBIAN}/dev.csv --calibration {DEBIAN}/train.csv --quantize all --max-examples all",
            "kbert export --model all-minilm-l6-v2 --task sentence-embedding --out saved_models/minilm \\\n"
            "      --data sts-dev.tsv --formats savedmodel,tflite --quantize none,dynamic",
        ],
        description=_DESCRIPTION,
        usage="kbert export --model MODEL --data FILE --out DIR [options]",
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
        help="comma-separated; default: every format the model's task has but huggingface (a transformers "
             "folder, verified by transformers on PyTorch: pip install transformers torch) and keras-hub "
             "(a keras-hub preset: pip install keras-hub), made when named",
    )
    p.add_argument(
        "--quantize", default=RECOMMENDED,
        help=(
            f"comma-separated quantizations (each format gets those it supports), or {RECOMMENDED!r}: "
            f"{', '.join(RECOMMENDED_QUANTIZATIONS)} (int8 where the task has a budget for it), or "
            f"{ALL!r}: every quantization and the string-in TFLite file (a list with none also writes it)"
        ),
    )
    p.add_argument(
        "--max-examples", type=max_examples, default=DEFAULT_MAX_EXAMPLES,
        help=f"verify on the first N examples of --data; {ALL!r}: on every one",
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
        "--overwrite", action="store_true",
        help="replace --out if it is an earlier kbert export (reusing its artefacts made from the same inputs)",
    )
    p.add_argument(
        "--cache-dir",
        help="where MediaPipe's private environments live (default: $XDG_CACHE_HOME/kbert or ~/.cache/kbert)",
    )
    add_task_options(p, list(TASKS.values()), stored=True)
    p.set_defaults(
        run=run_export, check=check_export_args, reads=("data", "calibration"), interrupted=interrupted_line
    )
    return p


def max_examples(value):
    """`--max-examples`: a positive integer, or "all" (None: every example)."""
    if value.strip() == ALL:
        return None
    try:
        return positive_int(value)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error}; expected a positive integer or {ALL!r}") from None


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
    # A SIGTERM (a killed CI job) then unwinds like Ctrl-C: what is not
    # verified yet is removed, and what is stays for a rerun. `kbert.cli.main`
    # has its own handler, which also says what was kept (tools/export.py and
    # tools/quantize.py go through it too); this one serves other callers.
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from kbert.export.exporter import export_model

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
            options=task_options(args),
            overwrite=args.overwrite,
            cache_dir=args.cache_dir,
            task=args.task,
            sequence_length=args.seq_len,
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_json(report_summary(report, args.out))
    return 0 if report["passed"] else EXIT_OVER_BUDGET


def interrupted_line(args):
    """What an interrupted export kept, and how to go on, in one line (`kbert.cliio.interrupted_line`)."""
    from kbert.export.resume import kept_artefacts, work_path

    kept = kept_artefacts(args.out)
    if not kept:
        return f"interrupted; {args.out} was not written or changed"
    return (f"interrupted; {len(kept)} verified artefact{'s' if len(kept) != 1 else ''} kept in "
            f"{work_path(args.out)}; run the same command again to reuse them")


def report_summary(report, out):
    """What `kbert export` prints: the folder, its verdict and each artefact's
    figures against its budget (a NaN or infinite figure as null), and whether
    an earlier run's verification was reused; the whole report is `OUT/report.json`."""
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
                "passed": entry["passed"], "reused": entry.get("reused", False),
            }
            for entry in report["artefacts"]
        ],
    }


def _exit_on_sigterm(signum, frame):
    sys.exit(128 + signum)
