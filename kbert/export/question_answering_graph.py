"""The question-answering task's `serving_default` in TensorFlow ops: windows in, answers out.

`windowed_features` is `QuestionAnswering.prepare` and `row` for a batch of
`(question, context)` strings: words, WordPieces with their byte offsets,
run_squad.py's windows packed as rows, and for each position whether it is a
context piece and whether the window is its max-context one. `best_answers`
is `squad.best_answer` on the model's logits of those rows: the top
`n_best_size` starts and ends of each window, the best valid pair of each
question (the first in run_squad.py's order on ties), the null score, and the
answer cut from the context.

Two differences from the Python path, both in the offsets of the answer:
the pieces' offsets come from tf-text's `FastBertTokenizer` run on each word
(its normaliser folds a few characters Hugging Face's keeps, e.g. "ß", so
where its piece count differs from kbert's the pieces take the word's span),
and a question too long for the sequence is cut to fit instead of refused.
The export verification counts the answers that differ from `kbert predict`'s.
"""

import tensorflow as tf
import tensorflow_text as tf_text

from kbert.text import tokenizer as _wordpiece

# run_squad.py's word separators (`squad_text.WORD_SEPARATORS`); CJK characters
# are words of their own (`squad_text.character_classes().word`).
WORD_DELIMITERS = "[ \\t\\r\\n\\x{202F}]+|" + _wordpiece._CJK
WORD_KEPT = _wordpiece._CJK
# `null_score_diff` when a question has no valid span (an infinite
# difference, which JSON cannot carry).
NO_SPAN_DIFF = 3.0e38


def windowed_features(task, question, context):
    """Encoder inputs of every window of every question, and what decoding needs.

    Args:
        task: `QuestionAnswering`.
        question, context: string tensors `(batch,)`.

    Returns:
        dict: `token_ids`, `segment_ids`, `padding_mask` (int32 `(rows,
        sequence_length)`); `example_of_row` (int32 `(rows,)`); `in_doc`,
        `max_context` (bool `(rows, sequence_length)`); `byte_begin`,
        `byte_end` (int64 `(rows, sequence_length)`, each context piece's
        bytes in its context); `context`.
    """
    tokenizer, length = task.tokenizer, task.sequence_length
    query = tokenizer(question)[:, : min(task.max_query_length, length - 4)]
    words, word_begin, word_end = tf_text.regex_split_with_offsets(context, WORD_DELIMITERS, WORD_KEPT)
    pieces = tokenizer(words)  # (batch, words, pieces)
    ids = pieces.merge_dims(1, 2)  # (batch, pieces)
    begin, end = _piece_bytes(task, words, word_begin, word_end, pieces)

    # run_squad.py's windows: `room` pieces each, `step` apart.
    total = ids.row_lengths()
    room = length - 3 - query.row_lengths()
    step = tf.minimum(tf.cast(task.doc_stride, tf.int64), room)
    count = 1 + (tf.maximum(total - room, 0) + step - 1) // step
    example_of_row = tf.repeat(tf.range(tf.size(count, out_type=tf.int64)), count)
    first = tf.ragged.range(count).flat_values * tf.gather(step, example_of_row)
    size = tf.minimum(tf.gather(total, example_of_row) - first, tf.gather(room, example_of_row))
    start = tf.gather(ids.row_starts(), example_of_row) + first
    doc = tf.gather(ids.flat_values, tf.ragged.range(start, start + size))
    features = task.preprocessor.packer((tf.gather(query, example_of_row), doc))

    # Each position's piece of the context, if it holds one.
    offset = tf.gather(query.row_lengths(), example_of_row) + 2
    j = tf.range(length, dtype=tf.int64)[tf.newaxis, :] - offset[:, tf.newaxis]
    in_doc = (j >= 0) & (j < size[:, tf.newaxis])
    pieces_total = tf.size(ids.flat_values, out_type=tf.int64)
    piece = tf.where(in_doc, start[:, tf.newaxis] + j, pieces_total)  # pieces_total: none
    # run_squad.py's _check_is_max_context, in its float64 arithmetic.
    score = tf.cast(tf.minimum(j, size[:, tf.newaxis] - 1 - j), tf.float64) + 0.01 * tf.cast(
        size[:, tf.newaxis], tf.float64
    )
    score = tf.where(in_doc, score, -float("inf"))
    best = tf.math.unsorted_segment_max(score, piece, pieces_total + 1)
    is_best = in_doc & (score >= tf.gather(best, piece))
    rows = tf.size(example_of_row, out_type=tf.int64)
    row = tf.broadcast_to(tf.range(rows)[:, tf.newaxis], tf.shape(piece, out_type=tf.int64))
    first_best = tf.math.unsorted_segment_min(tf.where(is_best, row, rows), piece, pieces_total + 1)
    return {
        **features,
        "example_of_row": tf.cast(example_of_row, tf.int32),
        "in_doc": in_doc,
        "max_context": is_best & tf.equal(row, tf.gather(first_best, piece)),
        "byte_begin": tf.gather(tf.concat([begin, [-1]], 0), piece),
        "byte_end": tf.gather(tf.concat([end, [-1]], 0), piece),
        "context": context,
    }


def _piece_bytes(task, words, word_begin, word_end, pieces):
    """Each piece's bytes `[begin, end)` in its context, flat in piece order.

    tf-text's `FastBertTokenizer` gives offsets within each word; where it
    cuts a word into as many pieces as kbert's tokenizer does, piece `i`
    takes its piece `i`'s offsets, elsewhere the word's span.
    """
    tokenizer = task.tokenizer
    offsets = tf_text.FastBertTokenizer(
        vocab=list(tokenizer.vocabulary),
        token_out_type=tf.int32,
        unknown_token=tokenizer.unknown_token,
        lower_case_nfd_strip_accents=tokenizer.lowercase,
    )
    _, begin, end = offsets.tokenize_with_offsets(words.flat_values)
    per_word = pieces.values  # (words, pieces) over the batch
    word_of_piece = per_word.value_rowids()
    agree = tf.gather(tf.equal(begin.row_lengths(), per_word.row_lengths()), word_of_piece)
    in_word = tf.range(tf.size(word_of_piece, out_type=tf.int64)) - tf.gather(per_word.row_starts(), word_of_piece)
    # Clipped: where the counts differ the index may run past; the value is not used.
    index = tf.minimum(tf.gather(begin.row_starts(), word_of_piece) + in_word, tf.size(begin.values, out_type=tf.int64))
    word_first = tf.gather(word_begin.flat_values, word_of_piece)
    word_last = tf.gather(word_end.flat_values, word_of_piece)
    return (
        tf.where(agree, word_first + tf.gather(tf.concat([begin.values, [0]], 0), index), word_first),
        tf.where(agree, word_first + tf.gather(tf.concat([end.values, [0]], 0), index), word_last),
    )


def best_answers(task, features, outputs):
    """One answer per question from the logits of its windows (`squad.best_answer`).

    Returns:
        dict: `answer` (string, "" for none), `answer_start`, `answer_end`
        (int32 characters, -1 for none), `score` (the answer's: the span's,
        or for no answer the null score; 0 without either), `best_score`
        (the best span's, 0 without one) and, for v2.0, `null_score_diff`.
    """
    start_logits = tf.cast(outputs["start_logits"], tf.float64)
    end_logits = tf.cast(outputs["end_logits"], tf.float64)
    k = min(task.n_best_size, task.sequence_length)
    # top_k puts the lower index first on ties, as run_squad.py's stable sort.
    top_start = tf.math.top_k(start_logits, k).indices
    top_end = tf.math.top_k(end_logits, k).indices
    start_ok = tf.gather(features["in_doc"] & features["max_context"], top_start, batch_dims=1)
    end_ok = tf.gather(features["in_doc"], top_end, batch_dims=1)
    i, j = top_start[:, :, tf.newaxis], top_end[:, tf.newaxis, :]
    valid = start_ok[:, :, tf.newaxis] & end_ok[:, tf.newaxis, :] & (j >= i) & (j - i + 1 <= task.max_answer_length)
    pair = (
        tf.gather(start_logits, top_start, batch_dims=1)[:, :, tf.newaxis]
        + tf.gather(end_logits, top_end, batch_dims=1)[:, tf.newaxis, :]
    )
    pair = tf.reshape(tf.where(valid, pair, -float("inf")), [-1, k * k])
    row_best = tf.reduce_max(pair, axis=1)
    # The first pair of the best score: start rank, then end rank.
    row_pair = tf.argmin(tf.where(pair == row_best[:, tf.newaxis], tf.range(k * k), k * k), axis=1, output_type=tf.int32)

    example = features["example_of_row"]
    examples = tf.shape(features["context"])[0]
    rows = tf.shape(example)[0]
    best = tf.math.unsorted_segment_max(row_best, example, examples)
    # The first window of the best score.
    best_row = tf.math.unsorted_segment_min(
        tf.where(row_best == tf.gather(best, example), tf.range(rows), rows), example, examples
    )
    best_row = tf.minimum(best_row, rows - 1)
    chosen = tf.gather(row_pair, best_row)
    start_position = tf.gather(tf.gather(top_start, best_row), chosen // k, batch_dims=1)
    end_position = tf.gather(tf.gather(top_end, best_row), chosen % k, batch_dims=1)
    byte_begin = tf.gather_nd(features["byte_begin"], tf.stack([best_row, start_position], 1))
    byte_end = tf.gather_nd(features["byte_end"], tf.stack([best_row, end_position], 1))
    found = best > -float("inf")
    answered = found
    result = {}
    score = tf.where(found, best, 0.0)
    if task.version_2_with_negative:
        null = tf.math.unsorted_segment_min(start_logits[:, 0] + end_logits[:, 0], example, examples)
        diff = null - best
        answered = found & ~(diff > task.threshold)
        score = tf.where(answered, best, null)
        result["null_score_diff"] = tf.cast(tf.minimum(diff, NO_SPAN_DIFF), tf.float32)
    context = features["context"]
    byte_begin = tf.where(answered, byte_begin, 0)
    byte_end = tf.where(answered, byte_end, 0)
    text = tf.strings.substr(context, byte_begin, byte_end - byte_begin)
    char_start = tf.strings.length(tf.strings.substr(context, tf.zeros_like(byte_begin), byte_begin), unit="UTF8_CHAR")
    char_end = char_start + tf.strings.length(text, unit="UTF8_CHAR")
    return {
        "answer": text,
        "answer_start": tf.where(answered, char_start, -1),
        "answer_end": tf.where(answered, char_end, -1),
        "score": tf.cast(score, tf.float32),
        "best_score": tf.cast(tf.where(found, best, 0.0), tf.float32),
        **result,
    }
