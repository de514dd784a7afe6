"""Distribution strategies, XLA under `tf.distribute`, and batch-size logging.

Keras 3 and XLA under tf.distribute
-----------------------------------
`Model.compile(jit_compile="auto")` resolves to `False` whenever a
`tf.distribute` strategy is active (keras/src/trainers/trainer.py,
`_resolve_auto_jit_compile`). An explicit `jit_compile=True` is kept, but the
TensorFlow trainer then wraps the *whole* `strategy.run(...)` in one
`tf.function(jit_compile=True)` (keras/src/backend/tensorflow/trainer.py,
`_make_function`), and XLA compiles a cluster for one device: with
MirroredStrategy over two devices the first step fails with "Trying to access
resource .../replica_1/... located in device CPU:1 from device CPU:0".

`compile_for_strategy` therefore compiles the model with `jit_compile=False`
and installs a train step whose forward and backward pass is its own
`tf.function(jit_compile=True)`, run once per replica inside `strategy.run`
(what tf.keras 2 did). The gradient all-reduce and the optimizer update stay
outside XLA, in the strategy's collective ops. `is_xla_compiled(model)` checks
the traced train function: every replica device must call a function marked
`_XlaMustCompile`.

Launching on a cluster (MultiWorkerMirroredStrategy)
----------------------------------------------------
Every worker runs the same command (`--strategy multiworker`) with its own
`TF_CONFIG`; only `task.index` differs::

    # on host0                                   # on host1
    TF_CONFIG='{"cluster": {"worker": ["host0:12345", "host1:12345"]},
                "task": {"type": "worker", "index": 0}}'     # index 1 on host1
    python -m kbert.cli pretrain ... --strategy multiworker --checkpoint-every 1000

Worker 0 is the chief: only it writes the final model, the logs and the
checkpoints (`is_chief`); the others run the same saving code into a scratch
folder that is deleted (`chief_folder`). The output folder must be on storage
every worker can read (GCS, NFS): every worker restores from its `backup/`.
The batch size given is global: it is split evenly across
`num_replicas_in_sync` (all GPUs of all workers), so keep it divisible.

When one worker dies (SIGKILL, preemption), TensorFlow 2.21 does not carry on
without it and does not wait for it: the coordination service misses its
heartbeats and aborts the collectives of the survivors, whose next
all-reduce raises `UnavailableError: Collective ops is aborted by: ... The
following tasks are unhealthy (stopped sending heartbeats)`, and they exit
(about 20 s after the kill on localhost). Restart *every* worker with the same
command, as a cluster scheduler does: `kbert pretrain --checkpoint-every`
then resumes from the last checkpoint, at the same step and data position,
and with `--deterministic` ends with the weights of an uninterrupted run, bit
for bit (tests/test_multiworker.py).

TPU
---
On a Cloud TPU VM use `--strategy tpu` (the resolver finds the local TPU); for
a TPU node set `TPU_NAME` to its name or grpc address. TPUStrategy always
compiles with XLA, so `jit_compile` needs no help there. Data and checkpoints
must be on GCS, since the TPU workers cannot read local files.

With the JAX backend, use `keras.distribution.DataParallel` instead of a
`tf.distribute` strategy: `jax.jit` compiles every step, sharded or not.
"""

import contextlib
import json
import logging
import os
import shutil
import tempfile

import keras

from kbert.logs import to_stderr
from kbert.models import train_on_real_tokens

logger = logging.getLogger(__name__)

STRATEGIES = ("auto", "default", "mirrored", "multiworker", "tpu")


def get_strategy(name="auto"):
    """Returns the `tf.distribute.Strategy` called `name`.

    Create it first thing in the program: MultiWorkerMirroredStrategy
    configures collective ops, which TensorFlow refuses once it has run
    anything else (a `tf.data` pipeline included).

    Args:
        name: str or `tf.distribute.Strategy` (returned as is). One of
            `STRATEGIES`. "auto" is MirroredStrategy when more than one GPU
            is visible, otherwise the default (no-op) strategy;
            "multiworker" reads the cluster from the `TF_CONFIG` environment
            variable; "tpu" connects to the TPU named by `TPU_NAME` (or the
            local TPU of a TPU VM).

    Returns:
        A `tf.distribute.Strategy`; build and compile the model inside its
        `scope()`.

    Example:
    >>> get_strategy("default").num_replicas_in_sync
    1
    """
    import tensorflow as tf

    if isinstance(name, tf.distribute.Strategy):
        return name
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is not one of {STRATEGIES}")
    if name == "auto":
        name = "mirrored" if len(tf.config.list_physical_devices("GPU")) > 1 else "default"
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multiworker":
        tf_config = os.environ.get("TF_CONFIG")
        if not tf_config:
            raise ValueError(
                "strategy='multiworker' needs TF_CONFIG, e.g. "
                '{"cluster": {"worker": ["host0:12345", "host1:12345"]}, '
                '"task": {"type": "worker", "index": 0}}'
            )
        try:
            json.loads(tf_config)
        except json.JSONDecodeError as error:
            raise ValueError(f"TF_CONFIG={tf_config!r} is not valid JSON: {error}") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=os.environ.get("TPU_NAME", "")
        )
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError, RuntimeError) as error:
        raise ValueError(
            f"strategy='tpu' found no TPU (TPU_NAME={os.environ.get('TPU_NAME', '')!r}): {error}"
        ) from None
    return tf.distribute.TPUStrategy(resolver)


def log_batch_sizes(strategy, global_batch_size, log=None):
    """Logs and returns how `global_batch_size` splits across the replicas.

    Args:
        strategy: a `tf.distribute.Strategy`, or None for one device.
        global_batch_size: int. Examples per step over all replicas.
        log: callable taking a str, or None (standard error).

    Returns:
        str, e.g. "global batch 32 = 2 replicas x 16 per replica (MirroredStrategy)",
        or "global batch 32 on one device".
    """
    if not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise ValueError(f"global_batch_size={global_batch_size!r} must be a positive integer")
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    if global_batch_size % replicas:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by "
            f"num_replicas_in_sync={replicas}"
        )
    if replicas == 1:
        message = f"global batch {global_batch_size} on one device"
    else:
        message = (
            f"global batch {global_batch_size} = {replicas} replicas x "
            f"{global_batch_size // replicas} per replica ({type(strategy).__name__})"
        )
    logger.info(message)
    (log or to_stderr)(message)
    return message


def is_chief(strategy=None):
    """Whether this process writes the outputs (final model, logs, checkpoints).

    True everywhere except on the non-chief workers of a multi-worker cluster:
    with MultiWorkerMirroredStrategy the chief is worker 0 (or the task of
    type "chief" in `TF_CONFIG`).

    Args:
        strategy: a `tf.distribute.Strategy`, or None for one device.

    Returns:
        bool.
    """
    return strategy is None or strategy.extended.should_checkpoint


@contextlib.contextmanager
def chief_folder(folder, strategy=None):
    """Yields `folder` on the chief, a scratch folder removed afterwards elsewhere.

    Every worker of a MultiWorkerMirroredStrategy cluster must run the same
    saving code (reading a synchronised variable can be a collective op that
    waits for all workers), but only the chief may write the real files: the
    others write theirs to a temporary folder that is then deleted, Keras'
    and TensorFlow's usual multi-worker pattern.

    Args:
        folder: str. Where the chief writes.
        strategy: a `tf.distribute.Strategy`, or None for one device.

    Example:
    >>> with chief_folder("runs/model", None) as folder:
    ...     folder
    'runs/model'
    """
    if is_chief(strategy):
        yield folder
        return
    task = strategy.cluster_resolver
    scratch = tempfile.mkdtemp(prefix=f"kbert-{task.task_type}-{task.task_id}-")
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def wait_for_workers(strategy=None):
    """Returns once every worker of a MultiWorkerMirroredStrategy cluster has
    called it (one all-reduce of a number), at once with any other strategy.

    Called after the chief writes files that every worker then reads (an
    adapted encoder fine-tuning loads), it keeps the others from reading
    them before they are whole: the chief arrives only when it has written.
    """
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)


def _is_multi_replica(strategy):
    import tensorflow as tf

    return strategy is not None and isinstance(
        strategy,
        (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy),
    )


def compile_for_strategy(model, strategy=None, jit_compile=True, **compile_kwargs):
    """`model.compile(**compile_kwargs)` with XLA that takes effect under `strategy`.

    Call it inside `strategy.scope()`. With one device, TPUStrategy or the JAX
    backend this is `model.compile(jit_compile=jit_compile, ...)`. Under
    MirroredStrategy or MultiWorkerMirroredStrategy with `jit_compile=True`,
    each replica's forward and backward pass runs as one XLA computation (see
    the module docstring for why Keras cannot do this itself).

    Args:
        model: a `keras.Model` built under `strategy.scope()`.
        strategy: a `tf.distribute.Strategy` or None.
        jit_compile: bool. Compile the train step with XLA.
        **compile_kwargs: passed to `model.compile` (optimizer, loss, metrics…).

    Under MultiWorkerMirroredStrategy it also works around two Keras 3 bugs
    that make `fit` fail there (tensorflow/tensorflow#72388): see
    `_build_from_local_batch` and `_logs_as_vectors`.

    On TensorFlow without XLA, the encoder blocks train over each batch's
    real tokens alone (`kbert.models.train_on_real_tokens`).

    Returns:
        `model`, compiled.
    """
    if keras.backend.backend() != "tensorflow":
        model.compile(jit_compile=jit_compile, **compile_kwargs)
        return model
    import tensorflow as tf

    # A TensorFlow graph without XLA takes a new number of tokens each batch.
    train_on_real_tokens(model, enabled=not jit_compile)

    if not (jit_compile and _is_multi_replica(strategy)):
        model.compile(jit_compile=jit_compile, **compile_kwargs)
    else:
        model.compile(jit_compile=False, **compile_kwargs)
        model.train_step = _replica_xla_train_step(model)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        model._maybe_symbolic_build = _build_from_local_batch(model, strategy)
        model.train_step = _logs_as_vectors(model.train_step)
        model.test_step = _logs_as_vectors(model.test_step)
    _build_optimizer(model)
    return model


def _build_optimizer(model):
    """Creates the optimizer's variables of a built `model` now, before `fit`.

    Without a `tf.distribute` strategy of its own, a Keras 3 model defers
    building its optimizer to the first trace of the train function
    (keras/src/backend/tensorflow/trainer.py, `_maybe_symbolic_build`), and
    a `tf.function` that creates variables is traced twice: once creating
    them, once more without. Built here, the train step is traced once: on
    the Debian task the first step of `fit` took 7.8 s in place of 15.5 s.
    A model not built yet (its variables unknown) keeps Keras' own way. The
    optimizer so holds the variables trainable at compile time: set
    `trainable` on layers before `compile_for_strategy`, as Keras asks of
    `compile` too.
    """
    optimizer = model.optimizer
    if optimizer is not None and not optimizer.built and model.built:
        optimizer.build(model.trainable_variables)


def _logs_as_vectors(step):
    """`step` whose scalar logs are returned as vectors of one element.

    Keras 3 averages each replica's logs after the step with
    `strategy.reduce("MEAN", value, axis=0)` under MultiWorkerMirroredStrategy
    (keras/src/backend/tensorflow/trainer.py, `reduce_per_replica`), which
    fails on scalars: "Invalid reduction dimension 0 for input with 0
    dimensions". On one-element vectors it is the mean over the replicas.
    """
    import tensorflow as tf

    def vector_logs_step(data):
        return tf.nest.map_structure(lambda value: tf.reshape(value, [-1]), step(data))

    vector_logs_step.xla_function = getattr(step, "xla_function", None)
    return vector_logs_step


def _build_from_local_batch(model, strategy):
    """Keras' `_maybe_symbolic_build` with a batch of this worker's replicas.

    Before training, Keras 3 (keras/src/backend/tensorflow/trainer.py) takes
    one distributed batch and averages it over the replicas with
    `strategy.reduce` only to learn its shapes; with several workers that
    reduce is a collective op, which cannot take a nest of values: `fit` on a
    dict of features fails with "Attempt to convert a value ({'token_ids':
    PerReplica...}) ... to a Tensor". The shapes of the local batch suffice.
    """

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = keras.tree.map_structure(
                    lambda value: strategy.experimental_local_results(value)[0], next(batches)
                )
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    return maybe_symbolic_build


def _replica_xla_train_step(model):
    """Keras' TensorFlow `train_step` with forward and backward in one XLA function."""
    import tensorflow as tf
    from keras.src.losses import loss as loss_module
    from keras.src.trainers import data_adapters

    def forward_backward(x, y, sample_weight):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x, y, y_pred, sample_weight, training=True)
            scaled_loss = model.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled_loss, model.trainable_weights)
        return y_pred, loss, gradients

    forward_backward = tf.function(forward_backward, jit_compile=True, reduce_retracing=True)
    # `compile` makes it, first of `model.metrics`; the losses of each output are "<output>_loss".
    loss_tracker = next(metric for metric in model.metrics if metric.name == "loss")

    def train_step(data):
        x, y, sample_weight = data_adapters.data_adapter_utils.unpack_x_y_sample_weight(data)
        y_pred, loss, gradients = forward_backward(x, y, sample_weight)
        loss_tracker.update_state(
            loss_module.unscale_loss_for_distribution(loss),
            sample_weight=tf.shape(tf.nest.flatten(x)[0])[0],
        )
        # The all-reduce of the gradients happens here, outside XLA.
        model.optimizer.apply_gradients(zip(gradients, model.trainable_weights))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    train_step.xla_function = forward_backward
    return train_step


def is_xla_compiled(model):
    """Whether `model`'s traced train step runs under XLA on every replica.

    Inspects the graphs of `model.train_function` (call `fit` or
    `train_on_batch` first): each replica device of the model's strategy must
    call a function whose definition carries `_XlaMustCompile=True`, which is
    what `tf.function(jit_compile=True)` sets and what makes the runtime
    compile it with XLA instead of running its ops one by one. With the JAX
    backend every step goes through `jax.jit`, so this is True once compiled.

    Args:
        model: a compiled `keras.Model` whose train function has been traced.

    Returns:
        bool.
    """
    if keras.backend.backend() == "jax":
        return model.train_function is not None
    if keras.backend.backend() != "tensorflow" or model.train_function is None:
        return False
    import tensorflow as tf

    xla_names, calls = set(), []
    for function in _tf_functions(model.train_function):
        for concrete in function._list_all_concrete_functions():
            graph_def = concrete.graph.as_graph_def()
            library = graph_def.library.function
            xla_names |= {
                f.signature.name
                for f in library
                if "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b
            }
            for nodes in [graph_def.node, *(f.node_def for f in library)]:
                calls += [(n.attr["f"].func.name, n.device) for n in nodes if "f" in n.attr]
    xla_devices = {device for name, device in calls if name in xla_names}
    strategy = model.distribute_strategy
    if not _is_multi_replica(strategy):
        return bool(xla_devices)
    # A call without a device is the whole `strategy.run` under XLA (Keras'
    # own path), which cannot run on more than one device.
    canonical = {tf.DeviceSpec.from_string(d).to_string() for d in xla_devices if d}
    expected = {tf.DeviceSpec.from_string(d).to_string() for d in strategy.extended.worker_devices}
    return expected <= canonical


def _tf_functions(obj, seen=None):
    """The `tf.function`s reachable from `obj` through closures and wrappers."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    found = []
    if hasattr(obj, "_list_all_concrete_functions") and hasattr(obj, "_jit_compile"):
        found.append(obj)
        obj = getattr(obj, "_python_function", None)
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            found += _tf_functions(cell.cell_contents, seen)
        except ValueError:  # an empty cell
            pass
    wrapped = getattr(obj, "__wrapped__", None)
    if wrapped is not None:
        found += _tf_functions(wrapped, seen)
    return found
