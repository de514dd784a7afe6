"""Fine-tuning recipes on many seeds at once: kbert's classifier, one copy per seed, on an accelerator.

A recipe change worth half a point of dev accuracy hides in the seeds'
spread (0.6-0.9 point on the Debian task), so choosing one takes 20 seeds
or more, an hour and a half on two CPU cores for each variant. This tool
trains one copy of kbert's classifier per seed side by side (`jax.vmap`
over the seeds, one compiled step for all), which on one H200 took 115 s
for 32 seeds of `make run`'s recipe. Two steps:

    python tools/benchmarks/recipe_sweep.py prepare --train data/debian-packages/train.csv \\
        --dev data/debian-packages/dev.csv --out sweep-data
    KERAS_BACKEND=jax python tools/benchmarks/recipe_sweep.py run --data sweep-data \\
        --seeds 0-31 --variants base,head_tail,reinit_pooler --out sweep.jsonl

`prepare` (TensorFlow) encodes both files with kbert's tokenizer at 512
pieces, so that any length and truncation can be cut from them (a text of
more than 510 pieces keeps its first 510: 22 of Debian's 6,985 training
texts, whose `head_tail` rows end at piece 510 here), and writes
the checkpoint's weights with the token embeddings cut to the pieces the
data uses (13,307 of MiniLM's 30,522 on Debian; the others get no
gradient), their float32 bits as the high 16 and the next 8 (2**-17
relative error at most, far below bfloat16's): 41 MB in all, small enough
to upload to an accelerator machine.

`run` (the JAX backend) builds kbert's classifier (`bert_encoder` and
`bert_classifier`, mixed_bfloat16) and trains it by `model.stateless_call`
with Keras's AdamW written out as kbert's optimizer applies it: global-norm
clipping at 1.0, decoupled weight decay 0.01 scaled by the rate and not on
LayerNorm or biases, bias-corrected Adam with epsilon 1e-6, BERT's linear
warmup and decay (`kbert.training.make_optimizer`). Batches of 32 drawn at
random (not in kbert's length buckets), ceil(n / 32) an epoch. A seed
draws the head's initial weights, the batches and the dropout masks, the
same in every variant, so variants pair up seed by seed. Each seed's dev
accuracy and macro-F1 go to `--out` as a JSON line; a line per variant
sums them up on stdout.
"""

import argparse
import json
import os
import sys
import time
import zlib

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

DTYPE = "mixed_bfloat16"
PREPARED_LENGTH = 512
META_FILE, DATA_FILE, HIGH_FILE, LOW_FILE = "meta.json", "data.npz", "weights_high.npz", "weights_low.npz"
BATCH_SIZE = 32
# Recipe variants against `make run`'s (seq 128, 2 epochs at 1e-4, warmup
# 0.1). `tail`: a long text keeps its last `tail` pieces and as many of its
# first as fit; "half" is `kbert finetune --truncate head_tail`.
VARIANTS = {
    "base": {},
    "head_tail": {"tail": "half"},
    "tail32": {"tail": 32},
    "tail64": {"tail": 64},
    "reinit_pooler": {"reinit_pooler": True},
    "len256": {"length": 256},
    "epochs3": {"epochs": 3},
    "smooth01": {"smoothing": 0.1},
    "layer_decay09": {"layer_decay": 0.9},
    "bert_3ep_5e5": {"epochs": 3, "lr": 5e-5},
    "lr7e5": {"lr": 7e-5},
    "lr15e5": {"lr": 1.5e-4},
}


# === prepare (TensorFlow) ===


FORMAT = "kbert-recipe-sweep"


def is_prepared(path):
    """Whether `path` is a folder `prepare` wrote."""
    try:
        with open(os.path.join(path, META_FILE), encoding="utf-8") as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def prepare(train, dev, init, out, overwrite=False):
    """Writes `out` aside and renames it into place; refuses a folder `prepare` did not write."""
    from kbert.fileio import check_output_folder, staged_folder

    known = (META_FILE, DATA_FILE, HIGH_FILE, LOW_FILE)  # what a folder of before manifests holds
    check_output_folder(out, "recipe-sweep data", is_prepared, overwrite, known)
    with staged_folder(out, is_prepared, overwrite, what="recipe-sweep data", known_names=known) as staging:
        summary = _prepare(train, dev, init, staging)
    print(json.dumps({"out": out, **summary}))


def _prepare(train, dev, init, out):
    from kbert.checkpoints.huggingface import init_encoder
    from kbert.tasks import get_task
    from kbert.text import WordPieceTokenizer

    config, encoder, vocabulary, lowercase = init_encoder(init)
    task_class = get_task("text-classification")
    options = task_class.resolve_options({"truncate": "longest_first"})
    examples = {"train": task_class.read(train, options), "dev": task_class.read(dev, options)}
    settings = task_class.learn(examples["train"], train)
    length = min(PREPARED_LENGTH, config.max_position_embeddings)
    task = task_class(WordPieceTokenizer(vocabulary, lowercase=lowercase), length, **settings)
    task.check(examples["dev"], dev)
    encoded = {name: task.encode(rows) for name, rows in examples.items()}
    specials = [vocabulary.index(token) for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    used = np.unique(np.concatenate([e.features["token_ids"].ravel() for e in encoded.values()] + [specials]))
    compact = np.zeros(config.vocab_size, np.int32)
    compact[used] = np.arange(len(used))
    # The checkpoint's id of each compact one.
    arrays = {"vocabulary_ids": used.astype(np.int32)}
    for name, rows in encoded.items():
        arrays[f"{name}_ids"] = compact[rows.features["token_ids"]].astype(np.int16)
        arrays[f"{name}_len"] = rows.features["padding_mask"].sum(axis=1).astype(np.int16)
        arrays[f"{name}_y"] = np.asarray(rows.targets).astype(np.int8)
    np.savez_compressed(os.path.join(out, DATA_FILE), **arrays)
    high, low = {}, {}
    for variable in encoder.weights:
        value = np.asarray(variable.numpy(), np.float32)
        if variable.path.startswith("token_embedding"):
            value = value[used]
        bits = value.view(np.uint32)
        key = variable.path.replace("/", "|")
        high[key] = (bits >> 16).astype(np.uint16)
        low[key] = ((bits >> 8) & 0xFF).astype(np.uint8)
    np.savez_compressed(os.path.join(out, HIGH_FILE), **high)
    np.savez_compressed(os.path.join(out, LOW_FILE), **low)
    meta = {
        "format": FORMAT,
        "config": {**config.to_dict(), "vocab_size": int(len(used))},
        "labels": settings["labels"],
        "cls": int(compact[specials[2]]),
        "sep": int(compact[specials[3]]),
        "train": train, "dev": dev, "init": init,
    }
    with open(os.path.join(out, META_FILE), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    return {"train": len(examples["train"]), "dev": len(examples["dev"]), "vocabulary": int(len(used))}


# === run (JAX) ===


def load(folder):
    """What `prepare` wrote: `(meta, data arrays, weights by variable path)`."""
    with open(os.path.join(folder, META_FILE), encoding="utf-8") as f:
        meta = json.load(f)
    data = dict(np.load(os.path.join(folder, DATA_FILE)))
    high = np.load(os.path.join(folder, HIGH_FILE))
    low = np.load(os.path.join(folder, LOW_FILE))
    weights = {}
    for key in high.files:
        # The middle of the dropped low byte.
        bits = (high[key].astype(np.uint32) << 16) | (low[key].astype(np.uint32) << 8) | 0x80
        weights[key.replace("|", "/")] = bits.view(np.float32)
    return meta, data, weights


def view(ids, lengths, length, tail, cls_id, sep_id):
    """Rows `[CLS] pieces [SEP]` of `length`, cut from the 512-piece encodings.

    A text longer than `length - 2` pieces keeps its last `tail` pieces and
    as many of its first as fit: 0 keeps the start (`longest_first`), "half"
    the last half rounded up (`head_tail`).
    """
    rows = len(ids)
    out = np.zeros((rows, length), np.int32)
    mask = np.zeros((rows, length), np.int32)
    keep = length - 2
    kept_tail = keep - keep // 2 if tail == "half" else int(tail)
    for r in range(rows):
        n = int(lengths[r])
        row = ids[r, :n].astype(np.int32)
        if n > length:
            pieces = row[1:n - 1]
            pieces = np.concatenate([pieces[: keep - kept_tail], pieces[len(pieces) - kept_tail:]])
            row = np.concatenate([[cls_id], pieces, [sep_id]])
        out[r, : len(row)] = row
        mask[r, : len(row)] = 1
    return out, mask


def truncated_normal(rng, shape, stddev):
    """Keras's TruncatedNormal: normal draws, redrawn beyond two standard deviations."""
    x = rng.standard_normal(shape)
    outside = np.abs(x) > 2
    while outside.any():
        x[outside] = rng.standard_normal(outside.sum())
        outside = np.abs(x) > 2
    return (x * stddev).astype(np.float32)


def build(meta, weights, attention_dropout=None):
    from kbert.config import BertConfig
    from kbert.models import bert_classifier, bert_encoder

    values = dict(meta["config"])
    if attention_dropout is not None:
        values["attention_dropout"] = attention_dropout
    config = BertConfig.from_dict(values)
    encoder = bert_encoder(config, dtype=DTYPE)
    for variable in encoder.weights:
        variable.assign(weights[variable.path])
    return config, bert_classifier(encoder, len(meta["labels"]), dtype=DTYPE)


def make_functions(model, num_classes):
    """The compiled train step and prediction, each over a leading axis of seeds."""
    import jax
    import jax.numpy as jnp

    from kbert.fitting.optimizers import (
        DEFAULT_EPSILON,
        DEFAULT_GLOBAL_CLIPNORM,
        DEFAULT_WEIGHT_DECAY,
        NO_DECAY,
    )

    decay_mask = [
        0.0 if any(part in v.path.split("/")[-1] for part in NO_DECAY) else 1.0
        for v in model.trainable_variables
    ]

    def loss_fn(trainable, non_trainable, x, y, smoothing):
        logits, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
        target = jax.nn.one_hot(y, num_classes) * (1 - smoothing) + smoothing / num_classes
        return -(target * log_probs).sum(-1).mean(), non_trainable

    def step(trainable, non_trainable, m, v, t, x, y, rate, smoothing, factors):
        (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            trainable, non_trainable, x, y, smoothing
        )
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads))
        scale = DEFAULT_GLOBAL_CLIPNORM / jnp.maximum(norm, DEFAULT_GLOBAL_CLIPNORM)
        correction = jnp.sqrt(1 - 0.999 ** (t + 1.0)) / (1 - 0.9 ** (t + 1.0))
        new = ([], [], [])
        for w, g, mi, vi, decays, factor in zip(trainable, grads, m, v, decay_mask, factors):
            g = g.astype(jnp.float32) * scale
            lr = rate * factor
            w = w - w * (lr * DEFAULT_WEIGHT_DECAY * decays)
            mi = 0.9 * mi + 0.1 * g
            vi = 0.999 * vi + 0.001 * g * g
            w = w - lr * correction * mi / (jnp.sqrt(vi) + DEFAULT_EPSILON)
            for part, value in zip(new, (w, mi, vi)):
                part.append(value)
        return new[0], non_trainable, new[1], new[2], loss

    train_step = jax.jit(
        jax.vmap(step, in_axes=(0, 0, 0, 0, None, 0, 0, None, None, None)), donate_argnums=(0, 1, 2, 3)
    )

    def predict(trainable, non_trainable, x):
        logits, _ = model.stateless_call(trainable, non_trainable, x, training=False)
        return jnp.argmax(logits, -1)

    return train_step, jax.jit(jax.vmap(predict, in_axes=(0, 0, None)))


def run_variant(name, recipe, seeds, meta, data, weights, cache, log, max_dev=None):
    """Fine-tunes one copy per seed side by side; logs a record per seed, returns (mean accuracy, seconds)."""
    import jax
    import jax.numpy as jnp

    from kbert.tasks.classification import classification_metrics
    from kbert.training import WarmupPolynomialDecay, layerwise_multipliers
    from kbert.fitting.optimizers import layerwise_factor

    length = recipe.get("length", 128)
    tail = recipe.get("tail", 0)
    epochs = recipe.get("epochs", 2)
    peak = recipe.get("lr", 1e-4)
    smoothing = recipe.get("smoothing", 0.0)
    attention_dropout = recipe.get("attention_dropout")
    if attention_dropout not in cache:
        config, model = build(meta, weights, attention_dropout)
        cache[attention_dropout] = (config, model, make_functions(model, len(meta["labels"])))
    config, model, (train_step, predict) = cache[attention_dropout]
    x_train, m_train = view(data["train_ids"], data["train_len"], length, tail, meta["cls"], meta["sep"])
    x_dev, m_dev = view(data["dev_ids"], data["dev_len"], length, tail, meta["cls"], meta["sep"])
    y_train = data["train_y"].astype(np.int32)
    y_dev = data["dev_y"].astype(np.int32)
    if max_dev:
        x_dev, m_dev, y_dev = x_dev[:max_dev], m_dev[:max_dev], y_dev[:max_dev]
    paths = [v.path for v in model.trainable_variables]
    trainable = []
    for path, variable in zip(paths, model.trainable_variables):
        value = np.asarray(variable.value)
        per_seed = []
        for seed in seeds:
            rng = np.random.default_rng([seed, zlib.crc32(path.encode())])
            fresh = path.startswith("logits/") or recipe.get("reinit_pooler") and path.startswith("pooler/")
            if fresh and path.endswith("kernel"):
                stddev = 0.02 if path.startswith("logits/") else config.initializer_range
                per_seed.append(truncated_normal(rng, value.shape, stddev))
            elif fresh:
                per_seed.append(np.zeros_like(value))
            else:
                per_seed.append(value)
        trainable.append(jnp.asarray(np.stack(per_seed)))
    # The dropout layers' seed states, a pair of uint32 each: one stream per seed and layer.
    non_trainable = []
    for i, variable in enumerate(model.non_trainable_variables):
        value = np.asarray(variable.value)
        non_trainable.append(jnp.asarray(np.stack([
            (np.array([7919 * seed + 104729 * i + 1, 0]) % 2**31).astype(value.dtype)
            if value.shape == (2,) else value
            for seed in seeds
        ])))
    m = [jnp.zeros_like(w, dtype=jnp.float32) for w in trainable]
    v = [jnp.zeros_like(w, dtype=jnp.float32) for w in trainable]
    multipliers = layerwise_multipliers(config.num_layers, recipe.get("layer_decay", 1.0))
    factors = tuple(layerwise_factor(multipliers, p) for p in paths)
    rows = len(y_train)
    steps_per_epoch = -(-rows // BATCH_SIZE)
    total = steps_per_epoch * epochs
    schedule = WarmupPolynomialDecay(peak, total, int(recipe.get("warmup", 0.1) * total))
    shuffles = [np.random.default_rng(1000 + seed) for seed in seeds]
    t = 0
    start = time.time()
    for _ in range(epochs):
        orders = [shuffle.permutation(rows) for shuffle in shuffles]
        losses = []
        for b in range(steps_per_epoch):
            index = np.stack([order[b * BATCH_SIZE:(b + 1) * BATCH_SIZE] for order in orders])
            x = {
                "token_ids": jnp.asarray(x_train[index]),
                "segment_ids": jnp.zeros(index.shape + (length,), jnp.int32),
                "padding_mask": jnp.asarray(m_train[index]),
            }
            trainable, non_trainable, m, v, loss = train_step(
                trainable, non_trainable, m, v, float(t), x, jnp.asarray(y_train[index]),
                float(schedule(t)), smoothing, factors,
            )
            losses.append(loss)
            t += 1
    last_epoch_loss = np.asarray(jnp.stack(losses)).mean(0)
    jax.block_until_ready(trainable)
    seconds = time.time() - start
    predicted = []
    for b in range(0, len(y_dev), 256):
        x = {
            "token_ids": jnp.asarray(x_dev[b:b + 256]),
            "segment_ids": jnp.zeros_like(jnp.asarray(x_dev[b:b + 256])),
            "padding_mask": jnp.asarray(m_dev[b:b + 256]),
        }
        predicted.append(np.asarray(predict(trainable, non_trainable, x)))
    predicted = np.concatenate(predicted, axis=1)
    for i, seed in enumerate(seeds):
        figures = classification_metrics(y_dev, predicted[i], meta["labels"])
        log({"variant": name, "recipe": recipe, "seed": seed,
             "accuracy": figures["accuracy"], "macro_f1": figures["macro_f1"],
             "last_epoch_loss": float(last_epoch_loss[i]), "train_s": seconds})
    return float(np.mean(predicted == y_dev[np.newaxis])), seconds


def parse_seeds(text):
    """"0-31" or "0,1,5": a list of ints (an argparse type)."""
    seeds = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or high and not high.isdigit() or high and int(high) < int(low):
            raise argparse.ArgumentTypeError(f"{text!r}: expected seeds such as 0-31 or 0,1,5")
        seeds += list(range(int(low), int(high) + 1)) if high else [int(low)]
    return seeds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="encode the data and write the weights (TensorFlow)")
    p.add_argument("--train", required=True)
    p.add_argument("--dev", required=True)
    p.add_argument("--init", default="all-minilm-l6-v2")
    p.add_argument("--out", required=True, help="a new folder")
    p.add_argument("--overwrite", action="store_true", help="replace a folder prepare wrote")
    r = commands.add_parser("run", help="train the variants, every seed at once (KERAS_BACKEND=jax)")
    r.add_argument("--data", required=True, help="what prepare wrote")
    r.add_argument("--seeds", type=parse_seeds, default="0-31")
    r.add_argument("--variants", default="base,head_tail")
    r.add_argument("--out", required=True, help="JSON lines, one per seed and variant (appended)")
    r.add_argument("--max-train", type=int, default=None, help="the first N training rows only")
    r.add_argument("--max-dev", type=int, default=None, help="the first N dev rows only")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        try:
            return prepare(args.train, args.dev, args.init, args.out, args.overwrite)
        except ValueError as error:
            parser.error(str(error))
    unknown = [name for name in args.variants.split(",") if name not in VARIANTS]
    if unknown:
        parser.error(f"--variants: {unknown[0]!r} is not one of {', '.join(VARIANTS)}")
    import keras

    if keras.backend.backend() != "jax":
        parser.error("run needs the JAX backend: KERAS_BACKEND=jax")
    meta, data, weights = load(args.data)
    if args.max_train:
        for key in ("train_ids", "train_len", "train_y"):
            data[key] = data[key][: args.max_train]
    seeds = args.seeds
    cache = {}
    with open(args.out, "a", encoding="utf-8") as out:
        def log(record):
            out.write(json.dumps(record) + "\n")
            out.flush()

        for name in args.variants.split(","):
            accuracy, seconds = run_variant(
                name, VARIANTS[name], seeds, meta, data, weights, cache, log, args.max_dev
            )
            print(json.dumps({"variant": name, "seeds": len(seeds), "mean_accuracy": round(accuracy, 4),
                              "train_seconds": round(seconds, 1)}), flush=True)


if __name__ == "__main__":
    main()
