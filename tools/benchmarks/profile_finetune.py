"""Where one epoch of `kbert finetune` spends its time: prints one JSON object.

Builds the model, optimizer and batches the way `kbert finetune` does
(`kbert.training.finetune`), then fits one epoch with a
callback that times every step, and separately times what the fit also pays
for: reading the batches alone (the input pipeline), the dev evaluation, and
the epoch checkpoint. Step times are split by padded length; the first step of
each length includes tracing (`tf.function` retraces per new shape).

Variants switch one thing at a time, each fitted on the same batches:
`--no-dropout` (dropout costs random numbers on CPU), `--bucket-width N`
(length buckets padded to a multiple of N in place of kbert finetune's; 0:
batches drawn at random, each padded to its longest row),
`--padded` (the encoder blocks work on the padded batch, not the real tokens
alone), `--xla`, `--dtype`, `--keras-adamw` (Keras's AdamW in
place of kbert's fused update). `--trace-steps N` then fits N more
steps under TensorFlow's profiler and adds the op time of a step by part of
the model (activation, dropout, LayerNorm, AdamW, ...), forward and backward,
and by op type.

`--interleave` compares instead: it fits the variant and a second model with
kbert finetune's own settings in turn, one step each, on the same batches,
and reports each one's mean step and their ratio. This machine's speed
drifts by about 10% between runs minutes apart; taken step by step in turn,
the drift falls on both, and a change of a few percent shows.

    python tools/benchmarks/profile_finetune.py --train data/debian-packages/train.csv \\
        --dev data/debian-packages/dev.csv --steps 60
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import keras  # noqa: E402


def bucket_width_arg(value):
    """`--bucket-width`: a positive integer, or 0 for random batches."""
    try:
        width = int(value)
    except ValueError:
        width = -1
    if width < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: expected 0 (random batches) or a positive integer")
    return width


def parse_args(argv=None):
    from kbert.cliargs import positive_int
    from kbert.hardware import resolve_dtype
    from kbert.tasks import TASKS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="text-classification", choices=list(TASKS))
    parser.add_argument("--train", required=True)
    parser.add_argument("--dev", required=True)
    parser.add_argument("--init", default="all-minilm-l6-v2")
    parser.add_argument("--seq-len", type=positive_int, default=128)
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--steps", type=positive_int, default=None, help="steps to fit (default: one epoch)")
    parser.add_argument("--dtype", default="auto", help="a dtype policy, or auto (as kbert finetune)")
    parser.add_argument("--xla", action="store_true")
    parser.add_argument("--no-dropout", action="store_true", help="set every Dropout rate to 0")
    parser.add_argument("--bucket-width", type=bucket_width_arg, default=None,
                        help="length buckets padded to a multiple of this (default: kbert "
                             "finetune's); 0: batches drawn at random, padded to their longest row")
    parser.add_argument("--padded", action="store_true",
                        help="the encoder blocks train on the padded batch, not its real tokens alone")
    parser.add_argument("--keras-adamw", action="store_true",
                        help="Keras's AdamW in place of kbert's fused one")
    parser.add_argument("--trace-steps", type=positive_int, default=None,
                        help="also trace this many steps with TensorFlow's profiler")
    parser.add_argument("--interleave", action="store_true",
                        help="fit the variant and kbert finetune's settings in turn, step by step, "
                             "on the same batches, and report the ratio of their steps")
    args = parser.parse_args(argv)
    args.dtype = resolve_dtype(args.dtype)
    if args.interleave and args.trace_steps:
        parser.error("--interleave compares step times; trace without it (--trace-steps)")
    return args


# Parts of a step: an op belongs to the first whose fragment its name holds.
PARTS = ("dropout", "gelu", "layer_norm", "adam", "softmax", "attention", "dense", "embedding")


def trace_ops(model, dataset, steps):
    """Op time of `steps` fitted steps, a step's share, by part of the model and by op type.

    Read from the host plane of TensorFlow's profiler trace: each op event
    is named `scope/.../op:Type`; ops under `gradient_tape` are the backward pass.
    """
    import collections
    import glob

    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tempfile.TemporaryDirectory(prefix="kbert-trace-") as logdir:
        tf.profiler.experimental.start(logdir)
        model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
        tf.profiler.experimental.stop()
        (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        with open(path, "rb") as f:
            space = xplane_pb2.XSpace.FromString(f.read())
    parts, types = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                scope, _, op_type = name.rpartition(":")
                # Ops of the traced functions; not the calls that run them.
                if "/" not in scope or "PartitionedCall" in op_type:
                    continue
                lower = scope.lower()
                part = next((p for p in PARTS if p in lower), "other")
                direction = "backward" if "gradient_tape" in lower else "forward"
                seconds = event.duration_ps / 1e12 / steps
                parts[part, direction] += seconds
                types[op_type] += seconds
    by_part = {}
    for (part, direction), seconds in sorted(parts.items(), key=lambda item: -item[1]):
        by_part.setdefault(part, {})[direction] = round(seconds * 1000, 1)
    return {
        "steps": steps,
        "op_ms_per_step": round(sum(types.values()) * 1000, 1),
        "by_part_ms": by_part,
        "top_op_types_ms": {t: round(s * 1000, 1) for t, s in types.most_common(15)},
    }


def interleaved(variant, baseline, batches):
    """Mean step of two compiled models fitted in turn, one step each, on `batches`.

    The order alternates from batch to batch. Each model first fits the
    first two batches of different widths untimed: its first step traces,
    and TensorFlow traces again, shape-relaxed, at the second width.

    Returns:
        dict: steps timed, each model's mean step in seconds, and
        `variant_over_baseline`, the ratio of their sums.
    """
    import numpy as np

    widths = {}
    for features, targets in batches:
        widths.setdefault(int(features["token_ids"].shape[1]), (features, targets))
        if len(widths) == 2:
            break
    for model in (variant, baseline):
        for features, targets in widths.values():
            model.train_on_batch(features, targets)
    seconds = {"variant": [], "baseline": []}
    models = {"variant": variant, "baseline": baseline}
    for index, (features, targets) in enumerate(batches):
        order = ("variant", "baseline") if index % 2 == 0 else ("baseline", "variant")
        for name in order:
            start = time.perf_counter()
            models[name].train_on_batch(features, targets)
            seconds[name].append(time.perf_counter() - start)
    variant_s, baseline_s = np.array(seconds["variant"]), np.array(seconds["baseline"])
    return {
        "steps": len(variant_s),
        "variant_mean_s": round(float(variant_s.mean()), 4),
        "baseline_mean_s": round(float(baseline_s.mean()), 4),
        "variant_over_baseline": round(float(variant_s.sum() / baseline_s.sum()), 4),
    }


class StepTimer(keras.callbacks.Callback):
    """Keeps each training step's wall-clock."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


def settings(args):
    """The switches of the fitted variant, for the report."""
    keys = ("seq_len", "batch_size", "dtype", "xla", "no_dropout", "bucket_width", "padded", "keras_adamw")
    return {key: getattr(args, key) for key in keys}


def compiled_model(args, task, encoder, steps):
    """The task's model on `encoder`, compiled as `kbert finetune` does, with
    the switches of `args` (`--no-dropout`, `--xla`, `--keras-adamw`, `--padded`)."""
    from kbert.layers.attention import MultiHeadSelfAttention
    from kbert.models import train_on_real_tokens
    from kbert.fitting.distribute import compile_for_strategy
    from kbert.fitting.optimizers import make_optimizer

    model = task.build_model(encoder, dtype=args.dtype)
    if args.no_dropout:
        for layer in model._flatten_layers():
            if isinstance(layer, keras.layers.Dropout):
                layer.rate = 0.0
            if isinstance(layer, MultiHeadSelfAttention):
                layer.dropout = 0.0
    compile_for_strategy(
        model,
        jit_compile=args.xla,
        optimizer=make_optimizer("adamw", 5e-5, steps, warmup_steps=steps // 10, dtype=args.dtype,
                                 fused=not args.keras_adamw),
        **task.compile_args(),
    )
    if args.padded:
        train_on_real_tokens(model, False)
    return model


def main(argv=None):
    args = parse_args(argv)
    import numpy as np

    from kbert.checkpoints.huggingface import init_encoder
    from kbert.export.verify import machine
    from kbert.tasks import get_task
    from kbert.training.batching import train_dataset, training_bucket_width
    from kbert.text import WordPieceTokenizer

    task_class = get_task(args.task)
    options, train, dev, learned = task_class.read_training(args.train, args.dev)
    keras.utils.set_random_seed(0)
    config, encoder, vocabulary, lowercase = init_encoder(args.init, dtype=args.dtype)
    task = task_class(WordPieceTokenizer(vocabulary, lowercase=lowercase), args.seq_len, **learned)
    task.use_options(options)

    # 0 asks for random batches (None); no flag, for kbert finetune's buckets.
    bucket_width = training_bucket_width(args.xla) if args.bucket_width is None else args.bucket_width or None

    def batches():
        return train_dataset(task, train, args.batch_size, seed=0, bucket_width=bucket_width)

    ds, steps = batches()
    steps = min(steps, args.steps or steps)
    if args.interleave:
        # Only the step times: none of the single run's other measurements.
        model = compiled_model(args, task, encoder, steps)
        # kbert finetune's own settings, from a second copy of the checkpoint.
        baseline_args = parse_args(["--train", args.train, "--dev", args.dev, "--task", args.task])
        _, baseline_encoder, _, _ = init_encoder(args.init, dtype=baseline_args.dtype)
        baseline = compiled_model(baseline_args, task, baseline_encoder, steps)
        report = {
            "task": task.name,
            "settings": settings(args),
            "interleaved": interleaved(model, baseline, list(ds.take(steps))),
            "machine": machine(),
        }
        print(json.dumps(report, indent=2))
        return
    # The padded length of each batch, in the order fit will see them.
    lengths, real = [], []
    for features, _ in ds.take(steps):
        lengths.append(int(features["token_ids"].shape[1]))
        real.append(float(np.mean(features["padding_mask"].numpy().sum(axis=1))))
    start = time.perf_counter()
    for _ in batches()[0].take(steps):
        pass
    pipeline_seconds = time.perf_counter() - start

    model = compiled_model(args, task, encoder, steps)
    timer = StepTimer()
    start = time.perf_counter()
    model.fit(batches()[0].take(steps), epochs=1, steps_per_epoch=steps, callbacks=[timer], verbose=0)
    fit_seconds = time.perf_counter() - start

    by_length = {}
    first = {}
    for length, seconds in zip(lengths, timer.seconds):
        if length not in first:
            first[length] = seconds
            continue
        by_length.setdefault(length, []).append(seconds)
    steady = {
        str(length): {
            "steps": len(values),
            "median_s": round(statistics.median(values), 4),
            "sequences_per_s": round(args.batch_size / statistics.median(values), 2),
        }
        for length, values in sorted(by_length.items())
    }
    steady_total = sum(statistics.median(by_length.get(L, [first[L]])) for L in lengths)

    dev_encoded = task.encode(dev)
    start = time.perf_counter()
    task.run(model, dev_encoded.features, args.batch_size)
    eval_seconds = time.perf_counter() - start

    with tempfile.TemporaryDirectory(prefix="kbert-profile-") as work:
        start = time.perf_counter()
        model.save(os.path.join(work, "model.keras"))
        save_seconds = time.perf_counter() - start

    padded = np.array(lengths)
    report = {
        "task": task.name,
        "settings": settings(args),
        "steps": steps,
        "mean_padded_length": round(float(padded.mean()), 1),
        "mean_real_tokens": round(float(np.mean(real)), 1),
        "fit_seconds": round(fit_seconds, 1),
        "steps_seconds": round(sum(timer.seconds), 1),
        "steady_state_seconds": round(steady_total, 1),
        "first_step_of_each_length_s": {str(k): round(v, 2) for k, v in sorted(first.items())},
        "steady_step_by_length": steady,
        "input_pipeline_alone_seconds": round(pipeline_seconds, 1),
        "dev_predict_seconds": round(eval_seconds, 1),
        "dev_examples": len(dev),
        "model_save_seconds": round(save_seconds, 1),
        "fit_sequences_per_s": round(steps * args.batch_size / fit_seconds, 2),
        "machine": machine(),
    }
    if args.trace_steps:
        # The timed batches again, of mixed widths: where an average step goes.
        report["trace"] = trace_ops(model, batches()[0].take(steps).repeat(), args.trace_steps)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
