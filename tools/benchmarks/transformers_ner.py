"""The peer for named entities: Hugging Face transformers + PyTorch, run_ner.py's recipe.

Fine-tunes `BertForTokenClassification` on a CoNLL file as transformers'
`examples/pytorch/token-classification/run_ner.py` does with its defaults:
the label of each word on its first piece (the others ignored,
`label_all_tokens` off), AdamW at 5e-5 with a linear decay and no warm-up,
no weight decay, batch 8, 3 epochs, pieces up to the tokenizer's 512.
Its `Trainer` needs `accelerate`; `transformers_peer.train` runs the same steps.
Entities are scored on the dev file's words, as `kbert evaluate` scores
them (`kbert.tasks.tagging.entity_metrics`, conlleval's counting).

Prints one JSON object: dev precision, recall, F1, word accuracy, training time.

    python tools/benchmarks/transformers_ner.py --train conll2003/train.txt \
        --dev conll2003/dev.txt --init all-minilm-l6-v2 --seed 0

It imports PyTorch, never TensorFlow (the two crash together in one process here):
`tools/benchmarks/benchmark_finetune.py --impls kbert,transformers` runs it beside `kbert finetune`.
"""

import json

import torch
import transformers

import transformers_peer as peer  # before kbert: sets Keras on JAX's CPU backend

from kbert.checkpoints.huggingface import resolve_checkpoint
from kbert.tasks.conll import read_conll
from kbert.tasks.tagging import entity_metrics

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


def batch(rows, indices, pad_id):
    """The rows at `indices`, padded to the longest: ids, mask, labels."""
    chosen = [rows[i] for i in indices]
    width = max(len(row["input_ids"]) for row in chosen)
    ids = torch.full((len(chosen), width), pad_id, dtype=torch.long)
    labels = torch.full((len(chosen), width), IGNORED, dtype=torch.long)
    mask = torch.zeros((len(chosen), width), dtype=torch.long)
    for i, row in enumerate(chosen):
        n = len(row["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(row["input_ids"]), torch.tensor(row["labels"]), 1
    return ids, mask, labels


def main(argv=None):
    parser = peer.arguments(__doc__)
    args = parser.parse_args(argv)

    peer.seed(args.seed, args.threads)
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

    def loss(indices):
        ids, mask, labels = batch(train_rows, indices, tokenizer.pad_token_id)
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss

    train_seconds = peer.train(model, len(train_rows), RECIPE, args.seed, loss)
    predicted = [None] * len(dev_rows)
    with torch.no_grad():
        for start in range(0, len(dev_rows), 64):
            indices = range(start, min(start + 64, len(dev_rows)))
            ids, mask, _ = batch(dev_rows, indices, tokenizer.pad_token_id)
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
