"""The model card (`README.md`) that finetune, distill, `TaskModel.save_folder` and export write."""

import hashlib
import json
import os
import shutil

import keras
import pytest
import yaml

from kbert import modelcard
from kbert.cli import main
from kbert.fileio import read_manifest
from kbert.plots import PNG_SIGNATURE, is_kbert_png
from tests.task_harness import minilm_vocabulary
from tests.test_cli import subset, write_csv

# A one-block BERT of width 16: fine-tuning it takes seconds.
FAST = ["--seq-len", "16", "--batch-size", "8", "--lr", "1e-3", "--dtype", "float32"]


def card_parts(path):
    """`(front matter as YAML reads it, the Markdown after it)` of the card at `path`."""
    text = open(path, encoding="utf-8").read()
    assert text.startswith("---\n"), text[:80]
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def check_png(path, min_bytes=5_000):
    data = open(path, "rb").read()
    assert data[:8] == PNG_SIGNATURE and len(data) > min_bytes, (path, len(data))
    assert is_kbert_png(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny topic model fine-tuned through the CLI, two epochs, with TensorBoard logs."""
    from kbert.checkpoints import save_hf_checkpoint
    from kbert.config import BertConfig
    from kbert.models import bert_encoder

    folder = tmp_path_factory.mktemp("card")
    config = BertConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=64)
    keras.utils.set_random_seed(0)
    save_hf_checkpoint(bert_encoder(config), config, list(minilm_vocabulary()), str(folder / "bert"))
    train = write_csv(folder / "train.csv", subset("train", 8))
    dev = write_csv(folder / "dev.csv", subset("dev", 4))
    out, logs = str(folder / "topics"), str(folder / "logs")
    code = main(["finetune", "--train", train, "--dev", dev, "--init", str(folder / "bert"), "--out", out,
                 "--epochs", "2", "--tensorboard", logs, *FAST])
    assert code == 0
    return {"folder": folder, "train": train, "dev": dev, "model": out, "logs": logs}


def test_finetune_writes_a_model_card_whose_figures_are_the_folders(trained):
    model = trained["model"]
    metadata, body = card_parts(os.path.join(model, "README.md"))
    metrics = json.load(open(os.path.join(model, "metrics.json")))
    settings = json.load(open(os.path.join(model, "kbert.json")))
    assert metadata["library_name"] == "kbert" and metadata["pipeline_tag"] == "text-classification"
    result = metadata["model-index"][0]["results"][0]
    values = {m["type"]: m["value"] for m in result["metrics"]}
    assert values["accuracy"] == metrics["accuracy"] and values["macro_f1"] == metrics["macro_f1"]
    assert metadata["metrics"][0] == "accuracy"  # the task's own figure first
    # The data, named by file and hash, as kbert.json records it.
    for role in ("train", "dev"):
        entry = metadata["kbert"]["data"][role]
        assert entry["file"] == os.path.basename(trained[role]) and entry["sha256"] == sha256(trained[role])
    assert settings["data"] == metadata["kbert"]["data"]
    assert result["dataset"]["revision"] == f"sha256:{sha256(trained['dev'])}"
    assert metadata["datasets"] == ["train.csv", "dev.csv"]
    # What it predicts, how it was trained, its figures, its limits and how to use it.
    assert "- labels: `games`, `mail`, `math` — class names, in output order" in body
    assert "| `epochs` | 2 |" in body and "| `learning_rate` | 0.001 |" in body
    assert f"| {100 * metrics['accuracy']:.2f} |" in body and "figures are on `dev.csv` alone (12 examples)" in body
    assert "reads at most 16 WordPiece pieces at once; longer texts are cut (`truncate=head_tail`)" in body
    assert 'kbert.TaskModel.from_folder("topics")' in body and "kbert predict --model topics" in body
    assert '"signature_name": "serving_default"' in body and "mobile/README.md" in body
    assert "![training loss and dev figures](training.png)" in body


def test_finetune_draws_training_png_and_keeps_tensorboard_logs(trained):
    model = trained["model"]
    check_png(os.path.join(model, "training.png"))
    # New files are kbert's: --overwrite replaces the folder with them.
    assert {"README.md", "training.png"} <= read_manifest(model)
    events = [name for _, _, names in os.walk(trained["logs"]) for name in names if "tfevents" in name]
    assert events, os.listdir(trained["logs"])
    metrics = json.load(open(os.path.join(model, "metrics.json")))
    assert metrics["steps_per_epoch"] == 3  # 24 rows in batches of 8


def test_overwrite_replaces_the_card_and_picture_kbert_wrote(trained, tmp_path):
    copy = str(tmp_path / "topics")
    shutil.copytree(trained["model"], copy)
    code = main(["finetune", "--train", trained["train"], "--dev", trained["dev"],
                 "--init", str(trained["folder"] / "bert"), "--out", copy, "--epochs", "1", "--overwrite", *FAST])
    assert code == 0 and "| `epochs` | 1 |" in card_parts(os.path.join(copy, "README.md"))[1]
    check_png(os.path.join(copy, "training.png"))


def test_a_card_the_user_wrote_is_never_replaced(trained, tmp_path, capsys):
    """A README.md of the user's in a model folder written before cards is theirs: --overwrite refuses."""
    old = tmp_path / "old"
    old.mkdir()
    for name in ("kbert.json", "metrics.json", "model.keras", "vocab.txt"):
        (old / name).write_bytes(open(os.path.join(trained["model"], name), "rb").read())
    (old / "README.md").write_text("my notes", encoding="utf-8")
    code = main(["finetune", "--train", trained["train"], "--dev", trained["dev"],
                 "--init", str(trained["folder"] / "bert"), "--out", str(old), "--overwrite", *FAST])
    assert code != 0 and "README.md, which kbert did not write" in capsys.readouterr().err
    assert (old / "README.md").read_text(encoding="utf-8") == "my notes"


def test_distill_writes_a_card_of_the_student(trained, tmp_path):
    out = str(tmp_path / "student")
    code = main(["distill", "--teacher", trained["model"], "--train", trained["train"], "--dev", trained["dev"],
                 "--out", out, "--epochs", "1", "--batch-size", "8", "--dtype", "float32"])
    assert code == 0
    metadata, body = card_parts(os.path.join(out, "README.md"))
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    values = {m["type"]: m["value"] for m in metadata["model-index"][0]["results"][0]["metrics"]}
    assert values["accuracy"] == metrics["accuracy"]
    assert f"Distilled (`kbert distill`) from the teacher `{trained['model']}`, student `layers:1`." in body
    assert metadata["kbert"]["data"]["train"]["sha256"] == sha256(trained["train"])
    check_png(os.path.join(out, "training.png"))


def test_save_folder_writes_a_card_without_figures(tmp_path):
    from kbert.training.task_model import TaskModel

    model = TaskModel.from_checkpoint(str(_tiny_checkpoint(tmp_path)), task="text-pair-regression",
                                      score_range=(0, 5), sequence_length=16)
    model.save_folder(str(tmp_path / "pairs"))
    metadata, body = card_parts(tmp_path / "pairs" / "README.md")
    assert metadata["pipeline_tag"] == "sentence-similarity" and "model-index" not in metadata
    assert "- score_range: `0`, `5` — the training scores' [lowest, highest]" in body
    assert "No dev figures are recorded" in body and "mobile/README.md" not in body
    assert 'model.predict_labels((["A man plays a guitar."], ["A man plays music."]))' in body
    assert not os.path.exists(tmp_path / "pairs" / "training.png")  # no training curve to draw
    assert "README.md" in read_manifest(str(tmp_path / "pairs"))


def _tiny_checkpoint(folder):
    from kbert.checkpoints import save_hf_checkpoint
    from kbert.config import BertConfig
    from kbert.models import bert_encoder

    config = BertConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=64)
    save_hf_checkpoint(bert_encoder(config), config, list(minilm_vocabulary()), str(folder / "bert"))
    return folder / "bert"


@pytest.mark.parametrize("value", [
    "plain", 'a "quoted": value # not a comment', "ünïcødé — dash", "two\nlines", "", "- dash", "yes", "1e3",
    0, -2.5, 1e-12, True, None, [], {}, ["a", {"b": [1, "c"]}], {"nested": {"deeper": ["x", None]}},
])
def test_front_matter_reads_back_as_written(value):
    values = {"key": value, "list": [{"name": "n", "results": [{"value": value}]}]}
    text = modelcard.front_matter(values)
    assert text.startswith("---\n") and text.endswith("---\n")
    assert yaml.safe_load(text[4:-4]) == values


def test_export_writes_a_card_and_a_chart_of_each_files_figures(trained, tmp_path):
    from kbert.export.exporter import export_model
    from kbert.plots import report_chart

    out = tmp_path / "topics-export"
    report = export_model(trained["model"], str(out), data=trained["dev"], formats="tflite", quantizations="none",
                          latency_runs=2, log=lambda line: None)
    metadata, body = card_parts(out / "README.md")
    keras_figures = report["keras"]
    values = {m["type"]: m["value"] for m in metadata["model-index"][0]["results"][0]["metrics"]}
    assert values == {name: keras_figures[name] for name in report["figures"]}
    assert metadata["kbert"]["data"] == json.load(open(os.path.join(trained["model"], "kbert.json")))["data"]
    assert metadata["model-index"][0]["results"][0]["dataset"]["revision"] == f"sha256:{sha256(trained['dev'])}"
    for entry in report["artefacts"]:  # each file's size, latency and figure, as the report has them
        assert (f"| `{entry['path']}` | tflite | {entry['quantization']} | {entry['size_bytes'] / 2**20:.1f} MiB | "
                f"{entry['latency']['median_ms']:.2f} ms | {100 * entry['accuracy']:.2f} | yes |") in body
    assert "TF Serving" not in body  # no SavedModel in this export
    assert "Fine-tuned (`kbert finetune`) from" in body and "| `epochs` | 2 |" in body  # the model folder's recipe
    # report.png, shown in report.md and on the card, draws the report's figures.
    check_png(out / "report.png")
    assert "![size, latency and accuracy of each file](report.png)" in (out / "report.md").read_text()
    assert "](report.png)" in body and {"README.md", "report.png"} <= read_manifest(str(out))
    drawn = report_chart(report, str(tmp_path / "again.png"))
    assert drawn["latency_ms"] == [e["latency"]["median_ms"] for e in report["artefacts"]]
    assert drawn["accuracy"] == [100 * e["accuracy"] for e in report["artefacts"]]
    assert (tmp_path / "again.png").read_bytes() == (out / "report.png").read_bytes()
