"""`bert_classifier` and `bert_regressor`: a linear head on the pooled [CLS] output."""

import keras

from kbert.models.encoder import as_encoder, encoder_inputs, rewire_encoder

# Dropout before the classification head, as in the BERT paper's fine-tuning.
DEFAULT_HEAD_DROPOUT = 0.1


def bert_classifier(
    encoder_or_config, num_classes, dropout=DEFAULT_HEAD_DROPOUT, dtype=None, name="bert_classifier"
):
    """Builds a sequence classifier that outputs float32 logits.

    Args:
        encoder_or_config: a `BertConfig` (fresh encoder) or an encoder from
            `bert_encoder` (e.g. loaded from a checkpoint).
        num_classes: int. Number of classes, at least 2.
        dropout: float. Dropout on the pooled output.
        dtype: dtype policy for a fresh encoder and the head's dropout.
        name: str.

    Returns:
        A `keras.Model` from the encoder inputs to `(batch, num_classes)` logits.

    Example:
    >>> from kbert import BertConfig
    >>> model = bert_classifier(BertConfig.from_preset("bert_tiny", vocab_size=100), 3)
    >>> model.output.shape
    (None, 3)
    """
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes={num_classes!r} must be an integer >= 2")
    return _pooled_head(encoder_or_config, num_classes, "logits", dropout, dtype, name)


def bert_regressor(encoder_or_config, dropout=DEFAULT_HEAD_DROPOUT, dtype=None, name="bert_regressor"):
    """Builds a regressor: one float32 output on the pooled [CLS] vector.

    BERT's STS-B recipe: a linear output trained with mean squared error on
    the raw score.

    Args:
        encoder_or_config, dropout, dtype, name: as for `bert_classifier`.

    Returns:
        A `keras.Model` from the encoder inputs to `(batch, 1)` float32 scores;
        the output layer is named "score".
    """
    return _pooled_head(encoder_or_config, 1, "score", dropout, dtype, name)


def _pooled_head(encoder_or_config, units, output_name, dropout, dtype, name):
    # The nested encoder shares the given encoder's layers (training the
    # model trains them) but computes only [CLS] in its last block.
    encoder = rewire_encoder(as_encoder(encoder_or_config, dtype=dtype), first_token_only=True)
    inputs = encoder_inputs()
    pooled = encoder(inputs)["pooled_output"]
    pooled = keras.layers.Dropout(dropout, dtype=dtype, name="classifier_dropout")(pooled)
    # The head stays float32 so outputs and loss are float32 under mixed precision.
    outputs = keras.layers.Dense(
        units,
        kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        dtype="float32",
        name=output_name,
    )(pooled)
    return keras.Model(inputs=inputs, outputs=outputs, name=name)
