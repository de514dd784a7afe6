"""Training throughput, kbert vs keras-hub, side by side in one run. Prints JSON.

Both models get the same shape (MiniLM-L6-H384 by default), the same
classification head, optimiser (AdamW), loss, batch and sequence length, on
synthetic token ids, with XLA (`jit_compile=True`) off and on, in float32 and
in mixed_bfloat16. Throughput is sequences per second over timed steps after
warm-up steps (compilation excluded).

    python tools/benchmark_training.py --preset minilm_l6_h384 --seq-len 128 --batch-size 32
"""

import argparse
import json
import os
import platform
import time

import keras
import keras_hub
import numpy as np

import kbert
from kbert.checkpoints.keras_hub import keras_hub_backbone

NUM_CLASSES = 12


def kbert_model(config, dtype):
    return kbert.bert_classifier(config, NUM_CLASSES, dtype=dtype)


def keras_hub_model(config, dtype):
    backbone = keras_hub_backbone(config, dtype=dtype)
    return keras_hub.models.BertTextClassifier(
        backbone, NUM_CLASSES, preprocessor=None, dtype=dtype
    )


def synthetic_batch(config, batch_size, seq_len, seed=0):
    rng = np.random.default_rng(seed)
    features = {
        "token_ids": rng.integers(0, config.vocab_size, (batch_size, seq_len)).astype("int32"),
        "segment_ids": np.zeros((batch_size, seq_len), "int32"),
        "padding_mask": np.ones((batch_size, seq_len), "int32"),
    }
    labels = rng.integers(0, NUM_CLASSES, (batch_size,)).astype("int32")
    return features, labels


def measure(build, config, dtype, batch_size, seq_len, jit_compile, warmup_steps, steps):
    keras.utils.set_random_seed(0)
    model = build(config, dtype)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=1e-5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    features, labels = synthetic_batch(config, batch_size, seq_len)
    for _ in range(warmup_steps):
        model.train_on_batch(features, labels)
    start = time.perf_counter()
    for _ in range(steps):
        loss = model.train_on_batch(features, labels)
    elapsed = time.perf_counter() - start
    if not np.all(np.isfinite(loss)):
        raise RuntimeError(f"non-finite loss {loss}")
    return batch_size * steps / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="minilm_l6_h384")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtypes", default="float32,mixed_bfloat16")
    args = parser.parse_args()

    config = kbert.BertConfig.from_preset(args.preset)
    results = {}
    for dtype in args.dtypes.split(","):
        for name, build in (("kbert", kbert_model), ("keras_hub", keras_hub_model)):
            for jit_compile in (False, True):
                key = f"{name}_{dtype}_{'xla' if jit_compile else 'no_xla'}_seq_per_s"
                results[key] = round(
                    measure(
                        build, config, dtype, args.batch_size, args.seq_len,
                        jit_compile, args.warmup_steps, args.steps,
                    ),
                    2,
                )
                print(json.dumps({key: results[key]}), flush=True)

    def best(prefix):
        return max(v for k, v in results.items() if k.startswith(prefix))

    ratios = {
        f"kbert_over_keras_hub_{dtype}": round(best(f"kbert_{dtype}") / best(f"keras_hub_{dtype}"), 3)
        for dtype in args.dtypes.split(",")
    }
    report = {
        "preset": args.preset,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "keras_hub": keras_hub.__version__,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        **results,
        **ratios,
        "kbert_best_over_keras_hub_best": round(best("kbert") / best("keras_hub"), 3),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
