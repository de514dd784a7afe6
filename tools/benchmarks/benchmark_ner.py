"""Named-entity recognition: a token-classification model's dev figures, training time and throughput.

Measures a model folder written by `kbert finetune --task token-classification`
on a CoNLL file (CoNLL-2003's dev set by default):

- entity-level precision, recall and F1, overall and per type, and word
  accuracy, as `kbert evaluate` gives them (pre-split words);
- the same F1 from raw text, as `kbert predict TEXT` sees it: each sentence's
  words joined by spaces and split again by kbert's raw-text path, entities
  matched by type and character span;
- test-time throughput of `ModelFolder.predict` (tokenization, windows, the
  model as trained, decoding): sentences and words per second at batch 64;
- the training run's figures from the folder's `metrics.json` (wall clock,
  sequences per second, epochs) and its settings from `kbert.json`;
- with `--export`, each artefact of a `kbert export` report: F1 and batch-1
  latency;
- with `--window-lengths 32,24`, what max-context windows gain: the model
  read at each shorter sequence length, once in windows (every word tagged)
  and once truncated to one window (the words past it read as `O`).

The load average before and after is printed, as the machine may be shared.
Prints one JSON object; `--out FILE` writes it too.

    python tools/benchmarks/benchmark_ner.py --model runs/ner-minilm --export saved_models/ner
"""

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

DEFAULT_DATA = os.path.join(REPO, "..", "shared", "data", "conll2003", "dev.txt")
BATCH_SIZE = 64


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a token-classification model folder")
    parser.add_argument("--data", default=DEFAULT_DATA, help="a labelled CoNLL or JSON Lines file")
    parser.add_argument("--export", help="an export folder of the model (its report.json)")
    parser.add_argument(
        "--window-lengths", type=lengths, default=[],
        help="comma-separated sequence lengths to read the model at, windowed and truncated",
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.data):
        parser.error(f"--data {args.data}: no such file")
    if args.export and not os.path.isfile(os.path.join(args.export, "report.json")):
        parser.error(f"--export {args.export}: no report.json there")
    return args


def lengths(value):
    """`--window-lengths`: comma-separated whole numbers of at least 3 (a window holds a piece)."""
    try:
        values = [int(part) for part in value.split(",") if part]
    except ValueError:
        values = None
    if not values or min(values) < 3:
        raise argparse.ArgumentTypeError(f"{value!r}; expected lengths of at least 3, e.g. 32,24")
    return values


def window_figures(folder, examples, sequence_length):
    """Entity F1 of the model read at `sequence_length`: in windows, and truncated to one."""
    from kbert.tasks.tagging import entity_metrics

    trained = folder.task
    folder.task = type(trained)(trained.tokenizer, sequence_length, **trained.settings())
    try:
        gold = [example.tags for example in examples]
        windowed = [p["tags"] for p in folder.predict(examples, batch_size=BATCH_SIZE)]
        # Truncated: the words whose pieces fit one window; the rest are read as O.
        pieces = folder.task._word_ids(examples).row_lengths(axis=2).to_list()
        kept = [int(np.searchsorted(np.cumsum(counts), sequence_length - 2, side="right")) for counts in pieces]
        cut = [
            dataclasses.replace(example, words=example.words[:n], tags=example.tags[:n])
            for example, n in zip(examples, kept)
            if n
        ]
        cut_tags = iter(p["tags"] for p in folder.predict(cut, batch_size=BATCH_SIZE))
        truncated = [(next(cut_tags) if n else []) + ["O"] * (len(e.words) - n) for e, n in zip(examples, kept)]
    finally:
        folder.task = trained
    return {
        "sequence_length": sequence_length,
        "sentences_over_one_window": sum(n < len(e.words) for e, n in zip(examples, kept)),
        "windowed_f1": entity_metrics(gold, windowed)["f1"],
        "truncated_f1": entity_metrics(gold, truncated)["f1"],
    }


def raw_text_figures(task, folder, examples):
    """Entity P/R/F1 of the raw-text path: entities as (sentence, type, start, end)."""
    from kbert.tasks.tagging import chunks
    from kbert.tasks.token_classification import word_offsets

    texts = [word_offsets(example)[0] for example in examples]
    raw = task.examples_from_texts(texts)
    rows = task.predict_json(raw, folder.predict(raw, batch_size=BATCH_SIZE))
    gold, predicted = set(), set()
    for index, (example, row) in enumerate(zip(examples, rows)):
        _, starts, ends = word_offsets(example)
        gold |= {(index, kind, starts[a], ends[b - 1]) for kind, a, b in chunks(example.tags)}
        predicted |= {(index, e["type"], e["start"], e["end"]) for e in row["entities"]}
    correct = len(gold & predicted)
    precision = correct / len(predicted) if predicted else 0.0
    recall = correct / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def main(argv=None):
    args = parse_args(argv)
    from kbert.export.verify import load_average, machine
    from kbert.modelfolder import ModelFolder

    machine_before = machine()
    folder = ModelFolder.load(args.model)
    task = folder.task
    examples = task.read(args.data, folder.settings.get("options"))
    words = sum(len(example.words) for example in examples)
    folder.predict(examples[:BATCH_SIZE], batch_size=BATCH_SIZE)  # warm-up: traces the model
    start = time.perf_counter()
    predictions = folder.predict(examples, batch_size=BATCH_SIZE)
    seconds = time.perf_counter() - start
    figures = task.evaluate(examples, predictions)
    trained = json.load(open(os.path.join(args.model, "metrics.json"), encoding="utf-8"))
    settings = folder.settings
    result = {
        "model": args.model,
        "data": args.data,
        "sentences": len(examples),
        "words": words,
        "recipe": {key: settings.get(key) for key in ("init", "sequence_length", "dtype", "lowercase")},
        "training": {
            key: trained.get(key)
            for key in ("epochs", "train_examples", "train_seconds", "train_sequences_per_second")
        },
        "dev": {key: figures[key] for key in ("f1", "precision", "recall", "accuracy", "per_type")},
        "dev_raw_text": raw_text_figures(task, folder, examples),
        "throughput": {
            "batch_size": BATCH_SIZE,
            "compute_dtype": folder.compute_dtype,
            "seconds": round(seconds, 2),
            "sentences_per_second": round(len(examples) / seconds, 1),
            "words_per_second": round(words / seconds, 1),
        },
    }
    result["windows"] = [window_figures(folder, examples, length) for length in args.window_lengths]
    if args.export:
        report = json.load(open(os.path.join(args.export, "report.json"), encoding="utf-8"))
        result["export"] = {
            "keras_f1": report["keras"]["f1"],
            "artefacts": [
                {
                    "path": entry["path"],
                    "quantization": entry["quantization"],
                    "f1": entry["f1"],
                    "max_abs_diff": entry["max_abs_diff"],
                    "latency_ms": entry["latency"]["median_ms"],
                    "passed": entry["passed"],
                }
                for entry in report["artefacts"]
            ],
        }
    result["machine"] = machine_before
    result["load_average_after"] = load_average()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
