"""Keras layers of BERT. Backend-agnostic: `keras.ops` only."""

from kbert.layers.attention import MultiHeadSelfAttention
from kbert.layers.embeddings import PositionEmbedding
from kbert.layers.encoder_block import TransformerEncoderBlock
from kbert.layers.pooling import MaskedMeanPooling

__all__ = [
    "MaskedMeanPooling",
    "MultiHeadSelfAttention",
    "PositionEmbedding",
    "TransformerEncoderBlock",
]
