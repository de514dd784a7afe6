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

`--plan adaptation` runs text-pair classification's adaptation first
(`kbert.pretraining.adapt`, task-adaptive pretraining): masked-LM steps on
MRPC's training text, packed into sequences by kbert's own pipeline here
(`recipe_data.py --adaptation`) and masked on the GPU as tf-text masks them
for `kbert finetune` (`mask_batch`), then the default fine-tuning from each
seed's adapted encoder: 600 steps against 0, 1,200 (the recipe's), 2,400 and
4,800, seed by seed.

Each candidate's dev outputs come back (`predictions.npz`) and `--report`
scores them here with each task's own `evaluate`; the JSON carries the
GPU-side figures too. kbert's text-pair classification reads its dev pairs
both ways as well (`swap_pair`, as `--pair-order both` does): the other
order's outputs come back beside them, and the report scores what `kbert
finetune` keeps, the order dev chooses seed by seed. Candidates run in
`PLAN`'s order and stop when `--budget-s` is spent, writing the JSON after
each one.

    python tools/benchmarks/recipe_data.py --out runs/gpu-recipes --wheels   # here
    python tools/benchmarks/gpu_recipes.py --data runs/gpu-recipes --out $OUT  # on the GPU
    python tools/benchmarks/gpu_recipes.py --data runs/gpu-recipes --dry-run --out runs/sweep-dry
    python tools/benchmarks/recipe_data.py --out runs/gpu-adapt --adaptation --wheels   # here
    python tools/benchmarks/gpu_recipes.py --data runs/gpu-adapt --plan adaptation --seeds 0-7 --out $OUT
"""

import argparse
import json
import math
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
from kbert.layers import mean_probability_logits, swap_pair  # noqa: E402
from kbert.models import bert_classifier, bert_encoder, bert_pair_regressor, bert_pretrainer, bert_regressor  # noqa: E402
from kbert.pretraining.adapt import LEARNING_RATE as ADAPT_LEARNING_RATE  # noqa: E402
from kbert.pretraining.instances import DEFAULT_MASKED_LM_PROB, MASK_TOKEN_RATE  # noqa: E402
from kbert.pretraining.dynamic_masking import RANDOM_TOKEN_RATE  # noqa: E402
from kbert.recipes import Recipe  # noqa: E402
from recipe_report import SWAPPED, run_name  # noqa: E402  (how runs are keyed in predictions.npz)
from kbert.tasks.classification import classification_metrics  # noqa: E402
from kbert.tasks.text_pair_classification import POSITIVE_LABEL, TextPairClassification  # noqa: E402
from kbert.tasks.text_pair_regression import regression_metrics  # noqa: E402
from kbert.fitting.optimizers import (  # noqa: E402
    DEFAULT_EPSILON, DEFAULT_GLOBAL_CLIPNORM, DEFAULT_WEIGHT_DECAY, NO_DECAY, WarmupPolynomialDecay,
)

SEEDS = (0, 1, 2, 3, 4)
BATCH_SIZE = 32
WARMUP_FRACTION = Recipe.warmup_fraction  # every task's recipe's
EVAL_BATCH = 256
# (data key, implementation, epochs, learning rates[, adaptation steps]), in
# the order they run: the pairs task whose default is furthest from its target first.
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
# Pair classification's recipe after 0 to 4,800 adaptation steps: the default
# (1,200) and none first, so that a run cut short by its budget still pairs them.
ADAPTATION = (
    ("mrpc", "kbert", (5,), (1e-4,), (1200, 0, 2400, 600, 4800)),
)
PLANS = {"sweep": PLAN, "follow-up": FOLLOW_UP, "adaptation": ADAPTATION}
# The dry run (CPU): two seeds, two candidates of one epoch, on a few rows;
# with adaptation, 0 and 4 steps of it.
DRY_RUN = {"seeds": (0, 1), "rows": 64, "dev_rows": 40, "epochs": (1,), "lrs": (1e-4, 2e-4), "adapt_steps": (0, 4)}
# Adaptation steps run as scans of this many (each plan's counts are multiples of it).
ADAPT_CHUNK = 100


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


def minilm_encoder(config, weights, dtype):
    """A fresh encoder holding MiniLM's weights."""
    encoder = bert_encoder(config, dtype=dtype)
    for variable in encoder.weights:
        variable.assign(weights["weight." + variable.path])
    return encoder


def build(impl, info, config, weights, dtype):
    """A fresh model of `impl` for the task `info`, the encoder holding MiniLM's weights."""
    encoder = minilm_encoder(config, weights, dtype)
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


def mask_batch(key, ids, vocab_size, mask_id):
    """BERT's masking of packed `[CLS] body [SEP]` rows, as `kbert finetune`'s
    adaptation draws it (`make_dynamic_masking_dataset`, tf-text's
    `RandomItemSelector` and `MaskValuesChooser`): in each row
    `ceil(DEFAULT_MASKED_LM_PROB * body)` distinct body positions, each
    replaced by [MASK] (`MASK_TOKEN_RATE`), a random id of the vocabulary
    (`RANDOM_TOKEN_RATE`) or left as it is.

    Returns `(masked ids, positions, labels)`, positions `(rows, predictions)`."""
    rows, length = ids.shape
    predictions = math.ceil(DEFAULT_MASKED_LM_PROB * (length - 2))
    pick, kind_key, random_key = jax.random.split(key, 3)
    order = jnp.argsort(jax.random.uniform(pick, (rows, length - 2)), axis=1)
    positions = jnp.sort(order[:, :predictions], axis=1) + 1  # past [CLS]
    labels = jnp.take_along_axis(ids, positions, axis=1)
    kind = jax.random.uniform(kind_key, positions.shape)
    values = jnp.where(
        kind < MASK_TOKEN_RATE, mask_id,
        jnp.where(kind < MASK_TOKEN_RATE + RANDOM_TOKEN_RATE,
                  jax.random.randint(random_key, positions.shape, 0, vocab_size), labels))
    masked = ids.at[jnp.arange(rows)[:, None], positions].set(values.astype(ids.dtype))
    return masked, positions, labels


class Adapter:
    """Adaptation's masked-LM steps (`kbert.pretraining.adapt`), vmapped over seeds.

    Each seed's `BertPretrainer` starts from MiniLM's encoder with new heads
    drawn from its seed, as `kbert finetune --seed S` adapts: AdamW at
    `kbert.pretraining.adapt.LEARNING_RATE` on BERT's schedule, batch 32,
    dropout on. Each step masks its rows anew with `mask_batch`. The loss is
    the mean cross-entropy over the masked positions (`pretraining_losses`).
    """

    def __init__(self, config, weights, dtype, seeds, vocab_size, mask_id):
        self.vocab_size, self.mask_id = vocab_size, mask_id
        self.model, self.state0 = seed_states(
            seeds, lambda: bert_pretrainer(minilm_encoder(config, weights, dtype), dtype=dtype))
        self.optimizer, self.rate_index = optimizer_for(self.model)
        self.encoder_paths = {v.path for v in self.model.encoder.trainable_variables}
        step = jax.vmap(self._step, in_axes=(0, 0, 0, None, 0, 0, None))
        self.chunk = jax.jit(lambda state, sequences, index, keys, rates: jax.lax.scan(
            lambda s, xs: self._scan_body(step, s, sequences, xs), state, (index, keys, rates)))

    def _loss(self, trainable, non_trainable, x, labels):
        outputs, non_trainable = self.model.stateless_call(trainable, non_trainable, x, training=True)
        logits = outputs["masked_lm"].astype("float32")
        per_position = jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(
            logits, labels[..., None], axis=-1)[..., 0]
        accuracy = jnp.mean(jnp.argmax(logits, axis=-1) == labels)
        return jnp.mean(per_position), (non_trainable, accuracy)

    def _step(self, trainable, non_trainable, optimizer_vars, sequences, index, key, rate):
        ids, positions, labels = mask_batch(key, sequences[index], self.vocab_size, self.mask_id)
        x = {"token_ids": ids, "segment_ids": jnp.zeros_like(ids), "padding_mask": jnp.ones_like(ids),
             "masked_lm_positions": positions}
        (loss, (non_trainable, accuracy)), grads = jax.value_and_grad(self._loss, has_aux=True)(
            trainable, non_trainable, x, labels)
        optimizer_vars = list(optimizer_vars)
        optimizer_vars[self.rate_index] = rate
        trainable, optimizer_vars = self.optimizer.stateless_apply(optimizer_vars, grads, trainable)
        return trainable, non_trainable, optimizer_vars, jnp.stack([loss, accuracy])

    def _scan_body(self, step, state, sequences, xs):
        index, keys, rate = xs  # (seeds, batch) rows, (seeds, 2) keys, a scalar
        trainable, non_trainable, optimizer_vars = state
        trainable, non_trainable, optimizer_vars, figures = step(
            trainable, non_trainable, optimizer_vars, sequences, index, keys, rate)
        return (trainable, non_trainable, optimizer_vars), figures

    def run(self, sequences, steps, seeds, chunk=ADAPT_CHUNK):
        """`steps` steps per seed from the start; returns each encoder weight's
        stacked adapted values by path, and the last chunk's mean masked-LM
        loss and accuracy per seed. Seed s reads its own shuffle of the
        sequences, pass after pass (`adaptation_rows`)."""
        rates = schedule(ADAPT_LEARNING_RATE, steps, 1)
        index = adaptation_rows(len(sequences), steps, seeds)
        keys = np.stack([_step_keys(seed, steps) for seed in seeds], axis=1)  # (steps, seeds, 2)
        state = self.state0
        for start in range(0, steps, chunk):
            end = min(start + chunk, steps)
            state, figures = self.chunk(state, sequences, jnp.asarray(index[start:end]),
                                        jnp.asarray(keys[start:end]), jnp.asarray(rates[start:end]))
        figures = np.asarray(figures).mean(axis=0)  # (seeds, 2)
        paths = [v.path for v in self.model.trainable_variables]
        encoders = {path: value for path, value in zip(paths, state[0]) if path in self.encoder_paths}
        return encoders, {"masked_lm_loss": figures[:, 0].round(4).tolist(),
                          "masked_lm_accuracy": figures[:, 1].round(4).tolist()}


def _step_keys(seed, steps):
    """Raw PRNG keys `(steps, 2)` of one seed's masks, a key a step."""
    return np.asarray(jax.random.split(jax.random.PRNGKey(seed), steps))


def adaptation_rows(sequences, steps, seeds):
    """Rows of each step `(steps, seeds, batch)`: each seed a new shuffle of all
    sequences every pass, batches taken in order across passes (the pipeline
    repeats the packed sequences, then shuffles them)."""
    index = np.zeros((steps, len(seeds), BATCH_SIZE), "int32")
    needed = steps * BATCH_SIZE
    for s, seed in enumerate(seeds):
        rng = np.random.default_rng([seed, 1_000_003])
        order = np.concatenate([rng.permutation(sequences) for _ in range(-(-needed // sequences))])
        index[:, s] = order[:needed].reshape(steps, BATCH_SIZE)
    return index


def initial_state(impl, info, config, weights, dtype, seeds, encoders=None):
    """Stacked (seeds first) trainable, non-trainable and optimizer values, and a template model.

    `encoders`: None, or each encoder weight's stacked per-seed values by path
    (what `Adapter.run` returns), which replace MiniLM's: fine-tuning from each
    seed's adapted encoder, its head drawn as without adaptation."""
    model, stacked = seed_states(seeds, lambda: build(impl, info, config, weights, dtype))
    if encoders:
        paths = [v.path for v in model.trainable_variables]
        if set(encoders) - set(paths):
            raise ValueError(f"adapted weights the model lacks: {sorted(set(encoders) - set(paths))[:3]}")
        stacked[0][:] = [encoders.get(path, value).astype(value.dtype) for path, value in zip(paths, stacked[0])]
    return model, stacked


def seed_states(seeds, make_model):
    """`(the first seed's model, stacked state)`: `make_model()` under each seed
    (`keras.utils.set_random_seed`), and its trainable, non-trainable and
    optimizer values stacked seeds first."""
    per_seed = []
    for seed in seeds:
        keras.utils.set_random_seed(seed)
        model = make_model()
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


def swapped_dev(dev):
    """The dev pairs read the other way, `[CLS] b [SEP] a [SEP]`, as kbert's
    `--pair-order both` reads them beside the pairs as given."""
    views = swap_pair(dev)
    return {**views, "padding_mask": views["padding_mask"] != 0, "targets": dev["targets"]}


def both_ways(outputs, swapped):
    """Logits whose softmax is the mean of the two orders' (`merge_views`'s)."""
    return np.asarray(mean_probability_logits([outputs, swapped]))


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
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="e.g. 0-7 or 0,1,2 (default: 0-4)")
    parser.add_argument("--dry-run", action="store_true", help="CPU: a few rows, two seeds, two candidates")
    args = parser.parse_args()
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    manifest, arrays = load(args.data)
    config = BertConfig.from_dict(manifest["bert_config"])
    weights = {name: value for name, value in arrays.items() if name.startswith("weight.")}
    seeds = DRY_RUN["seeds"] if args.dry_run else parse_seeds(args.seeds)
    report = {"device": str(jax.devices()[0].device_kind), "seeds": list(seeds), "batch_size": BATCH_SIZE,
              "dtype": args.dtype, "versions": {"keras": keras.__version__, "jax": jax.__version__},
              "tensorflow_imported": sys.modules.get("tensorflow") is not None, "runs": []}
    predictions, trainers, adapter = {}, {}, None
    only = set(filter(None, args.only.split(",")))
    for key, impl, epochs_grid, rates, *adapting in PLANS[args.plan]:
        if only and key not in only:
            continue
        info = manifest["tasks"][key]
        if impl == "keras-hub" and not info["keras_hub"]:
            continue
        adapt_grid = adapting[0] if adapting else (0,)
        if args.dry_run:
            epochs_grid, rates = DRY_RUN["epochs"], DRY_RUN["lrs"]
            adapt_grid = DRY_RUN["adapt_steps"] if adapting else adapt_grid
        if adapting and "adaptation" not in info:
            raise SystemExit(f"{args.data} has no adaptation text for {key}: make it with recipe_data.py --adaptation")
        train, dev = task_data(arrays, key, impl, *(
            (DRY_RUN["rows"], DRY_RUN["dev_rows"]) if args.dry_run else (None, None)))
        rows = len(train["token_ids"])
        steps = -(-rows // BATCH_SIZE)
        regression = "labels" not in info["settings"]
        shape = (impl, info["task"], len(info["settings"].get("labels", ())), info["settings"].get("head"))
        # kbert's pair classification, read both ways as the product may read it.
        swapped = swapped_dev(dev) if impl == "kbert" and info["task"] == TextPairClassification.name else None
        if adapting:
            sequences = jnp.asarray(arrays[f"{key}.kbert.adapt.sequences.token_ids"].astype("int32"))
        for adapt_steps in adapt_grid:
            if time.perf_counter() - start > args.budget_s:
                report.setdefault("skipped", []).append([key, impl, adapt_steps])
                continue
            encoders, adaptation, began = None, None, time.perf_counter()
            if adapt_steps:
                if adapter is None:
                    adapter = Adapter(config, weights, args.dtype, seeds, config.vocab_size,
                                      info["adaptation"]["mask_id"])
                encoders, adaptation = adapter.run(sequences, adapt_steps, seeds, chunk=min(ADAPT_CHUNK, adapt_steps))
                adaptation["seconds"] = round(time.perf_counter() - began, 2)
                print(json.dumps({"data": key, "adapt_steps": adapt_steps, **adaptation}), flush=True)
            model, state0 = initial_state(impl, info, config, weights, args.dtype, seeds, encoders)
            if shape not in trainers:
                trainers[shape] = Trainer(model, regression)
            trainer = trainers[shape]
            for epochs, rate in ((e, r) for e in epochs_grid for r in rates):
                if time.perf_counter() - start > args.budget_s:
                    report.setdefault("skipped", []).append([key, impl, epochs, rate, adapt_steps])
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
                run = {"data": key, "impl": impl, "task": info["task"], "epochs": epochs,
                       "learning_rate": rate, "seconds": round(time.perf_counter() - began, 2),
                       "last_epoch_loss": [round(float(x), 4) for x in losses[-1]],
                       "finite": bool(np.isfinite(outputs).all()),
                       "figures": gpu_figures(outputs, np.asarray(dev["targets"]), info)}
                if adapting:
                    run.update(adapt_steps=adapt_steps, adaptation=adaptation)
                predictions[run_name(run)] = outputs.astype("float16")
                printed = {"adapt_steps": adapt_steps, "mean": summary(run["figures"])}
                if swapped is not None:
                    other = dev_outputs(trainer, state, swapped)
                    predictions[run_name(run) + SWAPPED] = other.astype("float16")
                    run["both_ways_figures"] = gpu_figures(both_ways(outputs, other), np.asarray(dev["targets"]), info)
                    printed["both_ways"] = summary(run["both_ways_figures"])
                report["runs"].append(run)
                print(json.dumps({k: run[k] for k in ("data", "impl", "epochs", "learning_rate", "seconds")}
                                 | printed), flush=True)
                report["elapsed_s"] = round(time.perf_counter() - start, 1)
                with open(os.path.join(args.out, "gpu_recipes.json"), "w", encoding="utf-8") as f:
                    json.dump(report, f, indent=1)
                np.savez(os.path.join(args.out, "predictions.npz"), **predictions)
    print(table(report))


def parse_seeds(text):
    """"0-7" or "0,1,2" as a tuple of ints."""
    if "-" in text:
        first, last = text.split("-")
        return tuple(range(int(first), int(last) + 1))
    return tuple(int(seed) for seed in text.split(","))


def summary(figures):
    return {name: round(float(np.mean([f[name] for f in figures])), 4) for name in figures[0]}


def table(report):
    lines = ["data           impl       ep  lr      adapt " + "mean figures over seeds"]
    for run in report["runs"]:
        both = f"  both ways: {json.dumps(summary(run['both_ways_figures']))}" if "both_ways_figures" in run else ""
        lines.append(f"{run['data']:<14} {run['impl']:<10} {run['epochs']:<3} {run['learning_rate']:<7g} "
                     f"{run.get('adapt_steps', 0):<5} " + json.dumps(summary(run["figures"])) + both)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
