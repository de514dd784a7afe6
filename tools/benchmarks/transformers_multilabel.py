"""The peer for multi-label classification: Hugging Face transformers + PyTorch.

Fine-tunes `BertForSequenceClassification` with
`problem_type="multi_label_classification"` (a sigmoid logit per label,
`BCEWithLogitsLoss`) on a CSV of texts and `;`-separated labels, with the
recipe of transformers' multi-label tutorial (Transformers-Tutorials,
"Fine-tuning BERT for multi-label text classification"): AdamW at 2e-5 with
a linear decay and no warm-up, weight decay 0.01, batch 8, 5 epochs, texts
cut at 128 pieces; `transformers_peer.train` runs `Trainer`'s steps.

Dev figures are kbert's (`multi_label_metrics`) at the tutorial's threshold
(0.5) and at the threshold kbert tunes on dev (the best dev micro-F1 of
0.05, 0.06, ..., 0.95): the same thresholding as `kbert finetune`.

Prints one JSON object: dev figures at both thresholds, the threshold, the training time.

    python tools/benchmarks/transformers_multilabel.py --train debian-tags/train.csv \
        --dev debian-tags/dev.csv --init all-minilm-l6-v2 --seed 0

It imports PyTorch, never TensorFlow (the two crash together in one process here):
`tools/benchmarks/benchmark_finetune.py --impls kbert,transformers` runs it beside `kbert finetune`.
"""

import json

import numpy as np
import torch
import transformers

import transformers_peer as peer  # before kbert: sets Keras on JAX's CPU backend

from kbert.checkpoints.huggingface import resolve_checkpoint
from kbert.tasks.multi_label_classification import THRESHOLDS, MultiLabelClassification, multi_label_metrics

# The tutorial's TrainingArguments and tokenizer call.
RECIPE = {"epochs": 5, "learning_rate": 2e-5, "batch_size": 8, "weight_decay": 0.01, "max_length": 128}
TUTORIAL_THRESHOLD = 0.5
FIGURES = ("micro_f1", "macro_f1", "samples_f1", "exact_match")


def main(argv=None):
    parser = peer.arguments(__doc__)
    args = parser.parse_args(argv)

    peer.seed(args.seed, args.threads)
    try:
        train = MultiLabelClassification.read(args.train)
        dev = MultiLabelClassification.read(args.dev)
        labels = MultiLabelClassification.learn(train, args.train)["labels"]
        MultiLabelClassification.check_learned({"labels": labels}, dev, args.dev)
        folder = resolve_checkpoint(args.init)
    except ValueError as error:
        parser.error(str(error))
    index = {label: i for i, label in enumerate(labels)}

    def targets(examples):
        matrix = np.zeros((len(examples), len(labels)), np.float32)
        for row, example in enumerate(examples):
            matrix[row, [index[label] for label in example.target]] = 1.0
        return matrix

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, num_labels=len(labels), problem_type="multi_label_classification",
        id2label=dict(enumerate(labels)), label2id=index)

    def encoded(examples, indices):
        return tokenizer([examples[i].texts[0] for i in indices], truncation=True, padding=True,
                         max_length=RECIPE["max_length"], return_tensors="pt")

    gold = targets(train)

    def loss(indices):
        inputs = encoded(train, indices)
        return model(**inputs, labels=torch.from_numpy(gold[indices])).loss

    train_seconds = peer.train(model, len(train), RECIPE, args.seed, loss)
    probabilities = []
    with torch.no_grad():
        for start in range(0, len(dev), 64):
            logits = model(**encoded(dev, range(start, min(start + 64, len(dev))))).logits
            probabilities.append(torch.sigmoid(logits).numpy())
    probabilities = np.concatenate(probabilities)
    dev_gold = targets(dev) > 0
    tuned = max(THRESHOLDS, key=lambda t: (multi_label_metrics(dev_gold, probabilities >= t)["micro_f1"], -t))

    def figures(threshold):
        found = multi_label_metrics(dev_gold, probabilities >= threshold)
        return {key: found[key] for key in FIGURES}

    print(json.dumps({
        "impl": f"transformers {transformers.__version__} + PyTorch {torch.__version__}",
        "seed": args.seed, "recipe": RECIPE,
        "dev": {**figures(TUTORIAL_THRESHOLD), "threshold": TUTORIAL_THRESHOLD, "n": len(dev)},
        "dev_tuned": {**figures(tuned), "threshold": float(tuned)},
        "train_seconds": round(train_seconds, 1),
    }))


if __name__ == "__main__":
    main()
