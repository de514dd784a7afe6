"""The peer for question answering: Hugging Face transformers + PyTorch, run_qa.py's recipe.

Fine-tunes `BertForQuestionAnswering` on a SQuAD-format file as transformers'
`examples/pytorch/question-answering/run_qa.py` does with the flags of its
README: 2 epochs at 3e-5, batch 12, 384 pieces with a stride of 128, AdamW
with a linear decay, no warm-up, no weight decay (`TrainingArguments`'
defaults). Windows and their labels are `prepare_train_features`': the fast
tokenizer's overflowing windows of the context, the answer's first and last
piece by the offset mapping, [CLS] when the window does not hold the whole
answer or the question has none. Answers are `postprocess_qa_predictions`':
the 20 best starts and ends of each window, spans of at most 30 pieces inside
the context, against the lowest [CLS] score of the question's windows
(`--version_2_with_negative`, null threshold 0). Its `Trainer` needs
`accelerate`; `transformers_peer.train` runs the same steps. Scored by the official
SQuAD 2.0 script's rules (`kbert.tasks.squad_eval`).

Prints one JSON object: the dev figures at the null threshold tuned on dev
(as `kbert finetune` tunes its own) and at run_qa.py's 0, HasAns F1 with
every question answered, and the training time.

    python tools/benchmarks/transformers_qa.py --train squad-sample/normans-dev-v2.0.json \
        --dev squad-sample/normans-dev-v2.0.json --init all-minilm-l6-v2 --seed 0

`--epochs`, `--lr` and `--batch-size` replace the recipe's, to tell a recipe's
part in a gap from the implementation's. It imports PyTorch, never
TensorFlow (the two crash together in one process here).
"""

import json

import numpy as np
import torch
import transformers

import transformers_peer as peer  # before kbert: sets Keras on JAX's CPU backend

from kbert.checkpoints.huggingface import resolve_checkpoint
from kbert.cliargs import learning_rate, positive_int
from kbert.tasks import squad_eval
from kbert.tasks.squad import read_squad_json

# run_qa.py's README command for SQuAD, and TrainingArguments' defaults.
RECIPE = {"epochs": 2, "learning_rate": 3e-5, "batch_size": 12, "weight_decay": 0.0, "max_length": 384,
          "doc_stride": 128, "n_best_size": 20, "max_answer_length": 30, "null_score_diff_threshold": 0.0}


def windows(tokenizer, examples):
    """`prepare_train_features`: each question's windows, with the answer's
    first and last piece (the [CLS] position when the window lacks it)."""
    encoding = tokenizer(
        [e.question.lstrip() for e in examples], [e.context for e in examples],
        truncation="only_second", max_length=RECIPE["max_length"], stride=RECIPE["doc_stride"],
        return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length",
    )
    rows = []
    for i, offsets in enumerate(encoding["offset_mapping"]):
        example = encoding["overflow_to_sample_mapping"][i]
        sequence_ids = encoding.sequence_ids(i)
        context = [position for position, side in enumerate(sequence_ids) if side == 1]
        answers = examples[example].answers
        start = end = encoding["input_ids"][i].index(tokenizer.cls_token_id)
        if answers:
            first, last = answers[0]["answer_start"], answers[0]["answer_start"] + len(answers[0]["text"])
            if offsets[context[0]][0] <= first and offsets[context[-1]][1] >= last:
                start = max(p for p in context if offsets[p][0] <= first)
                end = min(p for p in context if offsets[p][1] >= last)
        rows.append({
            "example": example, "input_ids": encoding["input_ids"][i],
            "token_type_ids": encoding["token_type_ids"][i], "attention_mask": encoding["attention_mask"][i],
            # Only the context's pieces can start or end an answer.
            "offsets": [tuple(o) if side == 1 else None for o, side in zip(offsets, sequence_ids)],
            "start": start, "end": end,
        })
    return rows


def tensors(rows, names):
    return [torch.tensor([row[name] for row in rows], dtype=torch.long) for name in names]


def answers(examples, rows, start_logits, end_logits):
    """`postprocess_qa_predictions`: each question's best span and its null-score difference."""
    best = [None] * len(examples)
    null = [None] * len(examples)
    top = RECIPE["n_best_size"]
    for row, starts, ends in zip(rows, start_logits, end_logits):
        example, offsets = row["example"], row["offsets"]
        if null[example] is None or starts[0] + ends[0] < null[example]:
            null[example] = starts[0] + ends[0]
        best_ends = np.argsort(ends)[::-1][:top]
        for s in np.argsort(starts)[::-1][:top]:
            for e in best_ends:
                if offsets[s] is None or offsets[e] is None or e < s or e - s + 1 > RECIPE["max_answer_length"]:
                    continue
                score = starts[s] + ends[e]
                if best[example] is None or score > best[example][0]:
                    best[example] = (score, examples[example].context[offsets[s][0]:offsets[e][1]])
    texts = [b[1] if b else "" for b in best]
    odds = [float(n - b[0]) if b else float("inf") for n, b in zip(null, best)]
    return texts, odds


def figures(examples, texts, odds):
    """SQuAD 2.0's figures at the null threshold tuned on these questions, and at 0."""
    golds = [[a["text"] for a in e.answers] for e in examples]

    def at(threshold):
        predictions = ["" if o > threshold else t for t, o in zip(texts, odds)]
        metrics = squad_eval.squad_v2_metrics(golds, predictions)
        return {k: round(v, 2) for k, v in metrics.items() if not k.endswith("total")}

    _, tuned, _ = squad_eval.tune_null_threshold(golds, texts, odds)  # as `kbert finetune` tunes its own
    return {
        **at(tuned), "null_score_diff_threshold": round(tuned, 4),
        "threshold_0": at(RECIPE["null_score_diff_threshold"]),
        "forced_answers_HasAns_f1": at(float("inf")).get("HasAns_f1"),
    }


def main(argv=None):
    parser = peer.arguments(__doc__)
    parser.add_argument("--epochs", type=positive_int, help="default: run_qa.py's 2")
    parser.add_argument("--lr", type=learning_rate, help="default: run_qa.py's 3e-5")
    parser.add_argument("--batch-size", type=positive_int, help="default: run_qa.py's 12")
    args = parser.parse_args(argv)
    for key, value in (("epochs", args.epochs), ("learning_rate", args.lr), ("batch_size", args.batch_size)):
        if value is not None:
            RECIPE[key] = value

    peer.seed(args.seed, args.threads)
    try:
        train, dev = read_squad_json(args.train), read_squad_json(args.dev)
        folder = resolve_checkpoint(args.init)
    except ValueError as error:
        parser.error(str(error))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(folder)
    train_rows, dev_rows = windows(tokenizer, train), windows(tokenizer, dev)
    names = ("input_ids", "token_type_ids", "attention_mask", "start", "end")
    ids, segments, mask, starts, ends = tensors(train_rows, names)

    def loss(batch):
        return model(input_ids=ids[batch], token_type_ids=segments[batch], attention_mask=mask[batch],
                     start_positions=starts[batch], end_positions=ends[batch]).loss

    train_seconds = peer.train(model, len(train_rows), RECIPE, args.seed, loss)
    ids, segments, mask = tensors(dev_rows, names[:3])
    start_logits, end_logits = [], []
    with torch.no_grad():
        for batch in torch.arange(len(dev_rows)).split(64):
            outputs = model(input_ids=ids[batch], token_type_ids=segments[batch], attention_mask=mask[batch])
            start_logits += outputs.start_logits.numpy().tolist()
            end_logits += outputs.end_logits.numpy().tolist()
    texts, odds = answers(dev, dev_rows, np.array(start_logits), np.array(end_logits))
    print(json.dumps({
        "impl": f"transformers {transformers.__version__} + PyTorch {torch.__version__}",
        "seed": args.seed, "recipe": RECIPE, "train_questions": len(train), "train_windows": len(train_rows),
        "dev": {"questions": len(dev), **figures(dev, texts, odds)},
        "train_seconds": round(train_seconds, 1),
    }))


if __name__ == "__main__":
    main()
