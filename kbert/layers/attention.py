"""Multi-head scaled dot-product self-attention."""

import keras
from keras import ops

from kbert.layers.dense import Dense
from kbert.layers.initializers import clone_initializer

# The score of a padded key: exp(-1e9 - max) is 0 in float32, as the -inf
# of an exact mask is, without the NaN a row of -inf gives.
MASKED_SCORE = -1e9


@keras.saving.register_keras_serializable(package="kbert")
class MultiHeadSelfAttention(keras.layers.Layer):
    """BERT's self-attention: query/key/value projections, softmax(QKᵀ/√d)V, output.

    Inference, and training without attention dropout, go through
    `keras.ops.dot_product_attention`, which GPU backends lower to fused (flash)
    kernels. Dropout on the attention probabilities, as in the BERT paper, has no
    fused form, so while training with `dropout > 0` the probabilities are
    computed explicitly, softmax in float32 (see `_dropped_attention`).

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
            return Dense(
                width,
                kernel_initializer=clone_initializer(self.kernel_initializer),
                dtype=self.dtype_policy,
                name=name,
            )

        self.query_dense = dense("query")
        self.key_dense = dense("key")
        self.value_dense = dense("value")
        self.output_dense = dense("attention_output")
        # Holds the seed generator of the probabilities' dropout mask, drawn
        # in float32: a float32 random draw is 1.45x as fast as a bfloat16
        # one on CPUs (see `TransformerEncoderBlock`).
        self.dropout_layer = keras.layers.Dropout(dropout, dtype="float32")

    def build(self, inputs_shape):
        inputs_shape = tuple(inputs_shape)
        for layer in (self.query_dense, self.key_dense, self.value_dense):
            layer.build(inputs_shape)
        self.output_dense.build(inputs_shape[:-1] + (self.num_heads * self.head_size,))

    def _split_heads(self, x):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads, self.head_size))

    def _merge_heads(self, x):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads * self.head_size))

    def call(self, inputs, padding_mask=None, training=False, first_token_only=False):
        # With `first_token_only`, only position 0 attends (to every position):
        # all a [CLS] classifier needs from the last block.
        query_inputs = inputs[:, :1, :] if first_token_only else inputs
        query = self._split_heads(self.query_dense(query_inputs))
        key = self._split_heads(self.key_dense(inputs))
        value = self._split_heads(self.value_dense(inputs))
        context = self._attend(query, key, value, padding_mask, training)
        return self.output_dense(self._merge_heads(context))

    def call_on_real_tokens(self, tokens, real, padding_mask, training=False, first_token_inputs=None):
        """The same attention, with the projections over a batch's real tokens alone.

        Args:
            tokens: `(tokens, hidden)`, `real.gather` of the padded inputs.
            real: `RealTokens` of the batch.
            padding_mask: `(batch, length)`, the mask `real` was made from.
            training: bool.
            first_token_inputs: optional `(batch, 1, hidden)`, the inputs at
                position 0: only they attend, as with `first_token_only`.

        Returns:
            `(tokens, hidden)`, or `(batch, 1, hidden)` with `first_token_inputs`.
        """

        def padded_heads(dense):
            return self._split_heads(real.scatter(dense(tokens)))

        key, value = padded_heads(self.key_dense), padded_heads(self.value_dense)
        if first_token_inputs is not None:
            query = self._split_heads(self.query_dense(first_token_inputs))
            context = self._attend(query, key, value, padding_mask, training)
            return self.output_dense(self._merge_heads(context))
        context = self._attend(padded_heads(self.query_dense), key, value, padding_mask, training)
        return self.output_dense(real.gather(self._merge_heads(context)))

    def _attend(self, query, key, value, padding_mask, training):
        """softmax(QKᵀ/√d) V over `(batch, length, heads, head_size)` projections."""
        # (batch, 1, 1, key_length): broadcast over heads and query positions.
        mask = None
        if padding_mask is not None:
            mask = ops.cast(padding_mask, "bool")[:, None, None, :]
        scale = 1.0 / float(self.head_size) ** 0.5
        if training and self.dropout > 0:
            return self._dropped_attention(query, key, value, mask, scale)
        return ops.dot_product_attention(query, key, value, mask=mask, scale=scale)

    def _dropped_attention(self, query, key, value, mask, scale):
        """softmax(QKᵀ·scale + mask) with dropout, times V: BERT's attention while training.

        Written for CPUs, where each elementwise op is a pass over the
        `(batch, heads, length, length)` scores: the scale goes on the
        queries (a fraction of that size), the mask is added as a bias
        (whose gradient costs nothing), and the dropped probabilities are
        zeroed in the compute dtype with the 1 / (1 - rate) factor put on
        the context. The same function as scaling the scores, masking with
        `where` and dropping the float32 probabilities, in 4% less time a
        step at 128 tokens (tools/benchmarks/profile_finetune.py).
        """
        query = query * ops.cast(scale, query.dtype)
        scores = ops.cast(ops.einsum("bqnh,bknh->bnqk", query, key), "float32")
        if mask is not None:
            scores = scores + ops.where(mask, 0.0, MASKED_SCORE)
        probs = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
        draws = keras.random.uniform(ops.shape(probs), seed=self.dropout_layer.seed_generator)
        probs = ops.where(draws >= self.dropout, probs, ops.zeros((), probs.dtype))
        context = ops.einsum("bnqk,bknh->bqnh", probs, value)
        return context * ops.cast(1.0 / (1.0 - self.dropout), context.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            head_size=self.head_size,
            dropout=self.dropout,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
