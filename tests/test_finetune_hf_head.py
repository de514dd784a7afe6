"""`kbert finetune --init HF_TASK_FOLDER` continues from a fine-tuned transformers folder with its head.

The transformers folder is written without PyTorch by kbert's own exporter
(`write_huggingface`) from a tiny kbert model folder whose labels are not in
the order training learns them (sorted), so the head's rows must be mapped.
A callback reads the model at `fit`'s start, after every step finetune takes
before training (head kept or probed), and before any weight moves.
"""

import json
import os

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file

from kbert import BertConfig
from kbert.checkpoints.hf_tasks import load_hf_task_folder
from kbert.cli import main
from kbert.export.huggingface import write_huggingface
from kbert.modelfolder import ModelFolder
from kbert.models.heads import HEAD_LAYER
from kbert.tasks import MultiLabelClassification, TextClassification, TokenClassification, get_task
from kbert.training.finetune import finetune
from kbert.training.init_head import check_init_head
from tests.task_harness import TINY_LABELS, TINY_TEXTS, write_task_folder

TINY = BertConfig(vocab_size=30522, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16,
                  max_position_embeddings=32)
SEQUENCE_LENGTH = 16
# Logits of the same weights on the same rows, computed twice in float32.
LOGIT_TOLERANCE = 1e-6
TASK = TextClassification.name
# Each folder's labels (or tags) in an order that training does not learn them in
# (labels sorted; tags O first, then by type), so that the head's rows are mapped.
FOLDER_LABELS = {TASK: ["net", "editors", "games"], TokenClassification.name: ["O", "B-PER", "I-PER", "B-LOC"]}
WORDS = [(["Peter", "Blackburn", "went", "to", "Paris", "."], ["B-PER", "I-PER", "O", "O", "B-LOC", "O"]),
         (["John", "lives", "in", "Rome", "."], ["B-PER", "O", "O", "B-LOC", "O"])]


class AtStart(keras.callbacks.Callback):
    """The head's weights and the model's first output on `features` when `fit` begins."""

    def __init__(self, task, features):
        super().__init__()
        self.task, self.features = task, features

    def on_train_begin(self, logs=None):
        dense = self.model.get_layer(HEAD_LAYER).dense
        self.kernel, self.bias = dense.kernel.numpy(), dense.bias.numpy()
        self.logits = self.task.run(self.model, self.features)[self.task.outputs[0]]


def _csv(path, labels):
    with open(path, "w", encoding="utf-8") as f:
        f.write("text,label\n" + "".join(f'"{text}",{label}\n' for text, label in zip(TINY_TEXTS, labels * 2)))
    return str(path)


def _data(path, name):
    """Training data of task `name` that has every label of its folder."""
    if name == TASK:
        return _csv(path / "data.csv", list(TINY_LABELS))
    with open(path / "data.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"tokens": words, "tags": tags}) + "\n" for words, tags in WORDS * 2)
    return str(path / "data.jsonl")


@pytest.fixture(scope="module", params=list(FOLDER_LABELS))
def folders(request, tmp_path_factory):
    return _folders(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return _folders(TASK, tmp_path_factory)


def _folders(name, tmp_path_factory):
    """`(task, kbert model folder, its transformers folder, training data, dev features)`."""
    root = tmp_path_factory.mktemp("hf-head")
    key = "labels" if name == TASK else "tags"
    model = write_task_folder(root / "model", name, {key: FOLDER_LABELS[name]}, TINY, SEQUENCE_LENGTH)
    write_huggingface(ModelFolder.load(model), str(root / "hf"))
    data = _data(root, name)
    task = ModelFolder.load(model).task
    features = task.encode(task.read(data, task.resolve_options(None))).features
    return name, model, str(root / "hf"), data, features


def _finetune(folders, out, capsys, data=None, **kwargs):
    """finetune from the transformers folder for one tiny epoch: `(AtStart, stderr, kbert.json)`."""
    name, model, hf, train, features = folders
    start = AtStart(ModelFolder.load(model).task, features)
    capsys.readouterr()
    finetune(data or train, data or train, hf, str(out), task=name, epochs=1, batch_size=3, learning_rate=1e-5,
             sequence_length=SEQUENCE_LENGTH, dtype="float32", callbacks=[start], **kwargs)
    with open(os.path.join(out, "kbert.json"), encoding="utf-8") as f:
        return start, capsys.readouterr().err, json.load(f)


def test_the_head_is_the_folders_at_the_start_its_rows_in_the_datas_order(folders, tmp_path, capsys):
    name, model, hf, _, features = folders
    start, err, settings = _finetune(folders, tmp_path / "out", capsys)
    learned = settings["task_settings"]["labels" if name == TASK else "tags"]
    order = [FOLDER_LABELS[name].index(label) for label in learned]
    assert order != sorted(order)
    # The weights, against the file itself.
    tensors = load_file(os.path.join(hf, "model.safetensors"))
    assert np.abs(start.kernel - tensors["classifier.weight"][order].T).max() <= 1e-7
    assert np.abs(start.bias - tensors["classifier.bias"][order]).max() <= 1e-7
    # The logits, against the transformers folder read as a kbert model and the kbert folder it came from.
    for folder in (load_hf_task_folder(hf, name), ModelFolder.load(model)):
        expected = folder.task.run(folder.model, features)[folder.task.outputs[0]][..., order]
        assert np.abs(start.logits - expected).max() <= LOGIT_TOLERANCE
    architecture = get_task(name).hf_architecture
    assert f"the head starts as {hf}'s ({architecture}, its rows put in the training data's order)" in err
    assert (f"linear probe skipped: the head is {hf}'s, kept" in err) == get_task(name).recipe.probe_head
    assert settings["training"]["init_head"] is True and settings["training"]["probe_head"] is False


def test_labels_that_differ_start_a_new_head_and_say_so(classifier, tmp_path, capsys):
    _, _, hf, _, _ = classifier
    data = _csv(tmp_path / "other.csv", ["editors", "games", "mail"])
    start, err, settings = _finetune(classifier, tmp_path / "out", capsys, data=data)
    lines = [line for line in err.splitlines() if "head is not kept" in line]
    assert lines == [f"{hf}'s head is not kept: its labels differ (net only in the folder, mail only in {data}); "
                     "a new head is trained (as transformers' ignore_mismatched_sizes does)"]
    kernel = load_file(os.path.join(hf, "model.safetensors"))["classifier.weight"]
    assert np.abs(start.kernel - kernel.T).max() > 0.1  # the probe's head, not the folder's
    assert "linear probe: the head starts as a logistic regression" in err
    assert settings["training"]["init_head"] is False and settings["training"]["probe_head"] is True
    with pytest.raises(ValueError, match=r"^--init-head: .*net only in the folder.*; fix the data, or --no-init-head"):
        finetune(data, data, hf, str(tmp_path / "refused"), task=TASK, epochs=1, init_head=True,
                 sequence_length=SEQUENCE_LENGTH)
    assert not (tmp_path / "refused").exists()


def test_a_folder_of_another_class_gives_its_encoder_alone_and_says_so(classifier, tmp_path, capsys):
    """As transformers' from_pretrained drops a head of another class; --init-head refuses it instead."""
    _, _, hf, _, _ = classifier
    other, data = TokenClassification.name, str(tmp_path / "tags.jsonl")
    said = []
    assert check_init_head(hf, TokenClassification, log=said.append) is None
    line = (f"--init {hf} is a transformers BertForSequenceClassification; --task {other} "
            f"keeps the head of a {TokenClassification.hf_architecture}")
    assert said == [f"{line}: its encoder alone is read; a new head is trained (as transformers' "
                    "ignore_mismatched_sizes does)"]
    with open(data, "w", encoding="utf-8") as f:
        f.write(json.dumps({"tokens": ["Peter", "went", "to", "Paris"], "tags": ["B-PER", "O", "O", "B-LOC"]}) + "\n")
    argv = ["finetune", "--task", other, "--train", data, "--dev", data, "--init", hf, "--init-head",
            "--out", str(tmp_path / "m")]
    capsys.readouterr()
    assert main(argv) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if "BertForSequenceClassification" in line]
    assert errors == [f"kbert: error: --init-head: {line}; --no-init-head starts from its encoder alone"]
    assert not (tmp_path / "m").exists()
    # A checkpoint without a head has none to keep.
    assert check_init_head(hf, TokenClassification, init_head=False) is None
    with pytest.raises(ValueError, match="is no fine-tuned transformers folder"):
        check_init_head(os.path.dirname(hf), TextClassification, init_head=True)


def test_a_head_of_another_kind_of_output_starts_afresh_and_says_so(classifier):
    """A single-label classifier's folder for multi-label classification: its class fits, its problem_type not."""
    _, _, hf, _, _ = classifier
    lines = []
    assert check_init_head(hf, MultiLabelClassification, log=lines.append) is None
    assert len(lines) == 1 and lines[0].startswith(f"{hf}'s head is not kept: --task {MultiLabelClassification.name}: ")
    assert "problem_type" in lines[0] and lines[0].endswith("a new head is trained (as transformers' "
                                                            "ignore_mismatched_sizes does)")
    with pytest.raises(ValueError, match=r"^--init-head: .*problem_type.*; --no-init-head starts from its encoder"):
        check_init_head(hf, MultiLabelClassification, init_head=True)
