"""`bert_pretrainer`: the encoder with BERT's masked-LM and next-sentence heads."""

import keras

from kbert.config import BertConfig
from kbert.layers.initializers import clone_initializer
from kbert.layers.masked_lm_head import MaskedLMHead
from kbert.models.encoder import ENCODER_INPUTS, as_encoder

# Names of the pretrainer's outputs; the labels and sample weights of
# `make_pretraining_dataset` are keyed the same way.
MASKED_LM = "masked_lm"
NEXT_SENTENCE = "next_sentence"
# BertConfig's default, used when an encoder is given without its config.
DEFAULT_INITIALIZER_RANGE = 0.02


def head_hyperparameters(encoder):
    """(activation, layer_norm_epsilon) of an encoder built by `bert_encoder`."""
    try:
        activation = encoder.get_layer("transformer_layer_0").activation
        epsilon = encoder.get_layer("embeddings_layer_norm").epsilon
        encoder.get_layer("token_embedding")
    except ValueError:
        raise ValueError(
            "the encoder lacks the layers of bert_encoder() (token_embedding, "
            "embeddings_layer_norm, transformer_layer_0)"
        ) from None
    return activation, epsilon


@keras.saving.register_keras_serializable(package="kbert")
class BertPretrainer(keras.Model):
    """BERT's pretraining model: encoder + masked-LM head + next-sentence head.

    A functional model built in `__init__` (as keras-hub's tasks are), so that
    `keras.models.load_model` rebuilds it from the encoder and the tie between
    the token embedding and the masked-LM projection survives saving.
    Prefer the builder `bert_pretrainer`.

    Args:
        encoder: a model from `bert_encoder`.
        activation: str. Activation of the masked-LM transform.
        layer_norm_epsilon: float. Epsilon of the masked-LM LayerNorm.
        initializer_range: float. Stddev of the heads' truncated-normal init.
        dtype: dtype policy of the heads.

    Inputs: `token_ids`, `segment_ids`, `padding_mask` `(batch, length)` and
    `masked_lm_positions` `(batch, max_predictions)`, all int32.
    Outputs: `{"masked_lm": (batch, max_predictions, vocab), "next_sentence":
    (batch, 2)}`, float32 logits. Next-sentence class 1 means "B is a random
    sentence", as in google-research/bert's `next_sentence_labels`.
    """

    def __init__(
        self,
        encoder,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        initializer_range=DEFAULT_INITIALIZER_RANGE,
        dtype=None,
        **kwargs,
    ):
        # === Layers ===
        initializer = keras.initializers.TruncatedNormal(stddev=initializer_range)
        masked_lm_head = MaskedLMHead(
            encoder.get_layer("token_embedding"),
            activation=activation,
            layer_norm_epsilon=layer_norm_epsilon,
            kernel_initializer=initializer,
            dtype=dtype,
            name=MASKED_LM,
        )
        # float32 so the logits and the loss stay float32 under mixed precision.
        next_sentence_head = keras.layers.Dense(
            2, kernel_initializer=clone_initializer(initializer), dtype="float32", name=NEXT_SENTENCE
        )

        # === Functional Model ===
        inputs = {
            name: keras.Input(shape=(None,), dtype="int32", name=name)
            for name in (*ENCODER_INPUTS, "masked_lm_positions")
        }
        outputs = encoder({name: inputs[name] for name in ENCODER_INPUTS})
        masked_lm = masked_lm_head(outputs["sequence_output"], inputs["masked_lm_positions"])
        next_sentence = next_sentence_head(outputs["pooled_output"])
        super().__init__(
            inputs=inputs,
            outputs={MASKED_LM: masked_lm, NEXT_SENTENCE: next_sentence},
            **kwargs,
        )

        # === Config ===
        self.encoder = encoder
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.head_dtype = dtype

    def compile(self, optimizer="adamw", loss="auto", weighted_metrics="auto", **kwargs):
        """`Model.compile` with BERT's pretraining losses and accuracies by default.

        The losses average over the sample weights, so with the weights of
        `make_pretraining_dataset` the masked-LM loss is the mean over real
        predictions only (google-research/bert's `sum(w·loss) / sum(w)`) and
        padded prediction slots count for nothing. The total loss is the sum of
        the two, as in google-research/bert. Logs `masked_lm_accuracy` and
        `next_sentence_accuracy`, both weighted the same way.
        """
        if loss == "auto":
            loss = pretraining_losses()
        if weighted_metrics == "auto":
            weighted_metrics = pretraining_metrics()
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics, **kwargs)

    def get_config(self):
        return {
            "encoder": keras.saving.serialize_keras_object(self.encoder),
            "activation": self.activation,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "initializer_range": self.initializer_range,
            "dtype": keras.saving.serialize_keras_object(self.head_dtype),
            "name": self.name,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = keras.saving.deserialize_keras_object(config["encoder"])
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        return cls(**config)


def pretraining_losses():
    """The two losses, keyed by output; both average over the sample weights."""
    return {
        name: keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight", name=f"{name}_loss"
        )
        for name in (MASKED_LM, NEXT_SENTENCE)
    }


def pretraining_metrics():
    """Masked-LM and next-sentence accuracy (pass as `weighted_metrics`)."""
    return {
        name: [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        for name in (MASKED_LM, NEXT_SENTENCE)
    }


def bert_pretrainer(encoder_or_config, dtype=None, name="bert_pretrainer"):
    """Builds BERT's pretraining model (masked LM + next sentence prediction).

    Args:
        encoder_or_config: a `BertConfig` (fresh encoder) or an encoder from
            `bert_encoder` (e.g. loaded from a checkpoint, to continue
            pretraining it).
        dtype: dtype policy of a fresh encoder and of the masked-LM transform.
        name: str.

    Returns:
        A `BertPretrainer` (a functional `keras.Model`); its `.encoder` is the
        encoder to fine-tune or export afterwards. Layer names map to
        google-research/bert: `masked_lm` ↔ `cls/predictions`,
        `next_sentence` ↔ `cls/seq_relationship`.

    Example:
    >>> from kbert import BertConfig
    >>> model = bert_pretrainer(BertConfig.from_preset("bert_tiny", vocab_size=100))
    >>> model.output["masked_lm"].shape
    (None, None, 100)
    """
    encoder = as_encoder(encoder_or_config, dtype=dtype)
    if isinstance(encoder_or_config, BertConfig):
        activation = encoder_or_config.activation
        epsilon = encoder_or_config.layer_norm_epsilon
        initializer_range = encoder_or_config.initializer_range
    else:
        activation, epsilon = head_hyperparameters(encoder)
        initializer_range = DEFAULT_INITIALIZER_RANGE
    return BertPretrainer(
        encoder,
        activation=activation,
        layer_norm_epsilon=epsilon,
        initializer_range=initializer_range,
        dtype=dtype,
        name=name,
    )
