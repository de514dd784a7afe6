"""A task model's forward pass spelled in the op forms that converters recognise.

The Keras model computes the same function with ops chosen for training and for
XLA; converters look for other forms. tf2onnx and onnxruntime's BERT fusions
(Attention, SkipLayerNormalization, BiasGelu) match these subgraphs only
(`target="onnx"`, also the SavedModel's graph):

| piece | Keras (TensorFlow backend) | here |
| --- | --- | --- |
| `Dense` on `(batch, length, width)` | `tensordot`: Reshape, MatMul, Reshape | one broadcasting MatMul, then Add |
| attention | `einsum`s and a `where` on a boolean mask | MatMul(q, kᵀ) / √head + (1 − mask)·−10000, Softmax, MatMul(·, v) on `(batch, heads, length, head)` |
| LayerNorm | moments and Rsqrt | ReduceMean, Sub, Pow 2, ReduceMean, Add ε, Sqrt, Div, Mul, Add |
| exact GELU | `0.5·x·erfc(−x/√2)` (tf2onnx has no Erfc) | `x·(1 + erf(x·1/√2))·0.5` |
| embeddings | `ops.take`, which maps negative ids with a Select on the ids | `tf.gather` |

For the TFLite converter (`target="tflite"`) four pieces differ: GELU is
`tf.nn.gelu`, which becomes the GELU builtin (LiteRT has no Erf); the
padding mask multiplies the softmax, which is then renormalised, instead of
adding −10000 to the scores, once each padded key has taken its row's lowest
score (`_masked_softmax`): exact in float, never 0 / 0, and no activation has
to span [−10000, scores] once quantized; Q, K and V are one FULLY_CONNECTED on the
concatenated kernels, split after (one GEMM and one dynamic quantisation of
the input instead of three); and the last block computes only the [CLS] row
after its keys and values, the only row the pooler reads (what
`bert_classifier` does in Keras). Without the Select on the ids, the 16x8
quantizer has no int32 tensor it cannot calibrate. onnxruntime's fusions need
the per-layer form, so the ONNX graph keeps it.

`encoder_outputs` computes the encoder this way; `model_outputs` then calls
the model's own head layer (`kbert.models.heads`) on it, with the same pass
over each text of a pair for a head that reads them apart, and over each of
the task's `input_views` (a pair read both ways), joined by its `merge_views`.
The last block computes [CLS] alone for TFLite only when the head reads the
pooled output alone (`Task.reads_sequence`).

The pass reads the Keras model's own variables, so an artefact traced from it
holds the fine-tuned weights; `tests/test_export_units.py` holds it to the Keras
model's logits within `GRAPH_TOLERANCE`.
"""

import math

import tensorflow as tf

from kbert.config import ENCODER_INPUTS

# The additive mask of google-research/bert and Hugging Face BERT: large enough
# that exp() of a masked score is 0 in float32, and the constant onnxruntime's
# attention fusion expects by default.
MASK_BIAS = -10000.0
# Float32 logits of the two forward passes agree to rounding error (measured
# ~1e-6 on MiniLM); the bound leaves an order of magnitude.
GRAPH_TOLERANCE = 1e-5
# The name scope of each block's feed-forward output matmul in the TFLite
# graph: its input, the activation's output, has the outlier channels that
# int8 quantization must treat apart (`kbert.export.tflite`).
FEED_FORWARD_OUTPUT = "feed_forward_output"


def model_outputs(task, model, features, target="onnx"):
    """The outputs of a task's model, computed with converter-friendly ops.

    Args:
        task: the model folder's `kbert.tasks.Task`.
        model: keras.Model from `task.build_model` (TensorFlow backend).
        features: dict of int32 `(batch, length)` tensors named `ENCODER_INPUTS`.
        target: str. "onnx" (also the SavedModel's graph) or "tflite": the TFLite
            converter has no Erf op but maps `tf.nn.gelu` to its GELU builtin.

    Returns:
        dict of float32 tensors keyed by `task.outputs`, equal to the Keras
        model's outputs up to float rounding.
    """
    if target not in ("onnx", "tflite"):
        raise ValueError(f"target={target!r}; expected 'onnx' or 'tflite'")
    from kbert.models.heads import HEAD_LAYER
    from kbert.tasks.inference import output_dict

    encoder = task_encoder(model)
    head = model.get_layer(HEAD_LAYER)
    first_token_only = target == "tflite" and not task.reads_sequence

    def one_view(features):
        outputs = encoder_outputs(encoder, features, target, first_token_only)
        if getattr(head, "reads_pair_segments", False):
            # Each text of the pair alone, through the same encoder.
            segments = model.get_layer("pair_segments")(
                features["token_ids"], features["segment_ids"], features["padding_mask"]
            )
            outputs["segment_sequence_output"] = encoder_outputs(encoder, segments, target)["sequence_output"]
            features = {**features, "segment_padding_mask": segments["padding_mask"]}
        return output_dict(head(outputs, features), task.outputs)

    return task.over_views(features, one_view)


def encoder_outputs(encoder, features, target="onnx", first_token_only=False):
    """`sequence_output` and `pooled_output` of a `bert_encoder`, converter-friendly.

    With `first_token_only`, the last block computes the [CLS] row alone and
    `sequence_output` is `(batch, 1, hidden)`.
    """
    token_ids = features["token_ids"]
    x = tf.gather(_value(encoder.get_layer("token_embedding").embeddings), token_ids)
    length = tf.shape(token_ids)[1]
    positions = _value(encoder.get_layer("position_embedding").embeddings)[:length]
    x = x + positions[tf.newaxis]
    x = x + tf.gather(_value(encoder.get_layer("segment_embedding").embeddings), features["segment_ids"])
    x = _layer_norm(x, encoder.get_layer("embeddings_layer_norm"))

    # (batch, 1, 1, length): two ExpandDims, then Cast, Sub and Mul, the mask
    # subgraph onnxruntime's attention fusion traces back to the graph input.
    mask = tf.expand_dims(tf.expand_dims(features["padding_mask"], 1), 1)
    if target == "tflite":
        attention_bias = tf.cast(mask, tf.float32)
    else:
        attention_bias = (1.0 - tf.cast(mask, tf.float32)) * MASK_BIAS
    blocks = _blocks(encoder)
    for index, block in enumerate(blocks):
        last_only = first_token_only and index == len(blocks) - 1
        x = _encoder_block(x, block, attention_bias, target, last_only)

    pooled = tf.tanh(_dense(x[:, 0, :], encoder.get_layer("pooler")))
    return {"sequence_output": x, "pooled_output": pooled}


def task_encoder(model):
    """The `bert_encoder` inside a task model; `ValueError` for other models."""
    try:
        encoder = model.get_layer("bert_encoder")
    except ValueError:
        raise ValueError(
            f"model {model.name!r} is not a kbert task model: expected a layer 'bert_encoder'"
        ) from None
    missing = sorted(set(ENCODER_INPUTS) - set(model.input))
    if missing:
        raise ValueError(f"model {model.name!r} lacks the inputs {missing}")
    return encoder


def _blocks(encoder):
    blocks = []
    while True:
        try:
            blocks.append(encoder.get_layer(f"transformer_layer_{len(blocks)}"))
        except ValueError:
            return blocks


def _value(variable):
    return tf.convert_to_tensor(variable, dtype=tf.float32)


def _dense(x, layer):
    """`x · kernel + bias` as one MatMul (broadcast over leading axes) and one Add."""
    y = tf.matmul(x, _value(layer.kernel))
    if layer.use_bias:
        y = y + _value(layer.bias)
    return y


def _layer_norm(x, layer):
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = tf.reduce_mean(tf.pow(centered, 2.0), axis=-1, keepdims=True)
    normalized = centered / tf.sqrt(variance + layer.epsilon)
    return normalized * _value(layer.gamma) + _value(layer.beta)


def _activation(name, x, target):
    if name == "gelu" and target == "tflite":
        return tf.nn.gelu(x, approximate=False)
    if name == "gelu":
        # Grappler folds x / √2 into x · (1/√2); this is then the order of
        # onnxruntime's TensorFlow Gelu pattern: x · (1 + erf(x · 1/√2)) · 0.5.
        return x * (1.0 + tf.math.erf(x * (1.0 / math.sqrt(2.0)))) * 0.5
    if name == "gelu_approximate":
        cube = 0.044715 * tf.pow(x, 3.0)
        return x * (1.0 + tf.tanh(math.sqrt(2.0 / math.pi) * (x + cube))) * 0.5
    if name == "relu":
        return tf.nn.relu(x)
    raise ValueError(f"activation={name!r} has no export form")


def _split_heads(x, num_heads, head_size, perm):
    batch, length = tf.shape(x)[0], tf.shape(x)[1]
    return tf.transpose(tf.reshape(x, [batch, length, num_heads, head_size]), perm)


def _fused_query_key_value(x, attention):
    """Q, K and V of `x` from one MatMul on the concatenated kernels."""
    layers = (attention.query_dense, attention.key_dense, attention.value_dense)
    kernel = tf.concat([_value(layer.kernel) for layer in layers], axis=-1)
    bias = tf.concat(
        [_value(layer.bias) if layer.use_bias else tf.zeros_like(_value(layer.kernel)[0])
         for layer in layers],
        axis=-1,
    )
    return tf.split(tf.matmul(x, kernel) + bias, 3, axis=-1)


def _masked_softmax(scores, mask):
    """softmax over the real keys, with `mask` (1 real, 0 padding) multiplying instead of
    an additive −10000, so that no tensor spans [−10000, scores] once quantized.

    Each padded key first takes its row's lowest score, so the row's maximum is
    a real key's: the real keys then hold at least 1/length of the softmax and
    the renormalisation never divides by 0. Without that step, the padded
    queries of a fine-tuned QA model's first block score the padded keys so far
    above the real ones (over 85 nats) that the real keys' exponentials
    underflow float32 to 0; 0 / 0 is NaN, and the next block's keys carry it
    to every row.
    """
    floor = tf.reduce_min(scores, axis=-1, keepdims=True)
    scores = scores * mask + floor * (1.0 - mask)
    probs = tf.nn.softmax(scores, axis=-1) * mask
    return probs / tf.reduce_sum(probs, axis=-1, keepdims=True)


def _encoder_block(x, block, attention_bias, target, first_token_only=False):
    """One post-LN block; with `first_token_only`, returns `(batch, 1, width)`."""
    attention = block.attention
    heads, head_size = attention.num_heads, attention.head_size
    if target == "tflite":
        query, key, value = _fused_query_key_value(x, attention)
    else:
        query, key, value = (
            _dense(x, layer)
            for layer in (attention.query_dense, attention.key_dense, attention.value_dense)
        )
    if first_token_only:
        x, query = x[:, :1], query[:, :1]
    # q, v: (batch, heads, length, head); k: (batch, heads, head, length).
    query = _split_heads(query, heads, head_size, [0, 2, 1, 3])
    key = _split_heads(key, heads, head_size, [0, 2, 3, 1])
    value = _split_heads(value, heads, head_size, [0, 2, 1, 3])
    # A Div, as in Hugging Face's graph: onnxruntime's fusion finds the scale
    # and the mask among the Add's parents by op type, so a Mul here would be
    # taken for the mask's Mul. The divisor comes from the runtime shape
    # because grappler, run by tf2onnx, turns a division by a constant into a
    # Mul.
    scale = tf.sqrt(tf.cast(tf.shape(query)[-1], tf.float32))
    scores = tf.matmul(query, key) / scale
    if target == "tflite":
        probs = _masked_softmax(scores, attention_bias)
    else:
        probs = tf.nn.softmax(scores + attention_bias, axis=-1)
    context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])
    batch, length = tf.shape(x)[0], tf.shape(x)[1]
    context = tf.reshape(context, [batch, length, heads * head_size])
    x = _layer_norm(x + _dense(context, attention.output_dense), block.attention_layer_norm)
    hidden = _activation(block.activation, _dense(x, block.intermediate_dense), target)
    if target == "tflite":
        # Named so that the int8 quantizer finds these matmuls (kbert.export.tflite).
        with tf.name_scope(FEED_FORWARD_OUTPUT):
            output = _dense(hidden, block.output_dense)
    else:
        output = _dense(hidden, block.output_dense)
    return _layer_norm(x + output, block.output_layer_norm)
