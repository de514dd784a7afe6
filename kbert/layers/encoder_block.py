"""The post-LayerNorm Transformer encoder block of the BERT paper."""

import keras
from keras import ops

from kbert.layers.attention import MultiHeadSelfAttention
from kbert.layers.dense import Dense
from kbert.layers.initializers import clone_initializer
from kbert.layers.normalization import LayerNormalization
from kbert.layers.real_tokens import RealTokens


# The exact GELU is x * Phi(x), Phi the standard normal CDF, phi its density:
# Phi(x) = (1 + erf(x / sqrt(2))) / 2 and phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
SQRT_HALF = 0.7071067811865476
INV_SQRT_2PI = 0.3989422804014327


def exact_gelu(x):
    """`x * Phi(x)`, its derivative `Phi(x) + x * phi(x)` written out.

    The function of `keras.activations.gelu(x, approximate=False)` (through
    erf, as google-research/bert writes it, where TensorFlow's form uses
    erfc: they agree to 2e-6). Differentiating that form, TensorFlow makes
    about ten elementwise passes over the feed-forward activations; this
    gradient makes five. The blocks use it while training; inference and
    export keep Keras's GELU.

    Args:
        x: float tensor, float32 under mixed precision (see
            `TransformerEncoderBlock`).
    """

    @ops.custom_gradient
    def gelu(x):
        scaled = x * SQRT_HALF
        cdf = 0.5 + 0.5 * ops.erf(scaled)

        def grad(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream
            pdf = ops.exp(-ops.square(scaled)) * INV_SQRT_2PI
            return upstream * (cdf + x * pdf)

        return x * cdf, grad

    return gelu(x)


def get_activation(name):
    """The feed-forward activation named in `BertConfig.activation`."""
    if name == "gelu":
        # Exact erf GELU, as google-research/bert and Hugging Face compute it.
        return lambda x: keras.activations.gelu(x, approximate=False)
    if name == "gelu_approximate":
        return lambda x: keras.activations.gelu(x, approximate=True)
    if name == "relu":
        return keras.activations.relu
    raise ValueError(f"activation={name!r} is not one of gelu, gelu_approximate, relu")


@keras.saving.register_keras_serializable(package="kbert")
class TransformerEncoderBlock(keras.layers.Layer):
    """x = LN(x + Dropout(Attention(x))); x = LN(x + Dropout(FFN(x))).

    Args:
        num_heads: int. Attention heads.
        intermediate_size: int. Width of the feed-forward layer.
        activation: str. "gelu" (exact), "gelu_approximate" or "relu".
        dropout: float. Dropout on the attention and feed-forward outputs.
        attention_dropout: float. Dropout on the attention probabilities.
        layer_norm_epsilon: float.
        kernel_initializer: initializer of every kernel.

    Called with `first_token_only=True` it returns `(batch, 1, hidden)`, the
    output at position 0 alone, as Model Garden's `output_range=1` does: exact,
    and it skips most of the last block's work when only [CLS] is used.

    Under mixed precision the matmuls run in the compute dtype and everything
    between them in float32: LayerNorm, the activation and dropout (whose
    random draw is made in float32). Besides the precision, this is speed on
    CPUs: TensorFlow's bfloat16 erf and random draws convert value by value,
    and take 2.4x and 1.45x as long as the float32 ones. Each block's output
    is cast back to the compute dtype, so the residual stream stays in one dtype.

    With `unpadded_training = True` (a switch of the running program, not
    saved with the layer), training calls run everything but attention's
    softmax over the batch's real tokens alone (`RealTokens`): the same
    function, for less work on padded batches. It needs shapes that vary
    from batch to batch, so kbert's trainers set it for TensorFlow without
    XLA (`kbert.models.train_on_real_tokens`); inference is always padded.
    """

    def __init__(
        self,
        num_heads,
        intermediate_size,
        activation="gelu",
        dropout=0.1,
        attention_dropout=0.1,
        layer_norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.intermediate_size = intermediate_size
        self.activation = activation
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._activation_fn = get_activation(activation)
        self._training_activation_fn = exact_gelu if activation == "gelu" else self._activation_fn
        self.unpadded_training = False

    def build(self, inputs_shape):
        inputs_shape = tuple(inputs_shape)
        hidden = inputs_shape[-1]
        if hidden % self.num_heads:
            raise ValueError(
                f"hidden size {hidden} is not divisible by num_heads={self.num_heads}"
            )
        self.attention = MultiHeadSelfAttention(
            self.num_heads,
            hidden // self.num_heads,
            dropout=self.attention_dropout,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="self_attention",
        )
        self.attention.build(inputs_shape)
        self.attention_layer_norm = LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype="float32", name="attention_layer_norm"
        )
        self.attention_layer_norm.build(inputs_shape)
        self.intermediate_dense = Dense(
            self.intermediate_size,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="intermediate_dense",
        )
        self.intermediate_dense.build(inputs_shape)
        self.output_dense = Dense(
            hidden,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="output_dense",
        )
        self.output_dense.build(inputs_shape[:-1] + (self.intermediate_size,))
        self.output_layer_norm = LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype="float32", name="output_layer_norm"
        )
        self.output_layer_norm.build(inputs_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype="float32")

    def _add_and_norm(self, residual, x, layer_norm, training):
        """LN(residual + Dropout(x)) in float32, cast to the compute dtype."""
        x = self.dropout_layer(ops.cast(x, "float32"), training=training)
        x = layer_norm(ops.add(ops.cast(residual, "float32"), x))
        return ops.cast(x, self.compute_dtype)

    def call(self, inputs, padding_mask=None, training=False, first_token_only=False):
        if training and self.unpadded_training and padding_mask is not None:
            return self._call_on_real_tokens(inputs, padding_mask, first_token_only)
        attended = self.attention(
            inputs, padding_mask=padding_mask, training=training, first_token_only=first_token_only
        )
        residual = inputs[:, :1, :] if first_token_only else inputs
        return self._feed_forward(residual, attended, training)

    def _call_on_real_tokens(self, inputs, padding_mask, first_token_only):
        """`call` while training, over the real tokens: zeros at the padding."""
        real = RealTokens(padding_mask)
        tokens = real.gather(inputs)
        if first_token_only:
            first = inputs[:, :1, :]
            attended = self.attention.call_on_real_tokens(
                tokens, real, padding_mask, training=True, first_token_inputs=first
            )
            return self._feed_forward(first, attended, True)
        attended = self.attention.call_on_real_tokens(tokens, real, padding_mask, training=True)
        return real.scatter(self._feed_forward(tokens, attended, True))

    def _feed_forward(self, residual, attended, training):
        """The block after attention: add & norm, the feed-forward layer, add & norm."""
        x = self._add_and_norm(residual, attended, self.attention_layer_norm, training)
        hidden = ops.cast(self.intermediate_dense(x), "float32")
        activation = self._training_activation_fn if training else self._activation_fn
        hidden = ops.cast(activation(hidden), self.compute_dtype)
        return self._add_and_norm(x, self.output_dense(hidden), self.output_layer_norm, training)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
            activation=self.activation,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
