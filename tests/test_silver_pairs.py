"""`tools/benchmarks/silver_pairs.py`: silver STS pairs scored by a sentence-embedding checkpoint."""

import csv
import json
import os
import subprocess
import sys

import numpy as np

from tests.test_sentence_embedding import write_checkpoint
from tests.test_pretrain_cli import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools", "benchmarks"))
import silver_pairs  # noqa: E402

TOOL = os.path.join(ROOT, "tools", "benchmarks", "silver_pairs.py")
GOLD = [
    ("A man is playing a flute.", "A man plays the flute.", "4.8"),
    ("A man is playing a flute.", "A dog runs in a field.", "0.2"),
    ("A woman slices an onion.", "Someone is cutting an onion.", "4.2"),
    ("A cat sleeps on a sofa.", "A dog runs in a field.", "0.6"),
    ("Two men are fighting.", "Two men are boxing.", "3.6"),
    ("A cat sleeps on a sofa.", "A kitten naps on the couch.", "4.4"),
]


def unit_rows(rows):
    rows = np.asarray(rows, np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_pairs_are_nearest_neighbours_once_each_without_the_excluded_ones():
    embeddings = unit_rows([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9], [-1, 0.2]])
    pairs = silver_pairs.silver_pairs(embeddings, neighbours=1, random_partners=0, excluded={(0, 1)})
    unordered = sorted((min(i, j), max(i, j)) for i, j, _ in pairs)
    # 0 and 1 are each other's nearest (excluded); 2 and 3 too; 4's nearest is 2.
    assert unordered == [(2, 3), (2, 4)]
    for i, j, cosine in pairs:
        assert abs(cosine - embeddings[i] @ embeddings[j]) < 1e-12


def test_random_partners_add_pairs_and_the_seed_fixes_them():
    embeddings = unit_rows(np.random.default_rng(1).normal(size=(30, 8)))
    first = silver_pairs.silver_pairs(embeddings, 2, 2, set(), seed=3)
    assert first == silver_pairs.silver_pairs(embeddings, 2, 2, set(), seed=3)
    assert len(first) > len(silver_pairs.silver_pairs(embeddings, 2, 0, set(), seed=3))
    assert all(i != j for i, j, _ in first)
    assert len({(min(i, j), max(i, j)) for i, j, _ in first}) == len(first)


def test_fit_line_is_least_squares():
    cosines, scores = [0.1, 0.5, 0.9, 0.3], [0.4, 2.6, 4.4, 1.2]
    a, b = silver_pairs.fit_line(cosines, scores)
    design = np.stack([cosines, np.ones(4)], axis=1)
    expected = np.linalg.lstsq(design, np.array(scores), rcond=None)[0]
    assert max(abs(a - expected[0]), abs(b - expected[1])) < 1e-9


def test_tool_writes_gold_then_silver_scored_by_the_fitted_line(tmp_path):
    train = tmp_path / "train.tsv"
    with open(train, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["sentence1", "sentence2", "score"])
        writer.writerows(GOLD)
    checkpoint = write_checkpoint(tmp_path / "checkpoint")
    out = tmp_path / "silver.tsv"
    command = [sys.executable, TOOL, "--embedder", str(checkpoint), "--train", str(train), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])

    from kbert.modelfolder import ModelFolder
    from kbert.tasks import get_task

    task = get_task("text-pair-regression")
    rows = task.read(str(out), task.resolve_options(None))  # kbert reads what it wrote
    assert [(*r.texts, float(s)) for r, (*_, s) in zip(rows, GOLD)] == [
        (a, b, float(s)) for a, b, s in GOLD
    ]
    silver = rows[len(GOLD):]
    assert len(silver) == report["silver_pairs"] > 0
    gold_pairs = {frozenset(g[:2]) for g in GOLD}
    assert not any(frozenset(r.texts) in gold_pairs for r in silver)

    folder = ModelFolder.from_pretrained(str(checkpoint), "sentence-embedding")
    vectors = {}
    for r in silver:
        for text, vector in zip(r.texts, folder.embed(list(r.texts))):
            vectors[text] = vector / np.linalg.norm(vector)
    line = report["line"]
    scores = [float(s) for *_, s in GOLD]
    for r in silver:
        cosine = float(vectors[r.texts[0]] @ vectors[r.texts[1]])
        expected = min(max(line["a"] * cosine + line["b"], min(scores)), max(scores))
        assert abs(r.target - expected) < 2e-3  # the line is printed to 4 decimals


def test_an_existing_output_is_refused(tmp_path):
    out = tmp_path / "silver.tsv"
    out.write_text("mine\n")
    done = subprocess.run(
        [sys.executable, TOOL, "--train", "x.tsv", "--out", str(out)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2 and "exists; pass --overwrite" in done.stderr
    assert out.read_text() == "mine\n"
