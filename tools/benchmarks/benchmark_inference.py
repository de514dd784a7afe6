"""Batch-1 inference latency of one classifier in five runtimes, side by side. Prints JSON.

The model folder is exported at `--seq-len` with kbert.export's own functions:
the SavedModel's `serve_tokens` signature (TensorFlow, float32), TFLite
float32 and dynamic-range int8 (LiteRT interpreter, XNNPACK), and ONNX with
onnxruntime's BERT fusions, float32 and dynamic int8. Every runtime gets the
same number of threads and the same input (a full-length row: `--seq-len`
tokens, no padding). Runs are interleaved in rounds so that a burst of load
on a shared machine hits every runtime alike; the load average is printed
with the figures.

    python tools/benchmarks/benchmark_inference.py --model runs/debian-minilm --seq-len 128 --threads 2

Targets of the export issue, reported under "targets": TFLite dynamic int8
at least 2.5 times faster than the float32 SavedModel, and at most 1.25 times
slower than onnxruntime int8.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

# The targets for TFLite dynamic int8.
TARGET_SPEEDUP_OVER_SAVEDMODEL = 2.5
TARGET_MAX_RATIO_TO_ONNX_INT8 = 1.25


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="fine-tuned model folder (kbert finetune --out)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="threads of every runtime")
    parser.add_argument("--runs", type=int, default=200, help="timed runs per runtime, all rounds")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs per runtime first")
    parser.add_argument("--keep", help="keep the exported artefacts in this folder")
    args = parser.parse_args(argv)
    if min(args.seq_len, args.threads, args.runs, args.rounds) < 1 or args.warmup < 0:
        parser.error("--seq-len, --threads, --runs and --rounds must be positive")
    return args


def build_runtimes(args, folder):
    """Exports the model into `folder`; returns {name: zero-argument callable}."""
    import numpy as np
    import tensorflow as tf

    from kbert.export import onnx as onnx_export
    from kbert.export import savedmodel, tflite
    from kbert.modelfolder import ModelFolder

    finetuned = ModelFolder.load(args.model)
    finetuned.set_sequence_length(args.seq_len)
    task = finetuned.task
    rng = np.random.default_rng(0)
    features = {
        "token_ids": rng.integers(1000, 20000, (1, args.seq_len)).astype(np.int32),
        "segment_ids": np.zeros((1, args.seq_len), np.int32),
        "padding_mask": np.ones((1, args.seq_len), np.int32),
    }

    log("exporting the SavedModel")
    version_dir = savedmodel.export_savedmodel(finetuned, os.path.join(folder, "serving"), "bench", [], folder)
    tokens_fn = savedmodel.load_savedmodel(version_dir).signatures[savedmodel.TOKENS_SIGNATURE]
    tensors = {name: tf.constant(value) for name, value in features.items()}

    log("converting to TFLite")
    source = os.path.join(folder, "tflite_source")
    tflite.write_token_source(task, finetuned.model, args.seq_len, source)
    runtimes = {"savedmodel_fp32": lambda: tokens_fn(**tensors)}
    for quantization, name in (("none", "tflite_fp32"), ("dynamic", "tflite_dynamic_int8")):
        path = os.path.join(folder, f"{name}.tflite")
        tflite.write_bytes(path, tflite.convert_tokens(source, quantization))
        runtimes[name] = _bind(tflite.TfliteRunner(path, args.threads).run, features)

    log("converting to ONNX")
    raw, fused, int8 = (os.path.join(folder, f) for f in ("raw.onnx", "fused.onnx", "int8.onnx"))
    onnx_export.convert_savedmodel_to_onnx(version_dir, raw, task.outputs)
    fusions = onnx_export.optimize_onnx(raw, fused, finetuned.config)
    onnx_export.quantize_onnx(fused, int8)
    for name, path in (("onnx_fp32", fused), ("onnx_int8", int8)):
        runner = onnx_export.OnnxRunner(path, args.threads)
        runtimes[name] = _bind(lambda f, runner=runner: runner.run(f, task.outputs), features)
    return runtimes, fusions


def _bind(function, argument):
    return lambda: function(argument)


def measure(runtimes, runs, rounds, warmup):
    """Interleaved timing: each round times every runtime `runs // rounds` times."""
    for call in runtimes.values():
        for _ in range(warmup):
            call()
    times = {name: [] for name in runtimes}
    per_round = max(1, runs // rounds)
    for _ in range(rounds):
        for name, call in runtimes.items():
            for _ in range(per_round):
                start = time.perf_counter()
                call()
                times[name].append((time.perf_counter() - start) * 1e3)
    results = {}
    for name, values in times.items():
        values.sort()
        results[name] = {
            "median_ms": round(statistics.median(values), 3),
            "p10_ms": round(values[int(0.1 * len(values))], 3),
            "p90_ms": round(values[min(len(values) - 1, int(0.9 * len(values)))], 3),
            "runs": len(values),
        }
    return results


def log(message):
    print(message, file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from kbert.export.verify import load_average, machine

    # Before TensorFlow runs anything: its pools cannot be resized later.
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    folder = args.keep or tempfile.mkdtemp(prefix="kbert-bench-")
    os.makedirs(folder, exist_ok=True)
    try:
        runtimes, fusions = build_runtimes(args, folder)
        machine_before = machine()
        latency = measure(runtimes, args.runs, args.rounds, args.warmup)
        load_after = load_average()
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)

    median = {name: figures["median_ms"] for name, figures in latency.items()}
    speedup = median["savedmodel_fp32"] / median["tflite_dynamic_int8"]
    ratio_to_onnx = median["tflite_dynamic_int8"] / median["onnx_int8"]
    print(
        json.dumps(
            {
                "model": args.model,
                "batch": 1,
                "seq_len": args.seq_len,
                "threads": args.threads,
                "machine": machine_before,
                "load_average_after": load_after,
                "latency": latency,
                "onnx_fusions": fusions,
                "ratios": {
                    "savedmodel_fp32 / tflite_dynamic_int8": round(speedup, 2),
                    "tflite_dynamic_int8 / onnx_int8": round(ratio_to_onnx, 2),
                },
                "targets": {
                    f"tflite_dynamic_int8 >= {TARGET_SPEEDUP_OVER_SAVEDMODEL}x faster than savedmodel_fp32": speedup
                    >= TARGET_SPEEDUP_OVER_SAVEDMODEL,
                    f"tflite_dynamic_int8 <= {TARGET_MAX_RATIO_TO_ONNX_INT8}x onnx_int8": ratio_to_onnx
                    <= TARGET_MAX_RATIO_TO_ONNX_INT8,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
