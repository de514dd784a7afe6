"""Keras layers of BERT. Backend-agnostic: `keras.ops` only."""

from kbert.layers.attention import MultiHeadSelfAttention
from kbert.layers.embeddings import PositionEmbedding
from kbert.layers.encoder_block import TransformerEncoderBlock
from kbert.layers.normalization import L2Normalization
from kbert.layers.pooling import FirstTokenPooling, MaskedMaxPooling, MaskedMeanPooling

__all__ = [
    "FirstTokenPooling",
    "L2Normalization",
    "MaskedMaxPooling",
    "MaskedMeanPooling",
    "MultiHeadSelfAttention",
    "PositionEmbedding",
    "TransformerEncoderBlock",
]
