"""The masked-LM head of BERT, with its output projection tied to the token embeddings."""

import keras
from keras import ops

from kbert.layers.dense import Dense
from kbert.layers.encoder_block import get_activation


@keras.saving.register_keras_serializable(package="kbert")
class MaskedLMHead(keras.layers.Layer):
    """Logits over the vocabulary at the masked positions only.

    google-research/bert's `cls/predictions`: gather the hidden states at
    `masked_lm_positions`, then Dense(hidden) → activation → LayerNorm, then
    `x · Eᵀ + output_bias` with `E` the encoder's token-embedding matrix (tied,
    not a copy). Gathering first keeps the `(hidden × vocab)` projection to
    `max_predictions` rows per sequence instead of the whole sequence.

    Args:
        token_embedding: `keras.layers.Embedding`. The encoder's token
            embedding, whose matrix is reused as the output projection. Not
            part of `get_config()`: `BertPretrainer` rebuilds the tie on load.
        activation: str. "gelu" (exact erf form), "gelu_approximate" or "relu".
        layer_norm_epsilon: float.
        kernel_initializer: initializer of the transform kernel.

    Call arguments:
        sequence_output: `(batch, length, hidden)`.
        masked_lm_positions: int `(batch, max_predictions)`; padded slots may
            hold any valid position (google's records use 0).

    Returns float32 logits `(batch, max_predictions, vocab_size)`; the
    LayerNorm and the projection run in float32 under mixed precision.
    """

    def __init__(
        self,
        token_embedding,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(token_embedding, keras.layers.Embedding):
            raise ValueError(
                "token_embedding must be the encoder's keras.layers.Embedding, "
                f"got {type(token_embedding).__name__}"
            )
        self.token_embedding = token_embedding
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._activation_fn = get_activation(activation)
        self.vocab_size = token_embedding.input_dim

    def build(self, sequence_output_shape, masked_lm_positions_shape=None):
        hidden = sequence_output_shape[-1]
        if hidden != self.token_embedding.output_dim:
            raise ValueError(
                f"hidden size {hidden} differs from the token embedding width "
                f"{self.token_embedding.output_dim}"
            )
        self.transform_dense = Dense(
            hidden,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="transform_dense",
        )
        self.transform_dense.build((None, None, hidden))
        self.transform_layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype="float32", name="transform_layer_norm"
        )
        self.transform_layer_norm.build((None, None, hidden))
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.vocab_size,), initializer="zeros", dtype="float32"
        )

    def call(self, sequence_output, masked_lm_positions):
        positions = ops.cast(masked_lm_positions, "int32")[:, :, None]
        gathered = ops.take_along_axis(sequence_output, positions, axis=1)
        x = self._activation_fn(self.transform_dense(gathered))
        x = self.transform_layer_norm(ops.cast(x, "float32"))
        table = ops.cast(self.token_embedding.embeddings, "float32")
        return ops.add(ops.matmul(x, ops.transpose(table)), self.output_bias)

    def compute_output_shape(self, sequence_output_shape, masked_lm_positions_shape):
        return (sequence_output_shape[0], masked_lm_positions_shape[1], self.vocab_size)

    def compute_output_spec(self, sequence_output, masked_lm_positions):
        shape = (sequence_output.shape[0], masked_lm_positions.shape[1], self.vocab_size)
        return keras.KerasTensor(shape, dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            activation=self.activation,
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
