"""`bert_classifier`: a classification head on the pooled [CLS] output."""

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
    # The nested encoder shares the given encoder's layers (training the
    # classifier trains them) but computes only [CLS] in its last block.
    encoder = rewire_encoder(as_encoder(encoder_or_config, dtype=dtype), first_token_only=True)
    inputs = encoder_inputs()
    pooled = encoder(inputs)["pooled_output"]
    pooled = keras.layers.Dropout(dropout, dtype=dtype, name="classifier_dropout")(pooled)
    # The head stays float32 so logits and loss are float32 under mixed precision.
    logits = keras.layers.Dense(
        num_classes,
        kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        dtype="float32",
        name="logits",
    )(pooled)
    return keras.Model(inputs=inputs, outputs=logits, name=name)
