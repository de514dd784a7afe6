"""`kbert export --formats keras-hub`: a keras-hub preset for every task keras-hub can compute.

Each tiny model folder is written as a preset, which keras-hub itself loads
fresh (`BertTextClassifier.from_preset` for a classifier, `BertBackbone` and
`BertTokenizer.from_preset` for the others) and runs on kbert's own rows
within `FLOAT_TOLERANCE` of the Keras model computed with keras-hub's GELU
(`keras_hub_twin`); keras-hub's own preprocessing gives kbert's token ids.
"""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest

from kbert.export.serving_base import FLOAT_TOLERANCE
from tests.task_harness import write_task_folder
from tests.test_export_huggingface import SEQUENCE_LENGTH, TINY, make_case

keras_hub = pytest.importorskip("keras_hub")

CLASSIFIERS = ("text-classification", "text-pair-classification", "multi-label-classification", "text-pair-regression")
BACKBONES = ("token-classification", "question-answering", "sentence-embedding")


def numpy(value):
    return {k: keras.ops.convert_to_numpy(v) for k, v in value.items()} if isinstance(value, dict) \
        else keras.ops.convert_to_numpy(value)


def written(name, root):
    """`(folder, features, path, kind)`: the task's tiny model, its data's rows, and its preset."""
    from kbert.export.keras_hub_preset import write_keras_hub
    from kbert.modelfolder import open_model

    model, data, task, options = make_case(name, root)
    folder = open_model(model, task, options)
    examples = folder.task.read(data, folder.use_options())
    features = folder.task.encode(examples, targets=False).features
    path = str(root / "keras-hub")
    return folder, examples, features, path, write_keras_hub(folder, path)


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_a_classifier_loads_as_keras_hubs_text_classifier(tmp_path, name):
    from kbert.export.keras_hub_preset import keras_hub_twin
    from kbert.export.serving import serving_for

    folder, examples, features, path, kind = written(name, tmp_path)
    assert kind == "BertTextClassifier"
    classifier = keras_hub.models.BertTextClassifier.from_preset(path)
    twin, _ = keras_hub_twin(folder)
    got = numpy(classifier(features, training=False))
    expected = folder.task.run(twin, features)[folder.task.outputs[0]]
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= FLOAT_TOLERANCE, name
    # keras-hub's preprocessing: kbert's token ids on the same texts (one text, or a pair).
    strings = serving_for(folder.task).strings(examples)
    texts = [np.asarray(strings[n], dtype=object) for n in folder.task.text_inputs]
    packed = numpy(classifier.preprocessor(x=texts[0] if len(texts) == 1 else tuple(texts)))
    for key in ("token_ids", "segment_ids", "padding_mask"):
        np.testing.assert_array_equal(packed[key], features[key], err_msg=key)


def test_the_twin_is_the_model_with_keras_hubs_gelu_and_differs_from_exact_gelu(tmp_path):
    """A model built with keras-hub's GELU is held to itself; one with exact GELU to its twin,
    whose outputs differ from the model's by more than round-off (so the twin is needed)."""
    from kbert.export.keras_hub_preset import keras_hub_twin
    from kbert.modelfolder import ModelFolder

    approximate = ModelFolder.load(write_task_folder(
        tmp_path / "approximate", "text-classification", {"labels": ["a", "b"]},
        dataclasses.replace(TINY, activation="gelu_approximate"), SEQUENCE_LENGTH))
    assert keras_hub_twin(approximate)[0] is approximate.model
    exact, _, features, _, _ = written("token-classification", tmp_path / "exact")
    twin, encoder = keras_hub_twin(exact)
    ours, theirs = exact.task.run(exact.model, features)["logits"], exact.task.run(twin, features)["logits"]
    # Measured 3.7e-5 on this tiny tagger, where keras-hub's own run differs from the twin by 1e-6.
    assert np.abs(ours - theirs).max() > 1e-5
    assert encoder.get_layer("transformer_layer_0").get_config()["activation"] == "gelu_approximate"


@pytest.mark.parametrize("name", BACKBONES)
def test_other_tasks_load_as_keras_hubs_backbone_and_tokenizer(tmp_path, name):
    from kbert.export.keras_hub_preset import keras_hub_twin

    folder, _, features, path, kind = written(name, tmp_path)
    assert kind == "BertBackbone"
    backbone = keras_hub.models.BertBackbone.from_preset(path)
    tokenizer = keras_hub.models.BertTokenizer.from_preset(path)
    _, encoder = keras_hub_twin(folder)
    got, expected = numpy(backbone(features, training=False)), numpy(encoder(features, training=False))
    mask = features["padding_mask"] == 1
    assert np.abs(got["sequence_output"][mask] - expected["sequence_output"][mask]).max() <= FLOAT_TOLERANCE
    assert np.abs(got["pooled_output"] - expected["pooled_output"]).max() <= FLOAT_TOLERANCE
    text = "A text editor for the terminal."
    assert numpy(tokenizer(text)).tolist() == numpy(folder.tokenizer(text)).tolist()
    with open(os.path.join(path, "README.md"), encoding="utf-8") as f:
        assert "BertBackbone.from_preset" in f.read()


def test_the_multi_label_readme_says_sigmoid_and_threshold(tmp_path):
    _, _, _, path, _ = written("multi-label-classification", tmp_path)
    with open(os.path.join(path, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert "sigmoid reaches 0.4" in readme and "`a`, `b`, `c`" in readme


def test_what_keras_hub_cannot_compute_is_refused_by_name(tmp_path):
    from kbert.export.keras_hub_preset import write_keras_hub
    from kbert.modelfolder import ModelFolder

    cosine = ModelFolder.load(write_task_folder(tmp_path / "cosine", "text-pair-regression", {"score_range": [0.0, 5.0]},
                                                TINY, SEQUENCE_LENGTH))
    with pytest.raises(ValueError, match="--head cross-cosine has no keras-hub class.*fine-tune it with --head cross"):
        write_keras_hub(cosine, str(tmp_path / "out"))
    both = ModelFolder.load(write_task_folder(tmp_path / "both", "text-pair-classification",
                                              {"labels": ["0", "1"], "pair_order": "both"}, TINY, SEQUENCE_LENGTH))
    with pytest.raises(ValueError, match="reads a pair once: export with --pair-order given"):
        write_keras_hub(both, str(tmp_path / "out"))
    relu = ModelFolder.load(write_task_folder(tmp_path / "relu", "text-classification", {"labels": ["a", "b"]},
                                              dataclasses.replace(TINY, activation="relu"), SEQUENCE_LENGTH))
    with pytest.raises(ValueError, match="activation='relu': keras-hub's BertBackbone computes gelu_approximate only"):
        write_keras_hub(relu, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


def test_keras_hub_is_made_only_when_named():
    from kbert.export.exporter import _plan
    from kbert.export.options import task_formats
    from tests.task_harness import task_instance

    task = task_instance("text-classification", {"labels": ["a", "b"]})
    assert "keras-hub" not in task_formats(task)
    assert ("keras-hub", "none") not in _plan(task, None, ("none",), print)
    assert _plan(task, "keras-hub,huggingface", ("none", "dynamic"), print) == [("huggingface", "none"),
                                                                                 ("keras-hub", "none")]


# === The exporter's verification, end to end ===


@pytest.mark.parametrize("name", ["text-classification", "token-classification"])
def test_export_verifies_the_preset_with_keras_hub(tmp_path, name):
    from kbert.export import export_model

    model, data, task, options = make_case(name, tmp_path)
    report = export_model(model, str(tmp_path / "export"), data=data, formats="keras-hub", latency_runs=1,
                          task=task, options=options, log=lambda line: None)
    (entry,) = report["artefacts"]
    assert entry["path"] == "keras-hub" and entry["format"] == "keras-hub" and entry["passed"], entry
    assert entry["max_abs_diff"] <= FLOAT_TOLERANCE and entry["metric_change"] <= 0.1
    assert max(entry["max_abs_diff_backbone"].values()) <= FLOAT_TOLERANCE
    if entry["class"] == "BertTextClassifier":
        own = entry["keras_hub_tokenizer"]
        assert own["rows_whose_token_ids_differ"] == 0 and own[report["metric"]] == entry[report["metric"]]
    with open(tmp_path / "export" / "keras-hub" / "metadata.json", encoding="utf-8") as f:
        assert "keras_hub_version" in json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["text-pair-classification", "multi-label-classification", "text-pair-regression",
                                  "question-answering", "sentence-embedding", "fill-mask"])
def test_export_verifies_every_other_task_with_keras_hub(tmp_path, name):
    test_export_verifies_the_preset_with_keras_hub(tmp_path, name)


def _minilm_classifier(path, labels):
    """A text classifier on the real all-MiniLM-L6-v2 encoder (exact GELU) with a seeded head."""
    from kbert.checkpoints import load_pretrained
    from kbert.modelfolder import write_model_folder
    from kbert.models.heads import HEAD_LAYER
    from tests.task_harness import task_instance

    pretrained = load_pretrained("all-minilm-l6-v2")
    task = task_instance("text-classification", {"labels": labels}, 64, vocabulary=pretrained.vocabulary)
    model = task.build_model(pretrained.encoder)
    dense = model.get_layer(HEAD_LAYER).dense
    dense.kernel.assign(np.random.default_rng(0).normal(0, 0.5, dense.kernel.shape))
    settings = {"bert_config": pretrained.config.to_dict(), "sequence_length": 64, "lowercase": pretrained.lowercase}
    write_model_folder(str(path), model, list(pretrained.vocabulary), task, settings, {})
    return str(path)


@pytest.mark.slow
def test_a_minilm_classifier_exports_to_keras_hub_with_its_gelu_measured(tmp_path):
    """Real MiniLM weights, exact GELU: keras-hub within 1e-4 of the twin, further from the model
    as trained (keras-hub's tanh GELU), the predictions and metric unchanged."""
    import csv

    from kbert.export import export_model
    from tests.test_export_huggingface import DEBIAN_DEV

    with open(DEBIAN_DEV, encoding="utf-8") as f:
        labels = sorted({row["label"] for row in csv.DictReader(f)})
    model = _minilm_classifier(tmp_path / "model", labels)
    report = export_model(model, str(tmp_path / "export"), data=DEBIAN_DEV, formats="keras-hub", max_examples=40,
                          latency_runs=1, log=lambda line: None)
    (entry,) = report["artefacts"]
    assert entry["passed"] and entry["max_abs_diff"] <= FLOAT_TOLERANCE, entry
    assert max(entry["max_abs_diff_backbone"].values()) <= FLOAT_TOLERANCE
    # keras-hub's GELU moves the logits by more than round-off (2.8e-3 on the trained Debian MiniLM).
    assert entry["to_model"]["max_abs_diff"] > 10 * entry["max_abs_diff"]
    assert entry["to_model"]["top1_agreement"] == 1.0 and entry["metric_change"] <= 0.1
