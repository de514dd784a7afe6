"""`bert_classifier` and `bert_regressor`: a linear head on the pooled [CLS] output;
`bert_pair_regressor`: that head plus the cosine of each text's own vector."""

import keras

from kbert.layers import PairSegments
from kbert.models.encoder import as_encoder, encoder_inputs, rewire_encoder
from kbert.models.heads import DEFAULT_HEAD_DROPOUT, HEAD_LAYER, DenseHead, PairCosineHead


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
        its head's Dense layer is named "score".
    """
    return _pooled_head(encoder_or_config, 1, "score", dropout, dtype, name)


def bert_pair_regressor(
    encoder_or_config, score_range=(0.0, 1.0), dropout=DEFAULT_HEAD_DROPOUT, dtype=None,
    name="bert_pair_regressor",
):
    """A pair regressor that reads the pair together and each text alone.

    Its score is a cross-encoder's, a linear output on the pooled [CLS]
    vector of `[CLS] a [SEP] b [SEP]`, plus a bi-encoder's: the cosine of the
    mean-pooled vectors of `[CLS] a [SEP]` and `[CLS] b [SEP]` (sentence-
    transformers' embedding), scaled and shifted by two trained weights.
    The same encoder computes all three rows, rebuilt from the packed pair
    (`PairSegments`), so the model takes the inputs every pair model takes.
    The cosine term starts as the cosine mapped onto `score_range` and the
    linear output near 0: training starts from the checkpoint's zero-shot
    similarity. Three encoder passes instead of one.

    Args:
        encoder_or_config, dropout, dtype, name: as for `bert_classifier`.
        score_range: (low, high) floats. The training scores' range.

    Returns:
        A `keras.Model` from the encoder inputs to `(batch, 1)` float32
        scores: the layer "pair_segments", the encoder, and the head
        (`kbert.models.heads.PairCosineHead`, named "head").
    """
    encoder = as_encoder(encoder_or_config, dtype=dtype)
    inputs = encoder_inputs()
    segments = PairSegments(dtype="int32", name="pair_segments")(
        inputs["token_ids"], inputs["segment_ids"], inputs["padding_mask"]
    )
    encoder_outputs = {
        "pooled_output": encoder(inputs)["pooled_output"],
        "segment_sequence_output": encoder(segments)["sequence_output"],
    }
    head = PairCosineHead(score_range, dropout, dropout_dtype=dtype, name=HEAD_LAYER)
    score = head(encoder_outputs, {**inputs, "segment_padding_mask": segments["padding_mask"]})
    return keras.Model(inputs=inputs, outputs=score, name=name)


def _pooled_head(encoder_or_config, units, output_name, dropout, dtype, name):
    # The nested encoder shares the given encoder's layers (training the
    # model trains them) but computes only [CLS] in its last block.
    encoder = rewire_encoder(as_encoder(encoder_or_config, dtype=dtype), first_token_only=True)
    inputs = encoder_inputs()
    head = DenseHead(units, output_name, "pooled_output", dropout, dropout_dtype=dtype, name=HEAD_LAYER)
    return keras.Model(inputs=inputs, outputs=head(encoder(inputs), inputs), name=name)
