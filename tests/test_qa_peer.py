"""The question-answering peer of the benchmarks: Hugging Face transformers with run_qa.py's
recipe (`tools/benchmarks/transformers_qa.py`), run beside kbert by
`tools/benchmarks/benchmark_finetune.py --task question-answering --impls kbert,transformers`."""

import json
import os
import subprocess
import sys

from tests.task_harness import load_tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(REPO, "tools", "benchmarks")
NORMANS = os.path.join(REPO, "..", "shared", "data", "squad-sample", "normans-dev-v2.0.json")

# In a process of its own: the peer imports PyTorch, which crashes beside TensorFlow.
GOLD_AS_LOGITS = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import transformers
import transformers_qa as peer
from kbert.checkpoints.huggingface import resolve_checkpoint
from kbert.tasks.squad import read_squad_json

examples = read_squad_json(sys.argv[2])
rows = peer.windows(transformers.AutoTokenizer.from_pretrained(resolve_checkpoint("all-minilm-l6-v2")), examples)
starts, ends = np.zeros((len(rows), 384)), np.zeros((len(rows), 384))
for i, row in enumerate(rows):
    starts[i, row["start"]] = ends[i, row["end"]] = 10.0
figures = peer.figures(examples, *peer.answers(examples, rows, starts, ends))
print(json.dumps({"questions": len(examples), "windows": len(rows), **figures}))
"""


def test_the_peer_reads_back_every_gold_answer_it_labels():
    """Each window's label fed back as its logits: run_qa.py's windows and answer
    rules give every Normans question its gold answer, or none, in every window
    of a context longer than 384 pieces too."""
    result = subprocess.run([sys.executable, "-c", GOLD_AS_LOGITS, TOOLS, NORMANS],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["windows"] > report["questions"] == 208
    for figures in (report, report["threshold_0"]):
        assert figures["HasAns_exact"] == figures["NoAns_exact"] == figures["exact_match"] == 100.0
    assert report["forced_answers_HasAns_f1"] == 100.0


def test_the_benchmark_runs_the_qa_peer_beside_kbert_against_answering_nothing():
    from kbert.tasks import get_task

    tool = load_tool("benchmark_finetune")
    args = tool.parse_args(["--task", "question-answering", "--train", NORMANS, "--dev", NORMANS,
                            "--impls", "kbert,transformers"])
    # kbert runs its task's recipe; the peer keeps run_qa.py's.
    assert (args.epochs, args.lr, args.batch_size, args.seq_len) == (10, 3e-4, 16, 384)
    task_class = get_task("question-answering")
    examples = task_class.read(NORMANS)
    nothing = tool.baselines(args, task_class, examples, examples)["no_answer"]
    abstaining = 100.0 * sum(e.is_impossible for e in examples) / len(examples)
    assert nothing["f1"] == nothing["exact_match"] == round(abstaining, 2) == 53.85
    assert nothing["HasAns_f1"] == 0.0 and nothing["NoAns_f1"] == 100.0


def test_the_peer_refuses_bad_input_in_one_line(tmp_path):
    """A checkpoint it cannot find, an answer not where the file says, a recipe
    value out of range: exit 2 and one line, before any training."""
    misplaced = tmp_path / "misplaced.json"
    misplaced.write_text(json.dumps({"data": [{"paragraphs": [{"context": "abc", "qas": [
        {"id": "q1", "question": "x?", "answers": [{"text": "zz", "answer_start": 0}]}]}]}]}), encoding="utf-8")
    for given, message in (
        (["--train", NORMANS, "--dev", NORMANS, "--init", "no-such-bert"], "checkpoint 'no-such-bert' is neither"),
        (["--train", str(misplaced), "--dev", NORMANS],
         f"{misplaced}: question 'q1': answer 'zz' is not at its answer_start=0"),
        (["--train", NORMANS, "--dev", NORMANS, "--batch-size", "0"], "argument --batch-size: 0 is not a positive integer"),
        (["--train", NORMANS, "--dev", NORMANS, "--lr", "-1"], "argument --lr: -1 is not a positive number"),
    ):
        result = subprocess.run([sys.executable, os.path.join(TOOLS, "transformers_qa.py"), *given],
                                capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-1000:]
        assert result.stdout == ""
