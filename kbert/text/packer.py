"""Packs token ids into BERT's `[CLS] a [SEP] (b [SEP])` inputs."""

import collections

import keras
import numpy as np
import tensorflow as tf

TRUNCATE_STRATEGIES = ("longest_first", "head_tail")


@keras.saving.register_keras_serializable(package="kbert")
class BertPacker(keras.layers.Layer):
    """Builds `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, truncated and padded.

    Truncation follows Hugging Face's `"longest_first"`: one token at a time is
    removed from the end of the longer segment (of the second when both are as
    long) until the whole fits `sequence_length`. `"head_tail"` keeps as many
    tokens of each segment, but cuts them from its middle: a cut segment keeps
    its first half (rounded down) and its last half (Sun et al., 2019, "How
    to fine-tune BERT for text classification": long texts end with what
    their start does not say).

    Args:
        sequence_length: int or None. Length of the outputs; None pads each batch
            to its longest sequence and truncates nothing.
        cls_id: int. Id of `[CLS]`.
        sep_id: int. Id of `[SEP]`.
        pad_id: int. Id that fills the padding.
        truncate: str. `"longest_first"` (the ends of segments go) or
            `"head_tail"` (their middles go).

    Input: the ids of one segment, or a tuple/list of two segments: each a
    `RaggedTensor` `(batch, None)`, a dense `(batch, length)` tensor (all of
    whose ids count) or a 1-D tensor for a single unbatched sequence.

    Output: a dict of int32 tensors `(batch, sequence_length)`, or
    `(sequence_length,)` for unbatched input: `"token_ids"`, `"segment_ids"` (0
    for `[CLS] a [SEP]`, 1 for `b [SEP]`) and `"padding_mask"` (1 for tokens, 0
    for padding).

    Example:
    >>> packer = BertPacker(8, cls_id=101, sep_id=102)
    >>> packer(([7, 8, 9, 10], [20, 21, 22]))["token_ids"].numpy().tolist()
    [101, 7, 8, 9, 102, 20, 21, 102]
    """

    def __init__(
        self,
        sequence_length=None,
        *,
        cls_id,
        sep_id,
        pad_id=0,
        truncate="longest_first",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self.built = True  # no weights
        if sequence_length is not None and (
            not isinstance(sequence_length, (int, np.integer)) or sequence_length < 2
        ):
            raise ValueError(
                f"sequence_length={sequence_length!r}; expected None or an int >= 2 "
                "([CLS] and [SEP] take two positions)."
            )
        _check_truncate(truncate)
        self.sequence_length = None if sequence_length is None else int(sequence_length)
        self.cls_id = int(cls_id)
        self.sep_id = int(sep_id)
        self.pad_id = int(pad_id)
        self.truncate = truncate

    def __call__(self, inputs, *args, **kwargs):
        # Keras refuses a tuple that mixes tensors and Python lists: convert first.
        return super().__call__(_to_tensors(inputs), *args, **kwargs)

    def call(self, inputs):
        segments = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
        if len(segments) not in (1, 2):
            raise ValueError(
                f"BertPacker packs one or two segments; got {len(segments)}."
            )
        rows = [_rows(segment) for segment in segments]
        unbatched = {row.unbatched for row in rows}
        if len(unbatched) > 1:
            raise ValueError(
                "BertPacker got one batched and one unbatched segment; expected both "
                "of the same rank."
            )
        batch_sizes = [row.lengths.shape[0] for row in rows]
        if None not in batch_sizes and len(set(batch_sizes)) > 1:
            raise ValueError(
                f"BertPacker got segments of batch sizes {batch_sizes}; expected "
                "equal batch sizes."
            )
        num_specials = 1 + len(rows)
        lengths = [row.lengths for row in rows]
        if self.sequence_length is not None:
            if self.sequence_length < num_specials:
                raise ValueError(
                    f"sequence_length={self.sequence_length} leaves no room for the "
                    f"{num_specials} special tokens of {len(rows)} segments; "
                    f"expected at least {num_specials}."
                )
            lengths = _truncate_longest_first(lengths, self.sequence_length - num_specials)
        outputs = self._pack(rows, lengths)
        if unbatched.pop():
            outputs = {name: value[0] for name, value in outputs.items()}
        return outputs

    def _pack(self, rows, lengths):
        """Fills each output position from `[CLS]`, a segment, `[SEP]` or padding.

        Position-wise selection over dense `(batch, length)` grids keeps the graph
        small, where concatenating ragged tensors would add hundreds of ops.
        """
        if self.sequence_length is None:
            total = 1 + len(rows) + tf.add_n(lengths)
            width = tf.maximum(tf.reduce_max(total), 0)  # 0 for an empty batch
        else:
            width = self.sequence_length
        positions = tf.range(width)[tf.newaxis, :]
        token_ids = tf.where(positions == 0, self.cls_id, self.pad_id)
        segment_ids = tf.zeros_like(positions)
        start = 1
        for index, (row, length) in enumerate(zip(rows, lengths)):
            end = start + length[:, tf.newaxis]  # where this segment's [SEP] goes
            offsets = positions - start
            if self.truncate == "head_tail":
                # The kept second half is read from the end of the segment.
                skipped = (row.lengths - length)[:, tf.newaxis]
                offsets += tf.where(offsets >= length[:, tf.newaxis] // 2, skipped, 0)
            # Clipped so that positions outside the segment read a valid index.
            offsets = row.starts[:, tf.newaxis] + offsets
            offsets = tf.clip_by_value(offsets, 0, tf.size(row.values))
            values = tf.concat([row.values, [self.pad_id]], axis=0)
            in_segment = (positions >= start) & (positions < end)
            token_ids = tf.where(in_segment, tf.gather(values, offsets), token_ids)
            token_ids = tf.where(positions == end, self.sep_id, token_ids)
            segment_ids = tf.where((positions >= start) & (positions <= end), index, segment_ids)
            start = end + 1
        return {
            "token_ids": token_ids,
            "segment_ids": segment_ids,
            "padding_mask": tf.cast(positions < start, tf.int32),
        }

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            cls_id=self.cls_id,
            sep_id=self.sep_id,
            pad_id=self.pad_id,
            truncate=self.truncate,
        )
        return config


def _check_truncate(truncate):
    if truncate not in TRUNCATE_STRATEGIES:
        raise ValueError(f"truncate={truncate!r}; expected one of {list(TRUNCATE_STRATEGIES)}.")


def _truncate_longest_first(lengths, budget):
    """Segment lengths cut so that they sum to at most `budget` per row."""
    if len(lengths) == 1:
        return [tf.minimum(lengths[0], budget)]
    first, second = lengths
    first_longer = first > second
    longer = tf.where(first_longer, first, second)
    shorter = tf.where(first_longer, second, first)
    # Removing one token at a time from the longer segment leaves it half of the
    # budget, rounded up, unless the shorter one needs less than the other half.
    keep_longer = tf.minimum(longer, tf.maximum(budget - shorter, (budget + 1) // 2))
    keep_shorter = tf.minimum(shorter, budget - keep_longer)
    return [
        tf.where(first_longer, keep_longer, keep_shorter),
        tf.where(first_longer, keep_shorter, keep_longer),
    ]


def _to_tensors(inputs):
    """A segment as a `Tensor` or `RaggedTensor`, or a tuple of such for segments.

    A tuple or list of sequences holds segments; a list of ints is one segment.
    """
    if isinstance(inputs, (tuple, list)) and inputs and all(
        isinstance(segment, (tf.Tensor, tf.RaggedTensor, np.ndarray, list, tuple))
        for segment in inputs
    ):
        return tuple(_to_tensor(segment) for segment in inputs)
    return _to_tensor(inputs)


def _to_tensor(segment):
    if isinstance(segment, tf.RaggedTensor) or tf.is_tensor(segment):
        return segment
    try:
        return tf.convert_to_tensor(segment)
    except (TypeError, ValueError):
        try:
            return tf.ragged.constant(segment)
        except (TypeError, ValueError):
            raise ValueError(
                f"BertPacker expects integer token ids; got {segment!r:.80}."
            ) from None


class _Rows(collections.namedtuple("_Rows", "values starts lengths unbatched")):
    """A batch of id sequences: row `i` is `values[starts[i]:starts[i] + lengths[i]]`."""


def _rows(ids):
    """One segment's ids (1-D, dense 2-D or ragged 2-D) as `_Rows` of int32."""
    if not ids.dtype.is_integer:
        raise ValueError(
            f"BertPacker expects integer token ids; got dtype {ids.dtype.name}. "
            "Tokenize strings first."
        )
    rank = ids.shape.rank
    if isinstance(ids, tf.RaggedTensor) and rank == 2 and ids.ragged_rank == 1:
        return _Rows(
            tf.cast(ids.values, tf.int32),
            tf.cast(ids.row_starts(), tf.int32),
            tf.cast(ids.row_lengths(), tf.int32),
            unbatched=False,
        )
    if not isinstance(ids, tf.RaggedTensor) and rank == 1:
        ids = tf.cast(ids, tf.int32)
        return _Rows(ids, tf.zeros([1], tf.int32), tf.size(ids)[tf.newaxis], unbatched=True)
    if not isinstance(ids, tf.RaggedTensor) and rank == 2:
        ids = tf.cast(ids, tf.int32)
        batch_size, length = tf.unstack(tf.shape(ids))
        return _Rows(
            tf.reshape(ids, [-1]),
            tf.range(batch_size) * length,
            tf.fill([batch_size], length),
            unbatched=False,
        )
    raise ValueError(
        f"BertPacker expects ids of shape (length,) or (batch, None); got rank "
        f"{rank} with shape {ids.shape}."
    )


def pack_one(segments, sequence_length, cls_id, sep_id, pad_id=0, truncate="longest_first"):
    """Packs one example's segments (1-D id tensors) into `(1, sequence_length)` inputs.

    The same result as `BertPacker` on a batch of one, made of the few builtin
    ops a TFLite converter keeps without custom ops (slice, concat, pad,
    fill): what a TFLite model with its tokenizer inside packs with.

    Args:
        segments: list of one or two int32 1-D tensors of WordPiece ids.
        sequence_length: int. The fixed length.
        cls_id, sep_id, pad_id: int. Special token ids.
        truncate: str. As for `BertPacker`.

    Returns:
        dict of int32 `(1, sequence_length)` tensors: `token_ids`,
        `segment_ids`, `padding_mask`.
    """
    if len(segments) not in (1, 2):
        raise ValueError(f"pack_one packs one or two segments; got {len(segments)}.")
    _check_truncate(truncate)
    lengths = [tf.shape(segment)[0] for segment in segments]
    lengths = _truncate_longest_first(lengths, sequence_length - 1 - len(segments))
    token_parts, segment_parts = [[cls_id]], [[0]]
    for index, (segment, length) in enumerate(zip(segments, lengths)):
        if truncate == "head_tail":
            head = length // 2
            kept = tf.concat([segment[:head], segment[tf.shape(segment)[0] - (length - head):]], axis=0)
        else:
            kept = segment[:length]
        token_parts += [kept, [sep_id]]
        segment_parts += [tf.fill([length + 1], index)]
    token_ids = tf.concat([tf.cast(part, tf.int32) for part in token_parts], axis=0)
    segment_ids = tf.concat([tf.cast(part, tf.int32) for part in segment_parts], axis=0)
    used = tf.shape(token_ids)[0]
    padding = [[0, sequence_length - used]]
    return {
        "token_ids": tf.reshape(tf.pad(token_ids, padding, constant_values=pad_id), [1, sequence_length]),
        "segment_ids": tf.reshape(tf.pad(segment_ids, padding), [1, sequence_length]),
        "padding_mask": tf.reshape(tf.pad(tf.ones([used], tf.int32), padding), [1, sequence_length]),
    }
