"""L2 normalisation of vectors, as sentence-transformers' `Normalize` module computes it."""

import keras
from keras import ops

# torch.nn.functional.normalize's default floor on the norm, which
# sentence-transformers' `Normalize` uses.
NORM_EPSILON = 1e-12


@keras.saving.register_keras_serializable(package="kbert")
class L2Normalization(keras.layers.Layer):
    """`x / max(||x||, 1e-12)` along the last axis, computed in float32.

    Spelled `x * rsqrt(max(sum(x²), 1e-24))`. Keras's `UnitNormalization`
    instead caps `rsqrt(sum(x²))` at 1e12 with a MINIMUM, and LiteRT's 16x8
    quantization of that form gave MiniLM's every vector the opposite sign
    (cosine -0.99 with the float model); this form keeps it at +0.997.
    """

    def call(self, inputs):
        inputs = ops.cast(inputs, "float32")
        squares = ops.sum(ops.square(inputs), axis=-1, keepdims=True)
        return inputs * ops.rsqrt(ops.maximum(squares, NORM_EPSILON**2))

    def compute_output_shape(self, input_shape):
        return input_shape
