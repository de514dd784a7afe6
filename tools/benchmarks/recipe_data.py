"""Prepares what `gpu_recipes.py` carries to a GPU machine: encoded task data and MiniLM.

The GPU machine has JAX but no TensorFlow, so the texts are encoded here, by
each task's own `encode` (kbert's packing and truncation, as `kbert finetune`
feeds the model) and by keras-hub's `BertTextClassifierPreprocessor` (as a
keras-hub user feeds `BertTextClassifier`), and saved as arrays:

- `debian`: text classification, `train.csv` against `dev.csv`;
- `debian-groups`: the same task on a second split made from `train.csv`
  alone: rows that share a 12-word run of text (one source package's
  binaries: `foo`, `foo-data`, `foo-doc`) are one group, and whole groups
  (`GROUP_DEV_SHARE` of the rows) are held out, as the folder's dev and test
  splits hold out source packages;
- `mrpc`: text-pair classification; `stsb`: text-pair regression.

The checkpoint (all-minilm-l6-v2) travels as its encoder's weights, with the
word-embedding table cut to the pieces the data uses and the ids renumbered
to match: rows no batch reads get no gradient, so training is the same as
with the whole table. The weights travel as float16 (a relative rounding of
at most 2**-12, under the 2**-9 of the bfloat16 the sweep computes in), so
that data, weights and wheels fit one device call (64 MiB).

With `--adaptation`, MRPC's training text also travels as the sequences
`kbert finetune`'s adaptation masks (`adaptation_sequences`), for
`gpu_recipes.py --plan adaptation`; the whole vocabulary is kept then, since
the masked LM predicts over all of it.

    python tools/benchmarks/recipe_data.py --out runs/gpu-recipes --wheels
    python tools/benchmarks/recipe_data.py --out runs/gpu-adapt --adaptation --wheels
"""

import argparse
import collections
import csv
import json
import os
import random
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_data  # noqa: E402

INIT = "all-minilm-l6-v2"
SEQUENCE_LENGTH = 128
# The share of train.csv's rows held out, by whole groups, as the second
# split's dev: about dev.csv's share of the folder (950 of 7,935 rows).
GROUP_DEV_SHARE = 0.12
# Rows sharing a run of this many words belong to one group: long enough that
# only text copied between a source package's binaries matches.
SHINGLE_WORDS = 12
# keras-hub 0.32 and the packages it imports that the GPU image lacks (its
# TensorFlow-only needs stay behind: the models import without them).
KERAS_HUB_WHEELS = ("keras-hub==0.32.0",)
# The tasks whose recipe adapts first (`--adaptation`): text-pair classification's.
ADAPTED = ("mrpc",)
# Each task: (task name, train file, dev file, keras-hub's peer runs it).
TASKS = {
    "debian": ("text-classification", "debian-packages/train.csv", "debian-packages/dev.csv", True),
    "mrpc": ("text-pair-classification", "glue-mrpc/train.tsv", "glue-mrpc/dev.tsv", True),
    "stsb": ("text-pair-regression", "glue-stsb/train.tsv", "glue-stsb/dev.tsv", False),
}


def shingles(text):
    words = text.lower().split()
    return {" ".join(words[i : i + SHINGLE_WORDS]) for i in range(len(words) - SHINGLE_WORDS + 1)}


def text_groups(texts):
    """A group id per text: texts sharing a `SHINGLE_WORDS`-word run, transitively."""
    parent = list(range(len(texts)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_seen = {}
    for i, text in enumerate(texts):
        for shingle in shingles(text):
            j = first_seen.setdefault(shingle, i)
            parent[root(i)] = root(j)
    return [root(i) for i in range(len(texts))]


def group_split(train_csv, out_folder, seed=0):
    """Writes `train.csv` and `dev.csv` of the second split; returns its counts."""
    with open(train_csv, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    groups = text_groups([row["text"] for row in rows])
    members = collections.defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    # Groups in the order of their first row: a group's id (its union-find
    # root) depends on the order shingles come out of a set, which changes
    # with Python's string hashing from one process to the next.
    order = sorted(members, key=lambda group: members[group][0])
    random.Random(seed).shuffle(order)
    held, target = set(), GROUP_DEV_SHARE * len(rows)
    for group in order:
        if len(held) >= target:
            break
        held.update(members[group])
    os.makedirs(out_folder, exist_ok=True)
    for name, keep in (("train.csv", False), ("dev.csv", True)):
        with open(os.path.join(out_folder, name), "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["text", "label"])
            writer.writeheader()
            writer.writerows(
                {"text": row["text"], "label": row["label"]}
                for i, row in enumerate(rows) if (i in held) == keep
            )
    sizes = collections.Counter(len(m) for m in members.values())
    return {"groups": len(members), "rows_in_groups_of_2_or_more": sum(
        count * size for size, count in sizes.items() if size > 1), "dev_rows": len(held),
        "train_rows": len(rows) - len(held)}


def kbert_arrays(task_class, tokenizer, train_path, dev_path):
    options, train, dev, settings = task_class.read_training(train_path, dev_path)
    task = task_class(tokenizer, SEQUENCE_LENGTH, **settings)
    task.use_options(options)
    settings = task.settings()
    arrays = {}
    for split, examples in (("train", train), ("dev", dev)):
        encoded = task.encode(examples)
        arrays[f"{split}.token_ids"] = encoded.features["token_ids"]
        arrays[f"{split}.segment_ids"] = encoded.features["segment_ids"]
        arrays[f"{split}.targets"] = np.asarray(encoded.targets)
    return arrays, settings


def adaptation_sequences(task_class, tokenizer, train_path, dev_path):
    """`(sequences, SEQUENCE_LENGTH)` ids: the training texts as `kbert finetune`
    adapts on them (`adaptation_text`), cut into `[CLS] body [SEP]` rows by
    `make_dynamic_masking_dataset` itself, in order, and read back unmasked
    (each masked position holds its label again)."""
    from kbert.pretraining.adapt import adaptation_text
    from kbert.pretraining.dynamic_masking import make_dynamic_masking_dataset

    options, train, _, settings = task_class.read_training(train_path, dev_path)
    task = task_class(tokenizer, SEQUENCE_LENGTH, **settings)
    task.use_options(options)
    texts, count = adaptation_text(task.texts(train), tokenizer.vocabulary, SEQUENCE_LENGTH, tokenizer.lowercase)
    data = make_dynamic_masking_dataset(texts, tokenizer.vocabulary, 1, SEQUENCE_LENGTH, SEQUENCE_LENGTH - 2,
                                        lowercase=tokenizer.lowercase, shuffle_buffer=0, repeat=False)
    rows = []
    for features, labels, weights in data.as_numpy_iterator():
        ids = features["token_ids"][0].copy()
        real = weights["masked_lm"][0] > 0
        ids[features["masked_lm_positions"][0][real]] = labels["masked_lm"][0][real]
        rows.append(ids)
    if len(rows) != count:
        raise RuntimeError(f"the pipeline cut {len(rows)} sequences where count_sequences says {count}")
    return np.stack(rows).astype(np.int32)


def keras_hub_arrays(task_class, vocabulary, lowercase, train_path, dev_path):
    import keras_hub
    import tensorflow as tf

    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=lowercase)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=SEQUENCE_LENGTH
    )
    options = task_class.resolve_options({})
    arrays = {}
    for split, path in (("train", train_path), ("dev", dev_path)):
        examples = task_class.read(path, options)
        columns = tuple(
            tf.constant([e.texts[i] for e in examples]) for i in range(len(task_class.text_inputs))
        )
        # By keyword: a positional tuple would be read as (x, y), the pair's second text as labels.
        packed = preprocessor(x=columns if len(columns) > 1 else columns[0])
        arrays[f"{split}.token_ids"] = packed["token_ids"].numpy().astype(np.int32)
        arrays[f"{split}.segment_ids"] = packed["segment_ids"].numpy().astype(np.int32)
    return arrays


def compact_vocabulary(arrays, specials, size=None):
    """Renumbers every `*.token_ids` array to the pieces used; returns the kept old ids.
    With the vocabulary's `size`, every id is kept (the arrays only change dtype)."""
    used = set(specials) | set(range(size or 0))
    for name, value in arrays.items():
        if name.endswith("token_ids"):
            used.update(np.unique(value).tolist())
    kept = np.array(sorted(used), dtype=np.int64)
    new_id = np.zeros(kept.max() + 1, dtype=np.int64)
    new_id[kept] = np.arange(len(kept))
    for name in list(arrays):
        if name.endswith("token_ids"):
            arrays[name] = new_id[arrays[name]].astype(np.uint16)
        elif name.endswith("segment_ids"):
            arrays[name] = arrays[name].astype(np.uint8)
    return kept


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.join("..", "shared", "data"),
                        help="folder holding debian-packages/, glue-mrpc/, glue-stsb/")
    parser.add_argument("--out", default="runs/gpu-recipes", help="folder the GPU run carries")
    parser.add_argument("--wheels", action="store_true", help="also download wheels to OUT/wheels")
    parser.add_argument("--adaptation", action="store_true",
                        help="also MRPC's adaptation sequences, and the whole vocabulary (gpu_recipes.py --plan adaptation)")
    args = parser.parse_args()
    from kbert.checkpoints import load_hf_checkpoint
    from kbert.tasks import get_task
    from kbert.text import WordPieceTokenizer

    checkpoint = load_hf_checkpoint(INIT)
    tokenizer = WordPieceTokenizer(checkpoint.vocabulary, lowercase=checkpoint.lowercase)
    os.makedirs(args.out, exist_ok=True)
    split_folder = os.path.join(args.out, "debian-groups")
    manifest = {"init": INIT, "sequence_length": SEQUENCE_LENGTH, "tasks": {}}
    manifest["debian_groups"] = group_split(
        os.path.join(args.data, TASKS["debian"][1]), split_folder)
    tasks = dict(TASKS)
    tasks["debian-groups"] = ("text-classification", os.path.join(split_folder, "train.csv"),
                              os.path.join(split_folder, "dev.csv"), True)
    arrays = {}
    for key, (task_name, train, dev, peer) in tasks.items():
        train, dev = (p if os.path.isabs(p) or p.startswith(args.out) else os.path.join(args.data, p)
                      for p in (train, dev))
        task_class = get_task(task_name)
        encoded, settings = kbert_arrays(task_class, tokenizer, train, dev)
        arrays.update({f"{key}.kbert.{name}": value for name, value in encoded.items()})
        if peer:
            hub = keras_hub_arrays(task_class, checkpoint.vocabulary, checkpoint.lowercase, train, dev)
            arrays.update({f"{key}.keras-hub.{name}": value for name, value in hub.items()})
        manifest["tasks"][key] = {"task": task_name, "settings": settings, "keras_hub": peer,
                                  "train": len(encoded["train.targets"]),
                                  "dev": len(encoded["dev.targets"]), "dev_file": dev}
        if args.adaptation and key in ADAPTED:
            arrays[f"{key}.kbert.adapt.sequences.token_ids"] = adaptation_sequences(task_class, tokenizer, train, dev)
            manifest["tasks"][key]["adaptation"] = {
                "sequences": len(arrays[f"{key}.kbert.adapt.sequences.token_ids"]), "mask_id": tokenizer.mask_id}
        print(json.dumps({key: manifest["tasks"][key]["train"]}), flush=True)

    specials = [tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id]
    kept = compact_vocabulary(arrays, specials, len(checkpoint.vocabulary) if args.adaptation else None)
    config = checkpoint.config.to_dict()
    config["vocab_size"] = len(kept)
    manifest["bert_config"] = config
    weights = {}
    for variable in checkpoint.encoder.weights:
        value = np.asarray(variable.numpy(), np.float32)
        if np.abs(value).max() >= np.finfo(np.float16).max:
            raise ValueError(f"{variable.path} holds values beyond float16's range")
        if variable.path.endswith("token_embedding/embeddings"):
            value = value[kept]
        weights["weight." + variable.path] = value.astype(np.float16)
    if not any(name.endswith("token_embedding/embeddings") for name in weights):
        raise ValueError("the encoder has no token_embedding/embeddings; renumbering failed")
    arrays.update(weights)
    np.savez_compressed(os.path.join(args.out, "recipes_data.npz"), **arrays)
    with open(os.path.join(args.out, "recipes_data.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    if args.wheels:
        folder = os.path.join(args.out, "wheels")
        gpu_data.download_wheels(folder)
        gpu_data.download_wheels(folder, KERAS_HUB_WHEELS)
    megabytes = os.path.getsize(os.path.join(args.out, "recipes_data.npz")) / 2**20
    print(json.dumps({"vocabulary": len(kept), "megabytes": round(megabytes, 1),
                      "debian_groups": manifest["debian_groups"]}))


if __name__ == "__main__":
    main()
