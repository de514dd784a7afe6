"""Never lose what the user has: output folders, strict data files, diverged training, resume.

Each test here failed before the fix it guards (issue: reliability).
"""

import json
import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from kbert import fileio
from kbert.cli import main
from kbert.tabular import read_table
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
    assert f"{model_file} is not a readable Keras model (truncated or corrupt?)" in err
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
