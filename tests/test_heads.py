"""kbert.models.heads: each task model's head is one layer, saved and exported as the
model's own; model folders written when heads were loose layers load and predict the same."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from kbert.config import PADDING_LOGIT
from kbert.export.graph import GRAPH_TOLERANCE, model_outputs
from kbert.modelfolder import ModelFolder, with_head_layer, write_model_folder
from kbert.models import bert_encoder, rewire_encoder
from kbert.models.encoder import encoder_inputs
from kbert.models.heads import HEAD_LAYER
from kbert.tasks.inference import output_dict
from tests.model_harness import tiny_inputs
from tests.task_harness import SEQUENCE_LENGTH, minilm_vocabulary, task_instance
from tests.test_export_units import TINY

# The head layers kbert built before `kbert.models.heads`, as they were written.


def _dense(units, name):
    return keras.layers.Dense(units, dtype="float32", name=name)


def legacy_pooled(encoder, units, name):
    encoder, inputs = rewire_encoder(encoder, first_token_only=True), encoder_inputs()
    pooled = keras.layers.Dropout(0.1, name="classifier_dropout")(encoder(inputs)["pooled_output"])
    return keras.Model(inputs, _dense(units, name)(pooled))


def legacy_tagger(encoder, units):
    encoder.get_layer("pooler").trainable = False
    inputs = encoder_inputs()
    sequence = keras.layers.Dropout(0.1, name="tagger_dropout")(encoder(inputs)["sequence_output"])
    return keras.Model(inputs, _dense(units, "logits")(sequence))


def legacy_span(encoder):
    encoder, inputs = rewire_encoder(encoder, first_token_only=False), encoder_inputs()
    start, end = ops.unstack(_dense(2, "qa_outputs")(encoder(inputs)["sequence_output"]), 2, axis=-1)
    padding = ops.equal(inputs["padding_mask"], 0)
    return keras.Model(inputs, {"start_logits": ops.where(padding, PADDING_LOGIT, start),
                                "end_logits": ops.where(padding, PADDING_LOGIT, end)})


def legacy_pair(encoder):
    from kbert.layers import CosineScore, L2Normalization, MaskedMeanPooling, PairSegments

    inputs = encoder_inputs()
    cross = _dense(1, "cross_score")(keras.layers.Dropout(0.1)(encoder(inputs)["pooled_output"]))
    segments = PairSegments(dtype="int32", name="pair_segments")(*(inputs[n] for n in inputs))
    vectors = MaskedMeanPooling(dtype="float32", name="segment_pooling")(
        encoder(segments)["sequence_output"], padding_mask=segments["padding_mask"])
    vectors = L2Normalization(dtype="float32", name="segment_normalize")(vectors)
    cosine = CosineScore(scale=5.0, offset=0.0, dtype="float32", name="cosine_score")(vectors)
    return keras.Model(inputs, keras.layers.Add(dtype="float32", name="score")([cross, cosine]))


LEGACY = {
    "text-classification": ({"labels": ["a", "b", "c"]}, lambda e: legacy_pooled(e, 3, "logits")),
    "text-pair-regression": ({"head": "cross"}, lambda e: legacy_pooled(e, 1, "score")),
    "text-pair-regression/cross-cosine": ({"head": "cross-cosine", "score_range": [0.0, 5.0]}, legacy_pair),
    "token-classification": ({"tags": ["O", "B-X", "I-X"], "scheme": "IOB2"}, lambda e: legacy_tagger(e, 3)),
    "question-answering": ({}, legacy_span),
}


@pytest.mark.parametrize("name", LEGACY)
def test_a_legacy_folder_loads_with_its_head_as_one_layer(name, tmp_path):
    """The loose head layers' weights move into the task's head: the same outputs, and
    the export graph, which calls the head layer, gives them too."""
    settings, build = LEGACY[name]
    task = task_instance(name.split("/")[0], settings)
    legacy = build(bert_encoder(TINY))
    rng = np.random.default_rng(0)
    for variable in legacy.weights:
        variable.assign(variable.numpy() + rng.normal(0, 0.05, variable.shape))
    folder_settings = {"bert_config": TINY.to_dict(), "sequence_length": SEQUENCE_LENGTH, "lowercase": True}
    write_model_folder(str(tmp_path / "m"), legacy, list(minilm_vocabulary()), task, folder_settings, {})
    loaded = ModelFolder.load(str(tmp_path / "m"))
    assert any(layer.name == HEAD_LAYER for layer in loaded.model.layers)
    inputs = tiny_inputs(TINY.vocab_size, batch=3, length=SEQUENCE_LENGTH)
    expected = output_dict(legacy(inputs), task.outputs)
    got = output_dict(loaded.model(inputs), task.outputs)
    graph = model_outputs(loaded.task, loaded.model, {k: tf.constant(v) for k, v in inputs.items()})
    for output in task.outputs:
        assert np.abs(np.asarray(got[output]) - np.asarray(expected[output])).max() <= 1e-6, output
        assert np.abs(graph[output].numpy() - np.asarray(expected[output])).max() <= GRAPH_TOLERANCE, output


def test_a_legacy_weight_without_a_place_is_refused():
    task = task_instance("text-classification", {"labels": ["a", "b", "c"]})
    odd = legacy_pooled(bert_encoder(TINY), 3, "classifier")  # no such layer in the head
    with pytest.raises(ValueError, match="weight 'classifier/kernel' has no place"):
        with_head_layer(odd, task)


def test_a_legacy_model_that_does_not_fit_its_settings_is_named_so(tmp_path):
    """A cross-cosine model whose settings say "cross": the settings' mismatch, not a weight's."""
    task = task_instance("text-pair-regression", {"head": "cross"})
    folder_settings = {"bert_config": TINY.to_dict(), "sequence_length": SEQUENCE_LENGTH, "lowercase": True}
    write_model_folder(str(tmp_path / "m"), legacy_pair(bert_encoder(TINY)), list(minilm_vocabulary()), task,
                       folder_settings, {})
    with pytest.raises(ValueError, match="settings name the 'cross' head but the model has the cosine term"):
        ModelFolder.load(str(tmp_path / "m"))


def test_heads_round_trip_through_keras_files(tmp_path):
    """Every head saves and loads in a `.keras` file with its model, to the same outputs."""
    inputs = tiny_inputs(TINY.vocab_size, batch=2, length=SEQUENCE_LENGTH)
    for name, (settings, _) in LEGACY.items():
        model = task_instance(name.split("/")[0], settings).build_model(TINY)
        model.save(tmp_path / "model.keras")
        loaded = keras.saving.load_model(tmp_path / "model.keras")
        before, after = (keras.tree.flatten(m(inputs)) for m in (model, loaded))
        assert max(np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in zip(before, after)) == 0.0, name


def test_a_new_process_loads_a_folder_with_its_head(tmp_path):
    """`kbert evaluate` in a process of its own: the head layers register before the model loads
    (within one test process something else has always imported them)."""
    import os
    import subprocess
    import sys

    from tests.task_harness import write_task_folder

    folder = write_task_folder(tmp_path / "m", "text-classification", {"labels": ["a", "b"]}, TINY)
    (tmp_path / "dev.csv").write_text("text,label\nA chess engine.,a\nAn IMAP server.,b\n")
    run = subprocess.run([sys.executable, "-m", "kbert.cli", "evaluate", "--model", folder,
                          "--data", str(tmp_path / "dev.csv")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert run.returncode == 0, run.stderr[-1000:]
    assert '"accuracy"' in run.stdout
