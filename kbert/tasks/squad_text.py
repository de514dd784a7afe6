"""SQuAD contexts as words and WordPieces with character offsets (run_squad.py's `doc_tokens`).

Words split as the tokenizer splits them: on run_squad.py's separators, and
each CJK character a word of its own. Each piece gets its characters in the
context, as Hugging Face's offset mapping gives them.
"""

import collections
import functools
import re
import unicodedata

import numpy as np

# run_squad.py's `is_whitespace`: the characters that separate words.
WORD_SEPARATORS = " \t\r\n\u202f"


def _python_class(re2_class):
    """An RE2 character class of `kbert.text.tokenizer` as a Python `re` class."""
    return re.sub(r"\\x\{([0-9A-Fa-f]+)\}", lambda m: f"\\U{int(m.group(1), 16):08x}", re2_class)


_Characters = collections.namedtuple(
    "_Characters", "word is_cjk punctuation control whitespace nonspacing_mark"
)


@functools.cache
def character_classes():
    """The tokenizer's own character classes as Python patterns.

    The same tables, so that the words and offsets here split text exactly
    where its ids do. Compiled on first use: they live in the TensorFlow
    tokenizer's module, and `kbert.tasks` loads without TensorFlow so that the
    command line's `--help` is instant.
    """
    from kbert.text import tokenizer as wordpiece

    cjk = _python_class(wordpiece._CJK)
    return _Characters(
        # A word: a CJK character, or a run of characters that are neither
        # separators nor CJK.
        word=re.compile(f"{cjk}|[^{re.escape(WORD_SEPARATORS)}{cjk[1:-1]}]+"),
        is_cjk=re.compile(cjk),
        punctuation=re.compile(_python_class(wordpiece._PUNCTUATION)),
        control=re.compile(_python_class(wordpiece._CONTROL)),
        whitespace=re.compile(_python_class(wordpiece._WHITESPACE)),
        nonspacing_mark=re.compile(_python_class(wordpiece._NONSPACING_MARKS)),
    )


class Context:
    """A context split into words (run_squad.py's `doc_tokens`) and WordPieces.

    Attributes:
        text: str.
        word_starts, word_ends: int arrays. Each word's characters `[start, end)`.
        ids: int32 array. The WordPiece ids of the words, in order.
        first_piece: int array, one more than the words: the first piece of
            each word (`orig_to_tok_index`); the last entry is `len(ids)`.
        piece_starts, piece_ends: int arrays. Each piece's characters in `text`.
        fallbacks: int. Words whose pieces could not be placed one by one and
            were each given the span of their unit or word (see `_piece_spans`).
    """

    def __init__(self, text, word_spans, word_ids, pieces, lowercase, max_chars):
        self.text = text
        self.word_starts = np.array([s for s, _ in word_spans], np.int64)
        self.word_ends = np.array([e for _, e in word_spans], np.int64)
        lengths = [len(ids) for ids in word_ids]
        self.first_piece = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.ids = np.fromiter((i for ids in word_ids for i in ids), np.int32, int(self.first_piece[-1]))
        starts, ends = [], []
        self.fallbacks = 0
        for (word_start, word_end), tokens in zip(word_spans, pieces):
            spans, fallback = _piece_spans(text[word_start:word_end], tokens, lowercase, max_chars)
            self.fallbacks += fallback
            starts += [word_start + s for s, _ in spans]
            ends += [word_start + e for _, e in spans]
        self.piece_starts = np.array(starts, np.int64)
        self.piece_ends = np.array(ends, np.int64)

    def __len__(self):
        return len(self.ids)

    def word_of_char(self, char):
        """run_squad.py's `char_to_word_offset[char]`: the word at or before `char`."""
        return int(np.searchsorted(self.word_starts, char, side="right")) - 1


def split_words(text):
    """The `(start, end)` character spans of `text`'s words."""
    return [m.span() for m in character_classes().word.finditer(text)]


def tokenize_contexts(tokenizer, texts):
    """`Context`s of `texts`, all their words tokenized in one call."""
    spans = [split_words(text) for text in texts]
    words = [text[s:e] for text, text_spans in zip(texts, spans) for s, e in text_spans]
    word_ids = tokenize(tokenizer, words)
    vocabulary = tokenizer.vocabulary
    contexts, at = [], 0
    for text, text_spans in zip(texts, spans):
        ids = word_ids[at : at + len(text_spans)]
        at += len(text_spans)
        pieces = [[vocabulary[i] for i in word] for word in ids]
        contexts.append(Context(text, text_spans, ids, pieces, tokenizer.lowercase, tokenizer.max_chars_per_word))
    return contexts


def tokenize(tokenizer, texts):
    """WordPiece ids of each of `texts`: a list of lists of int."""
    if not texts:
        return []
    ragged = tokenizer(np.array(texts, dtype=object))
    flat = ragged.flat_values.numpy().tolist()
    bounds = ragged.row_splits.numpy().tolist()
    return [flat[bounds[i] : bounds[i + 1]] for i in range(len(texts))]


def _normalize_char(char, lowercase):
    """What the tokenizer's normaliser makes of one character (`WordPieceTokenizer._normalize`)."""
    characters = character_classes()
    if characters.control.match(char):
        return ""
    if not lowercase:
        return char
    decomposed = unicodedata.normalize("NFD", char)
    stripped = "".join(c for c in decomposed if not characters.nonspacing_mark.match(c))
    return stripped.replace("Σ", "σ").lower()


def _units(word, lowercase, special):
    """The pieces of text the tokenizer runs WordPiece on, within `word`.

    Returns:
        list of `(normalized, owner)`: the unit's normalized text and, for each
        of its characters, the index in `word` of the character it comes from.
        Units are special tokens kept whole, CJK and punctuation characters
        alone, and runs of other characters; whitespace (inside a run_squad.py
        word, e.g. U+00A0) separates them.
    """
    characters = character_classes()
    units = []
    position = 0
    for part in special.split(word):
        if special.fullmatch(part):
            units.append((part, list(range(position, position + len(part)))))
            position += len(part)
            continue
        run, owner = [], []
        for index, char in enumerate(part, position):
            alone = characters.is_cjk.match(char) or characters.punctuation.match(char)
            if alone or characters.whitespace.match(char):
                if run:
                    units.append(("".join(run), owner))
                    run, owner = [], []
                if alone:
                    normalized = _normalize_char(char, lowercase)
                    units.append((normalized, [index] * len(normalized)))
                continue
            normalized = _normalize_char(char, lowercase)
            run.append(normalized)
            owner += [index] * len(normalized)
        if run:
            units.append(("".join(run), owner))
        position += len(part)
    return [unit for unit in units if unit[0]]


def _piece_spans(word, pieces, lowercase, max_chars):
    """Character spans of a word's WordPieces, relative to the word.

    Each unit of `_units` gives the pieces up to the next one that does not
    start with "##"; a piece spans the characters its normalized text comes
    from (characters the normaliser drops at its edges excluded, as in
    Hugging Face's offsets). A unit whose pieces do not spell its normalized
    text gives each of them the unit's span, and a word whose units and
    pieces do not pair up gives each piece the word's span: the answer then
    widens, as run_squad.py's falls back to whole words.

    Returns:
        (list of `(start, end)`, bool: a fallback was needed).
    """
    if not pieces:
        return [], False
    if word.isascii() and word.isalnum():  # most words: no normalisation to follow
        units = [(word.lower() if lowercase else word, range(len(word)))]
    else:
        units = _units(word, lowercase, _special_pattern())
    groups = []
    for piece in pieces:
        if groups and piece.startswith("##"):
            groups[-1].append(piece[2:])
        else:
            groups.append([piece])
    if len(groups) != len(units):
        return [(0, len(word))] * len(pieces), True
    spans, fallback = [], False
    for (normalized, owner), group in zip(units, groups):
        whole = (owner[0], owner[-1] + 1)
        if len(group) == 1:  # one piece, or [UNK]
            spans.append(whole)
        elif len(normalized) > max_chars or "".join(group) != normalized:
            spans += [whole] * len(group)
            fallback = True
        else:
            at = 0
            for text in group:
                spans.append((owner[at], owner[at + len(text) - 1] + 1))
                at += len(text)
    return spans, fallback


_SPECIAL = {}


def _special_pattern():
    """The special tokens the tokenizer keeps whole when written in the text."""
    if "pattern" not in _SPECIAL:
        tokens = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
        _SPECIAL["pattern"] = re.compile("(" + "|".join(re.escape(t) for t in tokens) + ")")
    return _SPECIAL["pattern"]
