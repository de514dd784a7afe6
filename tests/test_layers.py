"""The encoder's layers against straightforward formulas of the same function."""

import keras
import numpy as np
import pytest
from keras import ops

from kbert.layers import Dense, LayerNormalization, MultiHeadSelfAttention
from kbert.layers.encoder_block import exact_gelu

HIDDEN, HEADS = 16, 4


def attention_inputs(seed=0):
    rng = np.random.default_rng(seed)
    inputs = rng.normal(size=(3, 9, HIDDEN)).astype("float32")
    lengths = np.array([9, 5, 2])
    return inputs, (np.arange(9)[None, :] < lengths[:, None]).astype("int32")


def reference_attention(layer, inputs, padding_mask, keep=None, rate=0.0):
    """BERT's attention in numpy, float64: softmax(QKᵀ/√d + mask), dropout (`keep`), times V."""

    def project(dense, x):
        kernel, bias = (np.asarray(w, np.float64) for w in dense.get_weights())
        return x @ kernel + bias

    def heads(x):
        return x.reshape(x.shape[0], x.shape[1], HEADS, -1).transpose(0, 2, 1, 3)

    x = inputs.astype(np.float64)
    query, key, value = (heads(project(d, x)) for d in (layer.query_dense, layer.key_dense, layer.value_dense))
    scores = query @ key.transpose(0, 1, 3, 2) / np.sqrt(HIDDEN // HEADS)
    scores = np.where(padding_mask[:, None, None, :] > 0, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if keep is not None:
        probs = np.where(keep, probs / (1 - rate), 0.0)
    context = (probs @ value).transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], HIDDEN)
    return project(layer.output_dense, context)


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_attention_while_training_is_berts_with_its_dropout_mask(rate):
    """Training with attention dropout (the explicit path: scale on the queries,
    the mask as a bias, the dropout factor on the context) gives BERT's attention
    with the probabilities the layer's own draws keep; rate 0 takes
    `dot_product_attention`, the path of inference."""
    keras.utils.set_random_seed(1)
    layer = MultiHeadSelfAttention(HEADS, HIDDEN // HEADS, dropout=rate)
    inputs, padding_mask = attention_inputs()
    layer.build(inputs.shape)
    seeds = layer.dropout_layer.seed_generator if rate else None
    state = np.asarray(seeds.state.value) if rate else None
    outputs = np.asarray(layer(inputs, padding_mask=padding_mask, training=True))
    keep = None
    if rate:
        seeds.state.assign(state)  # the same draws again
        keep = np.asarray(keras.random.uniform((3, HEADS, 9, 9), seed=seeds)) >= rate
        assert 0.5 < keep.mean() < 0.9
    expected = reference_attention(layer, inputs, padding_mask, keep, rate)
    np.testing.assert_allclose(outputs, expected, atol=1e-5)


def test_attention_dropout_follows_its_seed_and_moves_on():
    """Two training calls drop different probabilities; inference drops none."""
    keras.utils.set_random_seed(2)
    layer = MultiHeadSelfAttention(HEADS, HIDDEN // HEADS, dropout=0.5)
    inputs, padding_mask = attention_inputs()
    first, second = (np.asarray(layer(inputs, padding_mask=padding_mask, training=True)) for _ in range(2))
    assert np.abs(first - second).max() > 1e-3
    inference = np.asarray(layer(inputs, padding_mask=padding_mask, training=False))
    np.testing.assert_allclose(inference, reference_attention(layer, inputs, padding_mask), atol=1e-5)


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_layer_normalization_equals_keras(dtype, training):
    """kbert's LayerNormalization computes Keras's function, its gradients
    included (written out while training, TensorFlow's own otherwise)."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    inputs = (rng.normal(size=(4, 6, HIDDEN)) * 3 + 1).astype("float32")
    weights = [rng.normal(size=HIDDEN).astype("float32") for _ in range(2)]
    upstream = rng.normal(size=inputs.shape).astype("float32")
    layers = [LayerNormalization(epsilon=1e-12, dtype=dtype), keras.layers.LayerNormalization(epsilon=1e-12, dtype=dtype)]
    results = []
    for layer in layers:
        layer.build(inputs.shape)
        layer.set_weights(weights)
        x = tf.constant(inputs)
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs = layer(x, training=training)
            loss = tf.reduce_sum(tf.cast(outputs, "float32") * upstream)
        gradients = tape.gradient(loss, [x, *layer.trainable_variables])
        results.append([np.asarray(ops.cast(outputs, "float32"))] + [np.asarray(g) for g in gradients])
        assert outputs.dtype == layer.compute_dtype
    tolerance = 1e-4 if dtype == "float32" else 2e-2  # bfloat16 outputs: 8 bits of mantissa
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, atol=tolerance * max(1.0, np.abs(theirs).max()))


def test_exact_gelu_equals_keras_gelu_with_its_gradient():
    """`exact_gelu`'s written-out derivative against TensorFlow's of Keras's exact GELU."""
    import tensorflow as tf

    x = tf.constant(np.concatenate([np.linspace(-9, 9, 2001), np.random.default_rng(6).normal(size=999)]), "float32")
    results = []
    for gelu in (exact_gelu, lambda x: keras.activations.gelu(x, approximate=False)):
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs = gelu(x)
        results.append((np.asarray(outputs), np.asarray(tape.gradient(outputs, x))))
    (ours, our_slope), (keras_gelu, keras_slope) = results
    np.testing.assert_allclose(ours, keras_gelu, atol=2e-6, rtol=0)
    np.testing.assert_allclose(our_slope, keras_slope, atol=2e-6, rtol=0)
    # GELU'(0) = 1/2; GELU' is least at x = -sqrt(2): erfc(1) / 2 - sqrt(2) exp(-1) / sqrt(2 pi).
    assert abs(our_slope[1000] - 0.5) < 1e-7 and abs(our_slope.min() + 0.128904) < 1e-5


def test_dense_sums_its_bias_gradient_in_float32():
    """Under mixed_bfloat16 the bias gradient of 4,096 rows is the float64 sum
    of the upstream gradient, to bfloat16's rounding (TensorFlow's
    `BiasAddGrad`, which Keras's Dense takes, sums in bfloat16 on CPUs)."""
    import tensorflow as tf

    rng = np.random.default_rng(7)
    layer = Dense(8, dtype="mixed_bfloat16")
    layer.build((None, 4))
    inputs = tf.constant(rng.normal(size=(4096, 4)), "float32")
    # Upstream values exact in bfloat16, so the reference sums what the layer sees.
    upstream = np.asarray(tf.cast(tf.cast(rng.normal(1.0, 1.0, size=(4096, 8)), "bfloat16"), "float64"))
    with tf.GradientTape() as tape:
        outputs = layer(inputs, training=True)
        loss = tf.reduce_sum(tf.cast(outputs, "float32") * upstream.astype("float32"))
    gradient = np.asarray(tape.gradient(loss, layer.bias))
    # A few bfloat16 roundings of partial sums (about 2**-8 each); Keras's
    # Dense is 75% off here.
    np.testing.assert_allclose(gradient, upstream.sum(0), rtol=2**-7)
    np.testing.assert_array_equal(np.asarray(outputs), np.asarray(layer(inputs)))


def test_dense_config_round_trip():
    layer = Dense(3, activation="tanh", name="pooler")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is Dense and restored.get_config() == layer.get_config()


def test_layer_normalization_config_round_trip():
    layer = LayerNormalization(epsilon=1e-6, name="norm")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is LayerNormalization and restored.get_config() == layer.get_config()


def real_token_block(dropout=0.0):
    from kbert.layers import TransformerEncoderBlock

    keras.utils.set_random_seed(4)
    block = TransformerEncoderBlock(HEADS, 32, dropout=dropout, attention_dropout=dropout)
    inputs, padding_mask = attention_inputs()
    block.build(inputs.shape)
    return block, inputs, padding_mask


@pytest.mark.parametrize("first_token_only", [False, True])
def test_block_trains_over_real_tokens_to_the_same_function(first_token_only):
    """With `unpadded_training`, a training call computes the padded block's
    outputs at the real tokens, zeros at the padding, and the same gradients."""
    import tensorflow as tf

    block, inputs, padding_mask = real_token_block()
    weights = np.random.default_rng(5).normal(size=(3, 1 if first_token_only else 9, HIDDEN))
    real = padding_mask[:, :1, None] if first_token_only else padding_mask[..., None]
    results = []
    for unpadded in (False, True):
        block.unpadded_training = unpadded
        x = tf.constant(inputs)
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs = block(x, padding_mask=padding_mask, training=True, first_token_only=first_token_only)
            loss = tf.reduce_sum(outputs * (weights * real).astype("float32"))
        gradients = tape.gradient(loss, [x, *block.trainable_variables])
        results.append([np.asarray(outputs) * real] + [np.asarray(g) for g in gradients])
        if unpadded and not first_token_only:
            assert not np.asarray(outputs)[padding_mask == 0].any()
    for padded, unpadded in zip(*results):
        np.testing.assert_allclose(unpadded, padded, atol=1e-5)


def test_block_training_gradients_equal_tensorflows():
    """Without dropout a training call computes the inference function; its
    written-out gradients (GELU, LayerNorm, bias sums) equal TensorFlow's
    gradients of the inference ops."""
    import tensorflow as tf

    block, inputs, padding_mask = real_token_block()
    weights = np.random.default_rng(8).normal(size=inputs.shape).astype("float32")
    results = []
    for training in (False, True):
        x = tf.constant(inputs)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(block(x, padding_mask=padding_mask, training=training) * weights)
        results.append([np.asarray(g) for g in tape.gradient(loss, [x, *block.trainable_variables])])
    for inference, training in zip(*results):
        np.testing.assert_allclose(training, inference, atol=1e-5 * max(1.0, np.abs(inference).max()))


def test_block_trains_over_real_tokens_with_dropout_and_infers_padded():
    """Dropout still drops over real tokens; inference ignores the switch."""
    block, inputs, padding_mask = real_token_block(dropout=0.3)
    block.unpadded_training = True
    first, second = (np.asarray(block(inputs, padding_mask=padding_mask, training=True)) for _ in range(2))
    assert np.all(np.isfinite(first)) and np.abs(first - second)[padding_mask == 1].max() > 1e-3
    inference = np.asarray(block(inputs, padding_mask=padding_mask))
    block.unpadded_training = False
    np.testing.assert_array_equal(inference, np.asarray(block(inputs, padding_mask=padding_mask)))
