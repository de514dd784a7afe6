"""`tools/benchmarks/pretrain_debian.py` end to end on a cut of the Debian data, BERT-tiny.

The real run (an hour, README) uses the same stages; here each is tiny: a
200-piece vocabulary from 300 descriptions, 6 pretraining steps, and four
one-epoch fine-tunes (two learning rates, pretrained and random init) on 120
training rows.
"""

import csv
import json
import os
import sys

import pytest

from tests.test_pretrain_cli import ROOT, TRAIN_CSV

sys.path.insert(0, os.path.join(ROOT, "tools", "benchmarks"))
import pretrain_debian  # noqa: E402

DEV_CSV = os.path.join(ROOT, "data", "debian-packages", "dev.csv")


def cut_csv(source, out, rows):
    with open(source, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        kept = [row for _, row in zip(range(rows), reader)]
        fields = reader.fieldnames
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(kept)
    return str(out)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    if not os.path.isfile(TRAIN_CSV):
        pytest.skip(f"{TRAIN_CSV} is not in this checkout")
    folder = tmp_path_factory.mktemp("debian")
    with open(TRAIN_CSV, newline="", encoding="utf-8") as f:
        texts = [row["text"] for _, row in zip(range(300), csv.DictReader(f))]
    corpus = folder / "corpus.txt"
    corpus.write_text("\n\n".join(text.replace(". ", ".\n") for text in texts) + "\n")
    return str(corpus), cut_csv(TRAIN_CSV, folder / "train.csv", 120), cut_csv(
        DEV_CSV, folder / "dev.csv", 40
    )


def arguments(data, out):
    corpus, train, dev = data
    return [
        "--corpus", corpus, "--out", str(out), "--preset", "bert_tiny",
        "--vocab-size", "200", "--seq-len", "32", "--max-predictions", "5",
        "--dupe-factor", "1", "--num-shards", "2", "--workers", "1",
        "--batch-size", "8", "--steps", "6", "--log-every", "3", "--eval-steps", "2",
        "--no-jit", "--train", train, "--dev", dev, "--finetune-epochs", "1",
        "--finetune-batch-size", "16", "--finetune-lr", "1e-3", "3e-4",
    ]


@pytest.mark.slow
def test_every_stage_then_reuse(data, tmp_path, capsys):
    out = tmp_path / "run"
    summary = pretrain_debian.main(arguments(data, out))

    assert summary["steps"] == 6 and 0 <= summary["val_masked_lm_accuracy"] <= 1
    assert (out / "curves.png").stat().st_size > 0
    assert os.path.isfile(os.path.join(summary["encoder"], "config.json"))
    comparison = json.loads((out / "finetune" / "comparison.json").read_text())
    assert comparison == summary["finetune"]
    runs = comparison["runs"]
    assert [(r["init"], r["learning_rate"]) for r in runs] == [
        ("pretrained", 1e-3), ("random_init", 1e-3), ("pretrained", 3e-4), ("random_init", 3e-4)
    ]
    assert all(r["n"] == 40 for r in runs)
    for name in ("pretrained", "random_init"):
        # each encoder is judged at its own best learning rate
        assert comparison[name] == max(
            (r for r in runs if r["init"] == name), key=lambda r: r["accuracy"]
        )
    assert comparison["accuracy_gain"] == round(
        comparison["pretrained"]["accuracy"] - comparison["random_init"]["accuracy"], 4
    )
    assert comparison["accuracy_gain_at_each_lr"] == {
        "0.001": round(runs[0]["accuracy"] - runs[1]["accuracy"], 4),
        "0.0003": round(runs[2]["accuracy"] - runs[3]["accuracy"], 4),
    }
    assert sorted(os.listdir(out / "finetune")) == [
        "comparison.json", "pretrained-lr0.0003", "pretrained-lr0.001",
        "random_init-lr0.0003", "random_init-lr0.001",
    ]

    # Run again: every stage is found done and nothing is recomputed.
    capsys.readouterr()
    assert pretrain_debian.main(arguments(data, out)) == summary
    printed = capsys.readouterr().out
    for stage in ("[1/4] vocabulary: reusing", "[2/4] records: reusing",
                  "[3/4] pretraining: reusing", "[4/4] fine-tuning: reusing"):
        assert stage in printed


@pytest.mark.parametrize(
    "change, message",
    [
        (["--finetune-lr", "3e-4", "0"], "--finetune-lr 0: expected a positive learning rate"),
        (["--train", "missing.csv"], "missing.csv: no such CSV for fine-tuning"),
        (["--steps", "0"], "argument --steps: 0 is not a positive integer"),
        (["--finetune-epochs", "two"], "argument --finetune-epochs: 'two' is not an integer"),
    ],
)
def test_bad_arguments_stop_before_any_work(data, tmp_path, capsys, change, message):
    with pytest.raises(SystemExit) as stop:
        pretrain_debian.main(arguments(data, tmp_path / "run") + change)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
