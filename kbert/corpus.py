"""Reading a raw-text pretraining corpus: one sentence per line, blank lines between documents.

Files may be gzip-compressed (a `.gz` suffix). A corpus is named by a path, a
glob pattern, or a list of either.
"""

import glob
import gzip
import os


def corpus_files(corpus):
    """The sorted files that `corpus` names (path, glob pattern or list of them)."""
    patterns = [corpus] if isinstance(corpus, (str, os.PathLike)) else list(corpus)
    if not patterns:
        raise ValueError("the corpus names no files")
    files = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        matches = [path for path in matches if os.path.isfile(path)]
        if not matches:
            raise ValueError(f"corpus file {pattern!r} not found")
        files.extend(matches)
    return files


def open_text(path):
    """Opens a UTF-8 text file for reading, decompressing it if it ends in `.gz`."""
    if os.fspath(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def read_documents(corpus):
    """Documents of a corpus as lists of non-empty, stripped lines.

    A blank line ends a document, and so does the end of a file. Empty
    documents are dropped, as google-research/bert drops them.
    """
    return list(iter_documents(corpus))


def iter_documents(corpus):
    """`read_documents`, one document at a time: a reader may stop early."""
    for path in corpus_files(corpus):
        document = []
        with open_text(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    document.append(line)
                elif document:
                    yield document
                    document = []
        if document:
            yield document


def _holds_text(path):
    """Whether the corpus file `path` holds a line that is not blank (read up to
    the first); a file that cannot be read counts as text, for its reader to name."""
    try:
        with open_text(path) as f:
            return any(line.strip() for line in f)
    except (OSError, EOFError):
        return True


def line_dataset(corpus_or_lines):
    """A `tf.data.Dataset` of the non-blank lines of a corpus or of a list of strings.

    Args:
        corpus_or_lines: a path, glob pattern or list of paths (`str` or
            path-like; `.gz` files are decompressed), or an iterable of text
            lines that is not a list of paths (e.g. a generator or a list of
            sentences).

    Raises:
        ValueError: the corpus holds no text (empty, or blank lines only),
            naming its file.
    """
    import tensorflow as tf

    if isinstance(corpus_or_lines, (str, os.PathLike)):
        files = corpus_files(corpus_or_lines)
    else:
        items = list(corpus_or_lines)
        is_paths = bool(items) and all(
            isinstance(item, os.PathLike)
            or (isinstance(item, str) and "\n" not in item and os.path.isfile(item))
            for item in items
        )
        if not is_paths:
            lines = [line.strip() for line in items]
            lines = [line for line in lines if line]
            if not lines:
                raise ValueError("the corpus holds no text")
            return tf.data.Dataset.from_tensor_slices(lines)
        files = corpus_files(items)
    if not any(_holds_text(path) for path in files):
        named = files[0] if len(files) == 1 else f"{files[0]} and the {len(files) - 1} other corpus files"
        raise ValueError(f"{named} holds no text (only blank lines, or nothing); expected one sentence a line")
    datasets = [
        tf.data.TextLineDataset(path, compression_type="GZIP" if path.endswith(".gz") else "")
        for path in files
    ]
    dataset = datasets[0]
    for other in datasets[1:]:
        dataset = dataset.concatenate(other)
    return dataset.map(tf.strings.strip).filter(lambda line: tf.strings.length(line) > 0)
