"""One `gpu_train.py` job on kbert + Keras 3 + JAX: XLA, mixed bfloat16, AdamW.

Imports only kbert's model code, which needs no TensorFlow (the GPU image has
none); the result says whether TensorFlow was imported all the same.

    KERAS_BACKEND=jax python tools/benchmarks/gpu_kbert.py '{"kind": "pretrain", ...}'
"""

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_common  # noqa: E402

from kbert.config import BertConfig  # noqa: E402
from kbert.models import bert_classifier, bert_pretrainer  # noqa: E402


def matmul(settings):
    import jax.numpy as jnp

    size, products = settings["size"], settings["products"]
    keys = jax.random.split(jax.random.key(0), 2)
    a = jax.random.normal(keys[0], (size, size), jnp.bfloat16)
    # Entries ~N(0, 1/size), so a chain of products keeps its magnitude.
    b = jax.random.normal(keys[1], (size, size), jnp.bfloat16) * jnp.bfloat16(size**-0.5)

    @jax.jit
    def chain(a, b):
        # A data dependency between products, so XLA cannot drop or merge them.
        for _ in range(products):
            a = a @ b
        return a

    return {"tflops": gpu_common.matmul_tflops(
        lambda: chain(a, b).block_until_ready(), size, products, settings["repeats"])}


def build(job):
    config = BertConfig.from_dict(job["config"])
    if job["kind"] == "pretrain":
        # Losses only (no accuracies), as on the PyTorch side.
        model = bert_pretrainer(config, dtype=job["dtype"])
        compile_kwargs = {"weighted_metrics": None}
    else:
        model = bert_classifier(config, job["num_classes"], dtype=job["dtype"])
        compile_kwargs = {"loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
    model.compile(
        optimizer=keras.optimizers.AdamW(
            learning_rate=job["lr"], weight_decay=job["weight_decay"], epsilon=job["epsilon"]
        ),
        jit_compile=job["xla"],
        **compile_kwargs,
    )
    return model


def to_keras(job, batch):
    x = {name: batch[name] for name in ("token_ids", "segment_ids", "padding_mask")}
    if job["kind"] == "finetune":
        return x, batch["labels"], None
    x["masked_lm_positions"] = batch["masked_lm_positions"]
    y = {"masked_lm": batch["masked_lm_ids"], "next_sentence": batch["next_sentence"]}
    # Padded prediction slots weigh 0, as google-research/bert's masked_lm_weights.
    weights = {"masked_lm": batch["masked_lm_weights"],
               "next_sentence": np.ones(len(batch["next_sentence"]), "float32")}
    return x, y, weights


def train(job):
    keras.utils.set_random_seed(job["seed"])
    model = build(job)
    batches = gpu_common.load_batches(
        job["data"], job["part"], job["batch_size"], job["warmup_steps"] + job["steps"]
    )
    batches = [to_keras(job, batch) for batch in batches]

    def step(batch):
        x, y, weights = batch
        logs = model.train_on_batch(x, y, sample_weight=weights, return_dict=True)
        return float(logs["loss"])

    result = gpu_common.timed_training(step, batches, job["warmup_steps"])
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        result["peak_memory_bytes"], result["peak_memory_kind"] = stats["peak_bytes_in_use"], "device"
    else:  # JAX on CPU keeps no allocator statistics.
        result["peak_memory_bytes"] = gpu_common.host_peak_bytes()
        result["peak_memory_kind"] = "host_rss"
    result["parameters"] = int(model.count_params())
    return result


def main():
    job = gpu_common.read_job()
    result = train(job)
    if "matmul" in job:
        # After training, so its buffers are not in the training's peak memory.
        result["matmul"] = matmul(job["matmul"])
    result.update({
        "device": str(jax.devices()[0].device_kind),
        "versions": {"keras": keras.__version__, "jax": jax.__version__},
        # None where an import of it was blocked.
        "tensorflow_imported": sys.modules.get("tensorflow") is not None,
    })
    gpu_common.report(result)


if __name__ == "__main__":
    main()
