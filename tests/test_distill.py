"""`kbert distill`: the student builder, the distillation losses against numpy, and the
command end to end on teachers fine-tuned here (a topic classifier, an STS-B regressor)."""

import dataclasses
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kbert.checkpoints import resolve_checkpoint
from kbert.checkpoints.huggingface import save_hf_checkpoint
from kbert.cli import main
from kbert.config import PADDING_LOGIT, BertConfig
from kbert.modelfolder import ModelFolder
from kbert.models import bert_encoder
from kbert.tasks.distillation import (
    HARD_WEIGHT,
    TARGET,
    TEACHER,
    ScoreDistillationLoss,
    SoftTargetLoss,
    SpanDistillationLoss,
)
from kbert.training.batching import batched_dataset, eval_dataset
from kbert.training.distill import (
    DEFAULT_ALPHA,
    DEFAULT_TEMPERATURE,
    Distiller,
    build_student,
    distill,
    kept_layers,
    teacher_targets,
    unlabelled_examples,
)
from tests.model_harness import tiny_inputs
from tests.task_harness import load_tool, minilm_vocabulary, write_task_folder
from tests.test_cli import LABELS, subset, write_csv
from tests.test_adding_a_task import CHOICES, MultipleChoice, registered, write_examples  # noqa: F401  (fixture)
from tests.test_export_units import TINY

STSB = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "glue-stsb")
NORMANS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "squad-sample", "normans-dev-v2.0.json")
# Four blocks: every-other keeps 1 and 3, layers:1 keeps 3, so the two differ.
TEACHER_PRESET = "bert_l4_h128"
# Float32 sums of a few dozen terms in another order than numpy's float64.
LOSS_TOLERANCE = 1e-5
# The same weights and ops in the same order: outputs agree to rounding.
OUTPUT_TOLERANCE = 1e-6
SETTINGS = {
    "text-classification": {"labels": list(LABELS)},
    "text-pair-regression": {},
    "token-classification": {"tags": ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"], "scheme": "IOB2"},
}
FAST = ["--seq-len", "32", "--batch-size", "8", "--epochs", "1", "--lr", "1e-3", "--dtype", "float32"]
# The topic teacher trains longer than `FAST`: after one epoch its outputs are as
# good as uniform (loss ln 3), and a student can learn nothing from it; after 12
# at 2e-3 its training loss is 0.60.
TEACHER_TRAINING = ["--epochs", "12", "--lr", "2e-3"]
# The most one epoch of `FAST` leaves of the distillation loss a student started
# from (on its training rows, in inference mode). Measured: 0.94 and 0.72 (topic
# students every-other, layers:1), 0.88 and 0.82 (STS-B), 0.59 (SQuAD); a
# student that learned nothing keeps 1.
LEARNED_SHARE = 0.97


# === Which layers a student keeps ===


@pytest.mark.parametrize(
    "spec, layers, kept",
    [
        ("every-other", 6, [1, 3, 5]),
        ("every-other", 4, [1, 3]),
        ("every-other", 12, [1, 3, 5, 7, 9, 11]),
        ("layers:3", 6, [1, 3, 5]),
        ("layers:4", 12, [2, 5, 8, 11]),
        ("layers:1", 4, [3]),
        ("layers:2", 2, [0, 1]),
        ("bert_tiny", 6, None),
    ],
)
def test_kept_layers(spec, layers, kept):
    assert kept_layers(spec, layers) == kept


@pytest.mark.parametrize(
    "spec, layers, message",
    [
        ("layers:0", 6, "student='layers:0'; expected layers:K with K from 1 to the teacher's 6 layers"),
        ("layers:7", 6, "student='layers:7'"),
        ("layers:two", 6, "student='layers:two'"),
        ("every-other", 1, "student='every-other' of a 1-layer teacher keeps no layer"),
    ],
)
def test_kept_layers_refuses(spec, layers, message):
    with pytest.raises(ValueError, match=message):
        kept_layers(spec, layers)


# === The student builder ===


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_student_starts_from_the_teachers_weights(name, tmp_path):
    teacher = ModelFolder.load(write_task_folder(tmp_path / "teacher", name, SETTINGS[name], TINY))
    inputs = tiny_inputs(50, batch=3, length=9)

    config, same, kept = build_student(teacher, "layers:2")
    assert kept == [0, 1] and config == teacher.config
    np.testing.assert_allclose(
        np.asarray(same(inputs)), np.asarray(teacher.model(inputs)), atol=OUTPUT_TOLERANCE
    )

    config, student, kept = build_student(teacher, "layers:1")
    assert kept == [1] and config.num_layers == 1
    source, encoder = teacher.encoder_layer, student.get_layer("bert_encoder")
    pairs = [("transformer_layer_0", "transformer_layer_1"), ("token_embedding",) * 2,
             ("position_embedding",) * 2, ("segment_embedding",) * 2,
             ("embeddings_layer_norm",) * 2, ("pooler",) * 2]
    for mine, theirs in pairs:
        for a, b in zip(encoder.get_layer(mine).get_weights(), source.get_layer(theirs).get_weights(), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=mine)
    head = [layer for layer in student.layers if layer.weights and layer.name != "bert_encoder"]
    assert head
    for layer in head:
        for a, b in zip(layer.get_weights(), teacher.model.get_layer(layer.name).get_weights(), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=layer.name)
    # One block fewer: the outputs are the student's own.
    assert not np.allclose(np.asarray(student(inputs)), np.asarray(teacher.model(inputs)), atol=1e-3)


def test_preset_and_checkpoint_students(tmp_path):
    teacher = ModelFolder.load(write_task_folder(tmp_path / "teacher", "text-classification",
                                                 SETTINGS["text-classification"], TINY))
    config, student, kept = build_student(teacher, "bert_tiny")
    assert kept is None and config.vocab_size == TINY.vocab_size and config.hidden_size == 128
    assert student.output.shape[-1] == len(LABELS)

    small = BertConfig(vocab_size=30522, hidden_size=16, num_layers=1, num_heads=2,
                       intermediate_size=32, max_position_embeddings=32)
    save_hf_checkpoint(bert_encoder(small), small, list(minilm_vocabulary()), str(tmp_path / "same"))
    config, student, kept = build_student(teacher, str(tmp_path / "same"))
    assert kept is None and config == small

    other = small.replace(vocab_size=40)
    save_hf_checkpoint(bert_encoder(other), other, [f"[unused{i}]" for i in range(40)], str(tmp_path / "other"))
    with pytest.raises(ValueError, match=r"has a vocabulary of 40 tokens other than the teacher's \(30522"):
        build_student(teacher, str(tmp_path / "other"))
    short = small.replace(max_position_embeddings=8)
    save_hf_checkpoint(bert_encoder(short), short, list(minilm_vocabulary()), str(tmp_path / "short"))
    with pytest.raises(ValueError, match="sequence_length=16 exceeds max_position_embeddings=8"):
        build_student(teacher, str(tmp_path / "short"))


# === The losses, against numpy ===


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _numpy_soft_target(labels, weight, teacher, student, temperature, alpha, ignored=None):
    """Hinton et al. (2015), written out in float64: the mean over counted positions."""
    counted = np.ones(labels.shape, bool) if ignored is None else labels != ignored
    log_p = _log_softmax(student)
    hard = -np.take_along_axis(log_p, np.where(counted, labels, 0)[..., None], axis=-1)[..., 0]
    p_teacher = np.exp(_log_softmax(teacher / temperature))
    kl = (p_teacher * (np.log(p_teacher) - _log_softmax(student / temperature))).sum(-1)
    weight = weight.reshape(weight.shape + (1,) * (labels.ndim - 1))
    per = alpha * weight * hard + (1 - alpha) * temperature**2 * kl
    return per[counted].mean()


@pytest.mark.parametrize("temperature, alpha", [(1.0, 0.5), (2.0, 0.3), (4.0, 0.0), (3.0, 1.0), (0.5, 0.7)])
def test_soft_target_loss_matches_numpy(temperature, alpha):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, 12).astype(np.int32)
    weight = np.array([1, 1, 0, 1, 0, 1, 1, 1, 0, 1, 1, 1], np.float32)
    teacher, student = rng.normal(0, 3, (2, 12, 5)).astype(np.float32)
    loss = SoftTargetLoss(temperature, alpha)
    got = float(loss({TARGET: labels, TEACHER: teacher, HARD_WEIGHT: weight}, student))
    expected = _numpy_soft_target(labels, weight, teacher, student, temperature, alpha)
    assert abs(got - expected) <= LOSS_TOLERANCE, (got, expected)
    # An unlabelled row's placeholder target does not count.
    moved = np.where(weight == 0, (labels + 1) % 5, labels)
    assert float(loss({TARGET: moved, TEACHER: teacher, HARD_WEIGHT: weight}, student)) == pytest.approx(got, abs=1e-6)


def test_tagger_teacher_targets_are_its_training_rows(tmp_path):
    """A named-entity teacher labels the rows the task trains on: each sentence alone and,
    under `--context document`, its document's windows."""
    settings = {**SETTINGS["token-classification"], "context": "document"}
    teacher = ModelFolder.load(write_task_folder(tmp_path / "teacher", "token-classification", settings, TINY))
    task = teacher.task
    examples = task.examples_from_inputs([["Anna", "flew", "to", "Paris"], ["Bob", "met", "Anna", "in", "Rome"]],
                                         [["B-PER", "O", "O", "B-LOC"], ["B-PER", "O", "B-PER", "O", "B-LOC"]])
    encoded = teacher_targets(teacher, task, examples, [], 8, log=lambda line: None)
    rows = task.training_rows(examples)
    assert task.context == "document" and len(encoded) == len(rows) == len(examples) + 1
    np.testing.assert_array_equal(encoded.features["token_ids"], rows.features["token_ids"])
    logits = teacher.outputs(encoded.features)["logits"]
    np.testing.assert_allclose(encoded.targets[TEACHER], logits, atol=OUTPUT_TOLERANCE)


@pytest.mark.parametrize("temperature, alpha", [(2.0, 0.5), (1.0, 0.0), (3.0, 1.0)])
def test_soft_target_loss_masks_ignored_tokens(temperature, alpha):
    import keras

    rng = np.random.default_rng(1)
    tags = rng.integers(0, 4, (3, 10)).astype(np.int32)
    tags[rng.uniform(size=tags.shape) < 0.4] = -1  # the pieces after a word's first, [CLS], padding
    teacher, student = rng.normal(0, 2, (2, 3, 10, 4)).astype(np.float32)
    targets = {TARGET: tags, TEACHER: teacher, HARD_WEIGHT: np.ones(3, np.float32)}
    got = float(SoftTargetLoss(temperature, alpha, ignored=-1)(targets, student))
    expected = _numpy_soft_target(tags, np.ones(3), teacher, student, temperature, alpha, ignored=-1)
    assert abs(got - expected) <= LOSS_TOLERANCE, (got, expected)
    # What a masked token's teacher says does not count.
    teacher[tags == -1] = 100.0
    assert float(SoftTargetLoss(temperature, alpha, ignored=-1)(targets, student)) == pytest.approx(got, abs=1e-5)
    if alpha == 1.0:  # the fine-tuning loss of token-classification, averaged the same way
        fine_tuning = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)
        assert abs(got - float(fine_tuning(tags, student))) <= LOSS_TOLERANCE


@pytest.mark.parametrize("alpha", [0.0, 0.4, 1.0])
def test_score_loss_matches_numpy(alpha):
    rng = np.random.default_rng(2)
    gold, teacher, student = rng.normal(2.5, 1.5, (3, 16, 1)).astype(np.float32)
    weight = (rng.uniform(size=16) < 0.7).astype(np.float32)
    got = float(ScoreDistillationLoss(alpha)({TARGET: gold, TEACHER: teacher, HARD_WEIGHT: weight}, student))
    g, t, s = (np.asarray(a, np.float64)[:, 0] for a in (gold, teacher, student))
    expected = np.mean(alpha * weight * (s - g) ** 2 + (1 - alpha) * (s - t) ** 2)
    assert abs(got - expected) <= LOSS_TOLERANCE, (got, expected)


@pytest.mark.parametrize("temperature, alpha", [(2.0, 0.5), (1.0, 0.0), (3.0, 1.0)])
def test_span_loss_matches_numpy(temperature, alpha):
    """Question answering: the soft-target loss of the start and of the end, averaged, over
    each row's own positions; the zeros that pad a shorter row's teacher logits do not count."""
    import keras

    rng = np.random.default_rng(3)
    rows, length = 4, 12
    used = np.array([12, 7, 9, 5])
    padded = np.arange(length)[None, :] >= used[:, None]
    gold = np.stack([rng.integers(0, u, 2) for u in used]).astype(np.int32)  # (rows, 2)
    weight = np.array([1, 0, 1, 1], np.float32)
    teacher, student = rng.normal(0, 3, (2, rows, length, 2)).astype(np.float32)
    teacher[padded] = 0.0  # as a bucketed batch pads it
    student[padded] = PADDING_LOGIT  # as the model's head pads
    outputs = ("start_logits", "end_logits")
    predicted = {name: student[..., i] for i, name in enumerate(outputs)}
    loss = SpanDistillationLoss(temperature, alpha, outputs, PADDING_LOGIT)
    positions = {name: gold[:, i] for i, name in enumerate(outputs)}
    got = float(loss({TARGET: positions, TEACHER: teacher, HARD_WEIGHT: weight}, predicted))
    per_row = [
        np.mean([
            _numpy_soft_target(gold[r, i : i + 1], weight[r : r + 1], teacher[r, : used[r], i][None],
                               student[r, : used[r], i][None], temperature, alpha)
            for i in range(2)
        ])
        for r in range(rows)
    ]
    assert abs(got - np.mean(per_row)) <= LOSS_TOLERANCE, (got, np.mean(per_row))
    if alpha == 1.0:  # the fine-tuning loss of question-answering (run_squad.py's mean of the two)
        fine_tuning = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        expected = np.mean([float(fine_tuning(gold[:, i], predicted[name])) for i, name in enumerate(outputs)])
        labelled = {TARGET: positions, TEACHER: teacher, HARD_WEIGHT: np.ones(rows, np.float32)}
        assert abs(float(loss(labelled, predicted)) - expected) <= LOSS_TOLERANCE


JAX_SCRIPT = r"""
import numpy as np, keras
from kbert.models import bert_classifier
from kbert.config import BertConfig
from kbert.tasks.distillation import SoftTargetLoss, distillation_targets
from kbert.training.distill import Distiller
assert keras.backend.backend() == "jax"
config = BertConfig(vocab_size=50, hidden_size=8, num_layers=1, num_heads=2,
                    intermediate_size=16, max_position_embeddings=16)
rng = np.random.default_rng(0)
x = {"token_ids": rng.integers(1, 50, (8, 6)).astype("int32"),
     "segment_ids": np.zeros((8, 6), "int32"), "padding_mask": np.ones((8, 6), "int32")}
y = distillation_targets(rng.integers(0, 3, 8).astype("int32"), rng.normal(0, 2, (8, 3)).astype("float32"),
                         np.array([1, 0] * 4, "float32"))
distiller = Distiller(bert_classifier(config, 3), SoftTargetLoss(2.0, 0.5))
distiller.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=True)
history = distiller.fit(x, y, batch_size=4, epochs=3, verbose=0).history["loss"]
assert np.all(np.isfinite(history)) and history[-1] < history[0], history
print("jax ok")
"""


def test_distiller_trains_under_jax():
    result = subprocess.run(
        [sys.executable, "-c", JAX_SCRIPT],
        env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0 and "jax ok" in result.stdout, result.stderr[-2000:]


# === End to end, on teachers fine-tuned here ===


def distillation_objective(model, task, encoded):
    """The loss `kbert distill` trains on (its default temperature and alpha) of `model`
    on the rows `encoded` with the teacher's targets, in inference mode (no dropout)."""
    distiller = Distiller(model, task.distillation_loss(DEFAULT_TEMPERATURE, DEFAULT_ALPHA))
    distiller.compile(optimizer="sgd", run_eagerly=True)  # a few tiny batches: tracing would cost more
    return float(distiller.evaluate(eval_dataset(task, encoded, 8), verbose=0))


def assert_learned_from_teacher(student, teacher, spec, train):
    """The student's distillation loss on the rows of `train` fell below the one it
    started from (`build_student` of the same `teacher` folder and `spec`)."""
    task = teacher.task
    encoded = teacher_targets(teacher, task, task.read(train, teacher.use_options()), [], 8, log=lambda line: None)
    _, initial, _ = build_student(teacher, spec)
    before, after = (distillation_objective(model, task, encoded) for model in (initial, student.model))
    assert after < LEARNED_SHARE * before, (before, after)


@pytest.fixture(scope="module")
def vocab():
    return os.path.join(resolve_checkpoint("all-minilm-l6-v2"), "vocab.txt")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, vocab):
    """A 4-block topic classifier fine-tuned through the CLI on 24 Debian descriptions."""
    folder = tmp_path_factory.mktemp("classifier")
    train = write_csv(folder / "train.csv", subset("train", 8))
    dev = write_csv(folder / "dev.csv", subset("dev", 4))
    teacher = str(folder / "teacher")
    assert main(["finetune", "--train", train, "--dev", dev, "--init", TEACHER_PRESET,
                 "--vocab", vocab, *FAST, *TEACHER_TRAINING, "--out", teacher]) == 0
    return {"teacher": teacher, "train": train, "dev": dev, "folder": folder}


@pytest.fixture(scope="module")
def regressor(tmp_path_factory, vocab):
    """A 4-block STS-B regressor fine-tuned through the CLI on 32 pairs."""
    folder = tmp_path_factory.mktemp("regressor")
    lines = open(os.path.join(STSB, "train.tsv"), encoding="utf-8").readlines()
    (folder / "train.tsv").write_text("".join(lines[:33]), encoding="utf-8")
    (folder / "dev.tsv").write_text("".join(lines[:1] + lines[33:49]), encoding="utf-8")
    teacher = str(folder / "teacher")
    assert main(["finetune", "--task", "text-pair-regression", "--train", str(folder / "train.tsv"),
                 "--dev", str(folder / "dev.tsv"), "--init", TEACHER_PRESET, "--vocab", vocab,
                 *FAST, "--out", teacher]) == 0
    return {"teacher": teacher, "train": str(folder / "train.tsv"), "dev": str(folder / "dev.tsv"),
            "folder": folder}


def _corpus(path, documents):
    """A google-research/bert corpus file: a line a sentence, a blank line between documents."""
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(document) for document in documents) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, classifier):
    """Six documents: four new texts, then repeats of a training, a dev and an earlier text."""
    task = ModelFolder.load(classifier["teacher"]).task
    train, dev = task.read(classifier["train"]), task.read(classifier["dev"])
    fresh = [["A puzzle game with tiles.", "Slide them."], ["An SMTP relay."],
             ["A linear algebra library."], ["A chess engine."]]
    words = dev[1].texts[0].split()
    # A dev text split into sentences, as the Debian corpus holds it.
    repeats = [[train[0].texts[0]], [" ".join(words[:3]), " ".join(words[3:])], fresh[0]]
    path = _corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt.gz", fresh[:2] + repeats + fresh[2:])
    return {"path": path, "fresh": [" ".join(d) for d in fresh], "train": train, "dev": dev}


@pytest.mark.slow
@pytest.mark.parametrize("teacher_fixture", ["classifier", "regressor"])
@pytest.mark.parametrize("spec, layers, kept", [("every-other", 2, [1, 3]), ("layers:1", 1, [3])])
def test_distill_end_to_end(teacher_fixture, spec, layers, kept, request, capsys):
    """Both students of both teachers; the classifier's every-other student also learns
    three unlabelled texts (`--unlabelled-limit 3`) from the teacher alone."""
    data = request.getfixturevalue(teacher_fixture)
    out = str(data["folder"] / f"student-{spec}")
    unlabelled = []
    if teacher_fixture == "classifier" and spec == "every-other":
        unlabelled = ["--unlabelled", request.getfixturevalue("corpus")["path"], "--unlabelled-limit", "3"]
    assert main(["distill", "--teacher", data["teacher"], "--train", data["train"], "--dev", data["dev"],
                 "--student", spec, *unlabelled, *FAST[2:], "--out", out]) == 0
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    student, teacher = ModelFolder.load(out), ModelFolder.load(data["teacher"])
    assert student.config.num_layers == layers and student.config.hidden_size == teacher.config.hidden_size
    assert student.task.name == teacher.task.name and student.task.settings() == teacher.task.settings()
    assert student.vocabulary == teacher.vocabulary and student.sequence_length == teacher.sequence_length
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["distillation"]["teacher_layers"] == kept and len(metrics["history"]["loss"]) == 1
    counted = 3 if unlabelled else 0
    assert metrics["distillation"]["unlabelled_examples"] == counted
    assert metrics["train_examples"] == (32 if teacher_fixture == "regressor" else 24) + counted
    assert printed["dev"]["n"] == metrics["n"] == (16 if teacher_fixture == "regressor" else 12)
    # kbert evaluate takes the student as it takes any model folder, and agrees with metrics.json.
    assert main(["evaluate", "--model", out, "--data", data["dev"]]) == 0
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    metric = teacher.task.metric
    assert figures[metric] == pytest.approx(metrics[metric], abs=1e-6)
    assert not [n for n in os.listdir(data["folder"]) if n.startswith(".kbert")]
    assert_learned_from_teacher(student, teacher, spec, data["train"])


@pytest.fixture(scope="module")
def answerer(tmp_path_factory, vocab):
    """A 4-block SQuAD v2.0 answerer fine-tuned through the CLI on the Normans sample's first
    three paragraphs (contexts that need two windows at 64 pieces)."""
    folder = tmp_path_factory.mktemp("answerer")
    with open(NORMANS, encoding="utf-8") as f:
        data = json.load(f)
    data["data"][0]["paragraphs"] = data["data"][0]["paragraphs"][:3]
    path = folder / "squad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    teacher = str(folder / "teacher")
    assert main(["finetune", "--task", "question-answering", "--train", str(path), "--dev", str(path),
                 "--init", TEACHER_PRESET, "--vocab", vocab, "--seq-len", "64", "--doc-stride", "32",
                 *FAST[2:], "--out", teacher]) == 0
    return {"teacher": teacher, "data": str(path), "folder": folder}


@pytest.mark.slow
def test_distill_question_answering(answerer, capsys):
    """A span task: the student learns start and end from the teacher (windows and all), is an
    ordinary model folder, and a question whose answer cannot be found weighs 0 in the gold loss."""
    teacher = ModelFolder.load(answerer["teacher"])
    examples = teacher.task.read(answerer["data"])
    encoded = teacher_targets(teacher, teacher.task, examples, [], 8, log=lambda line: None)
    targets = encoded.targets
    assert sorted(targets[TARGET]) == ["end_logits", "start_logits"]
    assert targets[TEACHER].shape == (len(encoded), teacher.sequence_length, 2)
    outputs = teacher.outputs(encoded.features)
    np.testing.assert_allclose(targets[TEACHER][..., 1], outputs["end_logits"], atol=OUTPUT_TOLERANCE)
    np.testing.assert_array_equal(targets[HARD_WEIGHT], 1.0)
    assert len(encoded) > len(examples)  # some contexts take two windows
    # A question whose answer run_squad.py cannot find (none here: one is given an
    # answer its context does not hold) is left out of fine-tuning; a student
    # learns its rows from the teacher alone.
    unfindable = list(examples)
    unfindable[1] = dataclasses.replace(examples[1], answers=[{"text": "zebra quartz", "answer_start": 0}])
    marked = teacher_targets(teacher, teacher.task, unfindable, [], 8, log=lambda line: None)
    expected = np.where(teacher.task.encode(unfindable).example_of_row == 1, 0.0, 1.0)
    assert expected.min() == 0.0
    np.testing.assert_array_equal(marked.targets[HARD_WEIGHT], expected)

    capsys.readouterr()
    out = str(answerer["folder"] / "student")
    assert main(["distill", "--teacher", answerer["teacher"], "--train", answerer["data"],
                 "--dev", answerer["data"], *FAST[2:], "--out", out]) == 0
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    student = ModelFolder.load(out)
    assert student.config.num_layers == 1 and student.task.name == "question-answering"
    metrics = json.load(open(os.path.join(out, "metrics.json")))
    assert metrics["distillation"]["teacher_layers"] == [3] and np.isfinite(metrics["history"]["loss"]).all()
    assert printed["dev"]["n"] == metrics["n"] == len(examples)
    # Its null threshold is chosen on dev for its own scores, not the teacher's kept.
    assert "tuned_f1" in metrics and student.task.null_score_diff_threshold == metrics["null_score_diff_threshold"]
    assert main(["evaluate", "--model", out, "--data", answerer["data"]]) == 0
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert figures["f1"] == pytest.approx(metrics["f1"], abs=1e-6)
    assert_learned_from_teacher(student, teacher, "layers:1", answerer["data"])


@pytest.mark.slow
def test_benchmark_distill_tool(classifier, tmp_path, capsys):
    """tools/benchmarks/benchmark_distill.py on the tiny teacher and a 1-block student: both exported,
    every file evaluated, sized and timed, the smaller model with fewer parameters."""
    student = str(tmp_path / "student")
    assert main(["distill", "--teacher", classifier["teacher"], "--train", classifier["train"],
                 "--dev", classifier["dev"], "--student", "layers:1", *FAST[2:], "--out", student]) == 0
    capsys.readouterr()
    tool = load_tool("benchmark_distill")
    out = tmp_path / "exports"
    tool.main([
        "--teacher", classifier["teacher"], "--student", f"l1={student}", "--data", classifier["dev"],
        "--calibration", classifier["train"], "--out", str(out), "--max-examples", "4",
        "--calibration-examples", "4", "--runs", "2", "--warmup", "0",
    ])
    report = json.loads(capsys.readouterr().out)
    assert sorted(os.listdir(out)) == ["l1", "teacher"]
    for name, model in report["models"].items():
        assert list(model["artefacts"]) == [f"{f}_{q}" for f, q in tool.ARTEFACTS]
        for key, entry in model["artefacts"].items():
            assert entry["size_mib"] == round(os.path.getsize(out / entry["path"]) / 2**20, 2)
            assert entry["latency"]["runs"] == 2
            assert entry["accuracy"] * 4 == round(entry["accuracy"] * 4)  # a share of the 4 examples
            if key.endswith("_none"):  # float32 files: the Keras model's labels, so its figures
                assert entry["top1_agreement_with_keras"] == 1.0, (name, key, entry)
                assert (entry["accuracy"], entry["macro_f1"]) == pytest.approx(
                    (model["keras"]["accuracy"], model["keras"]["macro_f1"])), (name, key, entry)
    teacher, small = report["models"]["teacher"], report["models"]["l1"]
    assert (teacher["num_layers"], small["num_layers"]) == (4, 1)
    assert small["parameters"] < teacher["parameters"]
    assert len(report["targets"]) == 2


def test_unlabelled_texts_carry_the_teachers_outputs_alone(classifier, corpus):
    teacher = ModelFolder.load(classifier["teacher"])
    task, known = teacher.task, corpus["train"] + corpus["dev"]
    examples, dropped = unlabelled_examples(task, corpus["path"], known=known)
    assert dropped == 3 and [e.texts[0] for e in examples] == corpus["fresh"]
    assert len(unlabelled_examples(task, corpus["path"], limit=2, known=known)[0]) == 2

    train = corpus["train"]
    encoded = teacher_targets(teacher, task, train, examples, 8, log=lambda line: None)
    targets = encoded.targets
    assert len(encoded) == len(train) + 4
    np.testing.assert_array_equal(targets[HARD_WEIGHT], [1] * len(train) + [0] * 4)
    np.testing.assert_array_equal(targets[TARGET][: len(train)], task.targets(train))
    expected = teacher.outputs(encoded.features)["logits"]
    np.testing.assert_allclose(targets[TEACHER], expected, atol=OUTPUT_TOLERANCE)
    # Bucketed batches carry the weights with their rows.
    dataset, steps = batched_dataset(task, encoded, 8, seed=0)
    batches = list(dataset)
    weights = np.concatenate([batch[1][HARD_WEIGHT].numpy() for batch in batches])
    assert len(batches) == steps and len(weights) == len(encoded) and weights.sum() == len(train)


# === Bad input: one line, exit status 2, nothing written ===


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """Random teachers (no training needed to be refused) and their data."""
    folder = tmp_path_factory.mktemp("untrained")
    classifier = write_task_folder(folder / "classifier", "text-classification",
                                   SETTINGS["text-classification"], TINY)
    regressor = write_task_folder(folder / "regressor", "text-pair-regression", {}, TINY)
    qa = write_task_folder(folder / "qa", "question-answering", {
        "version_2_with_negative": False, "null_score_diff_threshold": 0.0, "doc_stride": 4,
        "max_query_length": 4, "max_answer_length": 8, "n_best_size": 5,
    }, TINY)
    texts = write_csv(folder / "texts.csv", subset("dev", 2))
    pairs = folder / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tscore\na\tb\t1.0\nc\td\t2.0\n")
    corpus = _corpus(folder / "corpus.txt.gz", [["A game."]])
    return {"classifier": classifier, "regressor": regressor, "qa": qa, "texts": texts,
            "pairs": str(pairs), "corpus": corpus, "folder": folder}


@pytest.mark.parametrize(
    "teacher, data, extra, message",
    [
        ("texts", "texts", [], "is not a kbert model folder"),
        ("folder", "texts", [], "is not a kbert model folder"),
        ("classifier", "texts", ["--student", "bert_huge"],
         "student='bert_huge' is not every-other, layers:K, a BertConfig preset"),
        ("classifier", "texts", ["--student", "layers:3"],
         "student='layers:3'; expected layers:K with K from 1 to the teacher's 2 layers"),
        ("regressor", "pairs", ["--unlabelled", "corpus"],
         "task 'text-pair-regression' takes no --unlabelled texts"),
        ("classifier", "texts", ["--unlabelled", "missing.txt"], "--unlabelled missing.txt: no such file"),
        ("qa", "pairs", ["--unlabelled", "corpus"], "task 'question-answering' takes no --unlabelled texts"),
        ("classifier", "pairs", [], "no column 'text'"),
    ],
)
def test_bad_input(untrained, teacher, data, extra, message, capsys):
    paths = {key: str(value) for key, value in untrained.items()}
    extra = [paths.get(arg, arg) for arg in extra]
    out = untrained["folder"] / "out"
    code = main(["distill", "--teacher", paths[teacher], "--train", paths[data], "--dev", paths[data],
                 *extra, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("kbert: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not out.exists()
    assert not [n for n in os.listdir(untrained["folder"]) if n.startswith(".kbert")]


def test_out_may_not_be_the_teacher(untrained, capsys):
    code = main(["distill", "--teacher", untrained["classifier"], "--train", untrained["texts"],
                 "--dev", untrained["texts"], "--out", untrained["classifier"], "--overwrite"])
    assert code == 2 and "is the teacher's folder" in capsys.readouterr().err
    assert ModelFolder.load(untrained["classifier"]).config == TINY


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--alpha", "1.5", "argument --alpha: 1.5 is not in [0, 1]"),
        ("--alpha", "nan", "argument --alpha: nan is not a finite number"),
        ("--temperature", "0", "argument --temperature: 0 is not a positive number"),
        ("--unlabelled-limit", "0", "argument --unlabelled-limit: 0 is not a positive integer"),
    ],
)
def test_bad_numbers_are_refused_at_parse_time(flag, value, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["distill", "--teacher", "t", "--train", "a", "--dev", "b", "--out", "o", flag, value])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_command_line_defaults_are_the_functions():
    """`kbert distill` with no recipe flag trains what `distill()` does by default
    (the CLI keeps its own copy of the student so that --help loads no TensorFlow)."""
    import inspect

    from kbert.cli import build_parser
    from kbert.recipes import DISTILLATION
    from kbert.training.distill import DEFAULT_STUDENT

    args = build_parser().parse_args(["distill", "--teacher", "t", "--train", "a", "--dev", "b", "--out", "o"])
    defaults = inspect.signature(distill).parameters
    assert args.student == defaults["student"].default == DEFAULT_STUDENT
    for flag, parameter in (("lr", "learning_rate"), ("epochs", "epochs"), ("batch_size", "batch_size"),
                            ("seq_len", "sequence_length")):
        assert getattr(args, flag) == defaults[parameter].default == getattr(DISTILLATION, parameter)
    assert args.dtype == "auto"


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"alpha": 1.5}, "alpha=1.5; expected a number in [0, 1]"),
        ({"temperature": 0}, "temperature=0; expected a finite number above 0"),
        ({"temperature": float("inf")}, "temperature=inf"),
        ({"unlabelled_limit": 0}, "unlabelled_limit=0; expected a positive integer"),
    ],
)
def test_bad_numbers_from_python(untrained, arguments, message):
    out = untrained["folder"] / "python-out"
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        distill(untrained["classifier"], untrained["texts"], untrained["texts"], str(out), **arguments)
    assert not out.exists()


def test_teacher_targets_keep_a_task_s_groups(registered, tmp_path):
    """Rows that must stay together (a multiple-choice example's options) stay so for the student."""
    teacher = ModelFolder.load(write_task_folder(tmp_path / "teacher", MultipleChoice.name, {}, TINY, 32))
    examples = teacher.task.read(write_examples(tmp_path / "data.csv", 6, seed=0))
    rows = teacher_targets(teacher, teacher.task, examples, [], 8, log=lambda line: None)
    assert rows.group_size == CHOICES and len(rows) == 6 * CHOICES
