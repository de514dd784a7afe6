"""Multiple choice, a task added through the public contract alone (docs/adding-a-task.md)."""

import csv
import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import kbert.export.serving
import kbert.tasks
from kbert.cli import main
from kbert.config import ENCODER_INPUTS
from kbert.export.exporter import export_model
from kbert.recipes import Recipe
from kbert.tabular import read_table
from kbert.tasks import Encoded, Score, Task
from kbert.tasks.base import METRIC_BUDGETS
from kbert.tasks.inference import softmax
from kbert.training.batching import eval_dataset, train_dataset
from kbert.training.finetune import finetune
from tests.artefacts import check_files
from tests.task_harness import task_instance

CHOICES = 4
ANIMALS = "cat dog horse sheep goat mouse bird fish duck frog bear wolf lion tiger snake rabbit".split()
PLACES = "park river house garden field forest road farm".split()

# An example, a frozen dataclass as kbert's records (`TextExample`): a sentence, its `CHOICES`
# endings, the right one's index (None: unlabelled) and its line in the file.
Choice = dataclasses.make_dataclass("Choice", ["sentence", "endings", "target", "line"], frozen=True)


class ChoiceLoss(keras.losses.Loss):
    """Softmax cross-entropy across each example's `CHOICES` rows, which batches keep together."""

    def call(self, y_true, y_pred):
        y_true, y_pred = (keras.ops.reshape(y, (-1, CHOICES)) for y in (y_true, y_pred))
        return keras.losses.categorical_crossentropy(y_true, y_pred, from_logits=True)


class MultipleChoice(Task):
    """A sentence and `CHOICES` endings -> the ending that fits; CSV with
    `sentence`, `ending0` .. `ending3` and `label` (the right ending's index)."""

    name = "multiple-choice"
    description = "a sentence and 4 endings -> the ending that fits"
    objective = Score()  # one score a row from the pooled [CLS]; `compile_args` replaces its loss
    text_inputs = ("sentence", "ending")  # what `serving_default` scores: one pair
    metric, metric_scale, budgets = "accuracy", 100, METRIC_BUDGETS
    recipe = Recipe(epochs=1, learning_rate=1e-4, batch_size=8, sequence_length=32)  # MiniLM learns the set below

    @classmethod
    def read(cls, path, options=None, targets=True):
        endings = [f"ending{i}" for i in range(CHOICES)]
        return [Choice(row["sentence"], [row[e] for e in endings], int(row["label"]) if targets else None, row.line)
                for row in read_table(path, ["sentence", *endings] + (["label"] if targets else []))]

    def encode(self, examples, targets=True):
        """Each (sentence, ending) pair one row; an example's rows one group."""
        sentences = [e.sentence for e in examples for _ in range(CHOICES)]
        endings = [ending for e in examples for ending in e.endings]
        packed = self.preprocessor((tf.constant(sentences), tf.constant(endings)))
        features = {name: packed[name].numpy().astype(np.int32) for name in ENCODER_INPUTS}
        right = np.array([[e.target == i for i in range(CHOICES)] for e in examples], np.int32)
        return Encoded(features, right.reshape(-1) if targets else None,
                       example_of_row=np.repeat(np.arange(len(examples)), CHOICES), group_size=CHOICES)

    def compile_args(self):
        return {"loss": ChoiceLoss()}  # no Keras metric: `evaluate` gives the accuracy

    def decode(self, examples, encoded, outputs):
        return softmax(np.asarray(outputs["score"]).reshape(-1, CHOICES))

    def evaluate(self, examples, predictions):
        answers = np.asarray(predictions).argmax(axis=-1)
        return {"accuracy": float(np.mean(answers == [e.target for e in examples])), "n": len(examples)}

    def predict_json(self, examples, predictions):
        return [{"sentence": e.sentence, "endings": e.endings, "answer": int(np.argmax(p)),
                 "scores": [float(s) for s in p]} for e, p in zip(examples, predictions)]

    def serving_request(self, example):
        return {"sentence": example.sentence, "ending": example.endings[0]}  # one pair of several


class ChoiceServing(kbert.export.serving.Serving):
    """The strings of every pair, one row each, as `encode` packs them."""

    def strings(self, examples):
        return {"sentence": [e.sentence for e in examples for _ in e.endings],
                "ending": [ending for e in examples for ending in e.endings]}


def write_examples(path, count, seed):
    """The right ending names the sentence's animal again; the others, other animals."""
    rng, rows = np.random.default_rng(seed), [["sentence", *(f"ending{i}" for i in range(CHOICES)), "label"]]
    for _ in range(count):
        animals, label = rng.choice(ANIMALS, CHOICES, replace=False), int(rng.integers(CHOICES))
        sentence = f"a {'very ' * int(rng.integers(4))}big {animals[label]} ran to the {rng.choice(PLACES)}."
        rows.append([sentence, *(f"then the {a} slept." for a in animals), label])
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return str(path)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(kbert.tasks.TASKS, MultipleChoice.name, MultipleChoice)
    monkeypatch.setitem(kbert.export.serving.ADAPTERS, MultipleChoice, ChoiceServing)


def groups(batches):
    """Each example's rows (cut to its longest) and targets, from `(features, targets)` batches of rows."""
    tokens = [np.reshape(f["token_ids"], (-1, CHOICES, np.shape(f["token_ids"])[1])) for f, _ in batches]
    targets = [np.reshape(t, (-1, CHOICES)) for _, t in batches]
    return [(str(g[:, g.any(axis=0)].tolist()), str(t.tolist())) for b, c in zip(tokens, targets) for g, t in zip(b, c)]


@pytest.mark.parametrize("width", [None, 4])
def test_batches_hold_whole_examples_in_order(registered, tmp_path, width):
    """Both epochs and the validation hold each example's rows once, together and in order,
    in the batches announced; a training batch is as wide as its longest row's bucket."""
    task = task_instance(MultipleChoice.name, {}, 32)
    encoded = task.encode(examples := task.read(write_examples(tmp_path / "data.csv", 30, seed=2)))
    dataset, batches = train_dataset(task, examples, 8, seed=1, epochs=2, bucket_width=width)
    dataset, validation = list(dataset), list(eval_dataset(task, encoded, 8))
    assert len(dataset) == 2 * batches and [len(targets) for _, targets in validation] == [32, 32, 32, 24]
    widths = [(f["token_ids"].shape[1], f["padding_mask"].numpy().sum(axis=1).max()) for f, _ in dataset]
    assert all(padded == (used if width is None else -(-used // width) * width) for padded, used in widths)
    expected = sorted(groups([(encoded.features, encoded.targets)]))
    epochs = [groups(dataset[:batches]), groups(dataset[batches:]), groups(validation)]
    assert epochs[0] != epochs[1] and all(sorted(epoch) == expected for epoch in epochs)  # shuffled; whole


@pytest.mark.slow
def test_multiple_choice_is_trained_evaluated_and_exported(registered, tmp_path, capsys):
    """Matching a word across the pair takes a pretrained encoder: a tiny random one learns it in some runs only."""
    train, dev = write_examples(tmp_path / "train.csv", 200, seed=0), write_examples(tmp_path / "dev.csv", 80, seed=1)
    model = str(tmp_path / "model")
    figures = finetune(train, dev, "all-minilm-l6-v2", model, task=MultipleChoice.name, dtype="float32", verbose=0)
    assert figures["n"] == 80 and figures["accuracy"] > 0.6  # chance: 0.25
    assert main(["evaluate", "--model", model, "--data", dev]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["accuracy"] == pytest.approx(figures["accuracy"])
    report = export_model(model, str(tmp_path / "export"), dev, formats="savedmodel,onnx,tflite",
                          quantizations="none", latency_runs=1, log=lambda line: None)
    assert len(report["artefacts"]) == 4 and report["passed"], report["artefacts"]  # SavedModel, ONNX, 2 TFLite
    # The files themselves, run here apart from the exporter's verdict: each pair's score as Keras's.
    check_files(model, str(tmp_path / "export"), dev)
