"""`bert_encoder`: token, segment and position embeddings, then N encoder blocks."""

import keras
from keras import ops

from kbert.config import BertConfig
from kbert.layers import PositionEmbedding, TransformerEncoderBlock

# Names of the encoder's int32 inputs, each of shape (batch, length).
ENCODER_INPUTS = ("token_ids", "segment_ids", "padding_mask")


def encoder_inputs(sequence_length=None):
    """The three `keras.Input`s every kbert model takes, keyed by name."""
    return {
        name: keras.Input(shape=(sequence_length,), dtype="int32", name=name)
        for name in ENCODER_INPUTS
    }


def bert_encoder(config, sequence_length=None, dtype=None, name="bert_encoder"):
    """Builds the BERT encoder as a functional `keras.Model`.

    Args:
        config: `BertConfig`.
        sequence_length: int or None. Fixed input length (None: any length up
            to `config.max_position_embeddings`).
        dtype: str or `keras.DTypePolicy`. Defaults to the global policy; every
            sublayer honours it, LayerNorm runs in float32.
        name: str. Name of the returned model.

    Returns:
        A `keras.Model` mapping `{"token_ids", "segment_ids", "padding_mask"}` to
        `{"sequence_output": (batch, length, hidden), "pooled_output": (batch, hidden)}`.

    Example:
    >>> encoder = bert_encoder(BertConfig.from_preset("bert_tiny", vocab_size=100))
    >>> sorted(encoder.output)
    ['pooled_output', 'sequence_output']
    """
    if not isinstance(config, BertConfig):
        raise ValueError(f"config must be a BertConfig, got {type(config).__name__}")
    config.check_sequence_length(sequence_length)
    initializer = keras.initializers.TruncatedNormal(stddev=config.initializer_range)
    inputs = encoder_inputs(sequence_length)

    # === Embeddings ===
    token_embedding = keras.layers.Embedding(
        config.vocab_size,
        config.hidden_size,
        embeddings_initializer=initializer,
        dtype=dtype,
        name="token_embedding",
    )
    segment_embedding = keras.layers.Embedding(
        config.type_vocab_size,
        config.hidden_size,
        embeddings_initializer=initializer,
        dtype=dtype,
        name="segment_embedding",
    )
    position_embedding = PositionEmbedding(
        config.max_position_embeddings,
        initializer=initializer,
        dtype=dtype,
        name="position_embedding",
    )
    x = token_embedding(inputs["token_ids"])
    x = ops.add(ops.add(x, position_embedding(x)), segment_embedding(inputs["segment_ids"]))
    x = keras.layers.LayerNormalization(
        epsilon=config.layer_norm_epsilon, dtype="float32", name="embeddings_layer_norm"
    )(x)
    x = keras.layers.Dropout(config.hidden_dropout, dtype=dtype, name="embeddings_dropout")(x)

    # === Encoder blocks ===
    for index in range(config.num_layers):
        x = TransformerEncoderBlock(
            num_heads=config.num_heads,
            intermediate_size=config.intermediate_size,
            activation=config.activation,
            dropout=config.hidden_dropout,
            attention_dropout=config.attention_dropout,
            layer_norm_epsilon=config.layer_norm_epsilon,
            kernel_initializer=initializer,
            dtype=dtype,
            name=f"transformer_layer_{index}",
        )(x, padding_mask=inputs["padding_mask"])

    # === Pooler: tanh(W · h[CLS] + b) ===
    pooled = keras.layers.Dense(
        config.hidden_size,
        activation="tanh",
        kernel_initializer=initializer,
        dtype=dtype,
        name="pooler",
    )(x[:, 0, :])
    return keras.Model(
        inputs=inputs,
        outputs={"sequence_output": x, "pooled_output": pooled},
        name=name,
    )


def as_encoder(encoder_or_config, dtype=None):
    """An encoder model from either a `BertConfig` or an existing encoder."""
    if isinstance(encoder_or_config, BertConfig):
        return bert_encoder(encoder_or_config, dtype=dtype)
    if isinstance(encoder_or_config, keras.Model) and set(ENCODER_INPUTS) <= set(
        encoder_or_config.input
    ):
        return encoder_or_config
    raise ValueError(
        "expected a BertConfig or an encoder from bert_encoder(), "
        f"got {type(encoder_or_config).__name__}"
    )
