"""Silver training pairs for a pair regressor, scored by a sentence-embedding model.

The cross-encoder of `--task text-pair-regression` learns from the gold
pairs alone; a sentence-embedding checkpoint (all-MiniLM-L6-v2 was trained on
a billion pairs) already knows more about similarity than 4,249 STS-B pairs
teach. This tool hands that knowledge over as data (Thakur et al., 2021,
"Augmented SBERT", with the roles swapped; Liu et al., 2022, "Trans-Encoder"):

1. embed every sentence of the training file with `--embedder`;
2. fit score = a * cosine + b on the gold pairs (least squares), so silver
   scores are on the gold scale;
3. pair each sentence with its `--neighbours` nearest sentences and
   `--random` random ones (pairs already in the gold file are skipped), and
   score each by the fitted line, clipped to the gold range;
4. write the gold rows, then the silver rows, as one TSV that
   `kbert finetune --task text-pair-regression --train` reads.

Only the training file is read: no dev or test sentence is embedded or paired.

    python tools/benchmarks/silver_pairs.py --embedder all-minilm-l6-v2 \\
        --train ../shared/data/glue-stsb/train.tsv --out runs/stsb-silver.tsv
"""

import argparse
import csv
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def parse_args(argv=None):
    from kbert.cliargs import positive_int

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedder", default="all-minilm-l6-v2",
                        help="a sentence-embedding checkpoint (as for kbert embed --model)")
    parser.add_argument("--train", required=True, help="gold pairs: TSV/CSV with sentence1, sentence2, score")
    parser.add_argument("--out", required=True, help="the .tsv to write (gold rows, then silver rows)")
    parser.add_argument("--neighbours", type=positive_int, default=3, help="nearest sentences paired with each")
    parser.add_argument("--random", type=int, default=1, help="random sentences paired with each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if not args.out.endswith(".tsv"):
        parser.error(f"--out {args.out}: expected a .tsv file name")
    if os.path.exists(args.out) and not args.overwrite:
        parser.error(f"--out {args.out} exists; pass --overwrite to replace it")
    if args.random < 0:
        parser.error(f"--random {args.random}: expected 0 or more")
    return args


def fit_line(cosines, scores):
    """Least-squares `(a, b)` of score = a * cosine + b."""
    import numpy as np

    a, b = np.polyfit(np.asarray(cosines, np.float64), np.asarray(scores, np.float64), 1)
    return float(a), float(b)


def silver_pairs(embeddings, neighbours, random_partners, excluded, seed=0):
    """Index pairs `(i, j)`, i != j, each unordered pair once, in a seeded order.

    Args:
        embeddings: float array `(n, width)`, rows L2-normalised.
        neighbours: int. Nearest rows paired with each row.
        random_partners: int. Random rows paired with each row.
        excluded: set of `(i, j)` pairs (either order) not to return.
        seed: int.

    Returns:
        list of `(i, j, cosine)`, the order of `i` and `j` drawn at random.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    n = len(embeddings)
    similarity = embeddings @ embeddings.T
    np.fill_diagonal(similarity, -np.inf)
    keep = min(neighbours, n - 1)
    chosen = set()
    for i in range(n):
        partners = np.argpartition(-similarity[i], keep - 1)[:keep].tolist() if keep else []
        partners += rng.integers(n, size=random_partners).tolist()
        for j in partners:
            pair = (min(i, j), max(i, j))
            if i != j and pair not in excluded:
                chosen.add(pair)
    pairs = sorted(chosen)
    rng.shuffle(pairs)
    return [
        (i, j, float(similarity[i, j])) if rng.random() < 0.5 else (j, i, float(similarity[i, j]))
        for i, j in pairs
    ]


def main(argv=None):
    args = parse_args(argv)
    import numpy as np

    from kbert.fileio import write_file
    from kbert.modelfolder import ModelFolder
    from kbert.tasks import get_task
    from kbert.tasks.text_pair_regression import regression_metrics

    task_class = get_task("text-pair-regression")
    gold = task_class.read(args.train, task_class.resolve_options(None))
    sentences = list(dict.fromkeys(s for e in gold for s in e.texts))
    index = {s: i for i, s in enumerate(sentences)}
    folder = ModelFolder.from_pretrained(args.embedder, "sentence-embedding")
    embeddings = np.asarray(folder.embed(sentences), np.float64)
    embeddings /= np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)

    gold_pairs = [tuple(index[s] for s in e.texts) for e in gold]
    gold_scores = np.array([e.target for e in gold], np.float64)
    cosines = np.array([embeddings[i] @ embeddings[j] for i, j in gold_pairs])
    a, b = fit_line(cosines, gold_scores)
    excluded = {(min(i, j), max(i, j)) for i, j in gold_pairs}
    silver = silver_pairs(embeddings, args.neighbours, args.random, excluded, args.seed)
    low, high = float(gold_scores.min()), float(gold_scores.max())

    def write(f):
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["sentence1", "sentence2", "score"])
        for e in gold:
            writer.writerow([*e.texts, repr(float(e.target))])
        for i, j, cosine in silver:
            writer.writerow([sentences[i], sentences[j], f"{min(max(a * cosine + b, low), high):.4f}"])

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_file(args.out, write, mode="w", encoding="utf-8", newline="")
    print(json.dumps({
        "out": args.out,
        "gold_pairs": len(gold),
        "silver_pairs": len(silver),
        "sentences": len(sentences),
        "line": {"a": round(a, 4), "b": round(b, 4)},
        "embedder_train_spearman": round(regression_metrics(gold_scores, cosines)["spearman"], 4),
    }))


if __name__ == "__main__":
    main()
