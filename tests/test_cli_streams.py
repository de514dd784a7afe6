"""Every command's standard output is JSON lines only; progress and Keras's lines go to stderr."""

import json
import os

import numpy as np
import pytest

from kbert.checkpoints import resolve_checkpoint
from kbert.cli import main
from tests.task_harness import write_two_label_rows



def json_lines(capsys):
    """Each stdout line of the last command, parsed: a line that is not JSON fails the test."""
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines and out.endswith("\n"), out
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("streams")
    rows = write_two_label_rows(folder)
    (folder / "texts.txt").write_text("A chess game.\nAn IMAP server.\n")
    (folder / "corpus.txt").write_text("".join(f"{row['text']}\n\n" for row in rows))
    return folder


def test_every_command_prints_json_lines_only(data, tmp_path, capsys):
    vocab = os.path.join(resolve_checkpoint("all-minilm-l6-v2"), "vocab.txt")
    csv_path, model = str(data / "data.csv"), str(tmp_path / "model")
    # Keras's epoch lines and the batch line are printed while it trains: on stderr.
    assert main(["finetune", "--train", csv_path, "--dev", csv_path, "--init", "bert_tiny", "--vocab", vocab,
                 "--seq-len", "32", "--epochs", "1", "--out", model]) == 0
    assert json_lines(capsys)[-1]["model"] == model
    # model.keras holds the weights, not the optimizer's state (two moments of each).
    from kbert.modelfolder import ModelFolder

    weights = sum(int(np.prod(w.shape)) * 4 for w in ModelFolder.load(model).model.weights)
    assert os.path.getsize(os.path.join(model, "model.keras")) <= 1.1 * weights
    commands = [
        ["evaluate", "--model", model, "--data", csv_path],
        ["predict", "--model", model, "A chess game.", "An IMAP server."],
        ["predict", "--model", model, "--input", str(data / "texts.txt")],
        ["embed", "--model", model, "--input", str(data / "texts.txt"), "--output", str(tmp_path / "e.npy")],
        ["search", "--model", model, "--corpus", str(data / "texts.txt"), "--index", str(tmp_path / "i.kbert-index"),
         "chess"],
        ["tokenize", "--vocab", vocab, "a text", "another text"],
        ["export", "--model", model, "--data", csv_path, "--out", str(tmp_path / "export"),
         "--formats", "savedmodel,tflite", "--quantize", "none", "--latency-runs", "1"],
    ]
    printed = {}
    for argv in commands:
        assert main(argv) == 0, argv
        printed[argv[0]] = json_lines(capsys)
    assert len(printed["predict"]) == 2 and len(printed["tokenize"]) == 2
    (summary,) = printed["export"]
    assert summary["passed"] is True and summary["report"].endswith("report.json")
    assert [a["path"] for a in summary["artefacts"]] == ["1", "tflite/model_none.tflite", "tflite/model_text.tflite"]
    assert set(summary["artefacts"][1]) >= {"max_abs_diff", "accuracy", "size_bytes", "latency_ms", "passed"}


def test_pretraining_commands_print_json_lines_only(data, tmp_path, capsys):
    corpus = str(data / "corpus.txt")
    assert main(["vocab", "--corpus", corpus, "--size", "300", "--min-count", "1",
                 "--out", str(tmp_path / "vocab.txt")]) == 0
    assert json_lines(capsys)[0]["vocab"] == str(tmp_path / "vocab.txt")
    records = str(tmp_path / "records")
    assert main(["pretraining-data", "--corpus", corpus, "--vocab", str(tmp_path / "vocab.txt"), "--out", records,
                 "--max-seq-length", "32", "--num-shards", "1", "--dupe-factor", "1", "--workers", "1"]) == 0
    assert json_lines(capsys)[0]["records"] == records
    assert main(["pretrain", "--records", records, "--config", "bert_tiny", "--steps", "2", "--batch-size", "2",
                 "--seq-len", "32", "--log-every", "1", "--no-jit", "--out", str(tmp_path / "run")]) == 0
    assert json_lines(capsys)[0]["final"]["step"] == 2


def test_the_python_api_prints_no_tensorflow_start_up_lines(data, tmp_path):
    """`import kbert`, then TaskModel on a CPU: no `E0000 ... failed call to cuInit` and the
    like on stderr, and no retracing warning for batches of several widths."""
    import subprocess
    import sys

    script = (
        "import kbert, keras\n"
        "model = kbert.TaskModel.from_checkpoint('all-minilm-l6-v2', labels=['a', 'b'], sequence_length=32)\n"
        "model.save('m.keras')\n"
        "model = keras.saving.load_model('m.keras')\n"
        "for n in range(1, 10):\n"
        "    model.predict_labels(['a text ' * (3 * n)] * n)\n"
        "print('done')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    assert result.stderr == "", result.stderr
