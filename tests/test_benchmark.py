"""tools/benchmarks/benchmark.py as it runs on an accelerator machine: JAX backend, no TensorFlow.

The GPU figures of the scale issue come from machines whose image has JAX with
CUDA but no TensorFlow (its wheel is too large to carry there), so the model
code the harness runs (`kbert.bert_pretrainer`, `kbert.bert_classifier`) must
not import TensorFlow, tf-text or keras-hub. The run here blocks those imports
and checks the report the harness writes.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "benchmarks", "benchmark.py")
TIMEOUT_S = 300

_BLOCKED_RUN = textwrap.dedent(
    """
    import importlib.abc, runpy, sys

    class NoTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("tensorflow", "tensorflow_text", "keras_hub", "tf2onnx"):
                raise ImportError(f"{name} imported by the JAX benchmark path")

    sys.meta_path.insert(0, NoTensorFlow())
    script = sys.argv[1]
    sys.argv = [script] + sys.argv[2:]
    runpy.run_path(script, run_name="__main__")
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["mlm", "classifier"])
def test_benchmark_runs_under_jax_without_tensorflow(task, tmp_path):
    command = [
        sys.executable, "-c", _BLOCKED_RUN, TOOL,
        "--quick", "--impls", "kbert", "--xla", "on", "--task", task,
        "--peak-tflops", "989", "--out", str(tmp_path),
    ]
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / f"benchmark_{task}_jax.json") as f:
        report = json.load(f)
    assert report["backend"] == "jax"
    (run,) = report["runs"]
    assert run["impl"] == "kbert" and run["xla"] and run["seq_per_s"] > 0
    assert report["peak_tflops"] == 989 and report["peak_source"] == "--peak-tflops"
    assert (tmp_path / f"benchmark_{task}_jax.png").stat().st_size > 0


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--inference-model", "no-such-folder"], "--inference-model no-such-folder: not a kbert model folder"),
        (["--num-classes", "1"], "--num-classes 1: expected at least 2"),
    ],
)
def test_benchmark_rejects_bad_arguments(arguments, message, tmp_path):
    done = subprocess.run(
        [sys.executable, TOOL, "--out", str(tmp_path), *arguments],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert done.returncode == 2 and message in done.stderr.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []
