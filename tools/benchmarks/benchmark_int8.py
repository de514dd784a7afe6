"""TFLite float32, dynamic int8 and int8 of one model folder, side by side. Prints JSON.

Writes `model_none.tflite`, `model_dynamic.tflite` and `model_int8.tflite`
to `--out` with kbert.export's own functions (the int8 file calibrated on the
first `--calibration-examples` rows of `--calibration`, as `kbert export`
does), runs each on the `--data` examples (the task's figures, e.g. accuracy
and macro-F1, and its agreement with the float file: top-1 agreement, max
abs diff), then times them at batch 1 on the first example: one call of each
file in turn per round (float, dynamic, int8, float, ...), so that a burst
of load on a shared machine hits every file alike; the load average is
printed with the figures.

    python tools/benchmarks/benchmark_int8.py --model runs/debian-minilm \\
        --data data/debian-packages/dev.csv --calibration data/debian-packages/train.csv \\
        --out benchmark_results/int8

Targets of the int8 issue, reported under "targets": the int8 file at most
a quarter of the float file's size plus 5% (what stays float: LayerNorm,
biases, positions), at most 25 MiB, faster than dynamic int8, and within
half a point of the float file's accuracy.
"""

import argparse
import json
import os
import shutil
import sys
import time

QUANTIZATIONS = ("none", "dynamic", "int8")
TARGET_MAX_SIZE_RATIO = 0.25 * 1.05
TARGET_MAX_MIB = 25
TARGET_MAX_METRIC_DROP = 0.005


def parse_args(argv=None):
    from kbert.export.options import DEFAULT_CALIBRATION_EXAMPLES, DEFAULT_THREADS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="fine-tuned model folder (kbert finetune --out)")
    parser.add_argument("--data", required=True, help="labelled examples to evaluate on (dev set)")
    parser.add_argument("--calibration", help="examples whose inputs calibrate int8 (default: --data)")
    parser.add_argument("--calibration-examples", type=int, default=DEFAULT_CALIBRATION_EXAMPLES)
    parser.add_argument("--out", required=True, help="folder for the three .tflite files")
    parser.add_argument("--max-examples", type=int, help="evaluate on the first N examples only")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="interpreter threads")
    parser.add_argument("--runs", type=int, default=100, help="timed rounds (one call of each file per round)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls of each file first")
    args = parser.parse_args(argv)
    if min(args.calibration_examples, args.threads, args.runs) < 1 or args.warmup < 0:
        parser.error("--calibration-examples, --threads and --runs must be positive, --warmup >= 0")
    if args.max_examples is not None and args.max_examples < 1:
        parser.error(f"--max-examples={args.max_examples}; expected a positive integer")
    return args


def log(message):
    print(message, file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from kbert.export import tflite
    from kbert.export.serving import serving_for
    from kbert.export.verify import interleaved_latency, load_average, machine
    from kbert.modelfolder import open_model

    folder = open_model(args.model)
    task = folder.task
    options = folder.settings.get("options") or {}
    task.use_options(options)
    examples = task.read(args.data, options)[: args.max_examples]
    calibration_set = task.read(args.calibration or args.data, options, targets=False)
    calibration_set = calibration_set[: args.calibration_examples]
    encoded = task.encode(examples, targets=False)
    calibration = task.encode(calibration_set, targets=False).features
    one = {name: value[:1] for name, value in encoded.features.items()}

    os.makedirs(args.out, exist_ok=True)
    source = tflite.scratch_folder(args.out)
    log("writing the converter's SavedModel")
    tflite.write_token_source(task, folder.model, folder.sequence_length, source)
    runners, outputs, results = {}, {}, {}
    for quantization in QUANTIZATIONS:
        log(f"converting ({quantization})")
        start = time.perf_counter()
        model_bytes = tflite.convert_tokens(source, quantization, calibration, args.threads)
        seconds = time.perf_counter() - start
        path = os.path.join(args.out, f"model_{quantization}.tflite")
        tflite.write_bytes(path, model_bytes)
        runners[quantization] = tflite.TfliteRunner(path, args.threads)
        log(f"running {len(examples)} examples ({quantization})")
        outputs[quantization] = runners[quantization].run(encoded.features)
        predictions = task.decode(examples, encoded, outputs[quantization])
        figures = {k: v for k, v in task.summary(task.evaluate(examples, predictions)).items() if k != "n"}
        results[quantization] = {
            "path": path,
            "size_bytes": len(model_bytes),
            "size_mib": round(len(model_bytes) / 2**20, 2),
            "convert_seconds": round(seconds, 1),
            **figures,
        }
    shutil.rmtree(source, ignore_errors=True)
    for quantization in QUANTIZATIONS:
        agreement = serving_for(task).agreement(outputs[quantization], outputs["none"])
        results[quantization]["versus_float"] = agreement

    log(f"timing: {args.runs} interleaved rounds")
    machine_before = machine()
    latency = interleaved_latency(
        {q: (lambda runner=runners[q]: runner.run(one)) for q in QUANTIZATIONS}, args.runs, args.warmup
    )
    load_after = load_average()
    for quantization in QUANTIZATIONS:
        results[quantization]["latency"] = latency[quantization]

    metric = task.metric
    int8, dynamic, float32 = results["int8"], results["dynamic"], results["none"]
    print(
        json.dumps(
            {
                "model": args.model,
                "data": args.data,
                "examples": len(examples),
                "calibration": args.calibration or args.data,
                "calibration_examples": len(calibration_set),
                "sequence_length": folder.sequence_length,
                "batch": 1,
                "threads": args.threads,
                "machine": machine_before,
                "load_average_after": load_after,
                "artefacts": results,
                "targets": {
                    f"int8 size <= {TARGET_MAX_SIZE_RATIO:.4f} x float": int8["size_bytes"]
                    <= TARGET_MAX_SIZE_RATIO * float32["size_bytes"],
                    f"int8 size <= {TARGET_MAX_MIB} MiB": int8["size_bytes"] <= TARGET_MAX_MIB * 2**20,
                    "int8 faster than dynamic (median)": int8["latency"]["median_ms"]
                    < dynamic["latency"]["median_ms"],
                    f"int8 {metric} >= float - {TARGET_MAX_METRIC_DROP}": int8[metric]
                    >= float32[metric] - TARGET_MAX_METRIC_DROP,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
