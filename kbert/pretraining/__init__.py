"""Pretraining BERT from raw text: vocabulary, data, the pretraining model, its optimizer.

The model (`bert_pretrainer`, in `kbert.models`) uses `keras.ops` only; the
data functions are TensorFlow (tf.data, tf-text) and import it when called.
The model, its masked-LM head and the corpus reader live below this package
(`kbert.models`, `kbert.layers`, `kbert.corpus`), where checkpoint loading and
distillation read them too; they are handed on here. The names below load on
first use, so that `kbert.pretraining.run_folder` imports no Keras.
"""

from kbert.lazy import lazy_names

_EXPORTS = {
    "MASKED_LM": "kbert.models.pretrainer",
    "NEXT_SENTENCE": "kbert.models.pretrainer",
    "BertPretrainer": "kbert.models.pretrainer",
    "InstanceOptions": "kbert.pretraining.instances",
    "MaskedLMHead": "kbert.layers.masked_lm_head",
    "SpecialIds": "kbert.pretraining.instances",
    # BERT's optimizers (AdamW or LAMB, warmup then linear decay, no decay on
    # LayerNorm and biases) are shared with fine-tuning.
    "WarmupPolynomialDecay": "kbert.fitting.optimizers",
    "adapt": "kbert.pretraining.adapt",
    "bert_pretrainer": "kbert.models.pretrainer",
    "create_training_instances": "kbert.pretraining.instances",
    "feature_spec": "kbert.pretraining.records",
    "learn_vocabulary": "kbert.pretraining.vocabulary",
    "make_dynamic_masking_dataset": "kbert.pretraining.dynamic_masking",
    "make_optimizer": "kbert.fitting.optimizers",
    "make_pretraining_dataset": "kbert.pretraining.records",
    "pretrain": "kbert.pretraining.train",
    "pretraining_losses": "kbert.models.pretrainer",
    "pretraining_metrics": "kbert.models.pretrainer",
    "read_documents": "kbert.corpus",
    "read_metadata": "kbert.pretraining.records",
    "write_pretraining_data": "kbert.pretraining.records",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
