"""Masked-LM batches straight from raw text, masked anew every time they are drawn.

RoBERTa's dynamic masking (Liu et al., 2019): instead of masks fixed once in
TFRecords (`dupe_factor` copies), a `tf.data` pipeline tokenizes the text,
packs it into full-length sequences and masks them on the fly with tf-text's
`mask_language_model` and `MaskValuesChooser`, so every pass over the corpus
sees new masks, the same in any process for a seed. Sequences are single
segments of contiguous text (no next-sentence pairs, as in RoBERTa): the
next-sentence outputs get weight 0.

With `whole_word_masking`, the items chosen are words (a piece and the `##`
pieces after it, as google-research/bert groups them), and a chosen word has
all its pieces predicted, each replaced 80/10/10 on its own.
"""

import os

from kbert.corpus import line_dataset
from kbert.models.pretrainer import MASKED_LM, NEXT_SENTENCE
from kbert.pretraining.instances import DEFAULT_MASKED_LM_PROB, MASK_TOKEN_RATE

# 80% [MASK], 10% random id, 10% unchanged, as in the BERT paper.
RANDOM_TOKEN_RATE = 0.1
# Lines tokenized together; their tokens are concatenated and cut into
# sequences, and the tail that does not fill a sequence is dropped (as Hugging
# Face's run_mlm `group_texts` drops it): at most one sequence per block.
LINES_PER_BLOCK = 1024
DEFAULT_SHUFFLE_BUFFER = 10_000


def make_dynamic_masking_dataset(
    corpus_or_lines,
    vocabulary,
    batch_size,
    seq_len,
    max_predictions,
    lowercase=True,
    masked_lm_prob=DEFAULT_MASKED_LM_PROB,
    shuffle_buffer=DEFAULT_SHUFFLE_BUFFER,
    repeat=True,
    seed=None,
    whole_word_masking=False,
):
    """A `tf.data` pipeline of dynamically masked batches for `BertPretrainer.fit`.

    Args:
        corpus_or_lines: corpus path, glob pattern or list of paths (`.gz`
            read transparently), or an iterable of text lines. Blank lines
            are skipped; document boundaries are not kept.
        vocabulary: list of str or path of a `vocab.txt`.
        batch_size: int. Batches are full, for static shapes.
        seq_len: int. Every sequence is `[CLS]` + `seq_len - 2` tokens + `[SEP]`.
        max_predictions: int. Most masked positions per sequence; the share
            masked is `masked_lm_prob` of the maskable tokens, rounded up.
        lowercase: bool. Tokenize uncased.
        masked_lm_prob: float. Share of tokens selected for prediction.
        shuffle_buffer: int. Sequences shuffled in a buffer this large (0: off).
        repeat: bool. Repeat the corpus forever (pass `steps_per_epoch` to
            `fit`); masks are drawn anew on every pass. Keep it on for
            training: with `repeat=False` each epoch starts a new iterator, and
            under a global seed (`keras.utils.set_random_seed`) TensorFlow
            replays the same masks.
        seed: int or None. Seed of the sequence shuffle. The masks come from
            TensorFlow's random ops, reproducible under `tf.random.set_seed`
            (`keras.utils.set_random_seed`), across processes too.
        whole_word_masking: bool. Choose whole words, as google-research/bert
            does: words are taken in random order when their pieces still fit
            the sequence's budget of `ceil(masked_lm_prob * maskable tokens)`,
            at most `max_predictions`. A word cut by a sequence boundary
            counts as two words.

    Returns:
        A `tf.data.Dataset` of `(features, labels, sample_weights)` with the
        structure of `make_pretraining_dataset`'s; `next_sentence` labels
        are 0 with weight 0, so that loss and accuracy ignore them.

    Example:
    >>> dataset = make_dynamic_masking_dataset(  # doctest: +SKIP
    ...     "corpus.txt.gz", vocab, batch_size=32, seq_len=128, max_predictions=20
    ... )
    """
    import tensorflow as tf
    import tensorflow_text as tf_text

    from kbert.text import WordPieceTokenizer, load_vocab
    from kbert.text.datasets import without_autotune

    if isinstance(vocabulary, (str, os.PathLike)):
        vocabulary = load_vocab(vocabulary)
    for name, value, low in (
        ("batch_size", batch_size, 1),
        ("seq_len", seq_len, 3),
        ("max_predictions", max_predictions, 1),
    ):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r} must be an integer >= {low}")
    if not 0.0 < masked_lm_prob < 1.0:
        raise ValueError(f"masked_lm_prob={masked_lm_prob!r} must be in (0, 1)")
    tokenizer = WordPieceTokenizer(vocabulary, lowercase=lowercase, split_special_tokens=True)
    cls_id, sep_id, pad_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
    body_length = seq_len - 2

    def pack(lines):
        ids = tokenizer(lines).flat_values
        usable = tf.size(ids) // body_length * body_length
        return tf.reshape(ids[:usable], [-1, body_length])

    dataset = line_dataset(corpus_or_lines).batch(LINES_PER_BLOCK)
    dataset = dataset.map(pack, num_parallel_calls=tf.data.AUTOTUNE)
    if repeat:
        # After packing, so every pass cuts the text into the same sequences;
        # before masking, so every pass masks them anew.
        dataset = dataset.repeat()
    dataset = dataset.unbatch()
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    dataset = dataset.batch(batch_size, drop_remainder=True)

    # Without whole words, each piece is a word of its own.
    continuation = tf.constant([whole_word_masking and token.startswith("##") for token in vocabulary])
    selector = _word_selector_class()(
        max_selections_per_batch=max_predictions,
        selection_rate=masked_lm_prob,
        unselectable_ids=[cls_id, sep_id, pad_id],
    )
    chooser = tf_text.MaskValuesChooser(
        len(vocabulary),
        tokenizer.mask_id,
        mask_token_rate=MASK_TOKEN_RATE,
        random_token_rate=RANDOM_TOKEN_RATE,
    )

    def mask(body):
        rows = tf.shape(body)[0]
        ids = tf.concat(
            [tf.fill([rows, 1], cls_id), body, tf.fill([rows, 1], sep_id)], axis=1
        )
        # masked: [rows, (tokens)]; positions index the tokens.
        masked, positions, labels = tf_text.mask_language_model(group_words(ids, continuation), selector, chooser)
        shape = [None, max_predictions]
        features = {
            "token_ids": masked.to_tensor(shape=[None, seq_len]),
            "segment_ids": tf.zeros_like(ids),
            "padding_mask": tf.ones_like(ids),
            "masked_lm_positions": tf.cast(positions.to_tensor(0, shape=shape), tf.int32),
        }
        labels = {
            MASKED_LM: labels.to_tensor(0, shape=shape),
            NEXT_SENTENCE: tf.zeros([rows], tf.int32),
        }
        weights = {
            MASKED_LM: tf.ones_like(positions, tf.float32).to_tensor(0.0, shape=shape),
            NEXT_SENTENCE: tf.zeros([rows], tf.float32),
        }
        return features, labels, weights

    # One batch masked at a time: parallel calls would draw the masks in the
    # order their threads run, other masks from the same seed on every run
    # (masking 32 x 128 pieces takes about 4 ms on one CPU core, far below a
    # training step).
    return without_autotune(dataset.map(mask).prefetch(tf.data.AUTOTUNE))


def count_sequences(lines, vocabulary, seq_len, lowercase=True):
    """How many sequences `make_dynamic_masking_dataset` cuts a list of text
    `lines` into on each pass (0: too little text to train on; the pipeline
    would then wait forever for a first batch)."""
    import tensorflow as tf

    from kbert.text import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(vocabulary, lowercase=lowercase, split_special_tokens=True)
    lines = [line.strip() for line in lines if line.strip()]
    return sum(
        int(tf.size(tokenizer(tf.constant(lines[start:start + LINES_PER_BLOCK])).flat_values)) // (seq_len - 2)
        for start in range(0, len(lines), LINES_PER_BLOCK)
    )


def group_words(ids, continuation):
    """`[rows, seq_len]` ids as a `[rows, (words), (pieces)]` RaggedTensor.

    A word is a piece and the `##` pieces after it (`continuation[id]`); the
    first two positions ([CLS] and the first body piece) and the last ([SEP])
    always start a word, so a word cut by the sequence start stands alone.
    """
    import tensorflow as tf

    seq_len = tf.shape(ids)[1]
    column = tf.range(seq_len)[tf.newaxis, :]
    starts = ~tf.gather(continuation, ids) | (column <= 1) | (column == seq_len - 1)
    word_of_piece = tf.cumsum(tf.cast(tf.reshape(starts, [-1]), tf.int64)) - 1
    pieces = tf.RaggedTensor.from_value_rowids(tf.reshape(ids, [-1]), word_of_piece)
    return tf.RaggedTensor.from_row_lengths(pieces, tf.reduce_sum(tf.cast(starts, tf.int64), 1))


def _word_selector_class():
    import tensorflow as tf
    import tensorflow_text as tf_text

    class WordSelector(tf_text.RandomItemSelector):
        """Chooses words of a `[rows, (words), (pieces)]` batch within a piece budget,
        from one random draw for the whole batch. (tf-text's own selector shuffles
        each row in a `map_fn` whose parallel iterations take turns at one random
        state in the order their threads run: the same seed gave other masks.)
        Words of one piece each make it `RandomItemSelector`'s choice: in each row,
        `selection_rate` of its selectable pieces rounded up, at most
        `max_selections_per_batch`, uniformly at random."""

        def get_selection_mask(self, input_ids, axis):
            selectable = self.get_selectable(input_ids, axis)
            sizes = tf.cast(input_ids.row_lengths(axis=2), tf.float32)
            sizes = tf.where(selectable, sizes, tf.zeros_like(sizes)).to_tensor(0.0)
            budget = tf.minimum(
                tf.math.ceil(tf.reduce_sum(sizes, 1) * self.selection_rate),
                float(self.max_selections_per_batch),
            )
            # A random order of each row's selectable words (the rest last),
            # then google's loop: take a word if its pieces still fit.
            priority = tf.where(sizes > 0, tf.random.uniform(tf.shape(sizes)), 2.0)
            order = tf.argsort(priority, axis=1)
            sizes_in_order = tf.transpose(tf.gather(sizes, order, batch_dims=1))

            def take_if_it_fits(total, size):
                return tf.where((size > 0) & (total + size <= budget), total + size, total)

            totals = tf.scan(take_if_it_fits, sizes_in_order, initializer=tf.zeros_like(budget))
            taken = tf.transpose(totals > tf.concat([tf.zeros_like(totals[:1]), totals[:-1]], 0))
            chosen = tf.gather(taken, tf.argsort(order, axis=1), batch_dims=1)
            return tf.RaggedTensor.from_tensor(chosen, lengths=selectable.row_lengths())

    return WordSelector
