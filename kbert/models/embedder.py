"""`bert_embedder`: sentence embeddings as sentence-transformers computes them."""

import keras

from kbert.layers import MaskedMeanPooling
from kbert.models.encoder import as_encoder, encoder_inputs


def bert_embedder(encoder_or_config, dtype=None, name="bert_embedder"):
    """Mean of the token vectors over the padding mask, then L2 normalisation.

    Args:
        encoder_or_config: a `BertConfig` or an encoder from `bert_encoder`.
        dtype: dtype policy for a fresh encoder.
        name: str.

    Returns:
        A `keras.Model` from the encoder inputs to `(batch, hidden)` float32
        unit vectors, equal to sentence-transformers'
        `encode(..., normalize_embeddings=True)` for mean-pooling models.
    """
    encoder = as_encoder(encoder_or_config, dtype=dtype)
    inputs = encoder_inputs()
    sequence = encoder(inputs)["sequence_output"]
    pooled = MaskedMeanPooling(dtype="float32", name="mean_pooling")(
        sequence, padding_mask=inputs["padding_mask"]
    )
    embeddings = keras.layers.UnitNormalization(dtype="float32", name="l2_normalize")(pooled)
    return keras.Model(inputs=inputs, outputs=embeddings, name=name)
