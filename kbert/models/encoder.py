"""`bert_encoder`: token, segment and position embeddings, then N encoder blocks."""

import keras
from keras import ops

from kbert.config import ENCODER_INPUTS, BertConfig
from kbert.layers import Dense, LayerNormalization, PositionEmbedding, TransformerEncoderBlock
EMBEDDING_LAYERS = (
    "token_embedding",
    "position_embedding",
    "segment_embedding",
    "embeddings_layer_norm",
    "embeddings_dropout",
)


def encoder_inputs(sequence_length=None):
    """The three `keras.Input`s every kbert model takes, keyed by name."""
    return {
        name: keras.Input(shape=(sequence_length,), dtype="int32", name=name)
        for name in ENCODER_INPUTS
    }


def _encoder_layers(config, dtype):
    """Every layer of the encoder, keyed by its stable name."""
    def initializer():
        # A new instance per layer: see kbert.layers.initializers.clone_initializer.
        return keras.initializers.TruncatedNormal(stddev=config.initializer_range)

    layers = {
        "token_embedding": keras.layers.Embedding(
            config.vocab_size,
            config.hidden_size,
            embeddings_initializer=initializer(),
            dtype=dtype,
            name="token_embedding",
        ),
        "position_embedding": PositionEmbedding(
            config.max_position_embeddings,
            initializer=initializer(),
            dtype=dtype,
            name="position_embedding",
        ),
        "segment_embedding": keras.layers.Embedding(
            config.type_vocab_size,
            config.hidden_size,
            embeddings_initializer=initializer(),
            dtype=dtype,
            name="segment_embedding",
        ),
        "embeddings_layer_norm": LayerNormalization(
            epsilon=config.layer_norm_epsilon, dtype="float32", name="embeddings_layer_norm"
        ),
        "embeddings_dropout": keras.layers.Dropout(
            config.hidden_dropout, dtype=dtype, name="embeddings_dropout"
        ),
        "pooler": Dense(
            config.hidden_size,
            activation="tanh",
            kernel_initializer=initializer(),
            dtype=dtype,
            name="pooler",
        ),
    }
    for index in range(config.num_layers):
        name = f"transformer_layer_{index}"
        layers[name] = TransformerEncoderBlock(
            num_heads=config.num_heads,
            intermediate_size=config.intermediate_size,
            activation=config.activation,
            dropout=config.hidden_dropout,
            attention_dropout=config.attention_dropout,
            layer_norm_epsilon=config.layer_norm_epsilon,
            kernel_initializer=initializer(),
            dtype=dtype,
            name=name,
        )
    return layers


def _wire(layers, inputs, first_token_only, name):
    """Connects `layers` into the encoder graph.

    With `first_token_only`, the last block computes position 0 alone, so
    `sequence_output` is `(batch, 1, hidden)`: what [CLS] heads need, for less work.
    """
    x = layers["token_embedding"](inputs["token_ids"])
    x = ops.add(
        ops.add(x, layers["position_embedding"](x)),
        layers["segment_embedding"](inputs["segment_ids"]),
    )
    x = layers["embeddings_layer_norm"](x)
    x = layers["embeddings_dropout"](x)
    blocks = sorted(
        (layer for key, layer in layers.items() if key.startswith("transformer_layer_")),
        key=lambda layer: int(layer.name.rsplit("_", 1)[1]),
    )
    for index, block in enumerate(blocks):
        last = index == len(blocks) - 1
        x = block(x, padding_mask=inputs["padding_mask"], first_token_only=first_token_only and last)
    pooled = layers["pooler"](x[:, 0, :])
    return keras.Model(
        inputs=inputs,
        outputs={"sequence_output": x, "pooled_output": pooled},
        name=name,
    )


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
    layers = _encoder_layers(config, dtype)
    return _wire(layers, encoder_inputs(sequence_length), False, name)


def rewire_encoder(encoder, first_token_only=False, sequence_length=None):
    """A new encoder graph over the SAME layers (shared weights) as `encoder`.

    `first_token_only=True` gives the cheaper graph that classifiers nest;
    `first_token_only=False` on such a graph gives back the full encoder.
    """
    layers = {
        layer.name: layer
        for layer in encoder.layers
        if layer.name in EMBEDDING_LAYERS + ("pooler",)
        or layer.name.startswith("transformer_layer_")
    }
    return _wire(layers, encoder_inputs(sequence_length), first_token_only, encoder.name)


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


def train_on_real_tokens(model, enabled=True):
    """Sets `unpadded_training` on every encoder block in `model`, nested models included.

    Training steps then run the blocks' dense layers over the batches' real
    tokens only (see `TransformerEncoderBlock`): for TensorFlow graphs
    without XLA, where a batch's number of real tokens may vary. kbert's
    trainers set it through `compile_for_strategy`.

    Returns:
        The number of blocks set.
    """
    count = 0
    for layer in model.layers:
        if isinstance(layer, TransformerEncoderBlock):
            layer.unpadded_training = enabled
            count += 1
        elif isinstance(layer, keras.Model):
            count += train_on_real_tokens(layer, enabled)
    return count
