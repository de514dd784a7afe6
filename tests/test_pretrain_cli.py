"""`kbert vocab`, `kbert pretraining-data` and `kbert pretrain`, with a resume after SIGKILL."""

import csv
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from kbert.cli import main
from kbert.pretraining.batch_size import ACCELERATOR_DEVICES
from kbert.pretraining.train import BACKUP_FOLDER, HISTORY_FILE, LOGS_FOLDER, WEIGHTS_FILE
from tests import skips
from tests.test_reliability import error_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_CSV = os.path.join(ROOT, "data", "debian-packages", "train.csv")
# A few hundred package descriptions: enough for a ~200-piece vocabulary.
NUM_DESCRIPTIONS = 300
TINY_CONFIG = {
    "hidden_size": 16,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
}
# Bounds the wait for the first checkpoint of the run that gets killed.
CHECKPOINT_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """(folder, config json) for a tiny corpus; vocab and records made through the CLI."""
    folder = tmp_path_factory.mktemp("pretrain")
    corpus = folder / "corpus.txt"
    with open(TRAIN_CSV, newline="", encoding="utf-8") as f:
        rows = [row["text"] for _, row in zip(range(NUM_DESCRIPTIONS), csv.DictReader(f))]
    # One sentence per line, a blank line between descriptions (documents).
    corpus.write_text(
        "\n\n".join("\n".join(re.split(r"(?<=[.!?])\s+", text.strip())) for text in rows) + "\n"
    )
    vocab = folder / "vocab.txt"
    assert main(["vocab", "--corpus", str(corpus), "--size", "200", "--min-count", "2",
                 "--out", str(vocab)]) == 0
    tokens = vocab.read_text().split("\n")[:-1]
    assert 150 <= len(tokens) <= 200 and tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    out = folder / "records"
    assert main([
        "pretraining-data", "--corpus", str(corpus), "--vocab", str(vocab), "--out", str(out),
        "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--dupe-factor", "2",
        "--num-shards", "2", "--workers", "1",
    ]) == 0
    metadata = json.loads((out / "pretraining_data.json").read_text())
    assert metadata["max_seq_length"] == 32 and metadata["num_instances"] > 100
    config = folder / "config.json"
    config.write_text(json.dumps(TINY_CONFIG))
    return out, config


def pretrain_command(records, config, out, data="--records"):
    """12 steps of 8 on the records, or on their corpus masked on the fly (`data="--corpus"`),
    a checkpoint every 4; no XLA: compiling would dominate."""
    if data == "--records":
        source = ["--records", str(records)]
    else:
        source = ["--corpus", str(records.parent / "corpus.txt"), "--vocab", str(records.parent / "vocab.txt")]
    return [
        sys.executable, "-m", "kbert.cli", "pretrain", *source,
        "--config", str(config), "--steps", "12", "--checkpoint-every", "4",
        "--batch-size", "8", "--seq-len", "32", "--lr", "1e-2", "--no-jit",
        "--deterministic", "--seed", "7", "--dtype", "float32", "--out", str(out),
    ]


def start(command):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(process):
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]
    return output


def weights(path):
    """Every array in a Keras weights file (model and optimizer state) by its path."""
    arrays = {}

    def add(name, item):
        if isinstance(item, h5py.Dataset):
            arrays[name] = item[()]

    with h5py.File(path, "r") as f:
        f.visititems(add)
    return arrays


@pytest.mark.slow
@pytest.mark.parametrize("data", ["--records", "--corpus"])
def test_pretrain_resumes_after_sigkill_with_the_same_weights(records, tmp_path, data):
    records, config = records
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    # The uninterrupted run and the run to kill share the two cores.
    reference = start(pretrain_command(records, config, uninterrupted, data))
    victim = start(pretrain_command(records, config, resumed, data))
    checkpoint = resumed / BACKUP_FOLDER / "latest" / "windows.json"
    deadline = time.monotonic() + CHECKPOINT_TIMEOUT_S
    while not checkpoint.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    assert victim.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert checkpoint.exists() and not (resumed / HISTORY_FILE).exists()
    steps_done = 4 * json.loads(
        (resumed / BACKUP_FOLDER / "latest" / "training_metadata.json").read_text()
    )["epoch"]
    assert steps_done in (4, 8)

    output = finish(start(pretrain_command(records, config, resumed, data)))
    finish(reference)
    # Resumed at a checkpoint: fewer than the 3 windows of 4 steps were run again.
    assert 1 <= len(re.findall(r"^steps \d+-\d+ of 12$", output, re.M)) < 3, output
    assert not (resumed / BACKUP_FOLDER).exists()
    history = json.loads((resumed / HISTORY_FILE).read_text())
    expected_history = json.loads((uninterrupted / HISTORY_FILE).read_text())
    assert [w["step"] for w in history["windows"]] == [4, 8, 12]
    assert history["windows"][-1]["loss"] == pytest.approx(
        expected_history["windows"][-1]["loss"], abs=1e-6
    )
    # Op determinism on: the same weights, optimizer moments and step counter,
    # bit for bit (tolerance 0).
    expected, actual = weights(uninterrupted / WEIGHTS_FILE), weights(resumed / WEIGHTS_FILE)
    assert sorted(actual) == sorted(expected) and any("optimizer" in name for name in actual)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=0, atol=0, err_msg=name)
    assert os.listdir(resumed / LOGS_FOLDER / "train")


def test_cli_errors_are_one_line(records, tmp_path, capsys):
    records, config = records
    assert main([
        "pretrain", "--records", str(records), "--config", str(config), "--steps", "2",
        "--vocab", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "run"),
    ]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert main([
        "pretrain", "--records", str(records), "--config", str(config), "--steps", "2",
        "--seq-len", "64", "--out", str(tmp_path / "run"),
    ]) == 2
    assert "seq_len=64" in capsys.readouterr().err
    assert main([
        "pretrain", "--records", str(records), "--config", str(config), "--steps", "2",
        "--whole-word-masking", "--out", str(tmp_path / "run"),
    ]) == 2
    assert "--whole-word-masking needs --corpus" in capsys.readouterr().err
    assert main(["vocab", "--corpus", str(tmp_path / "none.txt"), "--size", "3",
                 "--out", str(tmp_path / "v.txt")]) == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["pretrain", "--records", "r", "--corpus", "c", "--config", "x", "--steps", "1",
              "--out", "o"])
    assert exit_info.value.code == 2


def test_pretrain_from_raw_text_with_whole_word_masking(records, tmp_path):
    records, config = records
    out = tmp_path / "run"
    assert main([
        "pretrain", "--corpus", str(records.parent / "corpus.txt"),
        "--vocab", str(records.parent / "vocab.txt"), "--config", str(config),
        "--whole-word-masking", "--steps", "4", "--log-every", "2", "--batch-size", "8",
        "--seq-len", "32", "--max-predictions", "5", "--no-jit", "--out", str(out),
    ]) == 0
    history = json.loads((out / HISTORY_FILE).read_text())
    assert [w["step"] for w in history["windows"]] == [2, 4]
    assert all(np.isfinite(w["masked_lm_loss"]) for w in history["windows"])
    # Raw text trains no next-sentence head: none of its figures are kept.
    assert not [key for w in history["windows"] for key in w if "next_sentence" in key]


def test_pretrain_goes_on_from_a_packaged_checkpoint_with_its_vocabulary(records, tmp_path, capsys):
    """Domain-adaptive pretraining: `--corpus` from all-MiniLM-L6-v2 needs no `--vocab` and
    reads the text with the checkpoint's casing; its missing masked-LM head starts anew, said on stderr."""
    from kbert.checkpoints import load_hf_checkpoint, resolve_checkpoint

    corpus = records[0].parent / "corpus.txt"
    out = tmp_path / "domain"
    assert main([
        "pretrain", "--corpus", str(corpus), "--init", "all-minilm-l6-v2", "--cased",
        "--steps", "2", "--out", str(out),
    ]) == 2
    assert capsys.readouterr().err.strip() == (
        "kbert: error: --cased: --init all-minilm-l6-v2 is uncased (its tokenizer lowercases); drop --cased"
    )
    assert not out.exists()
    assert main([
        "pretrain", "--corpus", str(corpus), "--init", "all-minilm-l6-v2", "--steps", "2",
        "--log-every", "1", "--batch-size", "2", "--seq-len", "32", "--optimizer", "adamw",
        "--no-jit", "--out", str(out),
    ]) == 0
    assert (
        "kbert: warning: all-minilm-l6-v2 has no cls.predictions, cls.seq_relationship; initialised anew, "
        "as Hugging Face does (pretraining trains them)"
    ) in capsys.readouterr().err.splitlines()
    source = load_hf_checkpoint(resolve_checkpoint("all-minilm-l6-v2"))
    trained = load_hf_checkpoint(str(out / "encoder"), heads=True)
    assert trained.vocabulary == source.vocabulary and trained.lowercase is True
    history = json.loads((out / HISTORY_FILE).read_text())
    assert [w["step"] for w in history["windows"]] == [1, 2]
    assert all(np.isfinite(w["masked_lm_loss"]) for w in history["windows"])


# Runs `kbert` in a new process and says whether TensorFlow was loaded when it returned.
REFUSAL_SCRIPT = """
import sys
from kbert.cli import main
code = main(sys.argv[1:])
print("tensorflow loaded" if "tensorflow" in sys.modules else "tensorflow not loaded")
sys.exit(code)
"""


def refused_before_tensorflow(argv, prefix=()):
    """The one-line error of `kbert argv`, which must come before TensorFlow loads;
    `prefix` starts the process (`skips.unprivileged_prefix`)."""
    run = subprocess.run([*prefix, sys.executable, "-c", REFUSAL_SCRIPT, *argv], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 2 and run.stdout == "tensorflow not loaded\n", (run.stdout, run.stderr[-2000:])
    assert run.stderr.startswith("kbert: error: ") and run.stderr.count("\n") == 1, run.stderr[-2000:]
    return run.stderr


def has_accelerator():
    import glob

    return any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICES)


@pytest.mark.parametrize("case", ["batch larger than the records", "batch larger than memory", "config not JSON",
                                  "out in a read-only folder"])
def test_pretrain_refuses_before_tensorflow_loads(records, tmp_path, case):
    """What would end in a traceback, or in `double free or corruption` after swapping, is one line first."""
    records, config = records
    out = tmp_path / "locked" / "run" if case == "out in a read-only folder" else tmp_path / "run"
    prefix = ()
    argv = ["pretrain", "--records", str(records), "--config", str(config), "--steps", "2", "--batch-size", "8",
            "--seq-len", "32", "--no-jit", "--out", str(out)]
    if case == "batch larger than the records":
        argv[argv.index("--batch-size") + 1] = "100000"
        expected = (r"--batch-size 100000 is larger than the (\d+) sequences --records \S+ holds \(num_instances "
                    r"in its pretraining_data\.json\); expected at most \1$")
    elif case == "batch larger than memory":
        if has_accelerator():
            pytest.skip(skips.cpu_only("activations live in the accelerator's memory: the machine's says nothing"))
        argv = ["pretrain", "--corpus", str(records.parent / "corpus.txt"),
                "--vocab", str(records.parent / "vocab.txt"), "--config", "bert_large", "--steps", "2", "--batch-size", "1000000", "--seq-len", "512",
                "--out", str(out)]
        expected = (r"--batch-size 1000000 needs at least [\d.]+ GB of activations \(24 layers of 1024, 512 tokens a "
                    r"sequence\), more than the [\d.]+ GB of memory of this machine; expected a batch of at most \d+$")
    elif case == "config not JSON":
        bad = tmp_path / "bad.json"
        bad.write_text('{"hidden_size": 16,\n "num_layers": 2 "num_heads": 2}\n')
        argv[argv.index("--config") + 1] = str(bad)
        expected = rf"{re.escape(str(bad))} is not valid JSON \(Expecting ',' delimiter: line 2 column \d+"
    else:
        prefix = skips.unprivileged_prefix()
        out.parent.mkdir()
        out.parent.chmod(0o555)
        expected = rf"--out {re.escape(str(out))}: cannot write in {re.escape(str(out.parent))} \(permission denied\)"
    try:
        err = refused_before_tensorflow(argv, prefix)
    finally:
        if out.parent.name == "locked":
            out.parent.chmod(0o755)
    assert re.search(expected, err.removeprefix("kbert: error: ").strip()), err
    assert not out.exists()


@pytest.mark.parametrize("command", ["vocab", "pretraining-data", "pretrain"])
@pytest.mark.parametrize("content", ["", " \n\n\t\n"])
def test_a_corpus_without_text_is_one_line_naming_it(records, tmp_path, capsys, command, content):
    """tf-text's vocabulary learner ended in StopIteration on an empty corpus."""
    records, config = records
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(content)
    vocab = str(records.parent / "vocab.txt")
    out = tmp_path / "out"
    argv = {
        "vocab": ["vocab", "--corpus", str(corpus), "--size", "50", "--out", str(out)],
        "pretraining-data": ["pretraining-data", "--corpus", str(corpus), "--vocab", vocab, "--out", str(out),
                             "--workers", "1"],
        "pretrain": ["pretrain", "--corpus", str(corpus), "--vocab", vocab, "--config", str(config), "--steps", "2",
                     "--batch-size", "8", "--seq-len", "32", "--no-jit", "--out", str(out)],
    }[command]
    err = error_of(argv, capsys, after_progress=True)
    assert re.search(rf"{re.escape(str(corpus))} holds no text \(only blank lines, or nothing\); expected one "
                     "sentence a line", err), err
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt"]


def test_pretrain_follows_the_umask_and_a_finished_run_says_how_to_go_on(records, tmp_path, capsys):
    """`encoder/` was 0700 and its safetensors 0600 under any umask; rerunning a finished run said only
    that --out was not empty."""
    records, config = records
    out = tmp_path / "run"
    argv = ["pretrain", "--records", str(records), "--config", str(config), "--steps", "2", "--batch-size", "8",
            "--seq-len", "32", "--no-jit", "--out", str(out)]
    previous = os.umask(0o027)
    try:
        assert main(argv) == 0
    finally:
        os.umask(previous)
    entries = [str(out)] + [os.path.join(root, name) for root, dirs, files in os.walk(out) for name in dirs + files]
    modes = {os.path.relpath(p, out): stat.S_IMODE(os.stat(p).st_mode) for p in entries}
    assert "encoder/model.safetensors" in modes
    assert modes == {p: 0o750 if os.path.isdir(out / p) else 0o640 for p in modes}
    capsys.readouterr()
    err = error_of(argv, capsys)
    encoder = out / "encoder"
    assert re.search(rf"--out {re.escape(str(out))} holds a finished run \(2 steps\), with nothing to resume; to "
                     rf"pretrain it further, run again with --init {re.escape(str(encoder))} and a new folder$",
                     err), err
    assert sorted(os.listdir(out)) == sorted(["encoder", "history.json", "logs", "pretrainer.weights.h5"])
