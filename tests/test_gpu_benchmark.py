"""tools/benchmarks/gpu_train.py's dry run: the GPU benchmark's whole path on CPU.

The GPU machine's image has JAX with CUDA, PyTorch and transformers but no
TensorFlow, so every process of the run here (the driver and each job's worker)
starts with TensorFlow, tf-text and keras-hub blocked by a `sitecustomize.py`
on PYTHONPATH, JAX on CPU, `bert_tiny` and a few steps, on real Debian text
prepared the way `gpu_data.py` prepares it (a cut of train.csv, so it is quick).
The kbert + Keras/JAX side runs every dry-run job. The Hugging Face + PyTorch
side (torch and transformers: the GPU image has them, and the dev extra
declares them here) runs one job, eager (`--no-torch-compile`): on CPU,
compiling takes minutes and importing transformers tens of seconds per job.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools", "benchmarks")
TIMEOUT_S = 300
# Rows of train.csv the test's data is cut from: enough for every dry-run batch.
DATA_ROWS = 300
STEPS, WARMUP_STEPS = 8, 2

# As where TensorFlow is not installed: `import tensorflow` raises
# ModuleNotFoundError and `importlib.util.find_spec` returns None, which is how
# Keras and transformers look for it.
_NO_TENSORFLOW = textwrap.dedent(
    """
    import sys

    for name in ("tensorflow", "tensorflow_text", "keras_hub", "tf2onnx"):
        sys.modules[name] = None
    """
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu-bench")
    subprocess.run(
        [sys.executable, os.path.join(TOOLS, "gpu_data.py"), "--out", str(folder / "data"),
         "--work", str(folder / "work"), "--max-rows", str(DATA_ROWS), "--workers", "1"],
        cwd=ROOT, check=True, capture_output=True, timeout=TIMEOUT_S,
    )
    return folder / "data" / "gpu_bench_data.npz"


def dry_run(data, out, stacks, parts):
    """gpu_train.py --dry-run with TensorFlow blocked in every process; its report."""
    site = out / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(_NO_TENSORFLOW)
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(site), ROOT])}
    done = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "gpu_train.py"), "--dry-run", "--no-torch-compile",
         "--stacks", stacks, "--parts", parts, "--steps", str(STEPS), "--data", str(data),
         "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu_train.json").read_text())
    assert report["complete"] and report["sanity_ok"]
    assert report["matmul_tflops"] > 0 and report["peak_tflops"] == 989
    for run in report["runs"]:
        assert run["stack"] == stacks
        assert run["seq_per_s"] > 0 and 0 < run["mfu_vs_matmul"]
        # seq_per_s is rounded to 0.01 in the report, tokens_per_s to 1.
        assert abs(run["tokens_per_s"] - run["seq_per_s"] * run["seq_len"]) <= run["seq_len"] / 100
        assert run["peak_memory_gib"] > 0 and len(run["losses"]) == STEPS + WARMUP_STEPS
        assert run["loss_fell"] and run["loss_slope_per_step"] < 0
    assert (out / "gpu_train.png").stat().st_size > 0
    return report


@pytest.mark.slow
def test_kbert_side_runs_without_tensorflow_and_learns(data, tmp_path):
    report = dry_run(data, tmp_path, "kbert", "pretrain,finetune")
    jobs = {(r["kind"], r["seq_len"], r["batch_size"]) for r in report["runs"]}
    assert jobs == {("pretrain", 128, 8), ("pretrain", 512, 4), ("finetune", 128, 8)}
    assert all(r["tensorflow_imported"] is False for r in report["runs"])


@pytest.mark.slow
def test_torch_side_runs_and_learns(data, tmp_path):
    report = dry_run(data, tmp_path, "torch", "finetune")
    (run,) = report["runs"]
    assert (run["kind"], run["parameters"]) == ("finetune", 4387468)


def test_gpu_benchmark_rejects_missing_data(tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "gpu_train.py"), "--dry-run",
         "--data", str(tmp_path / "none.npz"), "--out", str(tmp_path / "out")],
        cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 2
    assert "no such file; run tools/benchmarks/gpu_data.py first" in done.stderr
