"""Converting a kbert encoder to and from keras-hub's `BertBackbone`, weight by weight.

Both are functional Keras models with the same inputs (`token_ids`,
`segment_ids`, `padding_mask`) and outputs (`sequence_output`,
`pooled_output`); the weights differ only in layout: keras-hub's attention
projections are `EinsumDense` kernels shaped `(hidden, heads, head_size)`
(output: `(heads, head_size, hidden)`), kbert's are `Dense` kernels
`(hidden, hidden)`. The conversion reshapes them and copies everything else.

One difference is not in the weights: keras-hub's `BertBackbone` hard-codes
the tanh approximation of GELU, while BERT checkpoints were trained with the
exact erf GELU (kbert's `activation="gelu"`). Measured on all-MiniLM-L6-v2
(float32, CPU, the 8 sentences of `tests/data/minilm_reference`):

- kbert (exact GELU) vs keras-hub on the same weights: max |diff| of
  `sequence_output` 3.6e-3 (over real tokens), `pooled_output` 2.2e-4;
- kbert with `activation="gelu_approximate"` vs keras-hub: 3.1e-6 and 2.2e-7;
- kbert → keras-hub → kbert: every weight identical.

So a converted encoder computes what keras-hub computes; `from_keras_hub`
therefore returns a config with `activation="gelu_approximate"` by default.
"""

import numpy as np

from kbert.config import BertConfig

# keras-hub's BertBackbone hard-codes the tanh-approximate GELU.
KERAS_HUB_ACTIVATION = "gelu_approximate"
# keras-hub's BertBackbone hard-codes BERT's LayerNorm epsilon.
KERAS_HUB_LAYER_NORM_EPSILON = 1e-12

_EMBEDDINGS = [
    ("token_embedding/embeddings", "token_embedding/embeddings"),
    ("position_embedding/embeddings", "position_embedding/embeddings"),
    ("segment_embedding/embeddings", "segment_embedding/embeddings"),
    ("embeddings_layer_norm/gamma", "embeddings_layer_norm/gamma"),
    ("embeddings_layer_norm/beta", "embeddings_layer_norm/beta"),
    ("pooler/kernel", "pooled_dense/kernel"),
    ("pooler/bias", "pooled_dense/bias"),
]
# (kbert name, keras-hub name) inside transformer_layer_i; the attention
# projections are reshaped between the two layouts.
_BLOCK = [
    ("self_attention/query/kernel", "self_attention_layer/query/kernel"),
    ("self_attention/query/bias", "self_attention_layer/query/bias"),
    ("self_attention/key/kernel", "self_attention_layer/key/kernel"),
    ("self_attention/key/bias", "self_attention_layer/key/bias"),
    ("self_attention/value/kernel", "self_attention_layer/value/kernel"),
    ("self_attention/value/bias", "self_attention_layer/value/bias"),
    ("self_attention/attention_output/kernel", "self_attention_layer/attention_output/kernel"),
    ("self_attention/attention_output/bias", "self_attention_layer/attention_output/bias"),
    ("attention_layer_norm/gamma", "self_attention_layer_norm/gamma"),
    ("attention_layer_norm/beta", "self_attention_layer_norm/beta"),
    ("intermediate_dense/kernel", "feedforward_intermediate_dense/kernel"),
    ("intermediate_dense/bias", "feedforward_intermediate_dense/bias"),
    ("output_dense/kernel", "feedforward_output_dense/kernel"),
    ("output_dense/bias", "feedforward_output_dense/bias"),
    ("output_layer_norm/gamma", "feedforward_layer_norm/gamma"),
    ("output_layer_norm/beta", "feedforward_layer_norm/beta"),
]


def _name_pairs(num_layers):
    pairs = list(_EMBEDDINGS)
    for i in range(num_layers):
        prefix = f"transformer_layer_{i}/"
        pairs += [(prefix + ours, prefix + theirs) for ours, theirs in _BLOCK]
    return pairs


def _variables(model):
    return {variable.path: variable for variable in model.weights}


def _copy(source, target, pairs, reverse):
    """Assigns `source`'s weights to `target`'s, reshaped to the target's shapes.

    `pairs` holds (kbert name, keras-hub name); `reverse` when the source is keras-hub's.
    """
    ours, theirs = _variables(source), _variables(target)
    if reverse:
        pairs = [(b, a) for a, b in pairs]
    missing = [a for a, _ in pairs if a not in ours] + [b for _, b in pairs if b not in theirs]
    if missing:
        raise ValueError(f"no weight {missing[0]!r} in the model to convert")
    if len(pairs) != len(ours) or len(pairs) != len(theirs):
        raise ValueError(
            f"expected {len(pairs)} weights, found {len(ours)} and {len(theirs)}"
        )
    for a, b in pairs:
        value = np.asarray(ours[a].numpy())
        shape = tuple(theirs[b].shape)
        if value.size != int(np.prod(shape)):
            raise ValueError(f"{a} has shape {value.shape}, {b} expects {shape}")
        # Row-major reshapes map (hidden, hidden) <-> (hidden, heads, head_size)
        # and (hidden, hidden) <-> (heads, head_size, hidden): heads are
        # contiguous column (resp. row) blocks in both layouts.
        theirs[b].assign(value.reshape(shape))


def config_of_encoder(encoder):
    """The `BertConfig` of a kbert encoder, read from its layers."""
    blocks = [layer for layer in encoder.layers if layer.name.startswith("transformer_layer_")]
    if not blocks:
        raise ValueError(f"{encoder.name} has no transformer_layer_* layers: not a kbert encoder")
    block = blocks[0].get_config()
    vocab_size, hidden_size = encoder.get_layer("token_embedding").embeddings.shape
    return BertConfig(
        vocab_size=int(vocab_size),
        hidden_size=int(hidden_size),
        num_layers=len(blocks),
        num_heads=block["num_heads"],
        intermediate_size=block["intermediate_size"],
        max_position_embeddings=int(encoder.get_layer("position_embedding").embeddings.shape[0]),
        type_vocab_size=int(encoder.get_layer("segment_embedding").embeddings.shape[0]),
        hidden_dropout=block["dropout"],
        attention_dropout=block["attention_dropout"],
        activation=block["activation"],
        layer_norm_epsilon=block["layer_norm_epsilon"],
    )


def to_keras_hub(encoder, dtype=None):
    """keras-hub's `BertBackbone` with the weights of a kbert encoder.

    Args:
        encoder: the `keras.Model` from `kbert.models.bert_encoder(config)`.
            Its activation is dropped: keras-hub always uses tanh-approximate
            GELU (see the module docstring).
        dtype: dtype policy of the backbone (None: the global policy).

    Returns:
        `keras_hub.models.BertBackbone`.

    Example:
    >>> encoder = load_hf_checkpoint("all-minilm-l6-v2").encoder  # doctest: +SKIP
    >>> backbone = to_keras_hub(encoder)  # doctest: +SKIP
    """
    import keras_hub

    config = config_of_encoder(encoder)
    if config.layer_norm_epsilon != KERAS_HUB_LAYER_NORM_EPSILON:
        raise ValueError(
            f"layer_norm_epsilon={config.layer_norm_epsilon}: keras-hub's BertBackbone "
            f"only supports {KERAS_HUB_LAYER_NORM_EPSILON}"
        )
    if config.hidden_dropout != config.attention_dropout:
        raise ValueError(
            f"hidden_dropout={config.hidden_dropout} and attention_dropout="
            f"{config.attention_dropout}: keras-hub's BertBackbone has one dropout rate"
        )
    backbone = keras_hub_backbone(config, dtype=dtype)
    _copy(encoder, backbone, _name_pairs(config.num_layers), reverse=False)
    return backbone


def keras_hub_backbone(config, dtype=None):
    """A freshly initialised keras-hub `BertBackbone` of `config`'s shape."""
    import keras_hub

    return keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        dropout=config.hidden_dropout,
        max_sequence_length=config.max_position_embeddings,
        num_segments=config.type_vocab_size,
        dtype=dtype,
    )


def config_from_keras_hub(backbone, activation=KERAS_HUB_ACTIVATION):
    """The `BertConfig` of a keras-hub `BertBackbone`."""
    return BertConfig(
        vocab_size=backbone.vocabulary_size,
        hidden_size=backbone.hidden_dim,
        num_layers=backbone.num_layers,
        num_heads=backbone.num_heads,
        intermediate_size=backbone.intermediate_dim,
        max_position_embeddings=backbone.max_sequence_length,
        type_vocab_size=backbone.num_segments,
        hidden_dropout=backbone.dropout,
        attention_dropout=backbone.dropout,
        activation=activation,
        layer_norm_epsilon=KERAS_HUB_LAYER_NORM_EPSILON,
    )


def from_keras_hub(backbone, activation=KERAS_HUB_ACTIVATION, dtype=None):
    """A kbert encoder with the weights of a keras-hub `BertBackbone`.

    Args:
        backbone: `keras_hub.models.BertBackbone`.
        activation: str. The encoder's GELU: "gelu_approximate" computes what
            keras-hub computes; "gelu" (exact) is what BERT checkpoints were
            trained with, when the backbone holds such a checkpoint.
        dtype: dtype policy of the encoder (None: the global policy).

    Returns:
        `(BertConfig, encoder)`.

    Example:
    >>> backbone = keras_hub.models.BertBackbone.from_preset("bert_tiny_en_uncased")  # doctest: +SKIP
    >>> config, encoder = from_keras_hub(backbone)  # doctest: +SKIP
    """
    from kbert.models import bert_encoder

    config = config_from_keras_hub(backbone, activation)
    encoder = bert_encoder(config, dtype=dtype)
    _copy(backbone, encoder, _name_pairs(config.num_layers), reverse=True)
    return config, encoder
