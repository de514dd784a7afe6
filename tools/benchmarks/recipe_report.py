"""Scores a `gpu_recipes.py` sweep with each task's own `evaluate`, and picks recipes.

For every candidate (data, implementation, epochs, learning rate, and the
adaptation steps before them in `--plan adaptation`) it gives the
mean and standard error over seeds of the task's figures, and, seed by seed,
the difference from the task's current default recipe (`Task.recipe`). A
candidate replaces the default only when its paired gain on the ranking
figure exceeds `GAIN_IN_ERRORS` standard errors of those differences. Prints
one JSON object and, with `--markdown`, the tables of docs/benchmarks.md.

Where a run's dev pairs were also read the other way (kbert's text-pair
classification), each seed's figures are those `kbert finetune` keeps: the
task's own `tune` chooses, on that seed's dev outputs, between the pairs as
given and both ways; the figures as given and the orders chosen are reported
beside them.

    python tools/benchmarks/recipe_report.py --data runs/gpu-recipes --sweep runs/gpu-recipes-out
"""

import argparse
import contextlib
import io
import json
import math
import os
import statistics

import numpy as np

# A candidate is better only beyond this many standard errors of its paired gain.
GAIN_IN_ERRORS = 2.0
# The figure candidates are ranked by: GLUE's pair of figures for MRPC, the
# folder's pair for Debian, Spearman for STS-B.
RANKED_BY = {
    "text-classification": ("accuracy", "macro_f1"),
    "text-pair-classification": ("accuracy", "f1"),
    "text-pair-regression": ("spearman",),
}


# The key suffix of a run's dev outputs for its pairs read the other way.
SWAPPED = "|swapped"


def run_name(run):
    """A run's key in `gpu_recipes.py`'s predictions.npz: data|impl|epochs|rate,
    then |adaptN for a run that adapted first."""
    name = f"{run['data']}|{run['impl']}|{run['epochs']}|{run['learning_rate']:g}"
    return name + (f"|adapt{run['adapt_steps']}" if "adapt_steps" in run else "")


def mean_error(values):
    mean = statistics.fmean(values)
    error = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return mean, error


def score(task, examples, outputs):
    """The task's figures of one seed's dev outputs."""
    name = task.outputs[0]
    predictions = task.decode(examples, None, {name: outputs.astype(np.float32)})
    return task.evaluate(examples, predictions)


def tuned_score(task, examples, given, swapped):
    """The figures of one seed's dev outputs after the task's `tune` chose
    between them as given and merged with the other order's, and its choice;
    the choice of an earlier seed is forgotten first (`Task.untune`)."""
    task.untune()
    name = task.outputs[0]
    given = given.astype(np.float32)
    merged = task.merge_views([{name: given}, {name: swapped.astype(np.float32)}])
    predictions = task.decode(examples, None, {name: given})
    as_given = task.evaluate(examples, predictions)
    with contextlib.redirect_stderr(io.StringIO()):  # its one line a seed
        chosen = task.tune(examples, predictions, lambda: task.decode(examples, None, {name: np.asarray(merged[name])}))
    figures = as_given if chosen["pair_order"] == "given" else chosen
    return figures, as_given, chosen["pair_order"]


def rank_value(task_name, figures):
    return statistics.fmean(figures[name] for name in RANKED_BY[task_name])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="runs/gpu-recipes", help="recipe_data.py's folder")
    parser.add_argument("--sweep", default="runs/gpu-recipes-out", help="gpu_recipes.py's --out")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    from kbert.checkpoints import load_hf_checkpoint
    from kbert.tasks import get_task
    from kbert.text import WordPieceTokenizer

    with open(os.path.join(args.data, "recipes_data.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    with open(os.path.join(args.sweep, "gpu_recipes.json"), encoding="utf-8") as f:
        sweep = json.load(f)
    checkpoint = load_hf_checkpoint(manifest["init"])
    tokenizer = WordPieceTokenizer(checkpoint.vocabulary, lowercase=checkpoint.lowercase)
    tasks, examples = {}, {}
    for key, info in manifest["tasks"].items():
        task_class = get_task(info["task"])
        examples[key] = task_class.read(info["dev_file"], task_class.resolve_options({}))
        tasks[key] = task_class(tokenizer, manifest["sequence_length"], **info["settings"])

    rows = []
    with np.load(os.path.join(args.sweep, "predictions.npz")) as predictions:
        for run in sweep["runs"]:
            key = run["data"]
            outputs = predictions[run_name(run)]
            # A dry run scores its first rows only.
            dev = examples[key][: outputs.shape[1]]
            both_ways = {}
            if run_name(run) + SWAPPED in predictions.files:
                tuned = [tuned_score(tasks[key], dev, given, swapped)
                         for given, swapped in zip(outputs, predictions[run_name(run) + SWAPPED])]
                per_seed = [figures for figures, _, _ in tuned]
                both_ways = {"as_given": [as_given for _, as_given, _ in tuned],
                             "pair_orders": [order for _, _, order in tuned]}
            else:
                per_seed = [score(tasks[key], dev, seed_outputs) for seed_outputs in outputs]
            rows.append({**{k: run[k] for k in ("data", "impl", "task", "epochs", "learning_rate")},
                         "adapt_steps": run.get("adapt_steps"),
                         "seconds": run["seconds"], "per_seed": per_seed, **both_ways,
                         "ranks": [rank_value(run["task"], figures) for figures in per_seed]})
    report = {"device": sweep["device"], "seeds": sweep["seeds"], "candidates": [], "chosen": {}}
    for row in rows:
        figures = {name: mean_error([s[name] for s in row["per_seed"]])
                   for name in RANKED_BY[row["task"]]}
        entry = {**{k: v for k, v in row.items() if k not in ("per_seed", "ranks", "as_given")},
                 "figures": rounded(figures), "rank": round(statistics.fmean(row["ranks"]), 4)}
        if "as_given" in row:
            entry["figures_as_given"] = rounded({name: mean_error([s[name] for s in row["as_given"]])
                                                 for name in RANKED_BY[row["task"]]})
        report["candidates"].append(entry)
    for key in manifest["tasks"]:
        for impl in ("kbert", "keras-hub"):
            mine = [r for r in rows if r["data"] == key and r["impl"] == impl]
            if not mine:
                continue
            recipe = get_task(mine[0]["task"]).recipe
            default = [r for r in mine if r["epochs"] == recipe.epochs
                       and math.isclose(r["learning_rate"], recipe.learning_rate)
                       and r["adapt_steps"] in (None, recipe.adapt_steps)]
            best = max(mine, key=lambda r: statistics.fmean(r["ranks"]))
            entry = {"best": candidate(best), "best_rank": round(statistics.fmean(best["ranks"]), 4)}
            if default and impl == "kbert":
                gains = [b - d for b, d in zip(best["ranks"], default[0]["ranks"])]
                gain, error = mean_error(gains)
                entry.update(default=candidate(default[0]),
                             paired_gain_over_default=[round(gain, 4), round(error, 4)],
                             beyond_error=bool(gain > GAIN_IN_ERRORS * error))
            report["chosen"][f"{key}|{impl}"] = entry
    print(json.dumps(report, indent=1))
    if args.markdown:
        print(markdown(report))


def rounded(figures):
    return {name: [round(mean, 4), round(error, 4)] for name, (mean, error) in figures.items()}


def candidate(row):
    """[epochs, learning rate], and the adaptation steps where the sweep adapted."""
    return [row["epochs"], row["learning_rate"]] + ([] if row["adapt_steps"] is None else [row["adapt_steps"]])


def markdown(report):
    """A table per task; where pairs were read both ways, the seeds read so and the figures as given."""
    lines = []
    for key in sorted({c["data"] for c in report["candidates"]}):
        candidates = [c for c in report["candidates"] if c["data"] == key]
        names = list(candidates[0]["figures"])
        adapting = any(c["adapt_steps"] is not None for c in candidates)
        ordering = any("pair_orders" in c for c in candidates)
        lines += ["", f"### {key}", "",
                  "| implementation | epochs | learning rate | " + ("adaptation steps | " if adapting else "")
                  + " | ".join(names) + " |" + (" seeds read both ways | as given |" if ordering else ""),
                  "| --- | --- | --- | " + ("--- | " if adapting else "") + " | ".join("---" for _ in names) + " |"
                  + (" --- | --- |" if ordering else "")]
        for c in sorted(candidates, key=lambda c: (c["impl"], c["epochs"], c["learning_rate"], c["adapt_steps"] or 0)):
            cells = [f"{m:.4f} ± {e:.4f}" for m, e in c["figures"].values()]
            if ordering:
                orders = c.get("pair_orders", [])
                cells += [f"{orders.count('both')} of {len(orders)}" if orders else "—",
                          " / ".join(f"{m:.4f}" for m, _ in c["figures_as_given"].values())
                          if "figures_as_given" in c else "—"]
            lines.append(f"| {c['impl']} | {c['epochs']} | {c['learning_rate']:g} | "
                         + (f"{c['adapt_steps'] or 0} | " if adapting else "") + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
