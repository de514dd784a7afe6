"""The two texts of a packed pair, each as a row of its own, and their cosine;
the pair packed the other way round (`swap_pair`).

A pair regressor that also reads each text alone (`bert_pair_regressor`)
takes the packed pair `[CLS] a [SEP] b [SEP]` that every pair task takes,
and rebuilds from it the rows a sentence encoder would see, `[CLS] a [SEP]`
and `[CLS] b [SEP]`, in the graph: one input for training, serving, TFLite
and ONNX alike, and no second tokenization.
"""

import keras
from keras import ops

from kbert.config import ENCODER_INPUTS


@keras.saving.register_keras_serializable(package="kbert")
class PairSegments(keras.layers.Layer):
    """Splits packed pairs into `[CLS] a [SEP]` rows, then `[CLS] b [SEP]` rows.

    Call args:
        token_ids, segment_ids, padding_mask: int `(batch, length)`, the pair
            packed as google-research/bert packs it (segment ids 0 for
            `[CLS] a [SEP]`, 1 for `b [SEP]`).

    Returns:
        dict of int32 `(2 * batch, length)` tensors named `ENCODER_INPUTS`:
        the first texts of the batch, then the second texts, each starting
        at position 0 with the pair's [CLS] and padded after its [SEP]
        (segment ids 0), as the text alone packs (up to the pair's truncation).
    """

    def call(self, token_ids, segment_ids, padding_mask):
        token_ids = ops.cast(token_ids, "int32")
        used = ops.cast(padding_mask, "int32")
        first = used * ops.cast(ops.equal(segment_ids, 0), "int32")
        first_length = ops.sum(first, axis=1, keepdims=True)
        second_length = ops.sum(used - first, axis=1, keepdims=True)
        width = ops.shape(token_ids)[1]
        positions = ops.expand_dims(ops.arange(width, dtype="int32"), 0)
        # Position p > 0 of b's row holds the pair's token first_length + p - 1.
        source = ops.clip(positions + first_length - 1, 0, width - 1)
        shifted = ops.take_along_axis(token_ids, source, axis=1)
        second = ops.cast(positions <= second_length, "int32")
        second_tokens = ops.where(positions == 0, token_ids[:, :1], shifted) * second
        mask = ops.concatenate([first, second], axis=0)
        return {
            "token_ids": ops.concatenate([token_ids * first, second_tokens], axis=0),
            "segment_ids": ops.zeros_like(mask),
            "padding_mask": mask,
        }

    def compute_output_spec(self, token_ids, segment_ids, padding_mask):
        shape = (None if token_ids.shape[0] is None else 2 * token_ids.shape[0], token_ids.shape[1])
        return {name: keras.KerasTensor(shape, dtype="int32") for name in ENCODER_INPUTS}


@keras.saving.register_keras_serializable(package="kbert")
class CosineScore(keras.layers.Layer):
    """`scale * a·b + offset` for the halves of a batch of unit vectors, in float32.

    Args:
        scale, offset: floats. Initial values of the two trained weights: a
            regressor starts from the cosine mapped onto its scores' range.

    Call args:
        vectors: float `(2 * batch, dimension)` of norm 1 (`L2Normalization`):
            the first texts' vectors, then the second texts'; their dot
            product is the cosine of the texts' vectors.

    Returns:
        float32 `(batch, 1)`.
    """

    def __init__(self, scale=1.0, offset=0.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(scale)
        self.offset = float(offset)

    def build(self, vectors_shape):
        self.scale_weight = self.add_weight(
            shape=(), initializer=keras.initializers.Constant(self.scale), name="scale"
        )
        self.offset_weight = self.add_weight(
            shape=(), initializer=keras.initializers.Constant(self.offset), name="offset"
        )

    def call(self, vectors):
        first, second = ops.split(ops.cast(vectors, "float32"), 2, axis=0)
        cosine = ops.sum(first * second, axis=-1, keepdims=True)
        return cosine * ops.cast(self.scale_weight, "float32") + ops.cast(self.offset_weight, "float32")

    def compute_output_shape(self, vectors_shape):
        return (None if vectors_shape[0] is None else vectors_shape[0] // 2, 1)

    def get_config(self):
        return {**super().get_config(), "scale": self.scale, "offset": self.offset}


def swap_pair(features):
    """The packed pairs `[CLS] a [SEP] b [SEP]` of `features` repacked as `[CLS] b [SEP] a [SEP]`.

    Args:
        features: dict of int `(batch, length)` arrays or tensors named
            `ENCODER_INPUTS`, pairs packed as google-research/bert packs them.

    Returns:
        dict of int32 `(batch, length)` tensors named `ENCODER_INPUTS`: each
        row's texts in the other order, segment ids 0 for `[CLS] b [SEP]` and
        1 for `a [SEP]`; the padding mask is the pair's. Where the pair was
        truncated, the pieces kept, so `b, a` packed alone where the pair fits.
    """
    token_ids = ops.cast(features["token_ids"], "int32")
    used = ops.cast(features["padding_mask"], "int32")
    length = ops.sum(used, axis=1, keepdims=True)
    second = used * ops.cast(ops.not_equal(features["segment_ids"], 0), "int32")
    second_length = ops.sum(second, axis=1, keepdims=True)
    first_length = length - second_length
    positions = ops.expand_dims(ops.arange(ops.shape(token_ids)[1], dtype="int32"), 0)
    # New position p holds [CLS] at 0, b's pieces (the pair's first_length + p - 1)
    # up to second_length - 1, a [SEP] at second_length, then a and its [SEP]
    # (the pair's p - second_length), then the padding where it was.
    source = ops.where(
        positions == 0, 0,
        ops.where(positions < second_length, positions + first_length - 1,
                  ops.where(positions == second_length, length - 1,
                            ops.where(positions < length, positions - second_length, positions))),
    )
    first = ops.logical_and(positions > second_length, positions < length)  # a [SEP]: segment 1 now
    return {
        "token_ids": ops.take_along_axis(token_ids, source, axis=1),
        "segment_ids": ops.cast(first, "int32"),
        "padding_mask": used,
    }


def mean_probability_logits(logits):
    """Logits whose softmax is the mean of the softmaxes of `logits`, a list of
    float `(batch, classes)`: `log(mean(softmax))`, computed stably in float32."""
    log_probabilities = ops.stack([ops.log_softmax(ops.cast(x, "float32"), axis=-1) for x in logits])
    return ops.logsumexp(log_probabilities, axis=0) - ops.log(ops.cast(len(logits), "float32"))
