"""`bert_embedder`: sentence embeddings as sentence-transformers computes them."""

import keras

from kbert.models.encoder import as_encoder, encoder_inputs
from kbert.models.heads import HEAD_LAYER, PoolingHead


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
        pooling and normalisation; its head is a `kbert.models.heads.PoolingHead`.
    """
    encoder = as_encoder(encoder_or_config, dtype=dtype)
    inputs = encoder_inputs()
    head = PoolingHead(pooling, normalize, name=HEAD_LAYER)
    return keras.Model(inputs=inputs, outputs=head(encoder(inputs), inputs), name=name)
