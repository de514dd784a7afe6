"""Learned absolute position embeddings."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="kbert")
class PositionEmbedding(keras.layers.Layer):
    """Adds nothing; returns the position embeddings for `inputs`' length.

    Args:
        max_length: int. Number of positions the table holds.
        initializer: initializer of the `(max_length, hidden)` table.

    Input: `(batch, length, hidden)`; output: `(1, length, hidden)` in the
    layer's compute dtype, ready to be added to the token embeddings.
    """

    def __init__(self, max_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length
        self.initializer = keras.initializers.get(initializer)

    def build(self, inputs_shape):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_length, inputs_shape[-1]),
            initializer=self.initializer,
        )

    def call(self, inputs):
        length = ops.shape(inputs)[1]
        table = ops.convert_to_tensor(self.embeddings)
        positions = ops.slice(table, (0, 0), (length, ops.shape(table)[1]))
        return ops.expand_dims(ops.cast(positions, self.compute_dtype), 0)

    def compute_output_shape(self, inputs_shape):
        return (1, inputs_shape[1], inputs_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(
            max_length=self.max_length,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config
