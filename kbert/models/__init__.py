"""Functional builders that return plain `keras.Model`s with stable layer names."""

from kbert.models.classifier import bert_classifier, bert_pair_regressor, bert_regressor
from kbert.models.embedder import bert_embedder
from kbert.models.encoder import ENCODER_INPUTS, bert_encoder, rewire_encoder, train_on_real_tokens
from kbert.models.pretrainer import BertPretrainer, bert_pretrainer

__all__ = [
    "ENCODER_INPUTS",
    "BertPretrainer",
    "bert_classifier",
    "bert_embedder",
    "bert_pair_regressor",
    "bert_pretrainer",
    "bert_regressor",
    "bert_encoder",
    "rewire_encoder",
    "train_on_real_tokens",
]
