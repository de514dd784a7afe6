"""Sentence-transformers' pooling of token vectors into one vector per text.

Each layer takes `(batch, length, hidden)` token vectors and the
`(batch, length)` padding mask, computes in float32 as sentence-transformers
does, and returns `(batch, hidden)`.
"""

import keras
from keras import ops

# sentence-transformers' max pooling sets padded positions to this value
# before the max (`sentence_transformers.models.Pooling`).
MAX_POOLING_FILL = -1e9


class _SequencePooling(keras.layers.Layer):
    def compute_output_shape(self, inputs_shape, padding_mask_shape=None):
        return (inputs_shape[0], inputs_shape[2])


@keras.saving.register_keras_serializable(package="kbert")
class MaskedMeanPooling(_SequencePooling):
    """Averages the token vectors over positions where `padding_mask` is 1.

    Spelled as one matrix product of the mask's weights `mask / count` with
    the vectors (sentence-transformers: `sum(x * mask) / count`, equal to
    rounding): LiteRT's 16x8 quantizer keeps a BATCH_MATMUL accurate where
    the MUL and SUM of the other form lost 0.013 of STS-B Spearman on MiniLM
    (0.003 this way). An all-padding row gives zeros rather than NaN.
    """

    def call(self, inputs, padding_mask):
        mask = ops.cast(padding_mask, "float32")
        weights = mask / ops.maximum(ops.sum(mask, axis=1, keepdims=True), 1e-9)
        return ops.matmul(weights[:, None, :], ops.cast(inputs, "float32"))[:, 0, :]


@keras.saving.register_keras_serializable(package="kbert")
class MaskedMaxPooling(_SequencePooling):
    """The largest value of each feature over positions where `padding_mask` is 1."""

    def call(self, inputs, padding_mask):
        mask = ops.cast(padding_mask, "float32")[:, :, None]
        inputs = ops.cast(inputs, "float32")
        return ops.max(inputs * mask + (1.0 - mask) * MAX_POOLING_FILL, axis=1)


@keras.saving.register_keras_serializable(package="kbert")
class FirstTokenPooling(_SequencePooling):
    """The vector of the first token, [CLS] (before BERT's pooler dense layer)."""

    def call(self, inputs, padding_mask=None):
        return ops.cast(inputs[:, 0, :], "float32")
