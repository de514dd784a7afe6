"""Properties every kbert model must keep, in the spirit of keras-hub's TestCase.

Each model test calls `check_model(build, ...)` once; `build(dtype)` returns a
fresh model from a tiny config.
"""

import os

import keras
import numpy as np

from kbert.models.encoder import ENCODER_INPUTS


def tiny_inputs(vocab_size, batch=2, length=7, seed=0):
    """Random encoder inputs with one padded row."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), "int32")
    mask[-1, length // 2 :] = 0
    return {
        "token_ids": rng.integers(1, vocab_size, (batch, length)).astype("int32") * mask,
        "segment_ids": (np.arange(length)[None, :] >= length // 2).astype("int32").repeat(batch, 0),
        "padding_mask": mask,
    }


def _flatten(outputs):
    if isinstance(outputs, dict):
        return [keras.ops.convert_to_numpy(outputs[k]) for k in sorted(outputs)]
    return [keras.ops.convert_to_numpy(outputs)]


def assert_same_outputs(a, b, inputs, atol=1e-6):
    for x, y in zip(_flatten(a(inputs)), _flatten(b(inputs))):
        np.testing.assert_allclose(x, y, atol=atol)


def check_config_round_trip(model, inputs):
    restored = model.__class__.from_config(model.get_config())
    restored.set_weights(model.get_weights())
    assert_same_outputs(model, restored, inputs)


def check_saved_model_equal(model, inputs, tmp_path):
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert_same_outputs(model, restored, inputs)


def check_variable_lengths(model, vocab_size):
    for length in (3, 11):
        outputs = _flatten(model(tiny_inputs(vocab_size, length=length)))
        assert all(np.all(np.isfinite(o)) for o in outputs)


# Two AdamW steps at 1e-3 lower the tiny models' loss on their batch by 8e-3 to
# 2e-2 (measured: encoder, classifier, embedder); a model whose weights do not
# move keeps it to float rounding.
MIN_LOSS_DROP = 1e-3


def batch_loss(model, inputs, targets, loss):
    """`loss` of `model` on one batch in inference mode (no dropout): summed over a
    dict's outputs, each the mean over its rows."""
    loss_fn = keras.losses.get(loss)
    outputs = model(inputs, training=False)
    if not isinstance(outputs, dict):
        outputs, targets = {"": outputs}, {"": targets}
    return sum(float(keras.ops.mean(loss_fn(targets[name], outputs[name]))) for name in outputs)


def check_fit_step(model, inputs, targets, loss, jit_compile=True):
    """`fit` compiles and learns: two steps on one batch lower its loss."""
    before = batch_loss(model, inputs, targets, loss)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss=loss, jit_compile=jit_compile)
    history = model.fit(inputs, targets, epochs=2, batch_size=len(targets), verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    after = batch_loss(model, inputs, targets, loss)
    assert after < before - MIN_LOSS_DROP, (before, after)


def check_dtype_policy(build, inputs, policy="mixed_bfloat16"):
    model = build(policy)
    layer_norms = [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, keras.layers.LayerNormalization)
    ]
    assert layer_norms and all(layer.compute_dtype == "float32" for layer in layer_norms)
    dense = [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, keras.layers.Dense) and layer.name not in ("logits",)
    ]
    assert all(layer.compute_dtype == "bfloat16" for layer in dense)
    assert all(v.dtype == "float32" for v in model.weights)
    outputs = _flatten(model(inputs))
    assert all(np.all(np.isfinite(o.astype("float32"))) for o in outputs)


def check_model(build, vocab_size, targets, loss, tmp_path):
    """Runs every property check on `build(None)` (float32) and `build(policy)`."""
    model = build(None)
    inputs = tiny_inputs(vocab_size)
    assert set(model.input) == set(ENCODER_INPUTS)
    check_config_round_trip(model, inputs)
    check_saved_model_equal(model, inputs, tmp_path)
    check_variable_lengths(model, vocab_size)
    check_fit_step(model, inputs, targets, loss, jit_compile=True)
    check_dtype_policy(build, inputs)
