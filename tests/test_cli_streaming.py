"""`predict`, `embed` and `evaluate` work through their input a chunk at a time.

What a run a chunk at a time must keep: the outputs of a run on every example
at once, to the last bit; examples that are read together (a document's
sentences, a question's windows) in one chunk; an input read as it is used;
outputs written as they come, and nothing half-written when stopped.
"""

import csv
import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from kbert.cli import main
from kbert.cli.streaming import NpyRows, text_lines
from kbert.tasks.inference import CHUNK_EXAMPLES, example_chunks, joined, predict_chunks
from tests.task_harness import task_instance, write_task_folder
from tests.test_export_units import TINY

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV_CSV = os.path.join(REPO, "data", "debian-packages", "dev.csv")
SHARED = os.path.join(REPO, "..", "shared", "data")
LABELS = ["editors", "games", "net"]
# More than two chunks: the last one partial.
TEXTS = 2 * CHUNK_EXAMPLES + 123


def debian_rows(count):
    """`count` (text, label) rows of the Debian dev set, repeated as needed, labels cut to `LABELS`."""
    with open(DEV_CSV, newline="", encoding="utf-8") as f:
        rows = [(" ".join(row["text"].split()), LABELS[i % 3]) for i, row in enumerate(csv.DictReader(f))]
    return list(itertools.islice(itertools.cycle(rows), count))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("streaming")
    rows = debian_rows(TEXTS)
    (folder / "texts.txt").write_text("".join(text + "\n" for text, _ in rows), encoding="utf-8")
    with open(folder / "data.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "label"), *rows])
    # Computing in bfloat16: batches of other widths would round otherwise.
    model = write_task_folder(folder / "model", "text-classification", {"labels": LABELS}, TINY,
                              dtype="mixed_bfloat16")
    return folder, model


def whole_run(folder, examples):
    """The task's predictions of `examples` from one run on all of them at once."""
    encoded = folder.task.encode(examples, targets=False)
    return folder.task.decode(examples, encoded, folder.task.run(folder.model, encoded.features))


def stdout_rows(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_predict_and_evaluate_a_chunk_at_a_time_give_a_whole_runs_outputs(files, tmp_path, capsys):
    from kbert.modelfolder import ModelFolder

    data, model = files
    folder = ModelFolder.load(model)
    texts = [text for text, _ in debian_rows(TEXTS)]
    examples = folder.task.examples_from_texts(texts)
    expected = folder.task.predict_json(examples, whole_run(folder, examples))
    assert main(["predict", "--model", model, "--input", str(data / "texts.txt")]) == 0
    assert stdout_rows(capsys) == expected  # every score to the last bit
    out = tmp_path / "predictions.jsonl"
    assert main(["predict", "--model", model, "--input", str(data / "texts.txt"), "--output", str(out)]) == 0
    assert stdout_rows(capsys) == [{"output": str(out), "examples": TEXTS}]
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == expected
    labelled = folder.task.read(str(data / "data.csv"))
    figures = folder.task.evaluate(labelled, whole_run(folder, labelled))
    assert folder.evaluate(labelled) == figures
    assert main(["evaluate", "--model", model, "--data", str(data / "data.csv")]) == 0
    assert stdout_rows(capsys) == [figures]


def test_a_chunk_is_read_as_it_is_used(files):
    """The first chunk's predictions come before the input is read further."""
    from kbert.modelfolder import ModelFolder

    folder = ModelFolder.load(files[1])
    read = []

    def examples():
        for text, _ in debian_rows(TEXTS):
            read.append(text)
            yield from folder.task.examples_from_texts([text])

    chunks = folder.predict_chunks(examples())
    chunk, predictions = next(chunks)
    assert len(chunk) == len(predictions) == len(read) == CHUNK_EXAMPLES
    assert sum(len(chunk) for chunk, _ in chunks) == TEXTS - CHUNK_EXAMPLES


def test_a_documents_sentences_stay_in_one_chunk():
    """Under context "document" a document's sentences are read in shared windows:
    a chunk never cuts one, and the tags are those of a run on all sentences at once."""
    from kbert.tasks import TASKS

    tags = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    task = task_instance("token-classification", {"tags": tags, "scheme": "IOB2", "context": "document"}, 32)
    sentences = TASKS["token-classification"].read(os.path.join(SHARED, "conll2003", "dev.txt"))[:120]
    sizes = [5, 12, 1, 30, 8, 20, 3, 15, 26]  # documents of 1 to 30 sentences, 120 in all
    documents = np.repeat(np.arange(len(sizes)), sizes)
    examples = [dataclasses.replace(e, document=int(d)) for e, d in zip(sentences, documents)]
    chunks = list(example_chunks(task, examples, size=7))
    assert [e for chunk in chunks for e in chunk] == examples and len(chunks) >= 3
    for before, after in zip(chunks, chunks[1:]):
        assert before[-1].document != after[0].document
    # One document of them all: one chunk, however long.
    one = [dataclasses.replace(example, document=0) for example in examples]
    assert [len(chunk) for chunk in example_chunks(task, one, size=7)] == [len(one)]
    model = task.build_model(TINY)
    chunked = joined(p for _, p in predict_chunks(task, examples, lambda f: task.run(model, f), size=7))
    encoded = task.encode(examples, targets=False)
    whole = task.decode(examples, encoded, task.run(model, encoded.features))
    assert [p["tags"] for p in chunked] == [p["tags"] for p in whole]
    np.testing.assert_allclose(np.concatenate([p["scores"] for p in chunked]),
                               np.concatenate([p["scores"] for p in whole]), atol=1e-5)


def test_a_questions_windows_stay_in_one_chunk():
    """A question whose context spans several windows is one example: chunked, it gets the
    answer a run on all questions at once gives."""
    task = task_instance("question-answering", {"version_2_with_negative": True, "doc_stride": 16,
                                                "max_query_length": 24}, 64)
    examples = task.read(os.path.join(SHARED, "squad-sample", "normans-dev-v2.0.json"))[:12]
    encoded = task.encode(examples, targets=False)
    assert len(encoded) > len(examples)  # several windows to a question
    model = task.build_model(TINY)
    chunked = joined(p for _, p in predict_chunks(task, examples, lambda f: task.run(model, f), size=5))
    whole = task.decode(examples, encoded, task.run(model, encoded.features))
    assert [task.answer(p)["text"] for p in chunked] == [task.answer(p)["text"] for p in whole]
    np.testing.assert_allclose([p["null_score_diff"] for p in chunked], [p["null_score_diff"] for p in whole],
                               atol=1e-4)


def test_embed_writes_its_array_a_chunk_at_a_time(files, tmp_path, capsys):
    from kbert.modelfolder import ModelFolder

    data, model = files
    out = tmp_path / "embeddings.npy"
    assert main(["embed", "--model", model, "--task", "sentence-embedding", "--input", str(data / "texts.txt"),
                 "--output", str(out)]) == 0
    assert stdout_rows(capsys) == [{"output": str(out), "shape": [TEXTS, TINY.hidden_size]}]
    folder = ModelFolder.from_pretrained(model, "sentence-embedding")
    expected = folder.task.embeddings(whole_run(folder, folder.task.examples_from_texts(
        [text for text, _ in debian_rows(TEXTS)])))
    np.testing.assert_array_equal(np.load(out), expected)
    np.testing.assert_array_equal(np.load(out, mmap_mode="r")[-5:], expected[-5:])
    assert sorted(os.listdir(tmp_path)) == ["embeddings.npy"]


def test_an_npy_file_of_rows_written_as_they_come(tmp_path):
    parts = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((5, 3), np.float32)]
    path = tmp_path / "rows.npy"
    with open(path, "wb") as f:
        rows = NpyRows(f)
        for part in parts:
            rows.append(part)
        with pytest.raises(ValueError, match=r"rows of shape \(1, 4\); expected \(n, 3\)"):
            rows.append(np.ones((1, 4)))
        rows.finish()
    np.testing.assert_array_equal(np.load(path), np.concatenate(parts))
    # The header holds any row count in the room kept for it.
    assert len(rows._header(np.iinfo(np.int64).max)) == len(rows._header(0, rows.reserved)) == rows.reserved


def test_a_bad_line_anywhere_in_a_file_is_refused_before_any_work(files, tmp_path, capsys):
    data, model = files
    lines = (data / "texts.txt").read_text(encoding="utf-8").splitlines()
    bad = tmp_path / "texts.txt"
    bad.write_text("\n".join(lines[:3999] + [""] + lines[3999:]) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", model, "--input", str(bad), "--output", str(out)]) == 2
    assert capsys.readouterr().err.endswith(f"{bad}, line 4000: a blank line; expected one text a line\n")
    assert sorted(os.listdir(tmp_path)) == ["texts.txt"]
    assert list(text_lines(str(data / "texts.txt"))) == lines


def test_predict_output_replaces_only_its_own_kind(files, tmp_path, capsys):
    data, model = files
    texts = str(data / "texts.txt")
    for output, flags, error in [
        ("out.json", [], "--output {}: expected a .jsonl file name"),
        ("data.jsonl", ["--overwrite"], "--output {} exists and is not a JSON Lines file of objects"),
        ("mine.jsonl", [], "--output {} exists; pass --overwrite to replace it"),
    ]:
        path = tmp_path / output
        path.write_text({"data.jsonl": "text,label\na,b\n"}.get(output, '{"text": "a", "label": "games"}\n'))
        assert main(["predict", "--model", model, "A chess game.", "--output", str(path), *flags]) == 2
        assert error.format(path) in capsys.readouterr().err
    mine = tmp_path / "mine.jsonl"
    assert main(["predict", "--model", model, "A chess game.", "--output", str(mine), "--overwrite"]) == 0
    assert json.loads(mine.read_text())["text"] == "A chess game."


def test_progress_lines_where_stderr_is_no_terminal(files, tmp_path, capsys, monkeypatch):
    """A line at most every `LINE_SECONDS` (0 here: one a chunk), with the total when it is known."""
    import kbert.logs

    data, model = files
    monkeypatch.setattr(kbert.logs, "LINE_SECONDS", 0)
    assert main(["predict", "--model", model, "--input", str(data / "texts.txt"),
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" in ")[0] for line in lines] == [
        f"predict: {n:,}/{TEXTS:,} examples" for n in (CHUNK_EXAMPLES, 2 * CHUNK_EXAMPLES, TEXTS, TEXTS)
    ]
    unknown = kbert.logs.Progress("embed", None, "texts", log=lines.append)
    unknown.update(5)
    assert lines[-1].startswith("embed: 5 texts in ") and "left" not in lines[-1]


def kbert_process(argv, **kwargs):
    """`kbert ARGV` as a process with SIGINT at its default, as a command typed in a shell
    (one started in the background of a script, as CI may run the suite, inherits it ignored)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    return subprocess.Popen([sys.executable, "-m", "kbert.cli", *argv], env=env, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


def test_ctrl_c_keeps_the_lines_printed_and_no_half_written_file(files, tmp_path):
    data, model = files
    many = tmp_path / "many.txt"
    many.write_text((data / "texts.txt").read_text(encoding="utf-8") * 6, encoding="utf-8")
    stopped = kbert_process(["predict", "--model", model, "--input", str(many)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = stopped.stdout.readline()  # the first chunk's lines come as soon as they are computed
    stopped.send_signal(signal.SIGINT)
    # Read on through the same buffered file: `communicate` reads the pipe beneath it
    # and would miss what `readline` has buffered beyond the first line.
    out, err = stopped.stdout.read(), stopped.stderr.read()
    stopped.wait(timeout=300)
    assert stopped.returncode == 130, err[-2000:]
    printed = [json.loads(line) for line in (first + out).splitlines()]  # whole lines, every one
    counted = int(re.fullmatch(r"kbert: interrupted; the predictions of the first (\d+) examples were printed, "
                               r"whole lines \(perhaps one more: count the lines to resume\)", err.splitlines()[-1])[1])
    assert len(printed) in (counted, counted + 1)
    assert 0 < len(printed) < 6 * TEXTS
    output = tmp_path / "out.jsonl"
    stopped = kbert_process(["predict", "--model", model, "--input", str(many), "--output", str(output)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while not any(name.startswith(".kbert-") and os.path.getsize(tmp_path / name) for name in os.listdir(tmp_path)):
        assert stopped.poll() is None, stopped.communicate()[1][-2000:]
        time.sleep(0.1)
    stopped.send_signal(signal.SIGINT)
    out, err = stopped.communicate(timeout=300)
    assert (stopped.returncode, out) == (130, "")
    assert err.splitlines()[-1] == f"kbert: interrupted; {output} was not written or changed"
    assert sorted(os.listdir(tmp_path)) == ["many.txt"]


def test_standard_input_is_read_as_it_comes(files, tmp_path):
    data, model = files
    output = tmp_path / "out.jsonl"
    run = kbert_process(["predict", "--model", model, "--input", "-", "--output", str(output)],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = run.communicate((data / "texts.txt").read_text(encoding="utf-8"), timeout=300)
    assert run.returncode == 0, err[-2000:]
    assert json.loads(out) == {"output": str(output), "examples": TEXTS}
    assert len(output.read_text(encoding="utf-8").splitlines()) == TEXTS
