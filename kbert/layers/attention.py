"""Multi-head scaled dot-product self-attention."""

import keras
from keras import ops

from kbert.layers.initializers import clone_initializer


@keras.saving.register_keras_serializable(package="kbert")
class MultiHeadSelfAttention(keras.layers.Layer):
    """BERT's self-attention: query/key/value projections, softmax(QKᵀ/√d)V, output.

    Inference, and training without attention dropout, go through
    `keras.ops.dot_product_attention`, which GPU backends lower to fused (flash)
    kernels. Dropout on the attention probabilities, as in the BERT paper, has no
    fused form, so while training with `dropout > 0` the probabilities are
    computed explicitly (softmax and dropout in float32).

    Args:
        num_heads: int. Number of attention heads.
        head_size: int. Width of each head.
        dropout: float. Dropout rate on the attention probabilities.
        kernel_initializer: initializer of the projection kernels.

    Call arguments:
        inputs: `(batch, length, hidden)`.
        padding_mask: optional `(batch, length)`; 1/True for real tokens. A
            boolean mask, so padding stays excluded under float16 and bfloat16.
        training: bool.
        first_token_only: bool. Compute the output at position 0 only.
    """

    def __init__(
        self, num_heads, head_size, dropout=0.0, kernel_initializer="glorot_uniform", **kwargs
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_size = head_size
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        width = num_heads * head_size

        def dense(name):
            return keras.layers.Dense(
                width,
                kernel_initializer=clone_initializer(self.kernel_initializer),
                dtype=self.dtype_policy,
                name=name,
            )

        self.query_dense = dense("query")
        self.key_dense = dense("key")
        self.value_dense = dense("value")
        self.output_dense = dense("attention_output")
        # Drops the float32 probabilities: a float32 random draw is 1.45x as
        # fast as a bfloat16 one on CPUs (see `TransformerEncoderBlock`).
        self.dropout_layer = keras.layers.Dropout(dropout, dtype="float32")

    def build(self, inputs_shape):
        inputs_shape = tuple(inputs_shape)
        for layer in (self.query_dense, self.key_dense, self.value_dense):
            layer.build(inputs_shape)
        self.output_dense.build(inputs_shape[:-1] + (self.num_heads * self.head_size,))

    def _split_heads(self, x):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads, self.head_size))

    def call(self, inputs, padding_mask=None, training=False, first_token_only=False):
        # With `first_token_only`, only position 0 attends (to every position):
        # all a [CLS] classifier needs from the last block.
        query_inputs = inputs[:, :1, :] if first_token_only else inputs
        query = self._split_heads(self.query_dense(query_inputs))
        key = self._split_heads(self.key_dense(inputs))
        value = self._split_heads(self.value_dense(inputs))
        # (batch, 1, 1, key_length): broadcast over heads and query positions.
        mask = None
        if padding_mask is not None:
            mask = ops.cast(padding_mask, "bool")[:, None, None, :]
        scale = 1.0 / float(self.head_size) ** 0.5

        if training and self.dropout > 0:
            scores = ops.einsum("bqnh,bknh->bnqk", query, key)
            scores = ops.cast(scores, "float32") * scale
            if mask is not None:
                scores = ops.where(mask, scores, -1e9)
            probs = self.dropout_layer(ops.softmax(scores, axis=-1), training=training)
            probs = ops.cast(probs, self.compute_dtype)
            context = ops.einsum("bnqk,bknh->bqnh", probs, value)
        else:
            context = ops.dot_product_attention(query, key, value, mask=mask, scale=scale)

        batch, length = ops.shape(context)[0], ops.shape(context)[1]
        context = ops.reshape(context, (batch, length, self.num_heads * self.head_size))
        return self.output_dense(context)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            head_size=self.head_size,
            dropout=self.dropout,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
