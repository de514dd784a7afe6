"""Training throughput and MFU, kbert vs keras-hub side by side, as JSON and PNG plots.

For every preset × sequence length × dtype × XLA on/off, both implementations
train on the same synthetic batch with AdamW; throughput is measured over
timed steps after warm-up steps (so compilation is excluded).

Tasks:
  mlm: masked-LM pretraining (kbert's `bert_pretrainer`, which also has the
      tiny next-sentence head, vs keras-hub's `BertMaskedLM`), 15% of the
      positions predicted.
  classifier: sequence classification (`bert_classifier` vs `BertTextClassifier`,
      `--num-classes` labels; issue 2's figure is `--task classifier
      --presets minilm_l6_h384 --seq-lens 128`).

With `--inference-model DIR` (a `kbert finetune` folder) the report also has
batch-1 inference latency per export format, from
`tools/benchmarks/benchmark_inference.py` (SavedModel, TFLite float32 / dynamic int8,
ONNX Runtime float32 / int8, same threads).

Model FLOPs per sequence (matmuls only, forward + backward = 3 × forward;
L sequence length, n layers, d hidden size, V vocabulary, C classes; the
72·n·d² term assumes an intermediate size of 4·d, and other sizes are
counted exactly as 2·n·d·(4·d + 2·intermediate) per token and pass):
  mlm:        L · (72·n·d² + 12·n·L·d + 6·0.15·(d² + d·V))
  classifier: L · (72·n·d² + 12·n·L·d) + 6·(d² + d·C)
(kbert's classifier computes only [CLS] in its last block, so its real work
is slightly lower than the count; MFU uses the same count for both.)
MFU = sequences/s × FLOPs per sequence / peak FLOP/s. `--peak-tflops` is the
accelerator's dense peak for the dtype (e.g. 989 for an H100 SXM in bf16);
without it, a CPU estimate: cores × 2.5 GHz × 32 float32 FLOP/cycle (two
AVX-512 FMA units) — a rough upper bound that ignores the real clock.

    python tools/benchmarks/benchmark.py --quick
    python tools/benchmarks/benchmark.py --task classifier --presets minilm_l6_h384 --seq-lens 128 \\
        --inference-model runs/debian-minilm
    python tools/benchmarks/benchmark.py --presets bert_tiny,bert_base --seq-lens 128,512 \\
        --peak-tflops 989 --out benchmark_results
    KERAS_BACKEND=jax python tools/benchmarks/benchmark.py --impls kbert --peak-tflops 989
"""

import argparse
import json
import os
import subprocess
import sys
import time

import keras
import numpy as np

import kbert
from kbert.export.verify import machine
from kbert.models import bert_pretrainer

NUM_CLASSES = 12  # the Debian package task
# BERT masks 15% of the positions (google-research/bert's masked_lm_prob).
MASKED_FRACTION = 0.15
# CPU peak estimate: 2.5 GHz × 32 float32 FLOP per cycle per core (2 AVX-512 FMA units).
CPU_FLOP_PER_CORE = 2.5e9 * 32


def flops_per_sequence(config, seq_len, task, num_classes=NUM_CLASSES):
    """Training FLOPs (matmuls only) per sequence; see the module docstring."""
    n, d, v = config.num_layers, config.hidden_size, config.vocab_size
    # 2·d·(4d) for Q, K, V, output and 2·2·d·intermediate for the FFN, per token.
    dense = 3 * 2 * n * d * (4 * d + 2 * config.intermediate_size)
    attention = 12 * n * seq_len * d
    flops = seq_len * (dense + attention)
    if task == "mlm":
        return flops + seq_len * 6 * MASKED_FRACTION * (d * d + d * v)
    return flops + 6 * (d * d + d * num_classes)


def masked_count(seq_len):
    return max(1, round(MASKED_FRACTION * seq_len))


def build_kbert(config, task, dtype, num_classes):
    if task == "mlm":
        model = bert_pretrainer(config, dtype=dtype)
        return model, {}  # BertPretrainer.compile fills in its losses.
    model = kbert.bert_classifier(config, num_classes, dtype=dtype)
    return model, {"loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}


def build_keras_hub(config, task, dtype, num_classes):
    import keras_hub

    from kbert.checkpoints.keras_hub import keras_hub_backbone

    backbone = keras_hub_backbone(config, dtype=dtype)
    if task == "mlm":
        model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None, dtype=dtype)
    else:
        model = keras_hub.models.BertTextClassifier(
            backbone, num_classes, preprocessor=None, dtype=dtype
        )
    return model, {"loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}


def synthetic_batch(config, impl, task, batch_size, seq_len, num_classes, seed=0):
    rng = np.random.default_rng(seed)
    x = {
        "token_ids": rng.integers(0, config.vocab_size, (batch_size, seq_len)).astype("int32"),
        "segment_ids": np.zeros((batch_size, seq_len), "int32"),
        "padding_mask": np.ones((batch_size, seq_len), "int32"),
    }
    if task == "classifier":
        return x, rng.integers(0, num_classes, (batch_size,)).astype("int32")
    positions = np.sort(
        np.stack([rng.permutation(seq_len)[: masked_count(seq_len)] for _ in range(batch_size)]),
        axis=1,
    ).astype("int32")
    ids = rng.integers(0, config.vocab_size, positions.shape).astype("int32")
    if impl == "keras_hub":
        return {**x, "mask_positions": positions}, ids
    x["masked_lm_positions"] = positions
    return x, {"masked_lm": ids, "next_sentence": rng.integers(0, 2, (batch_size,)).astype("int32")}


def measure(
    impl, config, task, dtype, batch_size, seq_len, jit_compile, warmup_steps, steps, num_classes
):
    keras.utils.set_random_seed(0)
    build = build_kbert if impl == "kbert" else build_keras_hub
    model, compile_kwargs = build(config, task, dtype, num_classes)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=1e-5), jit_compile=jit_compile,
        **compile_kwargs,
    )
    x, y = synthetic_batch(config, impl, task, batch_size, seq_len, num_classes)
    for _ in range(warmup_steps):
        model.train_on_batch(x, y)
    start = time.perf_counter()
    for _ in range(steps):
        # train_on_batch returns host values, so every step is waited for.
        loss = model.train_on_batch(x, y)
    elapsed = time.perf_counter() - start
    if not np.all(np.isfinite(loss)):
        raise RuntimeError(f"{impl} {dtype}: non-finite loss {loss}")
    return batch_size * steps / elapsed


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seq_lens = sorted({r["seq_len"] for r in runs})
    fig, axes = plt.subplots(2, len(seq_lens), figsize=(7 * len(seq_lens), 9), squeeze=False)
    for column, seq_len in enumerate(seq_lens):
        subset = [r for r in runs if r["seq_len"] == seq_len]
        labels = [
            f"{r['preset']} {r['impl']} {r['dtype'].replace('mixed_', '')} {'xla' if r['xla'] else 'no-xla'}"
            for r in subset
        ]
        colors = ["tab:blue" if r["impl"] == "kbert" else "tab:orange" for r in subset]
        for row, (key, title) in enumerate(
            (("tokens_per_s", "tokens/s"), ("mfu", "MFU"))
        ):
            ax = axes[row][column]
            ax.barh(range(len(subset)), [r[key] for r in subset], color=colors)
            ax.set_yticks(range(len(subset)), labels, fontsize=7)
            ax.invert_yaxis()
            ax.set_title(f"{title}, seq {seq_len} (blue kbert, orange keras-hub)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def best_ratios(runs):
    """kbert's fastest setting over keras-hub's fastest, per preset and sequence length."""
    ratios = {}
    for key in sorted({(r["preset"], r["seq_len"]) for r in runs}):
        best = {
            impl: max((r["seq_per_s"] for r in runs if (r["preset"], r["seq_len"]) == key
                       and r["impl"] == impl), default=None)
            for impl in ("kbert", "keras_hub")
        }
        if None not in best.values():
            ratios[f"{key[0]} seq {key[1]}"] = round(best["kbert"] / best["keras_hub"], 3)
    return ratios


def inference_latency(model, seq_len, threads):
    """Batch-1 latency per export format, from tools/benchmarks/benchmark_inference.py.

    A child process: TensorFlow's thread pools are sized before it first runs,
    and the training runs here have already started them.
    """
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmark_inference.py")
    command = [sys.executable, script, "--model", model, "--seq-len", str(seq_len),
               "--threads", str(threads)]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="bert_tiny,bert_mini,bert_small,bert_medium,bert_base")
    parser.add_argument("--seq-lens", default="128,512")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--task", choices=("mlm", "classifier"), default="mlm")
    parser.add_argument("--num-classes", type=int, default=NUM_CLASSES, help="classifier labels")
    parser.add_argument("--dtypes", default="float32,mixed_bfloat16")
    parser.add_argument("--xla", default="off,on", help="comma list of off/on")
    parser.add_argument("--impls", default="kbert,keras_hub")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--out", default="benchmark_results")
    parser.add_argument(
        "--inference-model", help="also time batch-1 inference of this fine-tuned model folder"
    )
    parser.add_argument("--threads", type=int, default=2, help="inference threads")
    parser.add_argument("--inference-seq-len", type=int, default=128)
    parser.add_argument(
        "--quick", action="store_true",
        help="bert_tiny, seq 128, batch 4, float32, 2 timed steps: a smoke test",
    )
    args = parser.parse_args()
    if args.inference_model and not os.path.isfile(os.path.join(args.inference_model, "model.keras")):
        parser.error(f"--inference-model {args.inference_model}: not a kbert model folder (no model.keras)")
    if args.num_classes < 2:
        parser.error(f"--num-classes {args.num_classes}: expected at least 2")
    if args.quick:
        args.presets, args.seq_lens, args.dtypes = "bert_tiny", "128", "float32"
        args.batch_size, args.warmup_steps, args.steps = 4, 1, 2

    if args.peak_tflops is not None:
        peak, peak_source = args.peak_tflops * 1e12, "--peak-tflops"
    else:
        peak = (os.cpu_count() or 1) * CPU_FLOP_PER_CORE
        peak_source = f"CPU estimate: {os.cpu_count()} cores x 2.5 GHz x 32 FLOP/cycle"

    runs = []
    for preset in args.presets.split(","):
        for seq_len in (int(s) for s in args.seq_lens.split(",")):
            config = kbert.BertConfig.from_preset(preset)
            config.check_sequence_length(seq_len)
            flops = flops_per_sequence(config, seq_len, args.task, args.num_classes)
            for dtype in args.dtypes.split(","):
                for xla in args.xla.split(","):
                    if xla not in ("on", "off"):
                        raise ValueError(f"--xla value {xla!r} is not 'on' or 'off'")
                    for impl in args.impls.split(","):
                        seq_per_s = measure(
                            impl, config, args.task, dtype, args.batch_size, seq_len,
                            xla == "on", args.warmup_steps, args.steps, args.num_classes,
                        )
                        run = {
                            "preset": preset, "seq_len": seq_len, "impl": impl,
                            "dtype": dtype, "xla": xla == "on",
                            "seq_per_s": round(seq_per_s, 2),
                            "tokens_per_s": round(seq_per_s * seq_len, 1),
                            "tflops_per_s": round(seq_per_s * flops / 1e12, 4),
                            "mfu": round(seq_per_s * flops / peak, 5),
                        }
                        runs.append(run)
                        print(json.dumps(run), flush=True)

    os.makedirs(args.out, exist_ok=True)
    report = {
        "task": args.task,
        "batch_size": args.batch_size,
        "warmup_steps": args.warmup_steps,
        "steps": args.steps,
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "machine": machine(),
        "peak_tflops": peak / 1e12,
        "peak_source": peak_source,
        "flops_formula": "see tools/benchmarks/benchmark.py docstring",
        "runs": runs,
        "kbert_best_over_keras_hub_best": best_ratios(runs),
    }
    if args.inference_model:
        report["inference"] = inference_latency(
            args.inference_model, args.inference_seq_len, args.threads
        )
    json_path = os.path.join(args.out, f"benchmark_{args.task}_{keras.backend.backend()}.json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=2)
    png_path = json_path[: -len(".json")] + ".png"
    plot(runs, png_path)
    print(f"wrote {json_path} and {png_path}")


if __name__ == "__main__":
    main()
