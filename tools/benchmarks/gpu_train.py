"""BERT pretraining and fine-tuning on one GPU, kbert + Keras/JAX beside HF + PyTorch.

One run measures, on the same real text (from `gpu_data.py`) and the same shapes:

- pretraining, BERT-base MLM + NSP (kbert's `bert_pretrainer` against
  `BertForPreTraining`), seq 128 and seq 512, batch 256;
- fine-tuning, sequence classification of MiniLM-L6 and BERT-base shapes at
  seq 128, batch 32 and 256;

each on kbert + Keras 3 + JAX (XLA, mixed_bfloat16, AdamW) and on Hugging Face
+ PyTorch (bfloat16 autocast, SDPA, `torch.compile`, fused AdamW), from random
init with the same hyperparameters. Every job runs in its own process
(`gpu_kbert.py`, `gpu_torch.py`), so each has the whole GPU and its own peak
memory. It reports sequences/s, tokens/s, model FLOPs utilisation against the
dense bf16 peak (`--peak-tflops`, the H200's 989) and against a bf16 matmul rate
measured in the same run, peak memory, and the loss over the timed steps: a
job whose loss does not fall fails the run (exit status 1), so a fast step
that learns nothing cannot pass. FLOPs per sequence are `tools/benchmarks/benchmark.py`'s
`flops_per_sequence`. Jobs are run in order of importance and skipped once
`--budget-s` is spent, so the JSON always comes back.

`--dry-run` runs the same path on CPU with `bert_tiny` and a few steps.

    python tools/benchmarks/gpu_data.py --out runs/gpu-bench --wheels   # here, with TensorFlow
    python tools/benchmarks/gpu_train.py --data runs/gpu-bench/gpu_bench_data.npz --out $OUT
    python tools/benchmarks/gpu_train.py --dry-run --out runs/gpu-bench-dry
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
# The workers get the environment as given; this process only counts and
# plots, and must not take the GPU's memory.
WORKER_ENV = dict(os.environ)
# JAX takes 75% of the GPU's memory up front by default; PyTorch can use it all.
WORKER_ENV.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
os.environ["JAX_PLATFORMS"] = "cpu"

HERE = os.path.dirname(os.path.abspath(__file__))
# The repository root, for kbert (the script's own folder, for benchmark, is on the path).
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from benchmark import NUM_CLASSES, flops_per_sequence  # noqa: E402

from kbert.config import BertConfig  # noqa: E402
from kbert.export.verify import machine  # noqa: E402

WORKERS = {"kbert": "gpu_kbert.py", "torch": "gpu_torch.py"}
STACK_LABELS = {"kbert": "kbert + Keras/JAX", "torch": "HF + PyTorch"}
# The H200's (and H100 SXM's) dense bfloat16 peak, by NVIDIA's datasheet.
H200_BF16_PEAK_TFLOPS = 989
# (part, preset, seq_len, batch_size) in the order they run: if the budget
# runs out, what is left out is the least needed (fine-tuning at batch 256).
# At seq 512, batch 256 is about 90 GB of bf16 activations for BERT-base
# without fused attention (Korthikanti et al.'s 34·s·h + 5·a·s² bytes per layer
# and sequence), 45 GB with it: it fills most of the GPU, and a job out of
# memory is retried at half the batch.
GPU_PLAN = (
    ("pretrain", "bert_base", 128, 256),
    ("pretrain", "bert_base", 512, 256),
    ("finetune", "minilm_l6_h384", 128, 32),
    ("finetune", "minilm_l6_h384", 128, 256),
    ("finetune", "bert_base", 128, 32),
    ("finetune", "bert_base", 128, 256),
)
DRY_RUN_PLAN = (
    ("pretrain", "bert_tiny", 128, 8),
    ("finetune", "bert_tiny", 128, 8),
    ("pretrain", "bert_tiny", 512, 4),
)
# AdamW as BERT's: weight decay 0.01, epsilon 1e-6; learning rate 1e-4 (BERT's
# pretraining peak) from step 0, so a random-init BERT-base's loss falls within
# the timed steps; the dry run's bert_tiny takes 1e-3, so it does within 8 to 10.
GPU_LR, DRY_RUN_LR = 1e-4, 1e-3
WEIGHT_DECAY, EPSILON = 0.01, 1e-6
# Attention dropout is off on both stacks: kbert then takes
# `keras.ops.dot_product_attention`'s fused path and PyTorch SDPA's, as fast
# BERT recipes (MosaicBERT) do; hidden dropout stays at BERT's 0.1.
ATTENTION_DROPOUT = 0.0
# The matmul ceiling: bf16 size³ products chained in one compiled call, on
# random data (zeros run faster on an H200).
GPU_MATMUL = {"size": 8192, "products": 10, "repeats": 10}
DRY_RUN_MATMUL = {"size": 512, "products": 2, "repeats": 3}
# A job is not started with less time than this left in the budget.
MIN_JOB_S = 30
OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "out of memory", "OutOfMemoryError")


def run_worker(stack, job, timeout, log):
    """Runs one job in a fresh process; its result dict, or one with an "error"."""
    command = [sys.executable, os.path.join(HERE, WORKERS[stack]), json.dumps(job)]
    try:
        done = subprocess.run(
            command, env=WORKER_ENV, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    log.write(f"==== {stack} {json.dumps(job)}\n{done.stdout[-4000:]}{done.stderr[-8000:]}\n")
    log.flush()
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][-500:],
                "out_of_memory": any(word in done.stderr for word in OUT_OF_MEMORY)}
    return json.loads(lines[-1][len("RESULT "):])


def measure(stack, job, deadline, log):
    """Runs `job`, halving its batch while the GPU runs out of memory."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining < MIN_JOB_S:
            return {"error": "skipped: time budget spent", "skipped": True}
        result = run_worker(stack, job, remaining, log)
        if not result.get("out_of_memory") or job.get("batch_size", 1) < 2:
            return {**result, "batch_size": job.get("batch_size")}
        job = {**job, "batch_size": job["batch_size"] // 2}
        print(f"{stack}: out of memory, retrying at batch {job['batch_size']}", flush=True)


def row(stack, job, result, peak_tflops, matmul_tflops):
    task = "mlm" if job["part"].startswith("pretrain") else "classifier"
    config = BertConfig.from_dict(job["config"])
    flops = flops_per_sequence(config, job["seq_len"], task, NUM_CLASSES)
    entry = {"stack": stack, "kind": job["kind"], "preset": job["preset"],
             "seq_len": job["seq_len"], "batch_size": result.get("batch_size")}
    if "error" in result:
        return {**entry, "error": result["error"], "skipped": result.get("skipped", False)}
    seq_per_s = result["batch_size"] / result["step_s"]
    tflops = seq_per_s * flops / 1e12
    return {
        **entry,
        "seq_per_s": round(seq_per_s, 2),
        "tokens_per_s": round(seq_per_s * job["seq_len"]),
        "step_ms": round(result["step_s"] * 1e3, 2),
        "model_tflops_per_s": round(tflops, 3),
        "mfu_vs_peak": round(tflops / peak_tflops, 6),
        "mfu_vs_matmul": round(tflops / matmul_tflops, 4) if matmul_tflops else None,
        "peak_memory_gib": round(result["peak_memory_bytes"] / 2**30, 2),
        "peak_memory_kind": result["peak_memory_kind"],
        "first_steps_s": result["warmup_s"],
        "parameters": result["parameters"],
        "loss_first": result["loss_first"],
        "loss_last": result["loss_last"],
        "loss_slope_per_step": result["loss_slope_per_step"],
        "loss_fell": result["loss_fell"],
        "losses": result["losses"],
        **({"tensorflow_imported": result["tensorflow_imported"]}
           if "tensorflow_imported" in result else {}),
    }


def ratios(runs):
    """kbert's sequences/s over PyTorch's, per job both stacks measured."""
    out = {}
    for r in runs:
        other = [o for o in runs if o["stack"] == "torch" and "seq_per_s" in o
                 and (o["kind"], o["preset"], o["seq_len"], o["batch_size"])
                 == (r["kind"], r["preset"], r["seq_len"], r["batch_size"])]
        if r["stack"] == "kbert" and "seq_per_s" in r and other:
            key = f"{r['kind']} {r['preset']} seq {r['seq_len']} batch {r['batch_size']}"
            out[key] = round(r["seq_per_s"] / other[0]["seq_per_s"], 3)
    return out


def plot(runs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in runs if "seq_per_s" in r]
    labels = [
        f"{r['kind']} {r['preset']} s{r['seq_len']} b{r['batch_size']} {STACK_LABELS[r['stack']]}"
        for r in measured
    ]
    colors = ["tab:blue" if r["stack"] == "kbert" else "tab:orange" for r in measured]
    fig, axes = plt.subplots(1, 2, figsize=(15, 1.5 + 0.45 * len(measured)), squeeze=False)
    for ax, key, title in ((axes[0][0], "seq_per_s", "sequences/s (log)"),
                           (axes[0][1], "mfu_vs_matmul", "MFU vs measured bf16 matmul")):
        ax.barh(range(len(measured)), [r[key] or 0 for r in measured], color=colors)
        ax.set_yticks(range(len(measured)), labels if key == "seq_per_s" else [""] * len(measured),
                      fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{title} (blue kbert + Keras/JAX, orange HF + PyTorch)", fontsize=9)
        if key == "seq_per_s" and measured:
            ax.set_xscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(args, settings, results, start, final):
    """Writes gpu_train.json from the results so far; returns the report."""
    matmul = {}
    for stack, _, result in results:
        if "tflops" in result.get("matmul", {}):
            matmul[stack] = result["matmul"]["tflops"]
    matmul_tflops = max(matmul.values(), default=None)
    runs = [row(stack, job, result, args.peak_tflops, matmul_tflops)
            for stack, job, result in results]
    first = {}
    for stack, _, result in results:
        if "device" in result:
            first.setdefault(stack, result)
    report = {
        "mode": "dry-run (CPU, bert_tiny)" if args.dry_run else "gpu",
        "complete": final,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "devices": {stack: r["device"] for stack, r in first.items()},
        "versions": {stack: r["versions"] for stack, r in first.items()},
        "peak_tflops": args.peak_tflops,
        # Four significant figures: a dry run on a busy CPU measures thousandths of a TFLOP/s.
        "matmul_tflops_by_stack": {stack: float(f"{t:.4g}") for stack, t in matmul.items()},
        "matmul_tflops": float(f"{matmul_tflops:.4g}") if matmul_tflops else None,
        "settings": settings,
        "flops_formula": "tools/benchmarks/benchmark.py flops_per_sequence (mlm for pretraining, classifier)",
        "runs": runs,
        "kbert_over_torch_seq_per_s": ratios(runs),
        # Every planned job measured and learning: a skipped or failed job fails the run.
        "sanity_ok": bool(runs) and all(r.get("loss_fell") for r in runs),
        "elapsed_s": round(time.monotonic() - start, 1),
    }
    with open(os.path.join(args.out, "gpu_train.json"), "w") as f:
        json.dump(report, f, indent=2)
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="runs/gpu-bench/gpu_bench_data.npz",
                        help="the .npz of tools/benchmarks/gpu_data.py")
    parser.add_argument("--out", default="runs/gpu-bench-out")
    parser.add_argument("--dry-run", action="store_true",
                        help="bert_tiny, a few steps: the whole path on CPU")
    parser.add_argument("--stacks", default="kbert,torch")
    parser.add_argument("--parts", default="pretrain,finetune")
    parser.add_argument("--steps", type=int, help="timed steps (default 50; dry run 10)")
    parser.add_argument("--warmup-steps", type=int, help="untimed steps (default 5; dry run 2)")
    parser.add_argument("--budget-s", type=float, default=450,
                        help="start no job after this many seconds (8 minutes less a margin)")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_PEAK_TFLOPS)
    parser.add_argument("--no-torch-compile", action="store_true", help="PyTorch eager")
    args = parser.parse_args()
    stacks = args.stacks.split(",")
    if any(s not in WORKERS for s in stacks):
        parser.error(f"--stacks {args.stacks}: expected a comma list of {sorted(WORKERS)}")
    if not os.path.isfile(args.data):
        parser.error(f"--data {args.data}: no such file; run tools/benchmarks/gpu_data.py first")
    plan = DRY_RUN_PLAN if args.dry_run else GPU_PLAN
    plan = [job for job in plan if job[0] in args.parts.split(",")]
    steps = args.steps or (10 if args.dry_run else 50)
    warmup_steps = args.warmup_steps
    if warmup_steps is None:
        warmup_steps = 2 if args.dry_run else 5
    if steps < 2 or warmup_steps < 1:
        parser.error(f"--steps {steps} --warmup-steps {warmup_steps}: expected at least 2 and 1")
    settings = {
        "steps": steps, "warmup_steps": warmup_steps,
        "lr": DRY_RUN_LR if args.dry_run else GPU_LR, "weight_decay": WEIGHT_DECAY,
        "epsilon": EPSILON, "attention_dropout": ATTENTION_DROPOUT, "dtype": "mixed_bfloat16",
        "xla": True, "bf16": True, "torch_compile": not args.no_torch_compile,
        "budget_s": args.budget_s,
    }

    os.makedirs(args.out, exist_ok=True)
    start = time.monotonic()
    deadline = start + args.budget_s
    results = []
    with open(os.path.join(args.out, "gpu_train.log"), "w") as log:
        for part, preset, seq_len, batch_size in plan:
            config = BertConfig.from_preset(preset, attention_dropout=ATTENTION_DROPOUT)
            for stack in stacks:
                job = {
                    **settings, "kind": part, "part": f"{part}_{seq_len}", "preset": preset,
                    "config": config.to_dict(), "seq_len": seq_len, "batch_size": batch_size,
                    "num_classes": NUM_CLASSES, "data": os.path.abspath(args.data),
                    "seed": 0, "compile": settings["torch_compile"],
                }
                # Each stack's first finished job also times the matmul ceiling,
                # in the process that already holds the GPU.
                if not any(s == stack and "matmul" in r for s, _, r in results):
                    job["matmul"] = DRY_RUN_MATMUL if args.dry_run else GPU_MATMUL
                results.append((stack, job, measure(stack, job, deadline, log)))
                shown = row(stack, job, results[-1][2], args.peak_tflops, None)
                print(json.dumps({k: v for k, v in shown.items() if k != "losses"}), flush=True)
                # Written after every job, so a run stopped from outside leaves its figures.
                write_report(args, settings, results, start, final=False)
        report = write_report(args, settings, results, start, final=True)
    plot(report["runs"], os.path.join(args.out, "gpu_train.png"))
    print(json.dumps({k: report[k] for k in ("matmul_tflops_by_stack", "kbert_over_torch_seq_per_s",
                                             "sanity_ok", "elapsed_s")}))
    verdict = "ok" if report["sanity_ok"] else "FAILED (a job failed, was skipped or did not learn)"
    print(f"wrote {args.out}/gpu_train.json and .png; sanity {verdict}")
    return 0 if report["sanity_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
