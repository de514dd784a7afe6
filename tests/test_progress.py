"""Training says how far it is on stderr, one line at a time where stderr is a file, and stdout stays JSON."""

import json
import os
import re
import threading

import pytest

import kbert.logs
from kbert.checkpoints import resolve_checkpoint
from kbert.cli import main
from kbert.logs import Progress, Waiting, quiet
from tests.task_harness import write_two_label_rows

# A time as `kbert.logs.duration` writes it.
TIME = r"(?:\d+ s|\d+ min \d\d s|\d+ h \d\d min)"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """16 Debian texts of two labels, and MiniLM's vocabulary for a bert_tiny from scratch."""
    folder = tmp_path_factory.mktemp("progress")
    write_two_label_rows(folder)
    return str(folder / "data.csv"), os.path.join(resolve_checkpoint("all-minilm-l6-v2"), "vocab.txt")


def finetune_args(data, out, *extra):
    csv_path, vocab = data
    return ["finetune", "--train", csv_path, "--dev", csv_path, "--init", "bert_tiny", "--vocab", vocab,
            "--seq-len", "32", "--batch-size", "2", "--epochs", "3", "--out", str(out), *extra]


def test_finetune_says_its_steps_and_the_time_left_on_stderr_and_json_on_stdout(data, tmp_path, capsys):
    # 16 texts in batches of 2: 8 steps an epoch, 24 in all.
    assert main(finetune_args(data, tmp_path / "model")) == 0
    captured = capsys.readouterr()
    (result,) = [json.loads(line) for line in captured.out.splitlines()]
    assert result["model"] == str(tmp_path / "model")
    err = captured.err
    assert "training: 3 epochs x 8 steps = 24 steps of 2 examples\n" in err, err
    # After the first epoch: the other 16 steps at the rate of those after the first (which traces),
    # and the other 2 dev passes at the first one's time.
    assert re.search(rf"^training: about {TIME} for the other 16 steps \((\d+ ms|\d+\.\d\d s) a step\) "
                     r"and 2 dev passes \((\d+ ms|\d+\.\d\d s) each\)$", err, re.MULTILINE), err
    assert "\r" not in err  # stderr is not a terminal: lines, not a bar


def test_a_file_gets_a_line_each_interval_with_the_rate_time_left_and_loss(data, tmp_path, capsys, monkeypatch):
    """Where Keras prints a line an epoch, kbert adds one every `LINE_SECONDS` (here: every step), dev pass too."""
    monkeypatch.setattr(kbert.logs, "LINE_SECONDS", 0)
    assert main(finetune_args(data, tmp_path / "model")) == 0
    err = capsys.readouterr().err
    steps = re.findall(rf"^training: epoch (\d)/3: (\d)/8 steps in {TIME}, [\d.,]+ (?:steps/s|s each)"
                       rf"(?:, about {TIME} left)?, loss \d+\.\d{{4}}$", err, re.MULTILINE)
    assert [int(step) for epoch, step in steps if epoch == "1"] == list(range(1, 9)), err
    assert re.search(rf"^training: dev pass: 1/\d+ batches in {TIME}, ", err, re.MULTILINE), err
    assert "\r" not in err


def test_python_callers_silence_it(data, tmp_path, capsys):
    from kbert.training.finetune import finetune

    csv_path, vocab = data
    lines = []
    finetune(csv_path, csv_path, "bert_tiny", str(tmp_path / "model"), vocab=vocab, sequence_length=32,
             batch_size=2, epochs=3, verbose=0, log=lines.append)
    assert "training: 3 epochs x 8 steps = 24 steps of 2 examples" in lines
    assert any(line.startswith("training: about ") for line in lines), lines
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "training" not in captured.err and "global batch" not in captured.err, captured.err
    finetune(csv_path, csv_path, "bert_tiny", str(tmp_path / "model"), vocab=vocab, sequence_length=32,
             epochs=1, verbose=0, log=quiet, overwrite=True)
    assert capsys.readouterr().out == ""


def test_progress_lines_name_the_count_rate_and_time_left(monkeypatch):
    monkeypatch.setattr(kbert.logs, "LINE_SECONDS", 0)
    lines = []
    with Progress("dev", 10, "rows", log=lines.append) as progress:
        progress.update(4)
        progress.update(6, postfix="loss 0.5000")
    assert re.fullmatch(rf"dev: 4/10 rows in {TIME}, [\d,.]+ (rows/s|s each), about {TIME} left", lines[0]), lines
    assert re.fullmatch(rf"dev: 10/10 rows in {TIME}, [\d,.]+ (rows/s|s each), loss 0.5000", lines[1]), lines
    assert lines[2].startswith("dev: 10/10 rows in ") and len(lines) == 3  # the last line, as it closes
    with Progress("stdin", None, "texts", log=lines.append) as progress:  # a stream: no total, no time left
        progress.update(3)
    assert re.fullmatch(rf"stdin: 3 texts in {TIME}, [\d,.]+ (texts/s|s each)", lines[-1]), lines


def test_waiting_says_it_is_still_at_work(monkeypatch):
    monkeypatch.setattr(kbert.logs, "LINE_SECONDS", 0.01)
    lines, first = [], threading.Event()

    def log(line):
        lines.append(line)
        first.set()

    with Waiting("encoding 5 examples", log):
        assert first.wait(timeout=60)  # the work goes on until a line says so
    assert re.fullmatch(rf"encoding 5 examples: {TIME} so far", lines[0]), lines
    assert re.fullmatch(rf"encoding 5 examples: done in {TIME}", lines[-1]), lines
    monkeypatch.setattr(kbert.logs, "LINE_SECONDS", 600)
    quiet_lines = []
    with Waiting("quick", quiet_lines.append):
        pass
    assert quiet_lines == []  # work that ends before the first interval says nothing


def test_the_estimate_comes_after_the_first_steps_without_a_dev_pass():
    """Without a dev pass the estimate comes after `ESTIMATE_STEPS` steps (or seconds), the dev passes unsaid."""
    import keras
    import numpy as np

    from kbert.training.progress import TrainingProgress

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    lines = []
    progress = TrainingProgress("adaptation", 25, log=lines.append)
    model.fit(np.zeros((100, 4)), np.zeros((100, 1)), batch_size=4, epochs=1, verbose=0, callbacks=[progress])
    (estimate,) = lines
    match = re.fullmatch(rf"adaptation: about {TIME} for the other (\d+) steps \((\d+ ms|\d+\.\d\d s) a step\)",
                         estimate)
    assert match and 5 <= int(match[1]) <= 23, lines  # at step 20 at the latest
