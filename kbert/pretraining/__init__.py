"""Pretraining BERT from raw text: vocabulary, data, the pretraining model, its optimizer.

The model (`bert_pretrainer`, in `kbert.models`) uses `keras.ops` only; the
data functions are TensorFlow (tf.data, tf-text) and import it when called.
The model, its masked-LM head and the corpus reader live below this package
(`kbert.models`, `kbert.layers`, `kbert.corpus`), where checkpoint loading and
distillation read them too; they are handed on here.
"""

from kbert.corpus import read_documents
from kbert.layers.masked_lm_head import MaskedLMHead
from kbert.models.pretrainer import (
    MASKED_LM,
    NEXT_SENTENCE,
    BertPretrainer,
    bert_pretrainer,
    pretraining_losses,
    pretraining_metrics,
)
from kbert.pretraining.dynamic_masking import make_dynamic_masking_dataset
from kbert.pretraining.instances import InstanceOptions, SpecialIds, create_training_instances
from kbert.pretraining.records import (
    feature_spec,
    make_pretraining_dataset,
    read_metadata,
    write_pretraining_data,
)
from kbert.pretraining.train import pretrain
from kbert.pretraining.vocabulary import learn_vocabulary
# BERT's optimizers (AdamW or LAMB, warmup then linear decay, no decay on
# LayerNorm and biases) are shared with fine-tuning.
from kbert.training.optimizers import WarmupPolynomialDecay, make_optimizer

__all__ = [
    "MASKED_LM",
    "NEXT_SENTENCE",
    "BertPretrainer",
    "InstanceOptions",
    "MaskedLMHead",
    "SpecialIds",
    "WarmupPolynomialDecay",
    "bert_pretrainer",
    "create_training_instances",
    "feature_spec",
    "learn_vocabulary",
    "make_dynamic_masking_dataset",
    "make_optimizer",
    "make_pretraining_dataset",
    "pretrain",
    "pretraining_losses",
    "pretraining_metrics",
    "read_documents",
    "read_metadata",
    "write_pretraining_data",
]
