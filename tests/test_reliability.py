"""Never lose what the user has: output folders, strict data files, diverged training, resume.

Each test here failed before the fix it guards (issue: reliability).
"""

import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from kbert import fileio
from kbert.cli import main
from kbert.tabular import iter_table, read_table
from tests.task_harness import minilm_vocabulary, write_task_folder
from tests.test_export_units import TINY

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "data", "debian-packages")


def error_of(argv, capsys, after_progress=False):
    """The one-line error of a failing command (after its progress lines, if it made any)."""
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    err = captured.err.splitlines(keepends=True)[-1] if after_progress else captured.err
    assert err.startswith("kbert: error: ") and err.count("\n") == 1, captured.err
    return err


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("".join(t + "\n" for t in minilm_vocabulary()), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def small_csvs(tmp_path_factory):
    """The first rows of the shipped train and dev files."""
    folder = tmp_path_factory.mktemp("data")
    for split, rows in (("train", 97), ("dev", 25)):
        with open(os.path.join(DATA, f"{split}.csv"), encoding="utf-8") as f:
            lines = f.readlines()[:rows]
        (folder / f"{split}.csv").write_text("".join(lines), encoding="utf-8")
    return str(folder / "train.csv"), str(folder / "dev.csv")


def finetune_args(small_csvs, vocab_file, out, *extra):
    train, dev = small_csvs
    return ["finetune", "--train", train, "--dev", dev, "--init", "bert_tiny", "--vocab", vocab_file,
            "--seq-len", "32", "--batch-size", "8", "--epochs", "1", "--out", str(out), *extra]


# === Strict data files ===


@pytest.mark.parametrize(
    "content, message",
    [
        ('text,label\n"a good game,games\nan editor,editors\n', "line 2: a quoted field opened in this record is never closed"),
        ("text,label\na game,games\nan editor,editors,extra\n", "line 3: 3 fields; expected 2"),
        ("text,label\na game,games\n  ,editors\n", "line 3: empty 'text'"),
        ("text,label\na game,games\nan editor,\n", "line 3: empty 'label'"),
        ("text,label\n", "has a header but no rows"),
        ("", "is empty"),
    ],
)
def test_malformed_csv_names_its_line(tmp_path, content, message):
    path = tmp_path / "data.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as error:
        read_table(str(path), ["text", "label"])
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_non_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("text,label\na game,games\nun éditeur,editors\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.csv, line 3: byte 0xe9 is not UTF-8"):
        read_table(str(path), ["text", "label"])


def test_tsv_quotes_bom_and_blank_lines(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text('\ufeffsentence1\tsentence2\tlabel\n"a ""quoted"" one"\tb\t1\n\nc\td\t0\n', encoding="utf-8")
    rows = read_table(str(path), ["sentence1", "sentence2", "label"])
    assert [dict(r) for r in rows] == [
        {"sentence1": 'a "quoted" one', "sentence2": "b", "label": "1"},
        {"sentence1": "c", "sentence2": "d", "label": "0"},
    ]
    assert [r.line for r in rows] == [2, 4]



@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_every_line_ending_reads_alike(tmp_path, ending):
    path = tmp_path / "endings.csv"
    lines = ["text,label", '"two\nlines",games', "an editor,editors", "héllo,net"]
    path.write_bytes((ending.join(lines) + ending).encode("utf-8"))
    rows = read_table(str(path), ["text", "label"])
    assert [dict(r) for r in rows] == [
        {"text": "two\nlines", "label": "games"},
        {"text": "an editor", "label": "editors"},
        {"text": "héllo", "label": "net"},
    ]
    assert [r.line for r in rows] == [2, 4, 5]


def test_a_table_is_read_as_it_is_used(tmp_path):
    """`iter_table` gives the rows before a bad one (a file of millions is never held whole)."""
    path = tmp_path / "long.csv"
    path.write_bytes(b"text,label\na game,games\nan editor,editors\n\xff,net\n")
    rows = iter_table(str(path), ["text", "label"])
    assert [next(rows)["label"], next(rows)["label"]] == ["games", "editors"]
    with pytest.raises(ValueError, match=r"long.csv, line 4: byte 0xff is not UTF-8"):
        next(rows)

def test_cli_malformed_csv_writes_nothing(tmp_path, small_csvs, vocab_file, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text('text,label\n"a game,games\nan editor,editors\n', encoding="utf-8")
    argv = finetune_args(small_csvs, vocab_file, tmp_path / "model")
    argv[argv.index("--train") + 1] = str(bad)
    assert "bad.csv, line 2: a quoted field" in error_of(argv, capsys)
    assert sorted(os.listdir(tmp_path)) == ["bad.csv"]


# === Output folders ===


def test_finetune_refuses_a_users_folder_before_any_work(tmp_path, small_csvs, vocab_file, capsys):
    users = tmp_path / "work"
    users.mkdir()
    (users / "thesis.tex").write_text("years of work")
    start = time.perf_counter()
    err = error_of(finetune_args(small_csvs, vocab_file, users), capsys)
    assert "is not empty and is not a kbert model folder" in err
    assert time.perf_counter() - start < 5  # refused before reading data or building a model
    assert os.listdir(users) == ["thesis.tex"] and (users / "thesis.tex").read_text() == "years of work"
    assert sorted(os.listdir(tmp_path)) == ["work"]


@pytest.mark.parametrize("kind", ["dot", "file", "parent-file", "cwd-inside"])
def test_bad_output_paths_are_refused_up_front(tmp_path, small_csvs, vocab_file, capsys, monkeypatch, kind):
    (tmp_path / "a-file").write_text("x")
    out = {
        "dot": ".",
        "file": str(tmp_path / "a-file"),
        "parent-file": str(tmp_path / "a-file" / "model"),
        "cwd-inside": str(tmp_path),
    }[kind]
    monkeypatch.chdir(tmp_path)
    message = {
        "dot": "expected the path of a new model folder",
        "file": "a file of that name exists",
        "parent-file": "is a file, not a folder",
        "cwd-inside": "holds the current folder",
    }[kind]
    assert message in error_of(finetune_args(small_csvs, vocab_file, out), capsys)
    assert sorted(os.listdir(tmp_path)) == ["a-file"]


def test_replacing_a_kbert_folder_needs_overwrite(tmp_path):
    ours = tmp_path / "model"
    ours.mkdir()
    (ours / "kbert.json").write_text(json.dumps({"bert_config": {}}))
    is_ours = lambda path: os.path.isfile(os.path.join(path, "kbert.json"))  # noqa: E731
    known = ["kbert.json"]  # a folder of before manifests: kbert's by its known names
    with pytest.raises(ValueError, match="pass --overwrite to replace it"):
        fileio.check_output_folder(str(ours), "model", is_ours, known_names=known)
    fileio.check_output_folder(str(ours), "model", is_ours, overwrite=True, known_names=known)
    with fileio.staged_folder(str(ours), is_ours, overwrite=True, known_names=known) as staging:
        (tmp_path / staging / "kbert.json").write_text("{}")
    assert json.loads((ours / "kbert.json").read_text()) == {}
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_umask_is_respected(tmp_path):
    old = os.umask(0o027)
    try:
        with fileio.staged_folder(str(tmp_path / "out"), lambda p: False) as staging:
            fileio.write_file(os.path.join(staging, "a.json"), lambda f: f.write(b"{}"))
            with open(os.path.join(staging, "b.txt"), "w") as f:
                f.write("b")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "out").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(tmp_path / "out" / "a.json").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "out" / "b.txt").st_mode) == 0o640


def test_stale_staging_of_the_same_output_is_cleaned(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    prefix = fileio.STAGING_PREFIX + "out-"
    owners = {"dead": dead.pid, "alive": os.getpid()}
    for name, pid in owners.items():
        folder = tmp_path / (prefix + name)
        folder.mkdir()
        (folder / "weights.h5").write_bytes(b"x" * 1000)
        (folder / fileio.OWNER_FILE).write_text(json.dumps({"pid": pid, "host": os.uname().nodename}))
    (tmp_path / (prefix + "unowned")).mkdir()  # no owner file: not provably ours, kept
    (tmp_path / (fileio.STAGING_PREFIX + "other-x")).mkdir()  # another output's, kept
    removed = fileio.remove_stale_staging(str(tmp_path / "out"))
    assert [os.path.basename(p) for p in removed] == [prefix + "dead"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        [prefix + "alive", prefix + "unowned", fileio.STAGING_PREFIX + "other-x"]
    )


# === Numbers at parse time, diverged training, broken models ===


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1e-5", "2", "1e6", "fast"])
def test_learning_rate_must_be_finite_and_in_range(value, capsys):
    for argv in (
        ["finetune", "--train", "t", "--dev", "d", "--init", "i", "--out", "o", "--lr", value],
        ["pretrain", "--records", "r", "--config", "bert_tiny", "--steps", "1", "--out", "o", "--lr", value],
    ):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        assert "argument --lr:" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "1", "-0.1", "high"])
def test_attention_dropout_must_be_a_rate(value, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["finetune", "--train", "t", "--dev", "d", "--init", "i", "--out", "o",
              "--attention-dropout", value])
    assert stop.value.code == 2
    assert "argument --attention-dropout:" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--masked-lm-prob", "--short-seq-prob"])
@pytest.mark.parametrize("value", ["nan", "1.5", "-0.1"])
def test_probabilities_must_be_fractions(flag, value, capsys):
    with pytest.raises(SystemExit):
        main(["pretraining-data", "--corpus", "c", "--vocab", "v", "--out", "o", flag, value])
    assert f"argument {flag}:" in capsys.readouterr().err


@pytest.fixture(scope="module")
def corrupt_checkpoint(tmp_path_factory):
    """A Hugging Face checkpoint folder whose word embeddings hold a NaN."""
    from kbert import BertConfig, bert_encoder
    from kbert.checkpoints import save_hf_checkpoint

    config = BertConfig.from_preset("bert_tiny", vocab_size=len(minilm_vocabulary()))
    encoder = bert_encoder(config)
    table = encoder.get_layer("token_embedding").embeddings
    value = table.numpy()
    value[:, 0] = np.nan
    table.assign(value)
    path = str(tmp_path_factory.mktemp("checkpoint") / "nan-bert")
    save_hf_checkpoint(encoder, config, list(minilm_vocabulary()), path)
    return path


def test_diverged_training_exits_non_zero_and_writes_no_model(tmp_path, small_csvs, corrupt_checkpoint, capsys):
    train, dev = small_csvs
    out = tmp_path / "model"
    err = error_of(["finetune", "--train", train, "--dev", dev, "--init", corrupt_checkpoint,
                    "--seq-len", "32", "--batch-size", "8", "--epochs", "1", "--out", str(out), "--no-probe-head"],
                   capsys, after_progress=True)
    assert "training diverged: the loss is nan at epoch 1, step 1" in err
    assert os.listdir(tmp_path) == []  # no model, no staging, nothing to resume from


def test_broken_weights_stop_the_linear_probe_before_training(tmp_path, small_csvs, corrupt_checkpoint, capsys):
    train, dev = small_csvs
    err = error_of(["finetune", "--train", train, "--dev", dev, "--init", corrupt_checkpoint,
                    "--seq-len", "32", "--batch-size", "8", "--epochs", "1", "--out", str(tmp_path / "model")],
                   capsys, after_progress=True)
    assert "the encoder gives non-finite vectors (NaN or infinity) before any training" in err
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def broken_folder(tmp_path_factory):
    """A classifier folder whose logits kernel holds NaN (a diverged or damaged model)."""
    import keras

    from kbert.modelfolder import MODEL_FILE

    folder = write_task_folder(
        tmp_path_factory.mktemp("broken") / "model", "text-classification", {"labels": ["a", "b"]}, TINY
    )
    model = keras.saving.load_model(os.path.join(folder, MODEL_FILE), compile=False)
    kernel = model.get_layer("head").dense.kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    model.save(os.path.join(folder, MODEL_FILE))
    return folder


def test_non_finite_scores_are_an_error_not_json(broken_folder, tmp_path, capsys):
    err = error_of(["predict", "--model", broken_folder, "a text"], capsys)
    assert "non-finite logits" in err
    data = tmp_path / "dev.csv"
    data.write_text("text,label\na text,a\n")
    assert "non-finite logits" in error_of(["evaluate", "--model", broken_folder, "--data", str(data)], capsys)


def test_truncated_model_and_mismatched_labels_name_the_file(tmp_path, capsys):
    folder = write_task_folder(tmp_path / "model", "text-classification", {"labels": ["a", "b", "c"]}, TINY)
    data = tmp_path / "dev.csv"
    data.write_text("text,label\na text,a\n")
    model_file = os.path.join(folder, "model.keras")
    content = open(model_file, "rb").read()
    with open(model_file, "wb") as f:
        f.write(content[: len(content) // 2])
    err = error_of(["evaluate", "--model", folder, "--data", str(data)], capsys)
    assert f"{model_file} is damaged: not a complete .keras zip archive" in err
    with open(model_file, "wb") as f:
        f.write(content)
    settings_file = os.path.join(folder, "kbert.json")
    settings = json.load(open(settings_file))
    settings["task_settings"]["labels"] = ["a", "b"]
    json.dump(settings, open(settings_file, "w"))
    err = error_of(["evaluate", "--model", folder, "--data", str(data)], capsys)
    assert f"{settings_file} names 2 labels but the model outputs 3 classes" in err


# === Resuming a killed fine-tune ===


def _weights(folder):
    import keras

    import kbert.layers  # noqa: F401

    model = keras.saving.load_model(os.path.join(folder, "model.keras"), compile=False)
    return model.get_weights()


@pytest.mark.slow
def test_killed_finetune_resumes_to_the_same_weights(tmp_path, small_csvs, vocab_file):
    """SIGKILL after the first epoch's checkpoint; the same command again ends bit for bit
    where an uninterrupted run ends."""
    train, dev = small_csvs
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}

    def command(out):
        return [sys.executable, "-m", "kbert.cli", "finetune", "--train", train, "--dev", dev,
                "--init", "bert_tiny", "--vocab", vocab_file, "--seq-len", "32", "--batch-size", "8",
                "--epochs", "3", "--lr", "1e-3", "--deterministic", "--out", str(out)]

    subprocess.run(command(tmp_path / "whole"), env=env, check=True, capture_output=True, timeout=300)
    out = tmp_path / "resumed"
    checkpoint = tmp_path / ".kbert-resume-resumed" / "latest" / "training_metadata.json"
    process = subprocess.Popen(command(out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    assert json.loads(checkpoint.read_text())["epoch"] in (1, 2)
    assert not out.exists()
    done = subprocess.run(command(out), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resuming from the checkpoint of epoch" in done.stderr
    for resumed, whole in zip(_weights(out), _weights(tmp_path / "whole")):
        np.testing.assert_array_equal(resumed, whole)
    assert sorted(os.listdir(tmp_path)) == ["resumed", "whole"]  # checkpoints gone once written


def test_output_files_are_not_overwritten_without_overwrite(tmp_path, capsys):
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps(["a text"]))
    users = tmp_path / "embeddings.npy"
    users.write_bytes(b"the user's own array")
    err = error_of(["embed", "--model", "all-minilm-l6-v2", "--input", str(texts), "--output", str(users)], capsys)
    assert "embeddings.npy exists and is not a .npy array file; kbert replaces only its own files" in err
    assert users.read_bytes() == b"the user's own array"
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("mine\n")
    err = error_of(["vocab", "--corpus", str(texts), "--size", "10", "--out", str(vocab)], capsys)
    assert "vocab.txt exists and is not a WordPiece vocabulary" in err and vocab.read_text() == "mine\n"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")  # kbert's kind: --overwrite replaces it
    err = error_of(["vocab", "--corpus", str(texts), "--size", "10", "--out", str(vocab)], capsys)
    assert "vocab.txt exists; pass --overwrite" in err


def test_the_data_options_the_cli_reads_with_before_tensorflow_are_the_loaded_folders(tmp_path):
    """`kbert evaluate` and `predict` read data before TensorFlow loads with the options
    `stored_data_options` gives from kbert.json: those of the loaded folder, and what
    `use_options` refuses is refused in its words."""
    from kbert.modelfolder import ModelFolder, stored_data_options
    from kbert.tasks import TASKS

    folders = {
        "token-classification": write_task_folder(
            tmp_path / "ner", "token-classification", {"tags": ["O", "B-LOC", "I-LOC"], "word_split": "none"}, TINY
        ),
        "text-pair-regression": write_task_folder(tmp_path / "pairs", "text-pair-regression", {}, TINY),
    }
    given = {"tag_scheme": "IOB2", "context": "document", "score_column": "similarity", "text_column": "x"}
    for name, folder in folders.items():
        for options in ({}, given):
            assert stored_data_options(folder, options) == (TASKS[name], ModelFolder.load(folder).use_options(options))
    assert stored_data_options(folders["token-classification"], {})[1]["word_split"] == "none"
    with pytest.raises(ValueError) as loaded:
        ModelFolder.load(folders["text-pair-regression"]).use_options({"head": "cross"})
    with pytest.raises(ValueError, match="^--head 'cross': this model has head 'cross-cosine'"):
        stored_data_options(folders["text-pair-regression"], {"head": "cross"})
    assert str(loaded.value).startswith("--head 'cross': this model has head 'cross-cosine'")
    with open(os.path.join(folders["token-classification"], "kbert.json"), "w") as f:
        f.write('{"task": "token-classification", "bert_config": {}}')  # not what kbert writes
    assert stored_data_options(folders["token-classification"]) is None


# === A model folder is read whole; inputs mean what the user meant (rule 3) ===


def _edit_settings(folder, change):
    path = os.path.join(folder, "kbert.json")
    with open(path, encoding="utf-8") as f:
        settings = json.load(f)
    change(settings)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(settings, f)


def _cut_vocab(folder):
    path = os.path.join(folder, "vocab.txt")
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines[:1000])


# Damage to one part of a model folder -> the task, and what the one-line error says.
FOLDER_DAMAGE = {
    "vocab cut": ("text-classification", _cut_vocab,
                  r"vocab.txt has 1000 tokens; \S*kbert.json says the model was written with 30522"),
    "vocab_size": ("text-classification", lambda f: _edit_settings(f, lambda s: s["bert_config"].update(vocab_size=1000)),
                   r"kbert.json says vocab_size=1000 but \S*model.keras has 30522 token embedding rows"),
    "positions": ("text-classification",
                  lambda f: _edit_settings(f, lambda s: s["bert_config"].update(max_position_embeddings=512)),
                  r"kbert.json says max_position_embeddings=512 but \S*model.keras has 64 position embedding rows"),
    "sequence length": ("text-classification", lambda f: _edit_settings(f, lambda s: s.update(sequence_length=65)),
                        r"kbert.json: sequence_length=65 exceeds max_position_embeddings=64"),
    "labels": ("text-classification",
               lambda f: _edit_settings(f, lambda s: s["task_settings"].update(labels=["a", "b"])),
               r"kbert.json names 2 labels but the model outputs 3 classes"),
    "score range": ("text-pair-regression",
                    lambda f: _edit_settings(f, lambda s: s["task_settings"].update(score_range=[0, 9])),
                    r"kbert.json: score_range=\[0, 9\] but the model's head was built for \[0.0, 5.0\]"),
}
FOLDER_SETTINGS = {"text-classification": {"labels": ["a", "b", "c"]}, "text-pair-regression": {"score_range": [0, 5]}}
FOLDER_DATA = {"text-classification": "text,label\na text,a\n", "text-pair-regression": "sentence1,sentence2,score\na,b,1\n"}


@pytest.mark.parametrize("damage", sorted(FOLDER_DAMAGE))
def test_every_reader_of_a_model_folder_checks_its_parts_agree(tmp_path, capsys, damage):
    """A folder whose parts disagree (a cut vocab.txt, an edited kbert.json) is refused by
    every command and function that reads it, in one line naming the file and both numbers."""
    from kbert.training.task_model import TaskModel

    task, spoil, message = FOLDER_DAMAGE[damage]
    folder = write_task_folder(tmp_path / "model", task, FOLDER_SETTINGS[task], TINY)
    data = tmp_path / "data.csv"
    data.write_text(FOLDER_DATA[task])
    texts = ["a text"] * (2 if task.startswith("text-pair") else 1)
    assert main(["predict", "--model", folder, *texts]) == 0  # whole, it serves
    capsys.readouterr()
    spoil(folder)
    for argv in (["evaluate", "--model", folder, "--data", str(data)], ["predict", "--model", folder, *texts],
                 ["export", "--model", folder, "--data", str(data), "--out", str(tmp_path / "export")]):
        assert re.search(message, error_of(argv, capsys, after_progress=True)), argv
    with pytest.raises(ValueError, match=message) as error:
        TaskModel.from_folder(folder)
    assert "\n" not in str(error.value)
    assert not os.path.exists(tmp_path / "export")


def test_integer_targets_are_label_names_never_positions(tmp_path):
    """Labels ["1", "0"] and y [1, 0]: read as positions, every label was inverted; an
    integer is a label's name, refused where a position could be meant."""
    from kbert.training.task_model import TaskModel

    inverted = TaskModel.from_folder(write_task_folder(tmp_path / "inverted", "text-classification",
                                                       {"labels": ["1", "0"]}, TINY))
    texts = ["a text", "another text"]
    for call in (inverted.examples, inverted.fit, inverted.evaluate, inverted.figures):
        with pytest.raises(ValueError, match=r"y\[0\] is the integer 1: the label named '1' is at position 0, "
                                             r"but position 1 holds '0'"):
            call(texts, [1, 0])
    assert [e.target for e in inverted.examples(texts, ["1", "0"])] == ["1", "0"]
    named = TaskModel.from_folder(write_task_folder(tmp_path / "named", "text-classification",
                                                    {"labels": ["neg", "pos"]}, TINY))
    with pytest.raises(ValueError, match=r"y\[0\] is the integer 0, and no label is named '0'"):
        named.fit(texts, np.array([0, 1]))
    counted = TaskModel.from_folder(write_task_folder(tmp_path / "counted", "text-classification",
                                                      {"labels": ["0", "1", "2"]}, TINY))  # labels=3
    assert [e.target for e in counted.examples(texts, np.array([2, 0]))] == ["2", "0"]


def _python_inputs_with_an_empty_text(tmp_path):
    """(what, call) for each Python entry point given a blank text, on tiny folders of the tasks."""
    from kbert.training.task_model import TaskModel

    def model(name, task, settings):
        return TaskModel.from_folder(write_task_folder(tmp_path / name, task, settings, TINY))

    classifier = model("c", "text-classification", {"labels": ["a", "b"]})
    pairs = model("p", "text-pair-regression", {"score_range": [0, 5]})
    tagger = model("t", "token-classification", {"tags": ["O", "B-X", "I-X"]})
    reader = model("q", "question-answering", {})
    return [
        (r"x\[1\]: empty text", lambda: classifier.fit(["a text", ""], ["a", "b"])),
        (r"x\[0\]: empty text", lambda: classifier.predict_labels(["  "])),
        (r"x\[0\]: empty text", lambda: classifier.predict([""])),
        (r"x\[1\]\[0\]: empty text", lambda: pairs.fit((["a"], [" "]), [1.0])),
        (r"x\[0\]: empty text", lambda: tagger.predict_labels([""])),
        (r"x\[0\]\['question'\]: empty text", lambda: reader.predict_labels([{"question": "", "context": "Ann wrote it."}])),
    ]


def test_an_empty_text_is_refused_by_every_entry_point(tmp_path, capsys):
    """`kbert finetune` refuses an empty text (`kbert.tabular.check_text`); so do predict,
    search, embed and `TaskModel`, with the same check."""
    folder = write_task_folder(tmp_path / "model", "text-classification", {"labels": ["a", "b"]}, TINY)
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps(["a text", ""]))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a text\n")
    index = tmp_path / "corpus.kbert-index"
    for argv, message in (
        (["predict", "--model", folder, "a text", ""], "text 2: empty text"),
        (["predict", "--model", folder, "--input", str(texts)], "texts.json, item 2: empty text"),
        (["embed", "--model", folder, "--task", "sentence-embedding", "--input", str(texts),
          "--output", str(tmp_path / "vectors.npy")], "texts.json, item 2: empty text"),
        (["search", "--model", folder, "--task", "sentence-embedding", "--corpus", str(corpus),
          "--index", str(index), " "], "query 1: empty text"),
    ):
        assert message in error_of(argv, capsys), argv
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "model", "texts.json"]  # refused before any work
    for message, call in _python_inputs_with_an_empty_text(tmp_path):
        with pytest.raises(ValueError, match=message):
            call()


@pytest.mark.parametrize("score_range", [(5, 0), (1, 1), (0, math.inf), (math.nan, 5), (0,), "0-5"])
def test_a_score_range_must_run_low_to_high(tmp_path, score_range):
    """The task's settings refuse it, wherever they come from: `TaskModel.from_checkpoint`
    (before any checkpoint loads), a task built in Python, a model folder's kbert.json."""
    from kbert.modelfolder import ModelFolder
    from kbert.training.task_model import TaskModel
    from tests.task_harness import task_instance

    message = r"^score_range=.*; expected \[low, high\], two finite numbers with low below high$"
    with pytest.raises(ValueError, match=message):
        TaskModel.from_checkpoint("no-such-checkpoint", task="text-pair-regression", score_range=score_range)
    with pytest.raises(ValueError, match=message):
        task_instance("text-pair-regression", {"score_range": score_range})
    folder = write_task_folder(tmp_path / "model", "text-pair-regression", {"score_range": [0, 5]}, TINY)
    stored = list(score_range) if isinstance(score_range, tuple) else score_range  # as JSON holds it
    _edit_settings(folder, lambda s: s["task_settings"].update(score_range=stored))
    with pytest.raises(ValueError, match="score_range="):
        ModelFolder.load(folder)


# === A damaged kbert file is named as damaged (rule 4) ===


def test_a_damaged_keras_file_is_named_so_by_every_reader(tmp_path, capsys):
    """Keras says "File not found" of a truncated .keras file; kbert names it damaged,
    and a flipped byte in its weights too (the archive's CRC)."""
    from kbert.training.task_model import TaskModel

    folder = write_task_folder(tmp_path / "model", "text-classification", {"labels": ["a", "b"]}, TINY)
    model_file = os.path.join(folder, "model.keras")
    data = tmp_path / "data.csv"
    data.write_text("text,label\na text,a\n")
    with open(model_file, "rb") as f:
        whole = f.read()
    flipped = bytearray(whole)
    flipped[len(whole) // 2] ^= 0xFF  # inside the weights
    for content, message in ((whole[: len(whole) - 100], "is damaged: not a complete .keras zip archive"),
                             (bytes(flipped), "is damaged: its member model.weights.h5 fails its CRC check")):
        with open(model_file, "wb") as f:
            f.write(content)
        for argv in (["evaluate", "--model", folder, "--data", str(data)], ["predict", "--model", folder, "a text"]):
            assert f"{model_file} {message}" in error_of(argv, capsys, after_progress=True)
        with pytest.raises(ValueError, match=re.escape(f"{model_file} {message}")):
            TaskModel.from_folder(folder)


def test_a_damaged_index_is_named_so_and_overwrite_replaces_it(tmp_path, capsys):
    """A truncated index is kbert's by its first bytes (`kbert.search.starts_as_index`): named
    as damaged, and replaced with --overwrite; a user's truncated .npz stays refused."""
    folder = write_task_folder(tmp_path / "model", "text-classification", {"labels": ["a", "b"]}, TINY)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a text editor\na chess game\n")
    index = tmp_path / "corpus.kbert-index"
    build = ["search", "--model", folder, "--task", "sentence-embedding", "--corpus", str(corpus), "--index", str(index)]
    assert main(build) == 0
    capsys.readouterr()
    whole = index.read_bytes()
    index.write_bytes(whole[: len(whole) // 2])
    err = error_of(["search", "--index", str(index), "an editor"], capsys)
    assert f"{index} is a damaged kbert index: not a complete .npz archive" in err
    assert f"--index {index} exists; pass --overwrite" in error_of(build, capsys)
    assert main([*build, "--overwrite"]) == 0 and index.read_bytes() != whole[: len(whole) // 2]
    capsys.readouterr()
    assert main(["search", "--index", str(index), "an editor"]) == 0
    users = tmp_path / "mine.npz"
    np.savez(users, meta=np.zeros(3))
    users.write_bytes(users.read_bytes()[:-30])
    assert "is not a kbert index" in error_of(["search", "--index", str(users), "an editor"], capsys)
    assert "exists and is not a kbert index" in error_of([*build[:-1], str(users), "--overwrite"], capsys)


# === Inputs mean what the user meant, errors name the real cause, data checks first (rules 3-5) ===


def _settings_folder(path, task, task_settings, positions=64):
    """A model folder's kbert.json alone: all that the checks made before TensorFlow loads read."""
    path.mkdir()
    settings = {"format": "kbert-model", "task": task, "task_settings": task_settings,
                "bert_config": {"max_position_embeddings": positions}, "sequence_length": 16, "lowercase": True}
    (path / "kbert.json").write_text(json.dumps(settings))
    return str(path)


def _refused_before_tensorflow(tmp_path, refusals):
    """Runs each `(arguments, error)` of `refusals` in one Python in `tmp_path`: each ends with
    its one line, status 2, TensorFlow never loads and nothing is written."""
    from tests.test_cli_help import run_in_one_process

    before = sorted(os.listdir(tmp_path))
    statuses, tensorflow_loaded, lines = run_in_one_process([argv for argv, _ in refusals], tmp_path)
    assert statuses == [2] * len(refusals) and not tensorflow_loaded, lines
    assert lines == [f"kbert: error: {error}" for _, error in refusals]
    assert sorted(os.listdir(tmp_path)) == before


def test_every_command_taking_seq_len_refuses_one_that_leaves_no_room_for_text(tmp_path):
    """`finetune --seq-len 2` trained on [CLS] [SEP] alone. Every task needs [CLS], and a
    piece and a [SEP] for each of its texts (3 for one, 5 for a pair); every command that
    takes --seq-len refuses less, and more than a model folder's positions, before
    TensorFlow loads."""
    from kbert.tasks import TASKS

    for task in TASKS.values():
        least = 1 + 2 * len(task.text_inputs)
        task.check_sequence_length(least)
        with pytest.raises(ValueError, match=rf"^sequence_length={least - 1} leaves no room for text: "
                                             rf"task '{task.name}' packs \[CLS\] .*; expected at least {least}$"):
            task.check_sequence_length(least - 1)
    (tmp_path / "data.csv").write_text("text,label\na text,a\nanother text,b\n")
    (tmp_path / "pairs.csv").write_text("sentence1,sentence2,label\na,b,a\nc,d,b\n")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    _settings_folder(tmp_path / "topics", "text-classification", {"labels": ["a", "b"]})
    _settings_folder(tmp_path / "pairs", "text-pair-classification", {"labels": ["a", "b"]})
    init = "--init bert_tiny --vocab vocab.txt --out m"
    one = "leaves no room for text: task 'text-classification' packs [CLS] text [SEP]; expected at least 3"
    pair = ("leaves no room for text: task 'text-pair-classification' packs [CLS] sentence1 [SEP] sentence2 [SEP]; "
            "expected at least 5")
    embedding = "leaves no room for text: task 'sentence-embedding' packs [CLS] text [SEP]; expected at least 3"
    _refused_before_tensorflow(tmp_path, [
        (f"finetune --train data.csv --dev data.csv {init} --seq-len 2", f"--seq-len 2 {one}"),
        (f"finetune --task text-pair-classification --train pairs.csv --dev pairs.csv {init} --seq-len 4",
         f"--seq-len 4 {pair}"),
        ("distill --teacher pairs --train pairs.csv --dev pairs.csv --out s --seq-len 4", f"--seq-len 4 {pair}"),
        ("evaluate --model topics --data data.csv --seq-len 2", f"--seq-len 2 {one}"),
        ("predict --model pairs --seq-len 3 a b", f"--seq-len 3 {pair}"),
        ("export --model topics --data data.csv --out e --seq-len 1", f"--seq-len 1 {one}"),
        ("embed --model all-minilm-l6-v2 --input data.csv --output e.npy --seq-len 2", f"--seq-len 2 {embedding}"),
        ("search --model all-minilm-l6-v2 --corpus data.csv --index i.kbert-index --seq-len 2",
         f"--seq-len 2 {embedding}"),
        ("evaluate --model topics --data data.csv --seq-len 100000",
         "--seq-len 100000 exceeds the 64 positions of --model topics (max_position_embeddings)"),
        ("predict --model topics --seq-len 65 a", "--seq-len 65 exceeds the 64 positions of --model topics "
         "(max_position_embeddings)"),
        ("export --model topics --data data.csv --out e --seq-len 65",
         "--seq-len 65 exceeds the 64 positions of --model topics (max_position_embeddings)"),
        ("distill --teacher pairs --train pairs.csv --dev pairs.csv --out s --seq-len 65",
         "--seq-len 65 exceeds the 64 positions of --teacher pairs (max_position_embeddings)"),
    ])


# The same two records as each table kbert reads; JSON Lines' keys in any order, blank lines skipped.
TABLE_FILES = {
    ".csv": 'text,label\n"a text, quoted",a\nanother text,b\n',
    ".tsv": "text\tlabel\na text, quoted\ta\nanother text\tb\n",
    ".jsonl": '{"text": "a text, quoted", "label": "a"}\n\n{"label": "b", "text": "another text"}\n',
}


def test_every_command_reads_a_file_of_one_extension_the_same_way(tmp_path, capsys):
    """`embed --input dev.csv` embedded its header and raw lines (17 vectors for 16 texts).
    One reader decides by the extension: a table's text column for embed and search
    (corpus and queries) as for the tasks' readers (finetune, evaluate, predict, export)."""
    from kbert.cliio import read_texts
    from kbert.search import read_corpus
    from kbert.tasks import get_task

    texts = ["a text, quoted", "another text"]
    for extension, content in TABLE_FILES.items():
        path = tmp_path / f"data{extension}"
        path.write_text(content)
        lines = [1, 3] if extension == ".jsonl" else [2, 3]
        assert read_texts(str(path)) == texts  # embed --input, search --queries
        assert read_corpus(str(path)) == (texts, lines)  # search --corpus
        examples = get_task("text-classification").read(str(path))
        assert [(e.texts, e.target, e.line) for e in examples] == [((t,), label, line) for t, label, line
                                                                  in zip(texts, "ab", lines)]
        err = error_of(["embed", "--model", "all-minilm-l6-v2", "--input", str(path), "--text-column", "body",
                        "--output", str(tmp_path / "e.npy")], capsys)
        missing = "line 1 has no key 'body'" if extension == ".jsonl" else "has no column 'body'"
        assert re.search(rf"^kbert: error: \S*data{extension},? {missing}", err)
    text = tmp_path / "texts.txt"
    text.write_text("text,label\n")
    assert "--text-column body: --input" in error_of(
        ["embed", "--model", "all-minilm-l6-v2", "--input", str(text), "--text-column", "body",
         "--output", str(tmp_path / "e.npy")], capsys)
    assert not (tmp_path / "e.npy").exists()


def test_every_task_that_reads_tables_reads_json_lines(tmp_path):
    """`predict` and `evaluate` read a .jsonl file as CSV ("has no column 'text'; its columns
    are ['{"text": ...']"): each task that reads tables reads one object a line, with the
    same column names, to the same examples; numbers are read as a CSV holds them."""
    from kbert.tasks import TASKS
    from kbert.tasks.text_task import TextTask

    tasks = [task for task in TASKS.values() if issubclass(task, TextTask)]
    assert len(tasks) >= 4
    for task in tasks:
        options = task.resolve_options({})
        columns = [options[name] for name in task.text_options] + [options[task.target_option]]
        rows = [[f"text {i} of {column}" for column in columns[:-1]] + [i] for i in (1, 2)]
        csv_file, jsonl_file = tmp_path / f"{task.name}.csv", tmp_path / f"{task.name}.jsonl"
        csv_file.write_text("\n".join(",".join(map(str, row)) for row in [columns, *rows]) + "\n")
        jsonl_file.write_text("".join(json.dumps(dict(zip(columns, row))) + "\n" for row in rows))
        for targets in (True, False):
            read = [task.read(str(path), targets=targets) for path in (csv_file, jsonl_file)]
            assert [(e.texts, e.target) for e in read[0]] == [(e.texts, e.target) for e in read[1]], task.name
    bad = tmp_path / "bad.jsonl"
    for content, message in (
        ('{"text": "a"}\n["a list"]\n', r"bad.jsonl, line 2: \['a list'\] is not a JSON object; expected one with"),
        ('{"text": "a"}\n{"text": \n', r"bad.jsonl, line 2: not valid JSON"),
        ('{"text": null}\n', r"bad.jsonl, line 1: 'text' is None; expected a string or a number"),
        ("\n", r"bad.jsonl holds no records"),
    ):
        bad.write_text(content)
        with pytest.raises(ValueError, match=message):
            read_table(str(bad), ["text"])


@pytest.mark.parametrize("command", [
    "finetune --train a.csv --dev a.csv --init bert_tiny --out m",
    "distill --teacher t --train a.csv --dev a.csv --out s",
    "pretrain --corpus a.txt --config bert_tiny --steps 1 --out p",
])
def test_a_dtype_no_training_runs_under_is_refused_at_parsing(command, capsys):
    """`--dtype float8` failed after 16 s in Keras's QuantizedDTypePolicy; every training
    command refuses it as its arguments are parsed, naming the choices."""
    with pytest.raises(SystemExit) as stop:
        main([*command.split(), "--dtype", "float8"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert re.search(r"error: argument --dtype: invalid choice: 'float8' \(choose from .*'mixed_bfloat16'", err)
    for name in ("auto", "float32", "mixed_float16"):
        assert f"'{name}'" in err


def test_a_label_column_of_texts_is_named_and_no_error_line_passes_the_cap(tmp_path, vocab_file, capsys, monkeypatch):
    """`--label-column text` blamed dev line 2 in a 20 KB line listing every training text.
    The real cause is named; a message quoting user data shortens each value, and every
    line kbert ends with is at most 300 characters, its middle cut."""
    from kbert.cliio import MAX_LINE

    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"{'The description of package %d. ' % i * 20},{'ab'[i % 2]}\n"
                                               for i in range(30)))
    err = error_of(["finetune", "--train", str(train), "--dev", str(train), "--init", "bert_tiny", "--vocab",
                    vocab_file, "--out", str(tmp_path / "m"), "--label-column", "text"], capsys)
    assert re.search(r"train.csv: no label repeats in its 30 rows \(such as 'The description of package \d+\..*…'\); "
                     r"a label names a class of several rows: is the label column a text column\?$", err), err
    assert len(err) <= MAX_LINE + 1
    labels = [f"label {i}" for i in range(500)]
    folder = _settings_folder(tmp_path / "topics", "text-classification", {"labels": labels})
    (tmp_path / "dev.csv").write_text(f"text,label\na text,{'a long label ' * 100}\n")
    monkeypatch.chdir(tmp_path)
    err = error_of(["evaluate", "--model", folder, "--data", "dev.csv"], capsys)
    assert re.match(r"kbert: error: dev.csv, line 2: label 'a long label a long .*…' is not one the model knows "
                    r"\(1 unknown: \['a long .*…'\]\); expected one of \['label 0', 'label 1', .*, … 4\d\d more\]$",
                    err), err
    assert len(err) <= MAX_LINE + 1
    model = "/".join(["nowhere"] * 150)
    err = error_of(["predict", "--model", model, "a text"], capsys)
    assert re.match(r"kbert: error: --model nowhere/nowhere/.* … .*/nowhere: no such model folder; a pretrained "
                    r"checkpoint needs --task, one that needs no training \(.*\)$", err), err
    assert len(err) == MAX_LINE + 1
    with pytest.raises(SystemExit):  # argparse's own error line too
        main(["finetune", "--dtype", "x" * 1000])
    assert len(capsys.readouterr().err.splitlines()[-1]) == MAX_LINE
    assert sorted(os.listdir(tmp_path)) == ["dev.csv", "topics", "train.csv"]


def test_a_field_longer_than_the_csv_modules_limit_is_read(tmp_path):
    """A valid 200 KB field was "malformed record (field larger than field limit (131072))":
    a field may be as long as its file, in every table; an unclosed quote is still named."""
    for extension, separator in ((".csv", ","), (".tsv", "\t")):
        path = tmp_path / f"long{extension}"
        path.write_text(f'text{separator}label\n"{"a" * 200_000}"{separator}games\nan editor{separator}editors\n')
        rows = read_table(str(path), ["text", "label"])
        assert [len(row["text"]) for row in rows] == [200_000, 9] and rows[1].line == 3
        path.write_text(f'text{separator}label\nan editor{separator}editors\n"{"a" * 200_000}{separator}games\n')
        with pytest.raises(ValueError, match=r"line 3: a quoted field opened in this record is never closed"):
            read_table(str(path), ["text", "label"])


def _kbert_with_stdin(argv, stdin, cwd):
    return subprocess.run([sys.executable, "-m", "kbert.cli", *argv], input=stdin, capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}, timeout=300)


def test_a_folder_is_named_so_and_standard_input_is_read(tmp_path):
    """`--train FOLDER` and `--input /dev/stdin` said "no such file". Every file option names a
    folder as one; predict and embed read standard input for `-` and a path that is no
    regular file (a pipe, /dev/stdin); the other options refuse `-`."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "data.csv").write_text("text,label\na text,a\nanother text,b\n")
    _settings_folder(tmp_path / "topics", "text-classification", {"labels": ["a", "b"]})
    folder = "is a folder; expected a file"
    _refused_before_tensorflow(tmp_path, [
        ("finetune --train mine --dev data.csv --init all-minilm-l6-v2 --out m", f"--train mine {folder}"),
        ("finetune --train data.csv --dev mine --init all-minilm-l6-v2 --out m", f"--dev mine {folder}"),
        ("distill --teacher topics --train mine --dev data.csv --out s", f"--train mine {folder}"),
        ("evaluate --model topics --data mine", f"--data mine {folder}"),
        ("predict --model topics --input mine", f"--input mine {folder}"),
        ("embed --model all-minilm-l6-v2 --input mine --output e.npy", f"--input mine {folder}"),
        ("export --model topics --data mine --out e", f"--data mine {folder}"),
        ("search --model all-minilm-l6-v2 --corpus mine --index i.kbert-index", f"--corpus mine {folder}"),
        ("tokenize --vocab mine hello", f"--vocab mine {folder}"),
        ("evaluate --model topics --data -", "--data -: this option reads no standard input; give a file"),
    ])
    done = _kbert_with_stdin(["embed", "--model", "all-minilm-l6-v2", "--input", "/dev/stdin", "--output", "e.npy"],
                             "a text\n\nanother text\n", tmp_path)
    assert (done.returncode, done.stderr) == (2, "kbert: error: /dev/stdin, line 2: a blank line; expected one "
                                                 "text a line\n")
    model = write_task_folder(tmp_path / "model", "text-classification", {"labels": ["a", "b"]}, TINY)
    done = _kbert_with_stdin(["predict", "--model", model, "--input", "-"], "a text\nanother text\n", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [json.loads(line)["text"] for line in done.stdout.splitlines()] == ["a text", "another text"]


def test_a_resume_folder_without_a_checkpoint_gives_way_and_says_so(tmp_path):
    """Stopped before its first epoch ended, finetune left .kbert-resume-NAME/run.json; the
    next run said it "holds the checkpoints of a run with other settings". What kbert left
    there is its own: a run with other settings replaces it, saying what it held
    (finetune and distill share `resume_point`); a file of the user's stays refused."""
    from kbert.training.finetune import resume_folder, resume_point

    out = str(tmp_path / "model")
    folder = resume_folder(out)
    logged = []
    assert resume_point(out, {"epochs": 1}, logged.append) == (folder, 0, None)  # then stopped
    assert resume_point(out, {"epochs": 2}, logged.append) == (folder, 0, None)
    assert logged == [f"starting afresh: {folder} holds no checkpoint (a run stopped before its first epoch ended)"]
    with open(os.path.join(folder, "run.json"), "w") as f:
        f.write('{"finger')  # torn, and a checkpoint half-written: still kbert's
    os.mkdir(os.path.join(folder, ".state-x1y2"))
    resume_point(out, {"epochs": 3}, logged.append)
    assert sorted(os.listdir(folder)) == ["run.json"] and json.load(open(os.path.join(folder, "run.json")))["run"] == {
        "epochs": 3}
    latest = os.path.join(folder, "latest")
    os.mkdir(latest)
    for name, value in (("training_metadata.json", {"epoch": 1}), ("windows.json", [])):
        with open(os.path.join(latest, name), "w") as f:
            json.dump(value, f)
    assert resume_point(out, {"epochs": 3}, logged.append)[1] == 1  # the same settings resume
    resume_point(out, {"epochs": 4}, logged.append)
    assert logged[-1] == f"starting afresh: {folder} holds the checkpoints of a run with other settings"
    with open(os.path.join(folder, "run.json"), "w") as f:
        f.write("not json")
    with open(os.path.join(folder, "notes.txt"), "w") as f:
        f.write("the user's")
    with pytest.raises(ValueError, match="is in the way and kbert did not write it; move it aside"):
        resume_point(out, {"epochs": 5}, logged.append)
    assert sorted(os.listdir(folder)) == ["notes.txt", "run.json"]


def test_labelled_data_is_checked_against_the_model_before_tensorflow_loads(tmp_path):
    """`evaluate` refused a label the model does not know after 18-30 s of loading. The
    model folder's kbert.json holds its labels (tags): evaluate and export check
    their --data against it before TensorFlow loads, in every table format."""
    _settings_folder(tmp_path / "topics", "text-classification", {"labels": ["editors", "games"]})
    _settings_folder(tmp_path / "ner", "token-classification", {"tags": ["O", "B-LOC", "I-LOC"]})
    (tmp_path / "data.csv").write_text("text,label\nan editor,editors\na router,net\n")
    (tmp_path / "data.jsonl").write_text('{"text": "a router", "label": "net"}\n')
    (tmp_path / "ner.conll").write_text("Paris B-LOC\nBob B-PER\n")
    unknown = "label 'net' is not one the model knows (1 unknown: ['net']); expected one of ['editors', 'games']"
    _refused_before_tensorflow(tmp_path, [
        ("evaluate --model topics --data data.csv", f"data.csv, line 3: {unknown}"),
        ("export --model topics --data data.csv --out e", f"data.csv, line 3: {unknown}"),
        ("evaluate --model topics --data data.jsonl", f"data.jsonl, line 1: {unknown}"),
        ("evaluate --model ner --data ner.conll",
         "ner.conll, line 2: tag 'B-PER' was not in the training data; the model knows ['O', 'B-LOC', 'I-LOC']"),
    ])
