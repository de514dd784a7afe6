"""One threshold for every label, or one per label? Measured on dev, across halves.

For each multi-label model folder, the dev texts are split into two halves
(a seeded shuffle); each scheme's thresholds are chosen on one half and
scored on the other, both ways, so that no figure is scored on the texts
its thresholds were chosen on:

- `global`: one threshold, the best micro-F1 of 0.05, 0.06, ..., 0.95 (what
  `kbert finetune` stores);
- `per_label`: each label with at least `--min-support` positives in the
  choosing half gets the threshold of its own best F1 (ties: the global
  one), the others the global one;
- `per_facet`: one threshold per facet, the part of a label's name before
  `::` (debtags' `use::`, `works-with::`...), each in turn the best micro-F1
  of all the labels with the others' held (ties: nearest the global one).

Prints one JSON object: each model's held-out micro-F1 and macro-F1 under
each scheme (the mean over `--splits` seeded halvings), and each scheme's
mean difference from `global`.

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


def per_facet_thresholds(gold, probabilities, fallback, facets):
    """One threshold per facet (`facets[j]` is label j's), each the best micro-F1
    over every label with the other facets' held, ties nearest `fallback`."""
    thresholds = np.full(gold.shape[1], fallback)
    for facet in sorted(set(facets)):
        members = np.array([f == facet for f in facets])

        def score(t):
            return multi_label_metrics(gold, probabilities >= np.where(members, t, thresholds))["micro_f1"]

        thresholds[members] = max(THRESHOLDS, key=lambda t: (score(t), -abs(t - fallback)))
    return thresholds


def held_out(gold, probabilities, halves, min_support, facets):
    """Each scheme's micro- and macro-F1 on each half (a list of two), its thresholds chosen on the other."""
    figures = {"global": [], "per_label": [], "per_facet": []}
    for choose, score in (halves, halves[::-1]):
        overall = best_threshold(gold[choose], probabilities[choose])
        labels = per_label_thresholds(gold[choose], probabilities[choose], overall, min_support)
        grouped = per_facet_thresholds(gold[choose], probabilities[choose], overall, facets)
        for scheme, thresholds in (("global", overall), ("per_label", labels), ("per_facet", grouped)):
            found = multi_label_metrics(gold[score], probabilities[score] >= thresholds)
            figures[scheme].append({k: found[k] for k in ("micro_f1", "macro_f1")})
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dev", required=True)
    parser.add_argument("--min-support", type=positive_int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="the first halving's seed")
    parser.add_argument("--splits", type=positive_int, default=1, help="halvings, seeds --seed, --seed + 1...")
    parser.add_argument("models", nargs="+", help="multi-label model folders (kbert finetune --out)")
    args = parser.parse_args(argv)
    from kbert.logs import Progress, Waiting
    from kbert.modelfolder import ModelFolder

    results = {}
    for path in args.models:
        folder = ModelFolder.load(path)
        examples = folder.task.read(args.dev, folder.use_options(None))
        with Waiting(f"{path}: the model on {len(examples):,} dev rows"):
            encoded = folder.task.encode(examples, targets=False)
            probabilities = np.asarray(
                folder.task.decode(examples, encoded, folder.task.run(folder.model, encoded.features))
            )
        gold = folder.task.targets(examples) > 0
        facets = [label.split("::")[0] for label in folder.task.labels]
        halves_scored = {}
        with Progress(f"{path}: thresholds", args.splits, "halvings") as progress:
            for seed in range(args.seed, args.seed + args.splits):
                halves = np.array_split(np.random.default_rng(seed).permutation(len(examples)), 2)
                for scheme, runs in held_out(gold, probabilities, halves, args.min_support, facets).items():
                    halves_scored.setdefault(scheme, []).extend(runs)
                progress.update()
        results[path] = {scheme: {k: float(np.mean([run[k] for run in runs])) for k in ("micro_f1", "macro_f1")}
                         for scheme, runs in halves_scored.items()}
    summary = {"dev": args.dev, "min_support": args.min_support, "splits": args.splits, "models": results}
    for scheme in ("per_label", "per_facet"):
        differences = [r[scheme]["micro_f1"] - r["global"]["micro_f1"] for r in results.values()]
        summary[f"{scheme}_minus_global_micro_f1"] = {"mean": float(np.mean(differences)), "each": differences}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
