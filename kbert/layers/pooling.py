"""Mean pooling over the real (unpadded) tokens."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="kbert")
class MaskedMeanPooling(keras.layers.Layer):
    """Averages `(batch, length, hidden)` over positions where `padding_mask` is 1.

    Computed in float32, as sentence-transformers does. An all-padding row
    gives zeros rather than NaN.
    """

    def call(self, inputs, padding_mask):
        mask = ops.cast(padding_mask, "float32")[:, :, None]
        total = ops.sum(ops.cast(inputs, "float32") * mask, axis=1)
        count = ops.maximum(ops.sum(mask, axis=1), 1e-9)
        return total / count

    def compute_output_shape(self, inputs_shape, padding_mask_shape=None):
        return (inputs_shape[0], inputs_shape[2])
