"""`bert_embedder`: sentence embeddings as sentence-transformers computes them."""

import keras

from kbert.config import POOLINGS
from kbert.layers import FirstTokenPooling, L2Normalization, MaskedMaxPooling, MaskedMeanPooling
from kbert.models.encoder import as_encoder, encoder_inputs

POOLING_LAYERS = dict(zip(POOLINGS, (MaskedMeanPooling, FirstTokenPooling, MaskedMaxPooling)))
NORMALIZE_LAYER = "l2_normalize"


def pooling_layer_name(pooling):
    """The name of `bert_embedder`'s pooling layer for `pooling`."""
    return f"{pooling}_pooling"


def bert_embedder(encoder_or_config, dtype=None, pooling="mean", normalize=True, name="bert_embedder"):
    """Pooled token vectors, then (by default) L2 normalisation.

    Args:
        encoder_or_config: a `BertConfig` or an encoder from `bert_encoder`.
        dtype: dtype policy for a fresh encoder.
        pooling: str. "mean" over the padding mask (sentence-transformers'
            default), "cls" (the first token's vector) or "max" over the mask.
        normalize: bool. Divide each vector by its L2 norm (sentence-transformers'
            `Normalize` module).
        name: str.

    Returns:
        A `keras.Model` from the encoder inputs to `(batch, hidden)` float32
        vectors, equal to sentence-transformers' `encode(...)` for the same
        pooling and normalisation. Its layers `<pooling>_pooling` and, with
        `normalize`, `l2_normalize` form the head.
    """
    if pooling not in POOLING_LAYERS:
        raise ValueError(f"pooling={pooling!r}; expected one of {', '.join(POOLING_LAYERS)}")
    encoder = as_encoder(encoder_or_config, dtype=dtype)
    inputs = encoder_inputs()
    sequence = encoder(inputs)["sequence_output"]
    embeddings = POOLING_LAYERS[pooling](dtype="float32", name=pooling_layer_name(pooling))(
        sequence, padding_mask=inputs["padding_mask"]
    )
    if normalize:
        embeddings = L2Normalization(dtype="float32", name=NORMALIZE_LAYER)(embeddings)
    return keras.Model(inputs=inputs, outputs=embeddings, name=name)
