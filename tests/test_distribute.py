"""Data-parallel training, XLA under tf.distribute, and mixed precision.

The two-device runs are subprocesses: logical CPU devices (TensorFlow) and
host devices (JAX) must be configured before the framework initialises. Both
start together when the module loads and each test waits for its own.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import kbert
from kbert.fitting import distribute

# Weights after a few identical steps on one device and on two replicas differ
# only by float32 summation order (measured ~1e-8); 1e-5 leaves room for XLA's
# fusions on the replica side.
REPLICA_ATOL = 1e-5
SUBPROCESS_TIMEOUT_S = 240
# A run killed by a signal before it prints a result is started again this
# many times. TensorFlow's runtime once aborted at start-up with "corrupted
# double-linked list" (glibc's heap check) before the first step, under the
# full suite's load, and never in 20 runs alone: a crash of the framework,
# not a result of kbert's. A run that crashes twice, or gives a wrong
# result, fails.
CRASH_RETRIES = 1

_COMMON = """
import json
import numpy as np
import keras
import kbert

CONFIG = kbert.BertConfig(
    vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
    max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0,
)
GLOBAL_BATCH, STEPS = 8, 3

def data():
    rng = np.random.default_rng(0)
    n = GLOBAL_BATCH * STEPS
    x = {
        "token_ids": rng.integers(1, 50, (n, 8)).astype("int32"),
        "segment_ids": np.zeros((n, 8), "int32"),
        "padding_mask": np.ones((n, 8), "int32"),
    }
    return x, rng.integers(0, 3, (n,)).astype("int32")

def build():
    return kbert.bert_classifier(CONFIG, 3, dropout=0.0)

def compile_kwargs():
    # kbert's AdamW: on TensorFlow one fused update a variable, which
    # tf.distribute runs on each replica's copy and XLA compiles.
    from kbert.training import make_optimizer
    return dict(
        optimizer=make_optimizer("adamw", 1e-3, total_steps=STEPS),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )

def train(model):
    # The weights after one epoch, and the epoch's mean loss as `fit` logs it.
    x, y = data()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"][-1]

def max_diff(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))
"""

_TF_MIRRORED = _COMMON + """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from kbert.fitting import distribute

keras.utils.set_random_seed(0)
reference = build()
initial = reference.get_weights()
# The reference runs without XLA so that "Compiled cluster using XLA", logged
# once per process, can only come from the replicas.
reference.compile(jit_compile=False, **compile_kwargs())
expected, expected_loss = train(reference)

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = build()
    model.set_weights(initial)
    distribute.compile_for_strategy(model, strategy, jit_compile=True, **compile_kwargs())
batch_log = distribute.log_batch_sizes(strategy, GLOBAL_BATCH)
got, loss = train(model)
print("RESULT " + json.dumps({
    "max_diff": max_diff(expected, got),
    "loss_diff": abs(loss - expected_loss),
    "moved": max_diff(initial, got),
    "xla": distribute.is_xla_compiled(model),
    "replicas": strategy.num_replicas_in_sync,
    "batch_log": batch_log,
}))
"""

_JAX_DATA_PARALLEL = _COMMON + """
import jax
from kbert.fitting import distribute

keras.utils.set_random_seed(0)
reference = build()
initial = reference.get_weights()
reference.compile(jit_compile=True, **compile_kwargs())
expected, _ = train(reference)

keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
model = build()
model.set_weights(initial)
distribute.compile_for_strategy(model, None, jit_compile=True, **compile_kwargs())
got, _ = train(model)
kernel = model.get_layer("head").dense.kernel.value
print("RESULT " + json.dumps({
    "max_diff": max_diff(expected, got),
    "moved": max_diff(initial, got),
    "devices": len(jax.devices()),
    "kernel_devices": len(kernel.sharding.device_set),
    "xla": distribute.is_xla_compiled(model),
}))
"""


def _start(script, tmp_dir, name, **env):
    path = os.path.join(tmp_dir, f"{name}.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(script))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full_env = {
        **os.environ,
        "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TF_CPP_MIN_LOG_LEVEL": "0",
        **env,
    }
    return {
        "process": _launch(path, full_env),
        "again": lambda: _launch(path, full_env),
    }


def _launch(path, env):
    return subprocess.Popen(
        [sys.executable, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )


def _result(run, retries=CRASH_RETRIES):
    process = run["process"]
    try:
        stdout, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"subprocess timed out after {SUBPROCESS_TIMEOUT_S}s:\n{stderr[-3000:]}")
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if process.returncode < 0 and not lines and retries:
        # Killed by a signal before a result: the framework's runtime crashed
        # (see CRASH_RETRIES), not a wrong result. Run it once more.
        print(f"run crashed (signal {-process.returncode}); running it again:\n{stderr[-1000:]}")
        run["process"] = run["again"]()
        return _result(run, retries - 1)
    assert process.returncode == 0 and lines, f"rc={process.returncode}\n{stdout}\n{stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):]), stdout, stderr


@pytest.fixture(scope="module")
def two_device_runs(tmp_path_factory):
    tmp_dir = str(tmp_path_factory.mktemp("distribute"))
    runs = {
        "tf": _start(_TF_MIRRORED, tmp_dir, "tf_mirrored", KERAS_BACKEND="tensorflow"),
        "jax": _start(
            _JAX_DATA_PARALLEL, tmp_dir, "jax_data_parallel", KERAS_BACKEND="jax",
            XLA_FLAGS="--xla_force_host_platform_device_count=2",
            JAX_PLATFORMS="cpu",
        ),
    }
    yield runs
    for run in runs.values():
        process = run["process"]
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_mirrored_strategy_matches_one_device_with_xla(two_device_runs):
    result, stdout, stderr = _result(two_device_runs["tf"])
    assert result["replicas"] == 2
    assert result["moved"] > 1e-4, "training did not change the weights"
    assert result["max_diff"] < REPLICA_ATOL, result
    assert result["loss_diff"] < REPLICA_ATOL, result  # the loss the replicas log, averaged as on one device
    assert result["xla"], "the per-replica train step is not XLA-compiled"
    # Runtime evidence, not just the graph: the XLA device compiler ran.
    assert "Compiled cluster using XLA" in stderr
    assert "global batch 8 = 2 replicas x 4 per replica (MirroredStrategy)" in stdout


def test_jax_data_parallel_matches_one_device(two_device_runs):
    result, _, _ = _result(two_device_runs["jax"])
    assert result["devices"] == 2 and result["kernel_devices"] == 2
    assert result["moved"] > 1e-4
    assert result["max_diff"] < REPLICA_ATOL, result
    assert result["xla"]


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.distribute")
def test_get_strategy_and_batch_log():
    strategy = distribute.get_strategy("default")
    assert strategy.num_replicas_in_sync == 1
    assert distribute.log_batch_sizes(strategy, 32) == "global batch 32 on one device"
    assert distribute.log_batch_sizes(None, 8) == "global batch 8 on one device"
    with pytest.raises(ValueError, match="positive integer"):
        distribute.log_batch_sizes(strategy, 0)
    with pytest.raises(ValueError, match="is not one of"):
        distribute.get_strategy("horovod")
    os.environ.pop("TF_CONFIG", None)
    with pytest.raises(ValueError, match="TF_CONFIG"):
        distribute.get_strategy("multiworker")


def _one_block_classifier():
    config = kbert.BertConfig(
        vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
        max_position_embeddings=16,
    )
    return kbert.bert_classifier(config, 3)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.distribute")
def test_default_strategy_xla_check():
    x, y = _mp_data(4)
    model = _one_block_classifier()
    distribute.compile_for_strategy(
        model, None, jit_compile=False, optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.train_on_batch(x, y)
    assert not distribute.is_xla_compiled(model)
    # Without XLA the blocks train over the real tokens; XLA takes fixed shapes.
    from kbert.layers import TransformerEncoderBlock

    blocks = [layer for layer in model.get_layer("bert_encoder").layers if isinstance(layer, TransformerEncoderBlock)]
    assert blocks and all(block.unpadded_training for block in blocks)
    distribute.compile_for_strategy(model, None, jit_compile=True, optimizer="sgd", loss="mse")
    assert not any(block.unpadded_training for block in blocks)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.function tracing")
def test_train_step_traced_once():
    # Keras builds an optimizer it finds unbuilt inside the first trace, and a
    # tf.function that creates variables is traced twice (15.5 s in place of
    # 7.8 s for the first step on the Debian task).
    from kbert.training import make_optimizer

    x, y = _mp_data(8)
    model = _one_block_classifier()
    distribute.compile_for_strategy(
        model, None, jit_compile=False, optimizer=make_optimizer("adamw", 1e-3, total_steps=2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    assert model.optimizer.built
    traces = []
    train_step = model.train_step

    def counted_train_step(data):
        traces.append(data)
        return train_step(data)

    model.train_step = counted_train_step
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert len(traces) == 1
    assert model.optimizer.iterations.numpy() == 2
    assert any(np.abs(a - b).max() > 0 for a, b in zip(before, model.get_weights()))


# Mixed precision: a few hundred steps of a tiny model at batch 4, sequence 8.
MIXED_PRECISION_STEPS = 200


def _mp_data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = {
        "token_ids": rng.integers(1, 50, (n, 8)).astype("int32"),
        "segment_ids": np.zeros((n, 8), "int32"),
        "padding_mask": np.ones((n, 8), "int32"),
    }
    return x, rng.integers(0, 3, (n,)).astype("int32")


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_stays_finite(policy):
    config = kbert.BertConfig(
        vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
        max_position_embeddings=16,
    )
    keras.utils.set_random_seed(0)
    model = kbert.bert_classifier(config, 3, dtype=policy)
    optimizer = keras.optimizers.Adam(1e-3)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    x, y = _mp_data(4 * MIXED_PRECISION_STEPS)
    history = model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
    if policy == "mixed_float16":
        scale = float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale))
        print(f"{policy}: loss scale {scale} after {MIXED_PRECISION_STEPS} steps")
        assert np.isfinite(scale) and scale >= 1.0


def test_loss_scale_optimizer_skips_inf_gradients():
    variable = keras.Variable(np.ones((3,), "float32"))
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    optimizer.build([variable])
    scale = float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
    gradients = keras.ops.convert_to_tensor(np.array([1.0, np.inf, 1.0], "float32"))
    optimizer.apply([gradients], [variable])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), np.ones(3))
    assert float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)) == scale / 2
    # A finite (scaled) gradient afterwards is applied unscaled.
    new_scale = scale / 2
    optimizer.apply([keras.ops.ones((3,)) * new_scale], [variable])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), np.full(3, 0.9), atol=1e-6)


_GROUPS_MIRRORED = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
root, checkpoint, train, dev, out = sys.argv[1:]
sys.path.insert(0, root)
import kbert.tasks
from kbert.training.finetune import finetune
from tests.test_adding_a_task import MultipleChoice

kbert.tasks.TASKS[MultipleChoice.name] = MultipleChoice
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
figures = finetune(train, dev, checkpoint, out, task=MultipleChoice.name, strategy=strategy, epochs=2,
                   batch_size=4, dtype="float32", verbose=0)
print("RESULT " + json.dumps({"n": figures["n"], "replicas": strategy.num_replicas_in_sync}))
"""


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.distribute")
def test_grouped_rows_stay_whole_on_each_replica(tmp_path):
    """Multiple choice, whose loss compares an example's rows, trains on two replicas:
    every batch holds a multiple of the replicas' groups, so each replica's share is
    whole groups (a bucket's odd last group is left out of its epoch; the count is exact)."""
    from kbert.checkpoints import save_hf_checkpoint
    from kbert.config import BertConfig
    from kbert.models import bert_encoder
    from kbert.training.batching import eval_dataset, train_dataset
    from tests.task_harness import minilm_vocabulary, task_instance
    from tests.test_adding_a_task import CHOICES, MultipleChoice, write_examples

    train, dev = write_examples(tmp_path / "train.csv", 13, seed=0), write_examples(tmp_path / "dev.csv", 7, seed=1)
    task = task_instance("text-classification", {"labels": ["a", "b"]}, 32)  # a tokenizer and preprocessor
    task = MultipleChoice(task.tokenizer, 32)
    for width in (None, 16):
        dataset, batches = train_dataset(task, task.read(train), 4, epochs=2, bucket_width=width, replicas=2)
        rows = [len(targets) for _, targets in dataset]
        assert len(rows) == 2 * batches and all(count % (2 * CHOICES) == 0 for count in rows), rows
    validation = [len(t) for _, t in eval_dataset(task, task.encode(task.read(dev)), 4, replicas=2)]
    assert validation == [4 * CHOICES, 2 * CHOICES]  # 7 examples: the 7th is over
    config = BertConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=64)
    save_hf_checkpoint(bert_encoder(config), config, list(minilm_vocabulary()), str(tmp_path / "bert"))
    run = subprocess.run(
        [sys.executable, "-c", _GROUPS_MIRRORED, os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
         str(tmp_path / "bert"), train, dev, str(tmp_path / "model")],
        capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, env={**os.environ, "KERAS_BACKEND": "tensorflow"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1][len("RESULT "):])
    assert result == {"n": 7, "replicas": 2}


def test_rows_made_one_at_a_time_keep_their_groups(tmp_path):
    """`Rows` with a `group_size` batch as `Encoded` rows do: each epoch holds every
    group once, whole and in order, and with replicas a multiple of them a batch."""
    from kbert.config import ENCODER_INPUTS
    from kbert.tasks import Rows
    from kbert.training.batching import train_dataset
    from tests.task_harness import task_instance
    from tests.test_adding_a_task import CHOICES, MultipleChoice, groups, write_examples

    class MadeOneAtATime(MultipleChoice):
        def training_rows(self, examples, packed=False):
            encoded = self.encode(examples)
            if packed:
                return encoded
            lengths = encoded.features["padding_mask"].sum(axis=1)
            return Rows(lengths, lambda i: ({name: encoded.features[name][i, :lengths[i]] for name in ENCODER_INPUTS},
                                            {"score": encoded.targets[i]}), ("score",), group_size=CHOICES)

    base = task_instance("text-classification", {"labels": ["a", "b"]}, 32)
    task, made = MultipleChoice(base.tokenizer, 32), MadeOneAtATime(base.tokenizer, 32)
    examples = task.read(write_examples(tmp_path / "data.csv", 13, seed=0))
    expected = sorted(groups([(f, t) for f, t in train_dataset(task, examples, 4, bucket_width=16)[0]]))
    for replicas in (1, 2):
        dataset, batches = train_dataset(made, examples, 4, epochs=2, bucket_width=16, replicas=replicas)
        dataset = [(f, t["score"]) for f, t in dataset]
        assert len(dataset) == 2 * batches
        assert all(len(t) % (replicas * CHOICES) == 0 for _, t in dataset)
        for epoch in (dataset[:batches], dataset[batches:]):
            assert sorted(groups(epoch)) == expected if replicas == 1 else set(groups(epoch)) < set(expected)
    with pytest.raises(ValueError, match="group_size=4; expected a positive integer that divides the 6 rows"):
        Rows(np.ones(6), None, (), group_size=4)
