"""Words as WordPieces in packed windows, each word read where it has the most context.

`token-classification`'s preprocessing (`TokenClassification.encode`) and its
SavedModel (`kbert.export.serving_tokens`) share `word_windows`, in
TensorFlow ops; `word_part_ids` cuts data tokens into the words raw text
gives (`--word-split raw`).
"""

import numpy as np


def word_part_ids(tokenizer, examples, word_split):
    """The pieces of each word's parts, `(examples, parts, pieces)`, and each word's number of parts.

    `examples`: `WordsExample`s. With `word_split` "raw" a word's parts are the words
    `WordPieceTokenizer.words_with_offsets` cuts it into, as it cuts raw
    text, whose pieces are together the word's own; else the word is one
    part. A word that gives no piece (all control characters, U+200B) is
    one part, [UNK], so that it is tagged all the same.
    """
    import tensorflow as tf

    words = [word for example in examples for word in example.words]
    if word_split == "raw":
        ids = tokenizer.words_with_offsets(words)[0]  # (words, parts, pieces)
        counts = ids.row_lengths().numpy()
        ids = ids.values
    else:
        ids = tokenizer(tf.constant(words, tf.string))
        counts = np.ones(len(words), np.int64)
    values, lengths = ids.flat_values.numpy(), ids.row_lengths().numpy()
    partless = np.flatnonzero(counts == 0)
    if partless.size:
        lengths = np.insert(lengths, (np.cumsum(counts) - counts)[partless], 0)
        counts = np.maximum(counts, 1)
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        values = np.insert(values, (np.cumsum(lengths) - lengths)[empty], tokenizer.unk_id)
        lengths = np.maximum(lengths, 1)
    per_part = tf.RaggedTensor.from_row_lengths(values.astype(np.int32), lengths)
    part_splits = np.concatenate([[0], np.cumsum(counts)])
    word_splits = np.cumsum([0] + [len(example.words) for example in examples])
    return tf.RaggedTensor.from_row_splits(per_part, part_splits[word_splits]), counts


def word_windows(word_ids, sequence_length, stride, packer):
    """Packed windows over each example's pieces, and where each word is read from.

    TensorFlow ops only: `encode` and the SavedModel share it.

    Args:
        word_ids: int32 `RaggedTensor` `(examples, words, pieces)`, every
            word at least one piece.
        sequence_length: int. Each window packs `sequence_length - 2` pieces.
        stride: int. Pieces between the starts of a long example's windows.
        packer: `kbert.text.BertPacker` of that length.

    Returns:
        dict: `ENCODER_INPUTS` `(rows, sequence_length)`, `example_of_row`
        `(rows,)`, and over all words in order `word_row` and
        `word_position`: the row and position of the word's first piece in
        the window where it has the most context.
    """
    import tensorflow as tf

    budget = sequence_length - 2
    pieces = word_ids.merge_dims(1, 2)
    counts = pieces.row_lengths()
    windows = 1 + tf.maximum(tf.constant(0, tf.int64), -(-(counts - budget) // stride))
    example_of_row = tf.repeat(tf.range(tf.size(counts, out_type=tf.int64)), windows)
    start = tf.ragged.range(windows).flat_values * stride
    length = tf.minimum(tf.constant(budget, tf.int64), tf.gather(counts, example_of_row) - start)
    first = tf.gather(pieces.row_starts(), example_of_row) + start
    index = tf.ragged.range(first, first + length)
    features = packer(tf.gather(pieces.flat_values, index))

    # google-research/bert's max context, min(left, right) + 0.01 * length,
    # times 100 so that it is exact; the first window wins a tie.
    row = index.value_rowids()
    offset = index.flat_values - tf.gather(first, row)
    length_of = tf.gather(length, row)
    score = 100 * tf.minimum(offset, length_of - 1 - offset) + length_of
    total = tf.size(pieces.flat_values, out_type=tf.int64)
    best = tf.math.unsorted_segment_max(score, index.flat_values, total)
    rows = tf.size(example_of_row, out_type=tf.int64)
    candidate = tf.where(score == tf.gather(best, index.flat_values), row, rows)
    best_row = tf.math.unsorted_segment_min(candidate, index.flat_values, total)
    word_first = word_ids.values.row_starts()
    word_row = tf.gather(best_row, word_first)
    return {
        **features,
        "example_of_row": example_of_row,
        "word_row": word_row,
        "word_position": word_first - tf.gather(first, word_row) + 1,  # after [CLS]
    }
