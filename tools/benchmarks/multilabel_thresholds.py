"""One threshold for every label, or one per label? Measured on dev, across halves.

For each multi-label model folder, the dev texts are split into two halves
(a seeded shuffle); each scheme's thresholds are chosen on one half and
scored on the other, both ways, so that no figure is scored on the texts
its thresholds were chosen on:

- `global`: one threshold, the best micro-F1 of 0.05, 0.06, ..., 0.95 (what
  `kbert finetune` stores);
- `per_label`: each label with at least `--min-support` positives in the
  choosing half gets the threshold of its own best F1 (ties: the global
  one), the others the global one.

Prints one JSON object: each model's held-out micro-F1 and macro-F1 under
both schemes, and the mean difference.

    python tools/benchmarks/multilabel_thresholds.py --dev debian-tags/dev.csv \
        runs/tags-0 runs/tags-1
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kbert.cliargs import positive_int  # noqa: E402
from kbert.tasks.multi_label_classification import THRESHOLDS, multi_label_metrics  # noqa: E402


def best_threshold(gold, probabilities, figure="micro_f1"):
    """The threshold of `THRESHOLDS` with the best `figure` (the lowest of equals)."""
    scores = [multi_label_metrics(gold, probabilities >= t)[figure] for t in THRESHOLDS]
    return float(THRESHOLDS[int(np.argmax(scores))])


def per_label_thresholds(gold, probabilities, fallback, min_support):
    """Each label's threshold of its best F1 where it has `min_support` positives, else `fallback`."""
    thresholds = np.full(gold.shape[1], fallback)
    for label in range(gold.shape[1]):
        if gold[:, label].sum() >= min_support:
            column = gold[:, label : label + 1], probabilities[:, label : label + 1]
            scores = [multi_label_metrics(column[0], column[1] >= t)["micro_f1"] for t in THRESHOLDS]
            if max(scores) > multi_label_metrics(column[0], column[1] >= fallback)["micro_f1"]:
                thresholds[label] = THRESHOLDS[int(np.argmax(scores))]
    return thresholds


def held_out(gold, probabilities, halves, min_support):
    """Each scheme's micro- and macro-F1 on each half, its thresholds chosen on the other."""
    figures = {"global": [], "per_label": []}
    for choose, score in (halves, halves[::-1]):
        overall = best_threshold(gold[choose], probabilities[choose])
        labels = per_label_thresholds(gold[choose], probabilities[choose], overall, min_support)
        for scheme, thresholds in (("global", overall), ("per_label", labels)):
            found = multi_label_metrics(gold[score], probabilities[score] >= thresholds)
            figures[scheme].append({k: found[k] for k in ("micro_f1", "macro_f1")})
    return {scheme: {k: float(np.mean([f[k] for f in runs])) for k in ("micro_f1", "macro_f1")}
            for scheme, runs in figures.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dev", required=True)
    parser.add_argument("--min-support", type=positive_int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("models", nargs="+", help="multi-label model folders (kbert finetune --out)")
    args = parser.parse_args(argv)
    from kbert.modelfolder import ModelFolder

    results = {}
    for path in args.models:
        folder = ModelFolder.load(path)
        examples = folder.task.read(args.dev, folder.use_options(None))
        encoded = folder.task.encode(examples, targets=False)
        probabilities = folder.task.decode(examples, encoded, folder.task.run(folder.model, encoded.features))
        gold = folder.task.targets(examples) > 0
        order = np.random.default_rng(args.seed).permutation(len(examples))
        results[path] = held_out(gold, np.asarray(probabilities), np.array_split(order, 2), args.min_support)
    differences = [r["per_label"]["micro_f1"] - r["global"]["micro_f1"] for r in results.values()]
    print(json.dumps({
        "dev": args.dev, "min_support": args.min_support, "models": results,
        "per_label_minus_global_micro_f1": {"mean": float(np.mean(differences)), "each": differences},
    }))


if __name__ == "__main__":
    main()
