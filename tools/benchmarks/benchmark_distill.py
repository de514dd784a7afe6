"""A teacher and its distilled students, exported and timed side by side. Prints JSON.

Each model folder goes through `kbert.export.export_model` (TFLite float32,
dynamic int8 and int8; ONNX float32 and dynamic int8), which evaluates every
artefact on `--data` in the runtime users run it in (LiteRT, onnxruntime)
and checks it against the model's Keras outputs. Then every file of every
model is timed at batch 1 on the first example, interleaved (one call of each
file per round), so that load on a shared machine hits every file alike; the
load average is printed with the figures.

    python tools/benchmarks/benchmark_distill.py --teacher runs/debian-minilm \\
        --student l3=runs/debian-minilm-l3 --student l2=runs/debian-minilm-l2 \\
        --data data/debian-packages/dev.csv --calibration data/debian-packages/train.csv \\
        --out benchmark_results/distill

Targets of the compression issue, under "targets": a student whose accuracy
in TFLite (dynamic or full int8) is within 1.5 points of the teacher's Keras
accuracy at a median batch-1 latency of at most 1 ms, and a full-integer
int8 teacher of at most 25 MiB.
"""

import argparse
import json
import os
import sys
import time

# (format, quantization) of every artefact benchmarked, in table order.
ARTEFACTS = (
    ("tflite", "none"),
    ("tflite", "dynamic"),
    ("tflite", "int8"),
    ("onnx", "none"),
    ("onnx", "dynamic"),
)
TARGET_MAX_DROP = 0.015
TARGET_MAX_MS = 1.0
TARGET_MAX_INT8_MIB = 25


def parse_args(argv=None):
    from kbert.export.options import DEFAULT_CALIBRATION_EXAMPLES, DEFAULT_THREADS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teacher", required=True, help="the teacher's model folder")
    parser.add_argument(
        "--student", action="append", required=True, metavar="NAME=DIR",
        help="a student's model folder (kbert distill --out), with the name it has in the table",
    )
    parser.add_argument("--data", required=True, help="labelled examples to evaluate on (dev set)")
    parser.add_argument("--calibration", help="examples whose inputs calibrate int8 (default: --data)")
    parser.add_argument("--calibration-examples", type=int, default=DEFAULT_CALIBRATION_EXAMPLES)
    parser.add_argument("--out", required=True, help="folder for one export folder per model")
    parser.add_argument("--overwrite", action="store_true", help="replace earlier exports in --out")
    parser.add_argument("--max-examples", type=int, help="evaluate on the first N examples only")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="runtime threads")
    parser.add_argument("--runs", type=int, default=100, help="timed rounds (one call of each file per round)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls of each file first")
    args = parser.parse_args(argv)
    if min(args.calibration_examples, args.threads, args.runs) < 1 or args.warmup < 0:
        parser.error("--calibration-examples, --threads and --runs must be positive, --warmup >= 0")
    if args.max_examples is not None and args.max_examples < 1:
        parser.error(f"--max-examples={args.max_examples}; expected a positive integer")
    args.models = {"teacher": args.teacher}
    for spec in args.student:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            parser.error(f"--student {spec!r}; expected NAME=DIR, e.g. l2=runs/debian-minilm-l2")
        if name in args.models:
            parser.error(f"--student {spec!r}: the name {name!r} is taken; give each model its own")
        args.models[name] = path
    return args


def log(message):
    print(message, file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from kbert.export import onnx as onnx_export
    from kbert.export import tflite
    from kbert.export.exporter import export_model
    from kbert.export.verify import interleaved_latency, load_average, machine
    from kbert.modelfolder import open_model

    reports, runners, one = {}, {}, None
    for name, path in args.models.items():
        log(f"exporting {name} ({path})")
        out = os.path.join(args.out, name)
        start = time.perf_counter()
        report = export_model(
            path, out, args.data, formats=("tflite", "onnx"),
            quantizations=sorted({q for _, q in ARTEFACTS}), calibration=args.calibration,
            max_examples=args.max_examples, calibration_examples=args.calibration_examples,
            threads=args.threads, overwrite=args.overwrite, log=lambda line: None,
        )
        folder = open_model(path)
        if one is None:
            task = folder.task
            task.use_options(folder.settings.get("options") or {})
            examples = task.read(args.data, folder.settings.get("options") or {})[:1]
            one = {k: v[:1] for k, v in task.encode(examples, targets=False).features.items()}
        entries = {(a["format"], a["quantization"]): a for a in report["artefacts"] if a["input"] == "tokens"}
        rows = {}
        for fmt, quantization in ARTEFACTS:
            entry = entries[(fmt, quantization)]
            key = f"{fmt}_{quantization}"
            file = os.path.join(out, entry["path"])
            if fmt == "tflite":
                runner = tflite.TfliteRunner(file, args.threads)
                runners[(name, key)] = lambda runner=runner: runner.run(one)
            else:
                runner = onnx_export.OnnxRunner(file, args.threads)
                names = [o.name for o in runner.session.get_outputs()]
                runners[(name, key)] = lambda runner=runner, names=names: runner.run(one, names)
            rows[key] = {
                "path": os.path.join(name, entry["path"]),
                "size_mib": round(entry["size_bytes"] / 2**20, 2),
                **{k: entry[k] for k in report["figures"]},
                "top1_agreement_with_keras": entry.get("top1_agreement"),
                "passed_budget": entry["passed"],
            }
        reports[name] = {
            "model": path,
            "num_layers": folder.config.num_layers,
            "hidden_size": folder.config.hidden_size,
            "parameters": int(folder.model.count_params()),
            "keras": {k: report["keras"][k] for k in report["figures"]},
            "export_seconds": round(time.perf_counter() - start, 1),
            "artefacts": rows,
        }

    log(f"timing: {args.runs} interleaved rounds over {len(runners)} files")
    machine_before = machine()
    latency = interleaved_latency({f"{n}/{k}": call for (n, k), call in runners.items()}, args.runs, args.warmup)
    load_after = load_average()
    for (name, key) in runners:
        reports[name]["artefacts"][key]["latency"] = latency[f"{name}/{key}"]

    metric = "accuracy"
    teacher = reports["teacher"]
    bar = teacher["keras"][metric] - TARGET_MAX_DROP
    reached = [
        f"{name}/{key}"
        for name, r in reports.items() if name != "teacher"
        for key in ("tflite_dynamic", "tflite_int8")
        if r["artefacts"][key][metric] >= bar and r["artefacts"][key]["latency"]["median_ms"] <= TARGET_MAX_MS
    ]
    print(
        json.dumps(
            {
                "data": args.data,
                "calibration": args.calibration or args.data,
                "sequence_length": int(one["token_ids"].shape[1]),
                "batch": 1,
                "threads": args.threads,
                "machine": machine_before,
                "load_average_after": load_after,
                "models": reports,
                "targets": {
                    f"a student's TFLite {metric} >= teacher's - {TARGET_MAX_DROP} at <= {TARGET_MAX_MS} ms": reached,
                    f"teacher's int8 TFLite <= {TARGET_MAX_INT8_MIB} MiB": teacher["artefacts"]["tflite_int8"]["size_mib"]
                    <= TARGET_MAX_INT8_MIB,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
