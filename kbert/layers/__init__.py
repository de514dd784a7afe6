"""Keras layers of BERT. Backend-agnostic: `keras.ops` only."""

from kbert.layers.attention import MultiHeadSelfAttention
from kbert.layers.dense import Dense
from kbert.layers.embeddings import PositionEmbedding
from kbert.layers.encoder_block import TransformerEncoderBlock
from kbert.layers.masked_lm_head import MaskedLMHead
from kbert.layers.normalization import L2Normalization, LayerNormalization
from kbert.layers.pooling import FirstTokenPooling, MaskedMaxPooling, MaskedMeanPooling
from kbert.layers.real_tokens import RealTokens
from kbert.layers.segments import CosineScore, PairSegments, mean_probability_logits, swap_pair

__all__ = [
    "CosineScore",
    "Dense",
    "FirstTokenPooling",
    "L2Normalization",
    "LayerNormalization",
    "MaskedLMHead",
    "MaskedMaxPooling",
    "MaskedMeanPooling",
    "MultiHeadSelfAttention",
    "PairSegments",
    "PositionEmbedding",
    "RealTokens",
    "TransformerEncoderBlock",
    "mean_probability_logits",
    "swap_pair",
]
