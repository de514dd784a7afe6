"""The `kbert` command line end to end, on a tiny model, plus its bad-input errors."""

import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from kbert.checkpoints import resolve_checkpoint
from kbert.cli import main

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "debian-packages")
LABELS = ("games", "mail", "math")


def write_csv(path, rows, header=("text", "label")):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        if header:
            writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def subset(split, per_label):
    """The first `per_label` rows of each of three labels from the shipped data."""
    counts = {label: 0 for label in LABELS}
    rows = []
    with open(os.path.join(DATA, f"{split}.csv"), newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["label"] in counts and counts[row["label"]] < per_label:
                counts[row["label"]] += 1
                rows.append((row["text"], row["label"]))
    return rows


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def vocab():
    return os.path.join(resolve_checkpoint("all-minilm-l6-v2"), "vocab.txt")


# bert_tiny from random weights on 48 texts: at 2e-3 it leaves chance after about 4
# epochs, and by 12 its training loss is 0.47 (seeds 0 and 1), where a model that
# learned nothing stays at ln 3 = 1.10 on three balanced labels (measured at 1e-9:
# 1.098), and it labels 0.67 of its training texts right (chance: 1/3). 12 epochs
# take the time 2 did: start-up and XLA compiling are the cost.
EPOCHS, LEARNING_RATE = 12, 2e-3
LEARNED_LOSS = 0.75 * math.log(3)
LEARNED_ACCURACY = 0.5


@pytest.fixture(scope="module")
def trained(workdir, vocab):
    """A tiny model fine-tuned through the CLI with XLA, mixed_bfloat16 and no attention dropout."""
    train = write_csv(workdir / "train.csv", subset("train", 16))
    dev = write_csv(workdir / "dev.csv", subset("dev", 6))
    out = str(workdir / "model")
    code = main([
        "finetune", "--train", train, "--dev", dev, "--init", "bert_tiny", "--vocab", vocab,
        "--seq-len", "32", "--batch-size", "8", "--epochs", str(EPOCHS), "--lr", str(LEARNING_RATE),
        "--xla", "--dtype", "mixed_bfloat16", "--attention-dropout", "0", "--out", out,
    ])
    assert code == 0
    return {"train": train, "dev": dev, "model": out}


def test_finetune_writes_model_folder(trained):
    files = sorted(os.listdir(trained["model"]))
    assert files == [".kbert-manifest.json", "README.md", "kbert.json", "metrics.json", "model.keras", "training.png",
                     "vocab.txt"]
    with open(os.path.join(trained["model"], "metrics.json")) as f:
        metrics = json.load(f)
    assert set(metrics["per_class_f1"]) == set(LABELS) and metrics["n"] == 18
    assert metrics["training_curve"] and len(metrics["history"]["loss"]) == EPOCHS
    # It learned its training texts.
    history = metrics["history"]
    assert history["loss"][-1] < LEARNED_LOSS and history["accuracy"][-1] > LEARNED_ACCURACY, history
    with open(os.path.join(trained["model"], "kbert.json")) as f:
        settings = json.load(f)
    config = settings["bert_config"]
    assert config["attention_dropout"] == 0.0 and config["hidden_dropout"] == 0.1
    # The recipe flags given, in place of the task's recipe.
    assert settings["sequence_length"] == 32
    assert {k: settings["training"][k] for k in ("epochs", "batch_size", "learning_rate", "jit_compile")} == {
        "epochs": EPOCHS, "batch_size": 8, "learning_rate": LEARNING_RATE, "jit_compile": True,
    }
    # No staging folder left beside the output.
    assert not [n for n in os.listdir(os.path.dirname(trained["model"])) if n.startswith(".kbert")]


def test_finetune_without_recipe_flags_runs_the_tasks_recipe_under_dtype_auto(workdir, vocab, capsys):
    """No recipe flag: the task's recipe (`make run`'s), recorded in kbert.json; the default
    `--dtype auto` trains under the policy `kbert.hardware` picks for this device, says so,
    and the model folder stores that policy, not "auto"."""
    from kbert.hardware import resolve_dtype

    out = str(workdir / "model-auto")
    code = main([
        "finetune", "--train", write_csv(workdir / "train-auto.csv", subset("train", 4)),
        "--dev", write_csv(workdir / "dev-auto.csv", subset("dev", 2)), "--init", "bert_tiny",
        "--vocab", vocab, "--out", out,
    ])
    assert code == 0
    chosen = resolve_dtype("auto")
    assert f"dtype auto: {chosen} (this device" in capsys.readouterr().err
    with open(os.path.join(out, "kbert.json")) as f:
        settings = json.load(f)
    assert settings["dtype"] == chosen
    assert settings["sequence_length"] == 128 and settings["task_settings"]["truncate"] == "head_tail"
    assert settings["training"] == {
        "epochs": 2, "batch_size": 32, "learning_rate": 1e-4, "warmup_fraction": 0.1,
        "weight_decay": 0.01, "layer_decay": 1.0, "ema_momentum": None, "reinit_pooler": False,
        "attention_dropout": None, "jit_compile": False, "seed": 0, "adapt_steps": 0, "probe_head": True,
        "init_head": False,
    }
    from kbert.modelfolder import ModelFolder

    assert ModelFolder.load(out).compute_dtype == ("bfloat16" if chosen == "mixed_bfloat16" else "float32")


def test_evaluate_matches_metrics_json(trained, capsys):
    assert main(["evaluate", "--model", trained["model"], "--data", trained["dev"]]) == 0
    result = json.loads(capsys.readouterr().out)
    with open(os.path.join(trained["model"], "metrics.json")) as f:
        metrics = json.load(f)
    assert result["n"] == 18
    assert result["accuracy"] == pytest.approx(metrics["accuracy"])
    assert result["macro_f1"] == pytest.approx(metrics["macro_f1"])


def test_predict_texts_and_file(trained, workdir, capsys):
    assert main(["predict", "--model", trained["model"], "A chess game.", "An IMAP server."]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["text"] for row in rows] == ["A chess game.", "An IMAP server."]
    for row in rows:
        assert row["label"] in LABELS
        assert sum(row["scores"].values()) == pytest.approx(1.0, abs=1e-5)
        assert row["label"] == max(row["scores"], key=row["scores"].get)
    (workdir / "in.txt").write_text("one\ntwo\nthree\n")
    assert main(["predict", "--model", trained["model"], "--input", str(workdir / "in.txt")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_embed_from_finetuned_model(trained, workdir):
    (workdir / "texts.json").write_text(json.dumps(["a game", "?", "mail server"]))
    out = workdir / "emb.npy"
    assert main(["embed", "--model", trained["model"], "--input", str(workdir / "texts.json"),
                 "--output", str(out)]) == 0
    embeddings = np.load(out)
    assert embeddings.shape == (3, 128)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=-1), 1.0, atol=1e-5)


def test_embed_from_packaged_checkpoint_matches_reference(workdir):
    reference_dir = os.path.join(os.path.dirname(__file__), "data", "minilm_reference")
    with open(os.path.join(reference_dir, "sentences.json"), encoding="utf-8") as f:
        sentences = json.load(f)
    # The reference embeds an empty sentence too, which kbert refuses.
    kept = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    (workdir / "sentences.json").write_text(json.dumps([sentences[i] for i in kept]))
    out = workdir / "minilm.npy"
    assert main(["embed", "--model", "all-minilm-l6-v2", "--input", str(workdir / "sentences.json"),
                 "--output", str(out)]) == 0
    expected = np.load(os.path.join(reference_dir, "minilm_reference.npz"))["sentence_embeddings"][kept]
    assert len(kept) == len(sentences) - 1 and np.sum(np.load(out) * expected, axis=-1).min() >= 0.99999


def test_tokenize(vocab, capsys):
    assert main(["tokenize", "--vocab", vocab, "BERT is a bidirectional transformer encoder."]) == 0
    ids = json.loads(capsys.readouterr().out)
    # The Hugging Face tokenizer's ids for this string (tests/data/minilm_reference).
    assert ids == [101, 14324, 2003, 1037, 7226, 7442, 7542, 2389, 10938, 2121, 4372, 16044, 2099, 1012, 102]


def error_of(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("kbert: error: ") and err.count("\n") == 1, err
    return err


def test_bad_inputs_give_one_line_errors(trained, workdir, vocab, capsys):
    base = ["finetune", "--init", "bert_tiny", "--vocab", vocab, "--out", str(workdir / "bad")]
    err = error_of(base + ["--train", str(workdir / "missing.csv"), "--dev", trained["dev"]], capsys)
    assert "missing.csv: no such file" in err
    empty = write_csv(workdir / "empty.csv", [], header=None)
    assert "is empty" in error_of(base + ["--train", empty, "--dev", trained["dev"]], capsys)
    header_only = write_csv(workdir / "header.csv", [])
    assert "no rows" in error_of(base + ["--train", header_only, "--dev", trained["dev"]], capsys)
    err = error_of(base + ["--train", trained["train"], "--dev", trained["dev"], "--label-column", "topic"], capsys)
    assert "no column 'topic'" in err
    assert not os.path.exists(workdir / "bad")

    unknown = write_csv(workdir / "unknown.csv", [("a text", "cooking")])
    err = error_of(["evaluate", "--model", trained["model"], "--data", unknown], capsys)
    assert "['cooking']" in err
    err = error_of(["evaluate", "--model", str(workdir / "nomodel"), "--data", trained["dev"]], capsys)
    assert "no such model folder" in err
    err = error_of(["predict", "--model", trained["model"]], capsys)
    assert "TEXT arguments or --input" in err
    err = error_of(["embed", "--model", trained["model"], "--input", trained["dev"],
                    "--output", str(workdir / "x.txt")], capsys)
    assert "expected a .npy" in err


def test_corrupt_model_folder(trained, workdir, capsys):
    broken = workdir / "broken"
    broken.mkdir()
    for name in os.listdir(trained["model"]):
        (broken / name).write_bytes(open(os.path.join(trained["model"], name), "rb").read())
    (broken / "model.keras").write_bytes(b"not a zip")
    assert "model.keras is damaged: not a complete .keras zip archive" in error_of(
        ["evaluate", "--model", str(broken), "--data", trained["dev"]], capsys
    )


def test_console_script_exit_status(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kbert.cli", "evaluate", "--model", str(tmp_path / "none"),
         "--data", str(tmp_path / "none.csv")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("kbert: error: ")
    assert "Traceback" not in result.stderr
    help_result = subprocess.run(
        [sys.executable, "-m", "kbert.cli", "finetune", "--help"], capture_output=True, text=True
    )
    assert help_result.returncode == 0 and "--init" in help_result.stdout


def test_unknown_strategy(trained, vocab, workdir, capsys):
    err = error_of(["finetune", "--train", trained["train"], "--dev", trained["dev"],
                    "--init", "bert_tiny", "--vocab", vocab, "--strategy", "gpu-farm",
                    "--out", str(workdir / "s")], capsys)
    assert "strategy='gpu-farm'" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["vocab", "--corpus", "c.txt", "--size", "abc", "--out", "v.txt"],
         "argument --size: 'abc' is not an integer"),
        (["pretrain", "--records", "r", "--steps", "0", "--out", "o"],
         "argument --steps: 0 is not a positive integer"),
        (["export", "--model", "m", "--threads", "-2"],
         "argument --threads: -2 is not a positive integer"),
    ],
)
def test_counts_must_be_positive_integers(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
