"""Pretraining BERT from raw text: vocabulary, data, the pretraining model."""

from kbert.pretraining.masked_lm_head import MaskedLMHead
from kbert.pretraining.pretrainer import BertPretrainer, bert_pretrainer

__all__ = ["BertPretrainer", "MaskedLMHead", "bert_pretrainer"]
