"""The peer for named entities: Hugging Face transformers + PyTorch, run_ner.py's recipe.

Fine-tunes `BertForTokenClassification` on a CoNLL file as transformers'
`examples/pytorch/token-classification/run_ner.py` does with its defaults:
the label of each word on its first piece (the others ignored,
`label_all_tokens` off), AdamW at 5e-5 with a linear decay and no warm-up,
no weight decay, batch 8, 3 epochs, pieces up to the tokenizer's 512.
Its `Trainer` needs `accelerate`; the loop here runs the same steps.
Entities are scored on the dev file's words, as `kbert evaluate` scores
them (`kbert.tasks.tagging.entity_metrics`, conlleval's counting).

Prints one JSON object: dev precision, recall, F1, word accuracy, training time.

    python tools/benchmarks/transformers_ner.py --train conll2003/train.txt \
        --dev conll2003/dev.txt --init all-minilm-l6-v2 --seed 0

It imports PyTorch, never TensorFlow (the two crash together in one process here):
`tools/benchmarks/benchmark_finetune.py --impls kbert,transformers` runs it beside `kbert finetune`.
"""

import argparse
import json
import os
import random
import sys
import time

import numpy as np
import torch
import transformers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
# kbert's checkpoint helpers import Keras: on JAX's CPU backend here, never TensorFlow.
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ["JAX_PLATFORMS"] = "cpu"

from kbert.checkpoints.huggingface import resolve_checkpoint  # noqa: E402
from kbert.tasks.conll import read_conll  # noqa: E402
from kbert.tasks.tagging import entity_metrics  # noqa: E402

# run_ner.py's defaults (transformers' TrainingArguments).
RECIPE = {"epochs": 3, "learning_rate": 5e-5, "batch_size": 8, "weight_decay": 0.0, "max_length": 512}
IGNORED = -100  # PyTorch's cross-entropy ignore_index, as run_ner.py labels later pieces


def first_pieces(word_ids):
    """`(position, word)` of each word's first piece, from a fast tokenizer's `word_ids()`."""
    previous = None
    for position, word in enumerate(word_ids):
        if word is not None and word != previous:
            yield position, word
        previous = word


def encode(tokenizer, sentences, label_ids):
    """run_ner.py's `tokenize_and_align_labels`: a word's label on its first piece."""
    rows = []
    for sentence in sentences:
        encoding = tokenizer(sentence.words, is_split_into_words=True, truncation=True,
                             max_length=RECIPE["max_length"])
        word_ids = encoding.word_ids()
        labels = [IGNORED] * len(word_ids)
        for position, word in first_pieces(word_ids):
            labels[position] = label_ids[sentence.tags[word]]
        rows.append({"input_ids": encoding["input_ids"], "labels": labels, "word_ids": word_ids})
    return rows


def batches(rows, size, order, pad_id):
    for start in range(0, len(order), size):
        indices = order[start:start + size]
        chosen = [rows[i] for i in indices]
        width = max(len(row["input_ids"]) for row in chosen)
        ids = torch.full((len(chosen), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chosen), width), IGNORED, dtype=torch.long)
        mask = torch.zeros((len(chosen), width), dtype=torch.long)
        for i, row in enumerate(chosen):
            n = len(row["input_ids"])
            ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(row["input_ids"]), torch.tensor(row["labels"]), 1
        yield indices, ids, mask, labels


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--dev", required=True)
    parser.add_argument("--init", default="all-minilm-l6-v2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    random.seed(args.seed), np.random.seed(args.seed), torch.manual_seed(args.seed)
    train, dev = read_conll(args.train, True), read_conll(args.dev, True)
    labels = sorted({tag for sentence in train for tag in sentence.tags})
    label_ids = {label: i for i, label in enumerate(labels)}
    for sentence in dev:
        unseen = [tag for tag in sentence.tags if tag not in label_ids]
        if unseen:
            parser.error(f"{args.dev}, line {sentence.line}: tag {unseen[0]!r} is not in --train's tags")
    try:
        folder = resolve_checkpoint(args.init)
    except ValueError as error:
        parser.error(f"--init: {error}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        folder, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label_ids)
    train_rows, dev_rows = encode(tokenizer, train, label_ids), encode(tokenizer, dev, label_ids)

    steps = RECIPE["epochs"] * -(-len(train_rows) // RECIPE["batch_size"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=RECIPE["learning_rate"],
                                  weight_decay=RECIPE["weight_decay"])
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, 0, steps)
    generator = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    model.train()
    for _ in range(RECIPE["epochs"]):
        order = torch.randperm(len(train_rows), generator=generator).tolist()
        for _, ids, mask, target in batches(train_rows, RECIPE["batch_size"], order, tokenizer.pad_token_id):
            loss = model(input_ids=ids, attention_mask=mask, labels=target).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # Trainer's max_grad_norm
            optimizer.step(), schedule.step(), optimizer.zero_grad()
    train_seconds = time.perf_counter() - started

    model.eval()
    predicted = [None] * len(dev_rows)
    with torch.no_grad():
        for indices, ids, mask, _ in batches(dev_rows, 64, list(range(len(dev_rows))), tokenizer.pad_token_id):
            best = model(input_ids=ids, attention_mask=mask).logits.argmax(-1).tolist()
            for index, row_best in zip(indices, best):
                pieces = first_pieces(dev_rows[index]["word_ids"])
                predicted[index] = [labels[row_best[position]] for position, _ in pieces]
    figures = entity_metrics([sentence.tags for sentence in dev], predicted)
    print(json.dumps({
        "impl": f"transformers {transformers.__version__} + PyTorch {torch.__version__}",
        "seed": args.seed, "recipe": RECIPE,
        "dev": {key: figures[key] for key in ("precision", "recall", "f1", "accuracy", "entities")},
        "train_seconds": round(train_seconds, 1),
    }))


if __name__ == "__main__":
    main()
