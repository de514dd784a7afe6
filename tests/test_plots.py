"""Pictures (`kbert.plots`): `evaluate --plots`, the training curve, the export report's chart."""

import json
import os

import numpy as np
import pytest

from kbert.cli import main
from kbert.config import BertConfig
from kbert.modelfolder import ModelFolder
from kbert.plots import (
    CONFUSION_PLOT,
    PER_LABEL_PLOT,
    PER_TYPE_PLOT,
    PNG_SIGNATURE,
    SCATTER_PLOT,
    confusion_figure,
    evaluation_plots,
    interval_losses,
    is_kbert_png,
    training_figures,
)
from kbert.tasks.classification import classification_metrics
from kbert.tasks.text_pair_regression import regression_metrics
from tests.task_harness import write_task_folder
from tests.test_cli import LABELS, subset, write_csv

# One block of width 16 on MiniLM's vocabulary: a model folder in a second.
TINY = BertConfig(vocab_size=30522, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                  max_position_embeddings=64)


def check_png(path, min_bytes=5_000):
    data = open(path, "rb").read()
    assert data[:8] == PNG_SIGNATURE and len(data) > min_bytes, (path, len(data))
    assert is_kbert_png(path)


def evaluated(model, data):
    """`(task, examples, predictions, figures)` of the model folder `model` on `data`."""
    folder = ModelFolder.load(model)
    examples = folder.task.read(data, folder.use_options())
    figures, predictions = folder.evaluated(examples, data)
    return folder.task, examples, predictions, figures


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plots")
    model = write_task_folder(folder / "model", "text-classification", {"labels": list(LABELS)}, TINY, seed=3)
    return {"folder": folder, "model": model, "dev": write_csv(folder / "dev.csv", subset("dev", 6))}


def test_evaluate_plots_a_confusion_matrix_of_the_figures_it_prints(classifier, tmp_path, capsys):
    plots = tmp_path / "plots"
    assert main(["evaluate", "--model", classifier["model"], "--data", classifier["dev"], "--plots", str(plots)]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert f"drew {plots / CONFUSION_PLOT}" in captured.err
    assert sorted(os.listdir(plots)) == [CONFUSION_PLOT]
    check_png(plots / CONFUSION_PLOT)
    # The counts drawn are the figures printed: accuracy, and each class's F1.
    task, examples, predictions, figures = evaluated(classifier["model"], classifier["dev"])
    assert figures == printed
    drawn = evaluation_plots(task, examples, predictions, figures, str(tmp_path / "again"))
    counts = np.array(drawn[str(tmp_path / "again" / CONFUSION_PLOT)]["counts"])
    assert counts.sum() == printed["n"] == 18
    assert counts.trace() / counts.sum() == printed["accuracy"]
    gold = np.repeat(np.arange(3), counts.sum(axis=1))
    predicted = np.concatenate([np.repeat(np.arange(3), row) for row in counts])
    assert classification_metrics(gold, predicted, list(LABELS))["per_class_f1"] == printed["per_class_f1"]
    # The same counts give the same picture, bit for bit: the command drew these.
    assert (plots / CONFUSION_PLOT).read_bytes() == (tmp_path / "again" / CONFUSION_PLOT).read_bytes()
    # Each cell's text is its count.
    figure = confusion_figure(list(LABELS), counts.tolist(), "t")
    cells = {(int(round(t.get_position()[1])), int(round(t.get_position()[0]))): int(t.get_text())
             for t in figure.axes[0].texts}
    assert cells == {(i, j): int(counts[i, j]) for i in range(3) for j in range(3) if counts[i, j]}


def test_evaluate_replaces_only_its_own_pictures(classifier, tmp_path, capsys):
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / CONFUSION_PLOT).write_bytes(b"the user's")
    argv = ["evaluate", "--model", classifier["model"], "--data", classifier["dev"], "--plots", str(plots)]
    assert main(argv) != 0
    assert f"{CONFUSION_PLOT} exists and is not a picture kbert drew" in capsys.readouterr().err
    assert (plots / CONFUSION_PLOT).read_bytes() == b"the user's"
    (plots / CONFUSION_PLOT).unlink()
    assert main(argv) == 0 and main(argv) == 0  # the second run replaces the first one's picture
    check_png(plots / CONFUSION_PLOT)
    model_plots = ["evaluate", "--model", classifier["model"], "--data", classifier["dev"],
                   "--plots", os.path.join(classifier["model"], "plots")]
    assert main(model_plots) != 0 and "is inside --model" in capsys.readouterr().err


def test_named_entities_get_each_types_figures(tmp_path):
    tags = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    model = write_task_folder(tmp_path / "ner", "token-classification", {"tags": tags, "scheme": "IOB2"}, TINY)
    sentences = [("Ann", "B-PER"), ("lives", "O"), ("in", "O"), ("New", "B-LOC"), ("York", "I-LOC")]
    data = tmp_path / "dev.conll"
    data.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in sentences) for _ in range(6)) + "\n")
    task, examples, predictions, figures = evaluated(model, str(data))
    drawn = evaluation_plots(task, examples, predictions, figures, str(tmp_path / "plots"))
    assert list(drawn) == [str(tmp_path / "plots" / PER_TYPE_PLOT)]
    values = drawn[str(tmp_path / "plots" / PER_TYPE_PLOT)]
    assert values == {kind: [f["precision"], f["recall"], f["f1"]] for kind, f in figures["per_type"].items()}
    assert set(values) >= {"LOC", "PER"}
    check_png(tmp_path / "plots" / PER_TYPE_PLOT)


def test_multi_label_gets_each_labels_figures(tmp_path):
    labels = ["games", "mail", "net"]
    model = write_task_folder(tmp_path / "ml", "multi-label-classification", {"labels": labels}, TINY)
    rows = [("A chess game.", "games"), ("A mail client.", "mail;net"), ("A web proxy.", "net"), ("Email.", "mail")]
    data = write_csv(tmp_path / "dev.csv", rows * 3, header=("text", "labels"))
    task, examples, predictions, figures = evaluated(model, data)
    drawn = evaluation_plots(task, examples, predictions, figures, str(tmp_path / "plots"))
    values = drawn[str(tmp_path / "plots" / PER_LABEL_PLOT)]
    assert values == {name: [f["precision"], f["recall"], f["f1"]] for name, f in figures["per_label"].items()}
    check_png(tmp_path / "plots" / PER_LABEL_PLOT)


def test_pair_regression_gets_predicted_against_gold(tmp_path):
    model = write_task_folder(tmp_path / "sts", "text-pair-regression", {}, TINY)
    rows = [("A man plays a guitar.", "A man plays music.", "4.2"), ("A cat sleeps.", "The stock fell.", "0.1"),
            ("Two dogs run.", "Dogs are running.", "3.8"), ("It rains.", "A woman cooks.", "0.5")]
    data = write_csv(tmp_path / "dev.csv", rows * 2, header=("sentence1", "sentence2", "score"))
    task, examples, predictions, figures = evaluated(model, data)
    drawn = evaluation_plots(task, examples, predictions, figures, str(tmp_path / "plots"))
    points = drawn[str(tmp_path / "plots" / SCATTER_PLOT)]
    assert points["gold"] == [float(r[2]) for r in rows * 2]
    recomputed = regression_metrics(np.array(points["gold"]), np.array(points["predicted"]))
    assert abs(recomputed["spearman"] - figures["spearman"]) < 1e-12
    assert abs(recomputed["pearson"] - figures["pearson"]) < 1e-6  # the scores as predict_json rounds them
    check_png(tmp_path / "plots" / SCATTER_PLOT)


def test_interval_losses_undo_keras_running_mean():
    """Keras logs the mean loss since the epoch began; each logged point becomes its interval's mean."""
    rng = np.random.default_rng(0)
    per_epoch, every, epochs = 7, 2, 3
    losses = rng.uniform(0.1, 2.0, per_epoch * epochs)
    steps, running = [], []
    for step in range(1, per_epoch * epochs + 1):
        start = (step - 1) // per_epoch * per_epoch
        if step % every == 0:
            steps.append(step)
            running.append(float(losses[start:step].mean()))
    expected, previous = [], None
    for step in steps:
        epoch_start = (step - 1) // per_epoch * per_epoch
        begin = previous if previous is not None and previous > epoch_start else epoch_start
        expected.append(losses[begin:step].mean())
        previous = step
    np.testing.assert_allclose(interval_losses(steps, running, per_epoch), expected, rtol=1e-12)
    metrics = {"training_curve": [{"step": s, "loss": v} for s, v in zip(steps, running)],
               "steps_per_epoch": per_epoch, "resumed_from_epoch": 1,
               "history": {"loss": [1.0, 0.9], "val_loss": [1.1, 1.0], "val_accuracy": [0.5, 0.6]}}
    curve_steps, drawn, dev, per_interval = training_figures(metrics)
    assert per_interval and curve_steps == steps and np.allclose(drawn, expected)
    assert dev == {"loss": ([2, 3], [1.1, 1.0]), "accuracy": ([2, 3], [0.5, 0.6])}  # resumed at epoch 1
    assert training_figures({"training_curve": []}) is None
