"""Learning a WordPiece vocabulary from raw text with tf-text's BERT vocabulary learner."""

from kbert.corpus import line_dataset

# The learner's defaults (tensorflow_text.tools.wordpiece_vocab), named here
# because they decide which rare words and characters make it in: a piece must
# occur at least MIN_COUNT times, and only the most frequent MAX_UNIQUE_CHARS
# characters are kept (words with other characters become [UNK]).
MIN_COUNT = 10
MAX_UNIQUE_CHARS = 1000
# Lines normalised per batch before word counting.
_BATCH_SIZE = 1024


def learn_vocabulary(corpus_or_lines, size, lowercase=True, min_count=MIN_COUNT, **learn_params):
    """Learns a WordPiece vocabulary of at most `size` tokens from raw text.

    The text is first normalised exactly as `kbert.text.WordPieceTokenizer`
    normalises it (control characters dropped, CJK ideographs split, and for
    `lowercase` accents stripped and the text lower-cased), then split into
    words and counted by `tensorflow_text.tools.wordpiece_vocab`, whose
    learner picks the pieces (`bert_vocab_from_dataset`'s algorithm). So every
    character the learner keeps is one the tokenizer will produce.

    The special tokens come first, in the compact order of
    `kbert.text.SPECIAL_TOKENS`: `[PAD]`=0, `[UNK]`=1, `[CLS]`=2, `[SEP]`=3,
    `[MASK]`=4 (google's vocabularies have [PAD]=0, [UNK]=100, [CLS]=101...;
    kbert reads ids from the vocabulary, so either works). Then single
    characters and their `##` forms, then pieces by frequency.

    Args:
        corpus_or_lines: a corpus path, glob pattern or list of paths (`.gz`
            read transparently), or an iterable of text lines.
        size: int. Largest vocabulary; the learner aims for 95-100% of it and
            returns fewer tokens when the corpus has too few frequent pieces.
        lowercase: bool. Learn an uncased vocabulary (use the same value for
            the tokenizer).
        min_count: int. Lowest piece frequency the learner considers.
        **learn_params: passed to the learner (`max_token_length`,
            `max_unique_chars`, `num_iterations`, `slack_ratio`, ...).

    Returns:
        list of str, the vocabulary in id order.

    Example:
    >>> vocab = learn_vocabulary(["the cat sat on the mat"] * 20, 100)
    >>> vocab[:6]
    ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'a']
    """
    import tensorflow as tf
    from tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset import (
        bert_vocab_from_dataset,
    )

    from kbert.text import SPECIAL_TOKENS, WordPieceTokenizer
    from kbert.text.datasets import without_autotune

    if not isinstance(size, int) or size <= len(SPECIAL_TOKENS):
        raise ValueError(
            f"size={size!r} must be an integer larger than the {len(SPECIAL_TOKENS)} "
            "special tokens"
        )
    if not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count={min_count!r} must be a positive integer")
    # A tokenizer over the special tokens alone, for its normalisation.
    normalizer = WordPieceTokenizer(list(SPECIAL_TOKENS), lowercase=lowercase)
    texts = line_dataset(corpus_or_lines).batch(_BATCH_SIZE)
    texts = without_autotune(texts.map(normalizer._normalize, num_parallel_calls=tf.data.AUTOTUNE))
    learn_params.setdefault("max_unique_chars", MAX_UNIQUE_CHARS)
    vocabulary = bert_vocab_from_dataset(
        texts,
        vocab_size=size,
        reserved_tokens=list(SPECIAL_TOKENS),
        # Already cased as the tokenizer wants it: only split on whitespace,
        # punctuation and CJK here.
        bert_tokenizer_params={"lower_case": False},
        learn_params={"lower_thresh": min_count, **learn_params},
    )
    return list(vocabulary)
