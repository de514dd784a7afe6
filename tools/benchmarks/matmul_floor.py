"""The matmul time of one fine-tuning step of kbert's encoder: a floor for the step.

Times, one at a time, every matrix product a training step over the real
tokens runs (`kbert.layers.RealTokens`): each dense layer's forward product,
its input gradient and its kernel gradient over `--tokens` rows, and
attention's score and context products over `--batch` x `--width` padded
positions, forward and backward. Sums them for the encoder's blocks; of the
last, only the keys and values of every token: a pooled classifier computes
the rest of it for [CLS] alone, a few rows, left out. Prints one JSON object.

A step cannot take less than this on the machine, whatever is done to the
work between the products, unless those products run faster or fewer of
them are run:

    python tools/benchmarks/matmul_floor.py --tokens 2854 --batch 32 --width 96
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def parse_args(argv=None):
    from kbert.cliargs import positive_int

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=positive_int, default=2854,
                        help="real tokens of a batch (Debian: 32 rows of 89.2 pieces)")
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--width", type=positive_int, default=96, help="padded length of the batch")
    parser.add_argument("--hidden", type=positive_int, default=384)
    parser.add_argument("--intermediate", type=positive_int, default=1536)
    parser.add_argument("--heads", type=positive_int, default=12)
    parser.add_argument("--layers", type=positive_int, default=6)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=positive_int, default=30)
    args = parser.parse_args(argv)
    if args.hidden % args.heads:
        parser.error(f"--hidden {args.hidden} is not divisible by --heads {args.heads}")
    return args


def median_seconds(function, inputs, repeats):
    """Median wall-clock of `function(*inputs)`, its outputs read back (`measure_latency`)."""
    from kbert.export.verify import measure_latency

    def call():
        outputs = function(*inputs)
        return [output.numpy() for output in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]

    return measure_latency(call, runs=repeats)["median_ms"] / 1e3


def dense_products(rows, inputs, units, dtype, repeats):
    """Forward, input-gradient and kernel-gradient products of one dense layer, in seconds."""
    import tensorflow as tf

    x = tf.cast(tf.random.normal((rows, inputs)), dtype)
    kernel = tf.cast(tf.random.normal((inputs, units)), dtype)
    grad = tf.cast(tf.random.normal((rows, units)), dtype)
    return {
        "forward": median_seconds(tf.function(lambda a, b: tf.matmul(a, b)), (x, kernel), repeats),
        "input_gradient": median_seconds(
            tf.function(lambda g, b: tf.matmul(g, b, transpose_b=True)), (grad, kernel), repeats
        ),
        "kernel_gradient": median_seconds(
            tf.function(lambda a, g: tf.matmul(a, g, transpose_a=True)), (x, grad), repeats
        ),
    }


def attention_products(batch, width, heads, head_size, dtype, repeats):
    """Attention's two products (as kbert writes them), forward and backward, in seconds."""
    import tensorflow as tf

    q, k, v = (tf.cast(tf.random.normal((batch, width, heads, head_size)), dtype) for _ in range(3))

    @tf.function
    def products(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            scores = tf.einsum("bqnh,bknh->bnqk", q, k)
            context = tf.einsum("bnqk,bknh->bqnh", scores, v)
        return tape.gradient(context, [q, k, v], output_gradients=tf.ones_like(context))

    return median_seconds(products, (q, k, v), repeats)


def main(argv=None):
    args = parse_args(argv)
    from kbert.export.verify import machine

    h, i = args.hidden, args.intermediate
    shapes = {"projection": (h, h), "intermediate": (h, i), "output": (i, h)}
    dense = {name: dense_products(args.tokens, *shape, args.dtype, args.repeats) for name, shape in shapes.items()}
    attention = attention_products(args.batch, args.width, args.heads, h // args.heads, args.dtype, args.repeats)

    def all_three(name):
        return sum(dense[name].values())

    # A full block: query, key, value and output projections, the feed-forward layer, attention.
    block = 4 * all_three("projection") + all_three("intermediate") + all_three("output") + attention
    # The last block of a pooled classifier: keys and values of every token, the rest for [CLS].
    last = 2 * all_three("projection")
    step = (args.layers - 1) * block + last

    def figures(name, seconds):
        rows_in, rows_out = shapes[name]
        return {"ms": round(seconds * 1e3, 2),
                "gflops": round(2 * args.tokens * rows_in * rows_out / seconds / 1e9, 1)}

    report = {
        "settings": vars(args),
        "dense_ms_and_gflops": {
            name: {kind: figures(name, seconds) for kind, seconds in products.items()}
            for name, products in dense.items()
        },
        "attention_products_ms": round(attention * 1e3, 2),
        "block_ms": round(block * 1e3, 1),
        "last_block_ms": round(last * 1e3, 1),
        "step_matmul_ms": round(step * 1e3, 1),
        "machine": machine(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
