"""The named-entity peer of the benchmarks: Hugging Face transformers with run_ner.py's
recipe (`tools/benchmarks/transformers_ner.py`), run beside kbert by
`tools/benchmarks/benchmark_finetune.py --impls kbert,transformers`."""

import json
import os
import subprocess
import sys

import pytest

from kbert.tasks.conll import read_conll
from kbert.tasks.tagging import chunks
from tests.task_harness import load_tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(REPO, "..", "shared", "data")
CONLL = os.path.join(SHARED, "conll2003")
STSB = os.path.join(SHARED, "glue-stsb")


def test_the_transformers_peer_runs_named_entities_only(capsys):
    tool = load_tool("benchmark_finetune")
    args = tool.parse_args([
        "--task", "token-classification", "--train", os.path.join(CONLL, "train.txt"),
        "--dev", os.path.join(CONLL, "dev.txt"), "--impls", "kbert,transformers", "--baselines", "",
    ])
    assert args.impls == ["kbert", "transformers"]
    # kbert runs the task's default recipe unless a flag says otherwise; the peer keeps run_ner.py's.
    assert (args.epochs, args.lr, args.batch_size, args.seq_len, args.warmup, args.weight_decay) == (
        6, 5e-5, 8, 128, 0.1, 0.01)
    args = tool.parse_args(["--task", "token-classification", "--train", os.path.join(CONLL, "train.txt"),
                            "--dev", os.path.join(CONLL, "dev.txt"), "--lr", "1e-4", "--batch-size", "32",
                            "--weight-decay", "0"])
    assert (args.epochs, args.lr, args.batch_size, args.seq_len, args.weight_decay) == (6, 1e-4, 32, 128, 0.0)
    with pytest.raises(SystemExit):
        tool.parse_args(["--task", "text-pair-regression", "--train", os.path.join(STSB, "train.tsv"),
                         "--dev", os.path.join(STSB, "dev.tsv"), "--impls", "kbert,transformers"])
    assert "--impls transformers: runs --task token-classification, question-answering or multi-label-classification only" in capsys.readouterr().err
    # A task with nothing to fine-tune (no recipe) is refused by name.
    with pytest.raises(SystemExit):
        tool.parse_args(["--task", "fill-mask", "--train", os.path.join(STSB, "train.tsv"),
                         "--dev", os.path.join(STSB, "dev.tsv")])
    assert "--task: invalid choice: 'fill-mask'" in capsys.readouterr().err


def test_the_transformers_peer_refuses_unknown_tags_and_checkpoints(tmp_path):
    """Both refused in one line, before any model loads."""
    peer = os.path.join(REPO, "tools", "benchmarks", "transformers_ner.py")
    (tmp_path / "train.txt").write_text("Paris NNP B-LOC\nis VBZ O\n", encoding="utf-8")
    (tmp_path / "dev.txt").write_text("Ada NNP B-PER\n", encoding="utf-8")
    for given, message in (
        (["--dev", str(tmp_path / "dev.txt")], f"{tmp_path / 'dev.txt'}, line 1: tag 'B-PER' is not in --train's tags"),
        (["--dev", str(tmp_path / "train.txt"), "--init", "no-such-bert"], "--init: checkpoint 'no-such-bert' is neither"),
    ):
        result = subprocess.run([sys.executable, peer, "--train", str(tmp_path / "train.txt"), *given],
                                capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-1000:]


@pytest.mark.slow
def test_the_transformers_peer_learns_and_scores_conll_words(tmp_path):
    """Six short CoNLL sentences seen twenty times an epoch: the peer learns them (an
    untrained head scores near 0), each word by its first piece, and is scored on the
    file's words (a misaligned word would lose its entity)."""
    with open(os.path.join(CONLL, "train.txt"), encoding="utf-8") as f:
        sentences = [block for block in f.read().split("\n\n") if "-DOCSTART-" not in block]
    # Short sentences with entities: cheap steps.
    chosen = [block for block in sentences if (" B-" in block or " I-" in block) and block.count("\n") < 8][:6]
    (tmp_path / "dev.txt").write_text("\n\n".join(chosen) + "\n", encoding="utf-8")
    (tmp_path / "train.txt").write_text("\n\n".join(chosen * 20) + "\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "benchmarks", "transformers_ner.py"),
         "--train", str(tmp_path / "train.txt"), "--dev", str(tmp_path / "dev.txt"), "--seed", "0"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    entities = sum(len(list(chunks(s.tags))) for s in read_conll(str(tmp_path / "dev.txt"), True))
    assert report["recipe"] == {"epochs": 3, "learning_rate": 5e-5, "batch_size": 8, "weight_decay": 0.0,
                                "max_length": 512}
    assert report["dev"]["entities"] == entities > 0
    assert report["dev"]["f1"] >= 0.9, report
