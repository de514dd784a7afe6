"""Recipe sweeps on one GPU: each task's epochs x learning rates over seeds, kbert beside keras-hub.

Reads what `recipe_data.py` wrote (encoded data and MiniLM's weights) and, for
each task and candidate recipe, fine-tunes all-minilm-l6-v2 with every seed at
once: one training step is `jax.vmap`ped over the seeds and one epoch is one
`lax.scan`, so a candidate's seeds cost about one run. kbert's models
(`bert_classifier`, `bert_pair_regressor`) run on kbert's packing; keras-hub's
`BertTextClassifier` (through `kbert.checkpoints.to_keras_hub`) on keras-hub's
preprocessor's. Both train as `kbert finetune` does: Keras's AdamW with BERT's
settings (`kbert.fitting.optimizers`: weight decay 0.01 off LayerNorm and
biases, epsilon 1e-6, global-norm clipping at 1), linear warmup over 10% of
the steps then linear decay to 0 (`WarmupPolynomialDecay`), batch 32, dropout
on, mixed bfloat16. Seed s gives the same head initialisation, shuffles and
dropout to every candidate, so candidates compare seed by seed.

Each candidate's dev outputs come back (`predictions.npz`) and `--report`
scores them here with each task's own `evaluate`; the JSON carries the
GPU-side figures too. Candidates run in `PLAN`'s order and stop when
`--budget-s` is spent, writing the JSON after each one.

    python tools/benchmarks/recipe_data.py --out runs/gpu-recipes --wheels   # here
    python tools/benchmarks/gpu_recipes.py --data runs/gpu-recipes --out $OUT  # on the GPU
    python tools/benchmarks/gpu_recipes.py --data runs/gpu-recipes --dry-run --out runs/sweep-dry
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from kbert.config import BertConfig  # noqa: E402
from kbert.models import bert_classifier, bert_encoder, bert_pair_regressor, bert_regressor  # noqa: E402
from kbert.recipes import Recipe  # noqa: E402
from kbert.tasks.classification import classification_metrics  # noqa: E402
from kbert.tasks.text_pair_classification import POSITIVE_LABEL  # noqa: E402
from kbert.tasks.text_pair_regression import regression_metrics  # noqa: E402
from kbert.fitting.optimizers import (  # noqa: E402
    DEFAULT_EPSILON, DEFAULT_GLOBAL_CLIPNORM, DEFAULT_WEIGHT_DECAY, NO_DECAY, WarmupPolynomialDecay,
)

SEEDS = (0, 1, 2, 3, 4)
BATCH_SIZE = 32
WARMUP_FRACTION = Recipe.warmup_fraction  # every task's recipe's
EVAL_BATCH = 256
# (data key, implementation, epochs, learning rates), in the order they run:
# the pairs task whose default is furthest from its target first.
PLAN = (
    ("mrpc", "kbert", (3, 5, 8), (3e-5, 5e-5, 1e-4, 2e-4)),
    ("mrpc", "keras-hub", (3, 5, 8), (3e-5, 5e-5, 1e-4, 2e-4)),
    ("debian", "kbert", (2, 3, 4), (5e-5, 1e-4, 2e-4)),
    ("debian", "keras-hub", (2, 3, 4), (5e-5, 1e-4, 2e-4)),
    ("debian-groups", "kbert", (2, 3, 4), (5e-5, 1e-4, 2e-4)),
    ("debian-groups", "keras-hub", (2, 3, 4), (5e-5, 1e-4, 2e-4)),
    ("stsb", "kbert", (3, 5, 8), (5e-5, 1e-4, 2e-4)),
)
# A second call's plan: keras-hub's best MRPC recipes beside kbert's default
# and the sweep's best, in one run.
FOLLOW_UP = (
    ("mrpc", "keras-hub", (3, 5), (5e-5, 1e-4, 2e-4)),
    ("mrpc", "kbert", (3, 5), (5e-5, 1e-4)),
)
PLANS = {"sweep": PLAN, "follow-up": FOLLOW_UP}
# The dry run (CPU): two seeds, two candidates of one epoch, on a few rows.
DRY_RUN = {"seeds": (0, 1), "rows": 64, "dev_rows": 40, "epochs": (1,), "lrs": (1e-4, 2e-4)}


def load(folder):
    with open(os.path.join(folder, "recipes_data.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    with np.load(os.path.join(folder, "recipes_data.npz")) as data:
        arrays = {name: data[name] for name in data.files}
    return manifest, arrays


def task_data(arrays, key, impl, rows=None, dev_rows=None):
    """Device arrays of one task's train and dev split as `impl` packs them."""
    def split(name, limit):
        ids = arrays[f"{key}.{impl}.{name}.token_ids"][:limit].astype("int32")
        return {
            "token_ids": jnp.asarray(ids),
            "segment_ids": jnp.asarray(arrays[f"{key}.{impl}.{name}.segment_ids"][:limit].astype("int32")),
            "padding_mask": jnp.asarray(ids != 0),
            # keras-hub's rows are kbert's rows in the same order: one target array.
            "targets": jnp.asarray(arrays[f"{key}.kbert.{name}.targets"][:limit]),
        }

    return split("train", rows), split("dev", dev_rows)


def build(impl, info, config, weights, dtype):
    """A fresh model of `impl` for the task `info`, the encoder holding MiniLM's weights."""
    encoder = bert_encoder(config, dtype=dtype)
    for variable in encoder.weights:
        variable.assign(weights["weight." + variable.path])
    settings = info["settings"]
    if impl == "keras-hub":
        import keras_hub

        from kbert.checkpoints import to_keras_hub

        return keras_hub.models.BertTextClassifier(
            to_keras_hub(encoder, dtype=dtype), len(settings["labels"]), preprocessor=None, dtype=dtype,
        )
    if "labels" in settings:
        return bert_classifier(encoder, len(settings["labels"]), dtype=dtype)
    if settings.get("head") == "cross":
        return bert_regressor(encoder, dtype=dtype)
    return bert_pair_regressor(encoder, settings["score_range"], dtype=dtype)


def optimizer_for(model):
    """Keras's AdamW as `kbert.training.make_optimizer` sets it, its rate a variable we set."""
    optimizer = keras.optimizers.AdamW(
        learning_rate=1.0, weight_decay=DEFAULT_WEIGHT_DECAY, epsilon=DEFAULT_EPSILON,
        global_clipnorm=DEFAULT_GLOBAL_CLIPNORM,
    )
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    optimizer.build(model.trainable_variables)
    rate = [i for i, v in enumerate(optimizer.variables) if v is optimizer._learning_rate]
    if len(rate) != 1:
        raise RuntimeError("the optimizer's learning rate is not one of its variables")
    return optimizer, rate[0]


class Trainer:
    """One model structure's jitted epoch and predict, vmapped over seeds."""

    def __init__(self, model, regression):
        self.model = model
        self.optimizer, self.rate_index = optimizer_for(model)
        self.regression = regression
        step = jax.vmap(self._step, in_axes=(0, 0, 0, 0, 0, None))
        self.epoch = jax.jit(lambda state, data, index, weight, rates: jax.lax.scan(
            lambda s, xs: self._scan_body(step, s, data, xs), state, (index, weight, rates)))
        self.predict = jax.jit(jax.vmap(self._predict, in_axes=(0, 0, None)))

    def _outputs(self, trainable, non_trainable, x, training):
        outputs, non_trainable = self.model.stateless_call(trainable, non_trainable, x, training=training)
        if isinstance(outputs, dict):
            outputs = next(iter(outputs.values()))
        return outputs.astype("float32"), non_trainable

    def _loss(self, trainable, non_trainable, x, y, weight):
        outputs, non_trainable = self._outputs(trainable, non_trainable, x, True)
        if self.regression:
            per_row = (outputs[:, 0] - y) ** 2
        else:
            per_row = jax.nn.logsumexp(outputs, axis=-1) - jnp.take_along_axis(
                outputs, y[:, None].astype("int32"), axis=-1)[:, 0]
        return jnp.sum(per_row * weight) / jnp.maximum(jnp.sum(weight), 1.0), non_trainable

    def _step(self, trainable, non_trainable, optimizer_vars, x, y_weight, rate):
        y, weight = y_weight
        (loss, non_trainable), grads = jax.value_and_grad(self._loss, has_aux=True)(
            trainable, non_trainable, x, y, weight)
        optimizer_vars = list(optimizer_vars)
        optimizer_vars[self.rate_index] = rate
        trainable, optimizer_vars = self.optimizer.stateless_apply(optimizer_vars, grads, trainable)
        return trainable, non_trainable, optimizer_vars, loss

    def _scan_body(self, step, state, data, xs):
        index, weight, rate = xs  # (seeds, batch) rows, (seeds, batch) weights, a scalar
        x = {name: data[name][index] for name in ("token_ids", "segment_ids", "padding_mask")}
        y = data["targets"][index]
        trainable, non_trainable, optimizer_vars = state
        trainable, non_trainable, optimizer_vars, loss = step(
            trainable, non_trainable, optimizer_vars, x, (y, weight), rate)
        return (trainable, non_trainable, optimizer_vars), loss

    def _predict(self, trainable, non_trainable, x):
        return self._outputs(trainable, non_trainable, x, False)[0]


def initial_state(impl, info, config, weights, dtype, seeds):
    """Stacked (seeds first) trainable, non-trainable and optimizer values, and a template model."""
    per_seed = []
    for seed in seeds:
        keras.utils.set_random_seed(seed)
        model = build(impl, info, config, weights, dtype)
        optimizer, _ = optimizer_for(model)
        per_seed.append((model, [v.value for v in model.trainable_variables],
                         [v.value for v in model.non_trainable_variables],
                         [v.value for v in optimizer.variables]))
    stacked = tuple(
        [jnp.stack([s[part][i] for s in per_seed]) for i in range(len(per_seed[0][part]))]
        for part in (1, 2, 3)
    )
    return per_seed[0][0], stacked


def schedule(peak, steps_per_epoch, epochs):
    total = steps_per_epoch * epochs
    rates = WarmupPolynomialDecay(peak, total, int(WARMUP_FRACTION * total))
    return np.asarray([float(rates(step)) for step in range(total)], "float32")


def epoch_rows(rows, steps, seeds, epoch):
    """Each seed's shuffled rows for one epoch as (steps, seeds, batch), padded rows weighing 0."""
    index = np.zeros((steps, len(seeds), BATCH_SIZE), "int32")
    weight = np.zeros((steps, len(seeds), BATCH_SIZE), "float32")
    for s, seed in enumerate(seeds):
        order = np.random.default_rng([seed, epoch]).permutation(rows)
        padded = np.zeros(steps * BATCH_SIZE, "int32")
        padded[:rows] = order
        index[:, s] = padded.reshape(steps, BATCH_SIZE)
        weight[:, s] = (np.arange(steps * BATCH_SIZE) < rows).reshape(steps, BATCH_SIZE)
    return index, weight


def dev_outputs(trainer, state, dev):
    rows = len(dev["token_ids"])
    chunks = []
    for start in range(0, rows, EVAL_BATCH):
        take = np.minimum(np.arange(start, start + EVAL_BATCH), rows - 1)
        x = {name: dev[name][take] for name in ("token_ids", "segment_ids", "padding_mask")}
        chunks.append(np.asarray(trainer.predict(state[0], state[1], x))[:, : rows - start])
    return np.concatenate(chunks, axis=1)  # (seeds, rows, outputs)


def gpu_figures(outputs, targets, info):
    """Each seed's figures by the tasks' own metric functions (TensorFlow-free); the
    report rescores the outputs with each task's `evaluate`."""
    targets = np.asarray(targets)
    labels = info["settings"].get("labels")
    figures = []
    for seed_outputs in outputs:
        if labels:
            metrics = classification_metrics(targets, seed_outputs.argmax(-1), labels)
            figure = {name: metrics[name] for name in ("accuracy", "macro_f1")}
            if POSITIVE_LABEL in labels:
                figure["f1"] = metrics["per_class_f1"][POSITIVE_LABEL]
        else:
            figure = {"spearman": regression_metrics(targets.reshape(-1), seed_outputs[:, 0])["spearman"]}
        figures.append(figure)
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="runs/gpu-recipes", help="recipe_data.py's folder")
    parser.add_argument("--out", default="runs/gpu-recipes-out")
    parser.add_argument("--budget-s", type=float, default=430, help="stop starting candidates after this")
    parser.add_argument("--dtype", default="mixed_bfloat16")
    parser.add_argument("--only", default="", help="comma-separated data keys to run (default: all)")
    parser.add_argument("--plan", default="sweep", choices=sorted(PLANS))
    parser.add_argument("--dry-run", action="store_true", help="CPU: a few rows, two seeds, two candidates")
    args = parser.parse_args()
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    manifest, arrays = load(args.data)
    config = BertConfig.from_dict(manifest["bert_config"])
    weights = {name: value for name, value in arrays.items() if name.startswith("weight.")}
    seeds = DRY_RUN["seeds"] if args.dry_run else SEEDS
    report = {"device": str(jax.devices()[0].device_kind), "seeds": list(seeds), "batch_size": BATCH_SIZE,
              "dtype": args.dtype, "versions": {"keras": keras.__version__, "jax": jax.__version__},
              "tensorflow_imported": sys.modules.get("tensorflow") is not None, "runs": []}
    predictions, trainers = {}, {}
    only = set(filter(None, args.only.split(",")))
    for key, impl, epochs_grid, rates in PLANS[args.plan]:
        if only and key not in only:
            continue
        info = manifest["tasks"][key]
        if impl == "keras-hub" and not info["keras_hub"]:
            continue
        if args.dry_run:
            epochs_grid, rates = DRY_RUN["epochs"], DRY_RUN["lrs"]
        train, dev = task_data(arrays, key, impl, *(
            (DRY_RUN["rows"], DRY_RUN["dev_rows"]) if args.dry_run else (None, None)))
        rows = len(train["token_ids"])
        steps = -(-rows // BATCH_SIZE)
        regression = "labels" not in info["settings"]
        shape = (impl, info["task"], len(info["settings"].get("labels", ())), info["settings"].get("head"))
        model, state0 = initial_state(impl, info, config, weights, args.dtype, seeds)
        if shape not in trainers:
            trainers[shape] = Trainer(model, regression)
        trainer = trainers[shape]
        for epochs in epochs_grid:
            for rate in rates:
                if time.perf_counter() - start > args.budget_s:
                    report.setdefault("skipped", []).append([key, impl, epochs, rate])
                    continue
                began = time.perf_counter()
                state = jax.tree_util.tree_map(lambda v: v, state0)
                rate_of_step = schedule(rate, steps, epochs)
                losses = []
                for epoch in range(epochs):
                    index, weight = epoch_rows(rows, steps, seeds, epoch)
                    state, loss = trainer.epoch(state, train, jnp.asarray(index), jnp.asarray(weight),
                                                jnp.asarray(rate_of_step[epoch * steps : (epoch + 1) * steps]))
                    losses.append(np.asarray(loss).mean(axis=0))  # (seeds,)
                outputs = dev_outputs(trainer, state, dev)
                name = f"{key}|{impl}|{epochs}|{rate:g}"
                predictions[name] = outputs.astype("float16")
                run = {"data": key, "impl": impl, "task": info["task"], "epochs": epochs,
                       "learning_rate": rate, "seconds": round(time.perf_counter() - began, 2),
                       "last_epoch_loss": [round(float(x), 4) for x in losses[-1]],
                       "finite": bool(np.isfinite(outputs).all()),
                       "figures": gpu_figures(outputs, np.asarray(dev["targets"]), info)}
                report["runs"].append(run)
                print(json.dumps({k: run[k] for k in ("data", "impl", "epochs", "learning_rate", "seconds")}
                                 | {"mean": summary(run["figures"])}), flush=True)
                report["elapsed_s"] = round(time.perf_counter() - start, 1)
                with open(os.path.join(args.out, "gpu_recipes.json"), "w", encoding="utf-8") as f:
                    json.dump(report, f, indent=1)
                np.savez(os.path.join(args.out, "predictions.npz"), **predictions)
    print(table(report))


def summary(figures):
    return {name: round(float(np.mean([f[name] for f in figures])), 4) for name in figures[0]}


def table(report):
    lines = ["data           impl       ep  lr      " + "mean figures over seeds"]
    for run in report["runs"]:
        lines.append(f"{run['data']:<14} {run['impl']:<10} {run['epochs']:<3} {run['learning_rate']:<7g} "
                     + json.dumps(summary(run["figures"])))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
