import subprocess
import sys

import keras
import numpy as np
import pytest

from kbert import BertConfig, bert_classifier, bert_embedder, bert_encoder
from tests.model_harness import check_model, tiny_inputs

TINY = BertConfig(
    vocab_size=50,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=32,
    hidden_dropout=0.1,
    attention_dropout=0.1,
)


def test_encoder(tmp_path):
    targets = {
        "sequence_output": np.zeros((2, 7, 16), "float32"),
        "pooled_output": np.zeros((2, 16), "float32"),
    }
    check_model(lambda dtype: bert_encoder(TINY, dtype=dtype), 50, targets, "mse", tmp_path)


def test_classifier(tmp_path):
    check_model(
        lambda dtype: bert_classifier(TINY, 3, dtype=dtype),
        50,
        np.array([0, 2], "int32"),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        tmp_path,
    )


def test_embedder(tmp_path):
    check_model(
        lambda dtype: bert_embedder(TINY, dtype=dtype),
        50,
        np.eye(16, dtype="float32")[:2],  # unit vectors, as it gives: a loss it can lower
        "mse",
        tmp_path,
    )


def test_padding_does_not_change_real_positions():
    encoder = bert_encoder(TINY)
    short = tiny_inputs(50, batch=1, length=5)
    short["padding_mask"][:] = 1
    padded = {k: np.pad(v, ((0, 0), (0, 4))) for k, v in short.items()}
    a = encoder(short)["sequence_output"]
    b = encoder(padded)["sequence_output"][:, :5]
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_padding_mask_holds_under_bfloat16():
    encoder = bert_encoder(TINY, dtype="mixed_bfloat16")
    short = tiny_inputs(50, batch=1, length=5)
    short["padding_mask"][:] = 1
    padded = {k: np.pad(v, ((0, 0), (0, 4))) for k, v in short.items()}
    a = keras.ops.convert_to_numpy(encoder(short)["sequence_output"]).astype("float32")
    b = keras.ops.convert_to_numpy(encoder(padded)["sequence_output"][:, :5]).astype("float32")
    # bfloat16 keeps 8 bits of mantissa; padding leaking in would move values by O(1).
    np.testing.assert_allclose(a, b, atol=5e-2)


def test_embedder_outputs_unit_vectors():
    embeddings = bert_embedder(TINY)(tiny_inputs(50))
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=-1), 1.0, atol=1e-5)


def test_sequence_longer_than_positions():
    with pytest.raises(ValueError, match="sequence_length=40 exceeds max_position_embeddings=32"):
        bert_encoder(TINY, sequence_length=40)


def test_bad_builder_arguments():
    with pytest.raises(ValueError, match="num_classes=1"):
        bert_classifier(TINY, 1)
    with pytest.raises(ValueError, match="expected a BertConfig or an encoder"):
        bert_classifier("bert_base", 2)


JAX_SCRIPT = """
import sys
import numpy as np
from kbert import BertConfig, bert_classifier
from kbert.models import bert_pair_regressor
assert "tensorflow" not in sys.modules, "model code imported TensorFlow"
config = BertConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                    intermediate_size=32, max_position_embeddings=32)
model = bert_classifier(config, 3)
x = {"token_ids": np.ones((2, 5), "int32"), "segment_ids": np.zeros((2, 5), "int32"),
     "padding_mask": np.ones((2, 5), "int32")}
model.compile(optimizer="adamw", loss="sparse_categorical_crossentropy", jit_compile=True)
losses = model.fit(x, np.array([0, 1]), epochs=1, verbose=0).history["loss"]
pairs = {"token_ids": np.array([[2, 5, 3, 6, 7, 3, 0]] * 2, "int32"),
         "segment_ids": np.array([[0, 0, 0, 1, 1, 1, 0]] * 2, "int32"),
         "padding_mask": np.array([[1, 1, 1, 1, 1, 1, 0]] * 2, "int32")}
regressor = bert_pair_regressor(config, (0.0, 5.0))
regressor.compile(optimizer="adamw", loss="mse", jit_compile=True)
losses += regressor.fit(pairs, np.array([1.0, 4.0]), epochs=1, verbose=0).history["loss"]
assert "tensorflow" not in sys.modules, "training imported TensorFlow"
# (Eager calls would add 17 s of op-by-op dispatch and check nothing fit has not.)
assert np.all(np.isfinite(losses)), losses
print("jax ok", losses)
"""


def test_model_code_runs_under_jax_without_tensorflow():
    pytest.importorskip("jax")
    result = subprocess.run(
        [sys.executable, "-c", JAX_SCRIPT],
        env={"KERAS_BACKEND": "jax", "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "jax ok" in result.stdout


def test_classifier_shares_encoder_weights_and_matches_full_graph():
    encoder = bert_encoder(TINY)
    classifier = bert_classifier(encoder, 3)
    nested = classifier.get_layer("bert_encoder")
    inputs = tiny_inputs(50)
    # The last block computes [CLS] alone, and gives the full graph's pooled output.
    assert tuple(nested(inputs)["sequence_output"].shape) == (2, 1, 16)
    np.testing.assert_allclose(
        nested(inputs)["pooled_output"], encoder(inputs)["pooled_output"], atol=1e-6
    )
    # Shared layers: changing the classifier's weights changes the encoder's.
    pooler = classifier.get_layer("bert_encoder").get_layer("pooler")
    pooler.bias.assign(pooler.bias + 1.0)
    np.testing.assert_allclose(encoder.get_layer("pooler").bias, pooler.bias)


def test_fresh_weights_differ_between_layers_and_projections():
    encoder = bert_encoder(TINY)
    first = encoder.get_layer("transformer_layer_0").attention
    second = encoder.get_layer("transformer_layer_1").attention
    kernels = [
        first.query_dense.kernel, first.key_dense.kernel, first.value_dense.kernel,
        second.query_dense.kernel,
    ]
    values = [keras.ops.convert_to_numpy(k) for k in kernels]
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            assert not np.allclose(values[i], values[j]), (kernels[i].path, kernels[j].path)
