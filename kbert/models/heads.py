"""The heads of kbert's task models, each one Keras layer named `HEAD_LAYER`.

A task model is the encoder and its head: `head(encoder_outputs, features)`
takes the encoder's `sequence_output` and `pooled_output` and the encoder
inputs, and gives the model's outputs (one tensor, or a dict for several).
The export graph (`kbert.export.graph`) computes the encoder with
converter-friendly ops and calls the model's own head layer on it, so a head
is written once. A head is a float32 layer, so that outputs and losses are
float32 under mixed precision; its dropout, which runs in training alone,
computes in the policy given as `dropout_dtype` (the model's).

| head | reads | outputs | tasks |
| --- | --- | --- | --- |
| `DenseHead` | `pooled_output` or `sequence_output` | dropout, then a Dense | classification, regression, tagging |
| `SpanHead` | `sequence_output` | start and end logits, padding at `PADDING_LOGIT` | question answering |
| `PoolingHead` | `sequence_output` | pooled (mean, [CLS] or max), then L2-normalised vectors | sentence embeddings |
| `PairCosineHead` | `pooled_output` and each text's own pass | a Dense on [CLS] plus the texts' scaled cosine | text-pair regression |
| `MaskedWordsHead` | `sequence_output` | BERT's masked-LM logits over the vocabulary at every position | a checkpoint's masked LM as a layer |
| `FillMaskHead` | `sequence_output` at the `[MASK]` tokens | the most likely words of each `[MASK]` and their probabilities | fill-mask |
"""

import keras
from keras import ops

from kbert.config import PADDING_LOGIT, POOLINGS
from kbert.layers import (
    CosineScore, FirstTokenPooling, L2Normalization, MaskedLMHead, MaskedMaxPooling, MaskedMeanPooling,
)

# The name of every task model's head layer.
HEAD_LAYER = "head"
# Dropout before a fine-tuning head, as in the BERT paper.
DEFAULT_HEAD_DROPOUT = 0.1
POOLING_LAYERS = dict(zip(POOLINGS, (MaskedMeanPooling, FirstTokenPooling, MaskedMaxPooling)))


def _dropout(rate, dtype):
    return keras.layers.Dropout(rate, dtype=dtype, name="dropout")


def _drop(dropout, x, training):
    """Dropout in training alone: at inference the float32 input passes as it is,
    not through the dropout's (perhaps bfloat16) policy."""
    return dropout(x, training=True) if training else x


def _output_dense(units, name):
    # Float32, so that outputs and loss are float32 under mixed precision.
    return keras.layers.Dense(
        units, kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02), dtype="float32", name=name
    )


@keras.saving.register_keras_serializable(package="kbert")
class DenseHead(keras.layers.Layer):
    """Dropout, then a float32 Dense of `units` on one of the encoder's outputs.

    Args:
        units: int. Classes, tags, or 1 for a score.
        output: str. The Dense layer's name ("logits", "score").
        reads: "pooled_output" ([CLS] after the pooler: BERT's sequence
            head) or "sequence_output" (every position: its tagging head).
        dropout: float.
    """

    def __init__(self, units, output="logits", reads="pooled_output", dropout=DEFAULT_HEAD_DROPOUT,
                 dropout_dtype=None, **kwargs):
        super().__init__(**{**kwargs, "dtype": "float32"})
        if reads not in ("pooled_output", "sequence_output"):
            raise ValueError(f"reads={reads!r}; expected 'pooled_output' or 'sequence_output'")
        self.units, self.output_name, self.reads, self.rate = units, output, reads, dropout
        self.dropout = _dropout(dropout, dropout_dtype)
        self.dense = _output_dense(units, output)

    def build(self, encoder_outputs_shape, features_shape=None):
        self.dense.build(encoder_outputs_shape[self.reads])
        self.built = True

    def call(self, encoder_outputs, features=None, training=None):
        return self.dense(_drop(self.dropout, encoder_outputs[self.reads], training))

    def compute_output_spec(self, encoder_outputs, features=None, training=None):
        shape = encoder_outputs[self.reads].shape[:-1] + (self.units,)
        return keras.KerasTensor(shape, dtype="float32")

    def get_config(self):
        return {**super().get_config(), "units": self.units, "output": self.output_name, "reads": self.reads,
                "dropout": self.rate, "dropout_dtype": self.dropout.dtype_policy.name}


@keras.saving.register_keras_serializable(package="kbert")
class SpanHead(keras.layers.Layer):
    """run_squad.py's span head: a float32 Dense(2) on every position ->
    `start_logits` and `end_logits`, padding positions at `PADDING_LOGIT`."""

    def __init__(self, **kwargs):
        super().__init__(**{**kwargs, "dtype": "float32"})
        self.dense = _output_dense(2, "qa_outputs")

    def build(self, encoder_outputs_shape, features_shape=None):
        self.dense.build(encoder_outputs_shape["sequence_output"])
        self.built = True

    def call(self, encoder_outputs, features, training=None):
        logits = self.dense(encoder_outputs["sequence_output"])
        padding = ops.equal(features["padding_mask"], 0)
        start, end = ops.unstack(logits, 2, axis=-1)
        return {"start_logits": ops.where(padding, PADDING_LOGIT, start),
                "end_logits": ops.where(padding, PADDING_LOGIT, end)}

    def compute_output_spec(self, encoder_outputs, features, training=None):
        shape = encoder_outputs["sequence_output"].shape[:-1]
        return {name: keras.KerasTensor(shape, dtype="float32") for name in ("start_logits", "end_logits")}


@keras.saving.register_keras_serializable(package="kbert")
class PoolingHead(keras.layers.Layer):
    """Sentence-transformers' embedding: token vectors pooled over the padding
    mask ("mean", "cls" or "max"), then divided by their L2 norm (`normalize`)."""

    def __init__(self, pooling="mean", normalize=True, **kwargs):
        super().__init__(**{**kwargs, "dtype": "float32"})
        if pooling not in POOLING_LAYERS:
            raise ValueError(f"pooling={pooling!r}; expected one of {', '.join(POOLING_LAYERS)}")
        self.pooling, self.normalize = pooling, normalize
        self.pool = POOLING_LAYERS[pooling](dtype="float32", name=f"{pooling}_pooling")
        self.unit = L2Normalization(dtype="float32", name="l2_normalize") if normalize else None

    def build(self, encoder_outputs_shape, features_shape=None):
        self.built = True  # no weights

    def call(self, encoder_outputs, features, training=None):
        vectors = self.pool(encoder_outputs["sequence_output"], padding_mask=features["padding_mask"])
        return self.unit(vectors) if self.normalize else vectors

    def compute_output_spec(self, encoder_outputs, features, training=None):
        sequence = encoder_outputs["sequence_output"]
        return keras.KerasTensor((sequence.shape[0], sequence.shape[-1]), dtype="float32")

    def get_config(self):
        return {**super().get_config(), "pooling": self.pooling, "normalize": self.normalize}


@keras.saving.register_keras_serializable(package="kbert")
class PairCosineHead(keras.layers.Layer):
    """A cross-encoder's score plus a bi-encoder's (`kbert.models.bert_pair_regressor`).

    Reads `pooled_output` (the packed pair) and `segment_sequence_output`, the
    encoder's pass over each text alone (`kbert.layers.PairSegments`: the
    first texts, then the second texts), whose padding mask is the feature
    `segment_padding_mask`. The score: a Dense on [CLS] after dropout, plus
    `scale * cosine + offset` of the texts' mean-pooled, normalised vectors,
    `scale` and `offset` trained from `score_range`'s mapping of [0, 1].
    """

    # The export graph computes `segment_sequence_output` for a head that says so.
    reads_pair_segments = True

    def __init__(self, score_range=(0.0, 1.0), dropout=DEFAULT_HEAD_DROPOUT, dropout_dtype=None, **kwargs):
        super().__init__(**{**kwargs, "dtype": "float32"})
        low, high = (float(value) for value in score_range)
        self.score_range, self.rate = (low, high), dropout
        self.dropout = _dropout(dropout, dropout_dtype)
        self.cross = _output_dense(1, "cross_score")
        self.pool = MaskedMeanPooling(dtype="float32", name="segment_pooling")
        self.unit = L2Normalization(dtype="float32", name="segment_normalize")
        # A cosine of 0 maps to the lowest score, of 1 to the highest.
        self.cosine = CosineScore(scale=high - low, offset=low, dtype="float32", name="cosine_score")

    def build(self, encoder_outputs_shape, features_shape=None):
        pooled = encoder_outputs_shape["pooled_output"]
        self.cross.build(pooled)
        self.cosine.build((None, encoder_outputs_shape["segment_sequence_output"][-1]))
        self.built = True

    def call(self, encoder_outputs, features, training=None):
        cross = self.cross(_drop(self.dropout, encoder_outputs["pooled_output"], training))
        vectors = self.pool(encoder_outputs["segment_sequence_output"], padding_mask=features["segment_padding_mask"])
        return cross + self.cosine(self.unit(vectors))

    def compute_output_spec(self, encoder_outputs, features, training=None):
        return keras.KerasTensor((encoder_outputs["pooled_output"].shape[0], 1), dtype="float32")

    def get_config(self):
        return {**super().get_config(), "score_range": list(self.score_range), "dropout": self.rate,
                "dropout_dtype": self.dropout.dtype_policy.name}


@keras.saving.register_keras_serializable(package="kbert")
class MaskedWordsHead(keras.layers.Layer):
    """google-research/bert's masked-LM head (`kbert.layers.MaskedLMHead`) at every
    position: logits over the vocabulary for each token, from which a `[MASK]`
    is filled in. Pretraining ties its projection to the encoder's token
    embeddings; this head holds a copy, so that it is one layer that saves and
    exports on its own. Build it from a pretrainer's weights with `from_pretrainer`
    (`kbert.checkpoints.load_pretrained(..., heads=True)`).

    Args:
        vocab_size: int.
        activation, layer_norm_epsilon: the transform's, as the encoder's.
    """

    def __init__(self, vocab_size, activation="gelu", layer_norm_epsilon=1e-12, **kwargs):
        super().__init__(**{**kwargs, "dtype": "float32"})
        self.vocab_size, self.activation, self.layer_norm_epsilon = vocab_size, activation, layer_norm_epsilon

    def build(self, encoder_outputs_shape, features_shape=None):
        hidden = encoder_outputs_shape["sequence_output"][-1]
        self.projection = keras.layers.Embedding(self.vocab_size, hidden, dtype="float32", name="projection")
        self.projection.build((None, None))
        self.masked_lm = MaskedLMHead(self.projection, self.activation, self.layer_norm_epsilon, dtype="float32",
                                      name="masked_lm")
        self.masked_lm.build((None, None, hidden))
        self.built = True

    def call(self, encoder_outputs, features=None, training=None):
        sequence = encoder_outputs["sequence_output"]
        shape = ops.shape(sequence)
        positions = ops.broadcast_to(ops.arange(shape[1], dtype="int32")[None, :], (shape[0], shape[1]))
        return self.masked_lm(ops.cast(sequence, "float32"), positions)

    def compute_output_spec(self, encoder_outputs, features=None, training=None):
        return keras.KerasTensor(encoder_outputs["sequence_output"].shape[:-1] + (self.vocab_size,), dtype="float32")

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "activation": self.activation,
                "layer_norm_epsilon": self.layer_norm_epsilon}

    @classmethod
    def from_pretrainer(cls, pretrainer, name=HEAD_LAYER, **kwargs):
        """The head with `pretrainer`'s masked-LM weights (`kbert.models.bert_pretrainer`);
        `kwargs` go to the constructor."""
        if not any(layer.name == "masked_lm" for layer in getattr(pretrainer, "layers", ())):
            raise ValueError(
                f"{getattr(pretrainer, 'name', type(pretrainer).__name__)!r} has no masked_lm layer; expected "
                "a bert_pretrainer, e.g. kbert.checkpoints.load_pretrained(path, heads=True).pretrainer"
            )
        source = pretrainer.get_layer("masked_lm")
        embeddings = pretrainer.encoder.get_layer("token_embedding").embeddings
        head = cls(source.vocab_size, activation=source.activation, layer_norm_epsilon=source.layer_norm_epsilon,
                   name=name, **kwargs)
        head.build({"sequence_output": (None, None, embeddings.shape[1])})
        for mine, theirs in zip(head.masked_lm.weights, source.weights, strict=True):
            mine.assign(ops.cast(theirs, "float32"))  # the tied embeddings land in the copy
        return head


@keras.saving.register_keras_serializable(package="kbert")
class FillMaskHead(MaskedWordsHead):
    """The masked LM at the `[MASK]` tokens alone: the `top_k` most likely words of
    each of a row's first `max_masks` `[MASK]`s, most likely first (Hugging
    Face's fill-mask). Shapes are static, so that it exports as it is.

    Args:
        vocab_size, activation, layer_norm_epsilon: as `MaskedWordsHead`'s.
        mask_id: int. The `[MASK]` token's id.
        max_masks: int. `[MASK]`s read per row; later ones are not.
        top_k: int. Words given per `[MASK]`.

    Outputs: `word_ids` int32 `(batch, max_masks, top_k)`, -1 past a row's
    `[MASK]`s; `word_scores` float32 probabilities (softmax over the
    vocabulary), 0 past them. `from_pretrainer(pretrainer, mask_id=...)` gives
    it a checkpoint's weights.
    """

    def __init__(self, vocab_size, mask_id, max_masks=8, top_k=5, activation="gelu", layer_norm_epsilon=1e-12,
                 **kwargs):
        super().__init__(vocab_size, activation, layer_norm_epsilon, **kwargs)
        self.mask_id, self.max_masks, self.top_k = mask_id, max_masks, top_k

    def call(self, encoder_outputs, features, training=None):
        sequence = ops.cast(encoder_outputs["sequence_output"], "float32")
        is_mask = ops.cast(ops.equal(features["token_ids"], self.mask_id), "float32")
        length = ops.shape(is_mask)[1]
        # The first [MASK]s rank highest: position p of a [MASK] scores length - p, others 0.
        rank = is_mask * ops.cast(length - ops.arange(length), "float32")[None, :]
        found, positions = ops.top_k(rank, self.max_masks)
        logits = self.masked_lm(sequence, positions)
        top, ids = ops.top_k(logits, self.top_k)
        scores = ops.exp(top - ops.logsumexp(logits, axis=-1, keepdims=True))
        real = ops.greater(found, 0.0)[:, :, None]
        return {"word_ids": ops.where(real, ops.cast(ids, "int32"), -1), "word_scores": ops.where(real, scores, 0.0)}

    def compute_output_spec(self, encoder_outputs, features, training=None):
        shape = (encoder_outputs["sequence_output"].shape[0], self.max_masks, self.top_k)
        return {"word_ids": keras.KerasTensor(shape, dtype="int32"), "word_scores": keras.KerasTensor(shape)}

    def get_config(self):
        return {**super().get_config(), "mask_id": self.mask_id, "max_masks": self.max_masks, "top_k": self.top_k}
