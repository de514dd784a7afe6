"""multi-label-classification: reading, figures against scikit-learn, the threshold, the
command line, `TaskModel`, distillation's loss, and every export artefact checked by hand."""

import csv
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from kbert.cli import main
from kbert.modelfolder import ModelFolder
from kbert.tasks import TASKS
from kbert.tasks.multi_label_classification import MultiLabelClassification, multi_label_metrics, sigmoid
from kbert.training.task_model import TaskModel
from tests.task_harness import minilm_vocabulary, task_instance

NAME = MultiLabelClassification.name
LABELS = ["editors", "games", "net"]
# Texts and their labels: each label's words appear in its texts, so a model can learn them.
ROWS = [
    ("A text editor for the terminal.", "editors"),
    ("A strategy game played over the network.", "games;net"),
    ("A web server and network proxy.", "net"),
    ("An editor of game levels.", "editors;games"),
    ("A puzzle game with falling blocks.", "games"),
    ("A network daemon with a web editor.", "editors;net"),
    ("Fonts for the console.", ""),
    ("A card game for two players.", "games"),
]


def write_rows(path, rows, separator=";", header=("text", "labels")):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t" if str(path).endswith(".tsv") else ",")
        writer.writerow(header)
        writer.writerows((text, labels.replace(";", separator)) for text, labels in rows)
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A one-block, 16-wide BERT on MiniLM's vocabulary as a Hugging Face folder, and data."""
    from kbert.checkpoints import save_hf_checkpoint
    from kbert.config import BertConfig
    from kbert.models import bert_encoder

    folder = tmp_path_factory.mktemp("tiny")
    config = BertConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=64)
    keras.utils.set_random_seed(0)
    save_hf_checkpoint(bert_encoder(config), config, list(minilm_vocabulary()), str(folder / "bert"))
    write_rows(folder / "data.csv", ROWS)
    return folder


# === Data ===


def test_reads_label_lists_and_learns_the_label_names(tmp_path):
    path = write_rows(tmp_path / "d.tsv", ROWS, separator="|")
    examples = MultiLabelClassification.read(path, {"label_separator": "|"})
    assert [e.target for e in examples[:2]] == [("editors",), ("games", "net")]
    assert examples[6].target == () and examples[6].line == 8
    assert MultiLabelClassification.learn(examples, path) == {"labels": LABELS}
    task = task_instance(NAME, {"labels": LABELS})
    np.testing.assert_array_equal(task.targets(examples[:2]), [[1, 0, 0], [0, 1, 1]])
    assert task.read(path, {"label_separator": "|"}, targets=False)[0].target is None


def test_reads_one_column_per_label(tmp_path, capsys):
    """`--label-columns`: a 0/1 column per label (as the Jigsaw toxic-comments files), read as the label lists."""
    path = tmp_path / "flags.csv"
    path.write_text("comment,editors,games,net\nA text editor.,1,0,0\nA network game.,0,1,1\nA font.,0,0,0\n")
    options = {"text_column": "comment", "label_columns": "editors, games,net"}
    examples = MultiLabelClassification.read(str(path), options)
    assert [e.target for e in examples] == [("editors",), ("games", "net"), ()]
    assert MultiLabelClassification.learn(examples, str(path)) == {"labels": LABELS}
    jsonl = tmp_path / "flags.jsonl"
    jsonl.write_text('{"comment": "A game.", "editors": 0, "games": 1, "net": 0}\n')
    assert MultiLabelClassification.read(str(jsonl), options)[0].target == ("games",)
    path.write_text("comment,editors,games,net\nA text editor.,1,yes,0\n")
    with pytest.raises(ValueError, match=r"flags\.csv, line 2: column 'games' holds 'yes'; expected 1 or 0"):
        MultiLabelClassification.read(str(path), options)
    jsonl.write_text('{"comment": "A game.", "editors": 0, "games": true, "net": 0}\n')
    with pytest.raises(ValueError, match=r"flags\.jsonl, line 1: 'games' is True; expected a string or a number"):
        MultiLabelClassification.read(str(jsonl), options)
    for bad in ("editors,,net", "editors,editors", "comment,games"):
        with pytest.raises(ValueError, match=r"label_columns=.*expected distinct column names"):
            MultiLabelClassification.read(str(path), {**options, "label_columns": bad})
    with pytest.raises(SystemExit):
        main(["finetune", "--task", NAME, "--help"])
    assert "--label-columns" in capsys.readouterr().out


@pytest.mark.parametrize("rows, options, message", [
    ([("a text", "editors;sports")], {}, r"d\.csv, line 2: label 'sports' is not one the model knows"),
    ([("  ", "editors")], {}, r"d\.csv, line 2: empty 'text'"),
    ([("a text", "editors")], {"label_separator": " "}, r"label_separator=' '; expected a non-blank string"),
])
def test_bad_data_is_refused_naming_the_line(tmp_path, rows, options, message):
    path = write_rows(tmp_path / "d.csv", rows)
    with pytest.raises(ValueError, match=message):
        task_instance(NAME, {"labels": LABELS}).check(MultiLabelClassification.read(path, options), path)


def test_settings_are_checked():
    with pytest.raises(ValueError, match=r"threshold=1\.5; expected a probability"):
        task_instance(NAME, {"labels": LABELS, "threshold": 1.5})
    with pytest.raises(ValueError, match="at least 2"):
        MultiLabelClassification.learn(MultiLabelClassification.examples_from_inputs(
            task_instance(NAME, {"labels": LABELS}), ["a"], [["x"]]), "y")


# === Figures ===


def test_figures_are_scikit_learns():
    from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support

    rng = np.random.default_rng(0)
    gold = rng.random((200, 7)) < 0.3
    predicted = rng.random((200, 7)) < 0.3
    gold[:, 6] = predicted[:, 6] = False  # a label nobody has: F1 0, as zero_division=0
    gold[5], predicted[5] = False, False  # an example with no label either way
    got = multi_label_metrics(gold, predicted, [f"l{i}" for i in range(7)])
    for average in ("micro", "macro", "samples"):
        assert got[f"{average}_f1"] == pytest.approx(f1_score(gold, predicted, average=average, zero_division=0), abs=1e-12)
    assert got["exact_match"] == pytest.approx(accuracy_score(gold, predicted), abs=1e-12)
    precision, recall, f1, support = precision_recall_fscore_support(gold, predicted, zero_division=0)
    for i in range(7):
        label = got["per_label"][f"l{i}"]
        assert (label["precision"], label["recall"], label["f1"], label["support"]) == pytest.approx(
            (precision[i], recall[i], f1[i], support[i]), abs=1e-12)


def test_the_threshold_is_tuned_on_dev_unless_given():
    task = task_instance(NAME, {"labels": LABELS})
    examples = task.examples_from_inputs(["a", "b", "c"], [["editors"], ["games", "net"], []])
    # Right at 0.3: a threshold above 0.3 loses 'net' of the second text, below 0.2 adds 'editors' to the third.
    probs = np.array([[0.9, 0.1, 0.1], [0.1, 0.8, 0.3], [0.2, 0.1, 0.1]], np.float32)
    assert task.evaluate(examples, probs)["micro_f1"] == pytest.approx(2 * 2 / (3 + 2))
    assert task.tune(examples, probs, None) == {"threshold": 0.21}
    assert task.evaluate(examples, probs)["micro_f1"] == 1.0
    assert task.predict_json(examples[1:2], probs[1:2])[0]["labels"] == ["games", "net"]
    assert task.tune(examples, probs * 0, None) == {}  # chosen already: kept


def test_per_facet_thresholds_find_each_facet_s_own_cut():
    """tools/benchmarks/multilabel_thresholds.py: a facet whose scores run low gets a lower threshold."""
    from tests.task_harness import load_tool

    tool = load_tool("multilabel_thresholds")
    rng = np.random.default_rng(0)
    gold = rng.random((400, 4)) < 0.3
    noise = rng.random((400, 4)) * 0.5
    probabilities = np.where(gold, 0.5 + noise, noise)  # a clean cut at 0.5
    probabilities[:, 2:] *= 0.4  # facet 'b' cut at 0.2
    thresholds = tool.per_facet_thresholds(gold, probabilities, 0.5, ["a::x", "a::y", "b::x", "b::y"])
    assert thresholds[0] == thresholds[1] and 0.45 <= thresholds[0] <= 0.5
    assert thresholds[2] == thresholds[3] and 0.18 <= thresholds[2] <= 0.2
    assert multi_label_metrics(gold, probabilities >= thresholds)["micro_f1"] == 1.0


def test_the_probe_fits_each_label_and_takes_the_rate_of_one_every_row_has():
    """A label every training row has (or none has) cannot be regressed: it starts at its smoothed rate."""
    from kbert.tasks.multi_label_classification import MultiLabels

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(40, 3))
    learnable = (vectors[:, 0] > 0).astype("float32")
    targets = np.stack([learnable, np.ones(40, "float32"), np.zeros(40, "float32")], axis=1)
    kernel, bias, accuracy = MultiLabels().fit_probe(vectors, targets, 3)
    assert kernel.shape == (3, 3) and kernel[0, 0] > 1 and not kernel[:, 1:].any()
    np.testing.assert_allclose(sigmoid(bias[1:]), [40.5 / 41, 0.5 / 41], rtol=1e-6)
    assert accuracy > 0.95


def test_the_distillation_loss_is_binary_cross_entropy_both_ways():
    from kbert.tasks.distillation import TARGET, TEACHER, HARD_WEIGHT

    rng = np.random.default_rng(1)
    gold, teacher, student = (rng.integers(0, 2, (4, 3)).astype("float32"),
                              rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 3)).astype("float32"))
    loss = task_instance(NAME, {"labels": LABELS}).distillation_loss(temperature=2.0, alpha=0.25)
    got = float(loss({TARGET: gold, TEACHER: teacher, HARD_WEIGHT: np.ones(4, "float32")}, student))

    def bce(p, logits):
        q = 1 / (1 + np.exp(-logits.astype(np.float64)))
        return -(p * np.log(q) + (1 - p) * np.log(1 - q)).mean(axis=-1)

    soft = 4.0 * bce(sigmoid(teacher / 2.0), student / 2.0)
    assert got == pytest.approx(float(np.mean(0.25 * bce(gold, student) + 0.75 * soft)), abs=1e-5)


# === Training and serving ===


@pytest.mark.parametrize("layout", ["labels column", "a column per label"])
def test_finetune_evaluate_predict_on_the_command_line(tiny, tmp_path, capsys, layout):
    """The same data either way; `--label-columns` is stored with the model, so evaluate reads it too."""
    data, out, flags = str(tiny / "data.csv"), str(tmp_path / "m"), []
    if layout == "a column per label":
        data, flags = str(tmp_path / "flags.csv"), ["--label-columns", ",".join(LABELS)]
        with open(data, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", *LABELS])
            writer.writerows([text, *(int(label in labels.split(";")) for label in LABELS)] for text, labels in ROWS)
    assert main(["finetune", "--task", NAME, "--train", data, "--dev", data, "--init", str(tiny / "bert"), *flags,
                 "--out", out, "--epochs", "2", "--batch-size", "4", "--seq-len", "16", "--dtype", "float32"]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    stored = json.loads((tmp_path / "m" / "kbert.json").read_text())["task_settings"]
    assert 0.05 <= stored["threshold"] <= 0.95 and stored["labels"] == LABELS
    assert main(["evaluate", "--model", out, "--data", data]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["micro_f1"] == pytest.approx(trained["dev"]["micro_f1"], abs=1e-9)
    assert set(figures["per_label"]["net"]) == {"precision", "recall", "f1", "support"}
    assert main(["predict", "--model", out, ROWS[1][0]]) == 0
    answer = json.loads(capsys.readouterr().out)
    scores = answer["scores"]
    assert list(scores) == LABELS and answer["labels"] == [k for k, v in scores.items() if v >= stored["threshold"]]


def texts_and_label_lists():
    return [t for t, _ in ROWS], [labels.split(";") if labels else [] for _, labels in ROWS]


@pytest.mark.slow
def test_minilm_learns_the_labels_on_the_command_line_and_in_python(tmp_path, capsys):
    """A learning bar: MiniLM gives every training text its labels, and so does TaskModel."""
    data = write_rows(tmp_path / "data.csv", ROWS)
    assert main(["finetune", "--task", NAME, "--train", data, "--dev", data, "--init", "all-minilm-l6-v2",
                 "--out", str(tmp_path / "m"), "--epochs", "10", "--lr", "3e-4", "--batch-size", "4",
                 "--seq-len", "16", "--dtype", "float32"]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert trained["dev"]["micro_f1"] == 1.0, trained  # predicting every label scores 0.59
    keras.utils.set_random_seed(0)
    model = TaskModel.from_checkpoint("all-minilm-l6-v2", task=NAME, labels=LABELS, sequence_length=16,
                                      dtype="float32")
    texts, targets = texts_and_label_lists()
    model.compile(optimizer=keras.optimizers.Adam(3e-4))
    history = model.fit(texts, targets, epochs=10, batch_size=4, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert [a["labels"] for a in model.predict_labels(texts)] == targets


def test_task_model_fits_on_label_lists(tiny, tmp_path):
    keras.utils.set_random_seed(0)
    model = TaskModel.from_checkpoint(str(tiny / "bert"), task=NAME, labels=LABELS, sequence_length=16,
                                      dtype="float32", threshold=0.5)
    texts, targets = texts_and_label_lists()
    model.fit(texts, targets, epochs=1, batch_size=4, verbose=0)
    answers = model.predict_labels(texts)
    scores = np.array([list(a["scores"].values()) for a in answers])
    np.testing.assert_allclose(scores, sigmoid(model.predict(texts)), atol=1e-6)
    assert [a["labels"] for a in answers] == [[n for n, p in zip(LABELS, row) if p >= 0.5] for row in scores]
    with pytest.raises(ValueError, match=r"y\[0\] is 'editors'; expected a list of label names"):
        model.fit(texts[:1], ["editors"], epochs=1)
    model.save_folder(str(tmp_path / "folder"))
    folder = ModelFolder.load(str(tmp_path / "folder"))
    assert folder.task.name == NAME and folder.task.labels == LABELS and folder.task.threshold == 0.5


def test_every_artefact_serves_the_labels_above_the_threshold(tiny, tmp_path):
    """SavedModel, TFLite and ONNX files run by hand against the Keras model's probabilities."""
    import onnxruntime
    from ai_edge_litert.interpreter import Interpreter

    from kbert.export import export_model

    data = write_rows(tmp_path / "data.csv", ROWS)
    keras.utils.set_random_seed(0)
    model = TaskModel.from_checkpoint(str(tiny / "bert"), task=NAME, labels=LABELS, sequence_length=16,
                                      dtype="float32", threshold=0.5)
    model.fit(*texts_and_label_lists(), epochs=1, batch_size=4, verbose=0)
    model.save_folder(str(tmp_path / "folder"))
    out = tmp_path / "export"
    report = export_model(str(tmp_path / "folder"), str(out), data=data, formats="savedmodel,tflite,onnx",
                          quantizations="none,dynamic", latency_runs=1, log=lambda line: None)
    assert report["passed"] and report["metric"] == "micro_f1"

    folder = ModelFolder.load(str(tmp_path / "folder"))
    task = folder.task
    examples = task.read(data)
    encoded = task.encode(examples, targets=False)
    expected = sigmoid(task.run(folder.model, encoded.features)["logits"])
    served = tf.saved_model.load(str(out / "1")).signatures["serving_default"](
        text=tf.constant([e.texts[0] for e in examples]))
    np.testing.assert_allclose(served["scores"].numpy(), expected, atol=1e-4)
    joined = [";".join(label for label, p in zip(LABELS, row) if p >= 0.5) for row in expected]
    assert [s.decode() for s in served["labels"].numpy()] == joined
    interpreter = Interpreter(model_path=str(out / "tflite" / "model_none.tflite"))
    run = interpreter.get_signature_runner()
    rows = [run(**{k: v[i : i + 1] for k, v in encoded.features.items()})["logits"][0] for i in range(len(examples))]
    np.testing.assert_allclose(sigmoid(np.array(rows)), expected, atol=1e-4)
    session = onnxruntime.InferenceSession(str(out / "onnx" / "model.onnx"))
    logits = session.run(["logits"], {k: v for k, v in encoded.features.items()})[0]
    np.testing.assert_allclose(sigmoid(logits), expected, atol=1e-4)
    assert (out / "labels.txt").read_text().split() == LABELS


def test_the_task_is_registered():
    assert TASKS[NAME] is MultiLabelClassification


def test_a_student_is_distilled_from_a_multi_label_teacher(tiny, tmp_path, capsys):
    """`kbert distill` trains a one-block student on the teacher's sigmoids and the gold labels;
    it keeps the teacher's labels and chooses its own threshold on dev."""
    data, teacher = str(tiny / "data.csv"), str(tmp_path / "teacher")
    assert main(["finetune", "--task", NAME, "--train", data, "--dev", data, "--init", str(tiny / "bert"),
                 "--out", teacher, "--epochs", "1", "--batch-size", "4", "--seq-len", "16",
                 "--dtype", "float32"]) == 0
    capsys.readouterr()
    assert main(["distill", "--teacher", teacher, "--train", data, "--dev", data, "--out", str(tmp_path / "s"),
                 "--epochs", "1", "--batch-size", "4", "--dtype", "float32"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    student = ModelFolder.load(str(tmp_path / "s"))
    assert student.task.name == NAME and student.task.labels == LABELS and student.config.num_layers == 1
    assert 0.05 <= student.task.threshold <= 0.95 and 0 <= result["dev"]["micro_f1"] <= 1


@pytest.mark.slow
def test_mediapipe_s_text_classifier_gives_each_label_s_probability(tiny, tmp_path):
    """MediaPipe itself runs the file: every label's sigmoid within 1e-4 of Keras, and the
    threshold written beside it for the app."""
    from kbert.export import export_model

    data = write_rows(tmp_path / "data.csv", ROWS)
    keras.utils.set_random_seed(0)
    model = TaskModel.from_checkpoint(str(tiny / "bert"), task=NAME, labels=LABELS, sequence_length=16,
                                      dtype="float32", threshold=0.4)
    model.save_folder(str(tmp_path / "folder"))
    out = tmp_path / "export"
    report = export_model(str(tmp_path / "folder"), str(out), data=data, formats="mediapipe", latency_runs=1,
                          log=lambda line: None)
    entries = {entry["runtime"]: entry for entry in report["artefacts"]}
    assert report["passed"] and entries["mediapipe"]["max_abs_diff"] <= 1e-4, entries
    assert (out / "mediapipe" / "threshold.txt").read_text() == "0.4\n"
    assert (out / "mediapipe" / "labels.txt").read_text().split() == LABELS
