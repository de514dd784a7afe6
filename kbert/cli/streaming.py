"""What `predict` and `embed` share to work through inputs of any size (progress
on stderr is `kbert.logs.Progress`).

- `input_texts` reads the texts of `--input` as they are used: a text file
  or standard input a line at a time; a table or a `.json` list whole.
- `count_texts` reads a text file through once before TensorFlow loads, so a
  bad line is refused before any work, holding none of it.
- `NpyRows` writes a `.npy` array of rows as they come.
"""

import contextlib
import json
import os
import stat
import sys

import numpy as np

from kbert.cliio import CliError
from kbert.fileio import decode_utf8

def is_stream(path):
    """Whether `path` can be read only once: standard input ("-"), a pipe, /dev/stdin."""
    if path == "-":
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def input_texts(path, option="--input", column=None):
    """The texts of `path`, an iterator read as it is used (`kbert.cliio.read_texts`'s rules).

    A text file or a stream ("-": standard input) is read a line at a time
    (`text_lines`); a table (the texts of `column`) and a `.json` list are read whole.
    """
    from kbert.cliio import read_texts
    from kbert.tabular import is_table

    if is_table(path) or column is not None or path.endswith(".json"):
        return iter(read_texts(path, option, column))
    return text_lines(path, option)


def count_texts(path, option="--input", column=None):
    """How many texts `path` holds, each checked as `input_texts` reads it; None
    for a stream, which can be read only once (its lines are checked as they are used)."""
    if is_stream(path):
        return None
    return sum(1 for _ in input_texts(path, option, column))


def text_lines(path, option="--input"):
    """The texts of a file of one text a line, read a line at a time ("-": standard input).

    Refused as `kbert.cliio.read_texts` refuses them, naming the line: a byte
    that is not UTF-8, a blank line before a text (blank lines that end the
    file are dropped), a CoNLL file, a file of no text.
    """
    from kbert.tasks.conll import CONLL_SNIFF_LINES

    where = "standard input" if path == "-" else path
    with _binary(path) as f:
        lines = _decoded_lines(f, where)
        head = [line for _, line in zip(range(CONLL_SNIFF_LINES), lines)]
        _check_not_conll(head, where, option)
        blank, count = None, 0
        for number, text in enumerate(_chain(head, lines), 1):
            if not text.strip():
                blank = blank or number
                continue
            if blank:
                raise CliError(f"{where}, line {blank}: a blank line; expected one text a line")
            count += 1
            yield text
    if not count:
        raise CliError(f"{where} holds no texts")


@contextlib.contextmanager
def _binary(path):
    if path == "-":
        yield sys.stdin.buffer
    else:
        with open(path, "rb") as f:
            yield f


def _decoded_lines(f, where):
    """The lines of the binary file `f`, decoded, split as `str.splitlines` splits
    the whole text; a byte that is not UTF-8 names its line."""
    for number, raw in enumerate(f, 1):
        text = decode_utf8(raw, where, first_line=number)
        if number == 1:
            text = text.removeprefix("\ufeff")
        yield from text.splitlines()


def _chain(head, rest):
    yield from head
    yield from rest


def _check_not_conll(head, where, option):
    from kbert.tabular import quoted
    from kbert.tasks.conll import looks_like_conll

    conll = looks_like_conll(head)
    if conll:
        raise CliError(
            f"{where}, line {conll}: {quoted(head[conll - 1].strip())} looks like CoNLL (a token and its tag "
            f"a line); a .txt {option} is one text a line (to tag a CoNLL file, name it .conll)"
        )


class NpyRows:
    """A `.npy` file of float32 `(rows, dimension)` written a chunk of rows at a time.

    The header comes first and holds the row count, which is known only at the
    end: room is kept for the longest header, rewritten with the count by `finish`.

    Example:
    >>> with open("e.npy", "wb") as f:  # doctest: +SKIP
    ...     rows = NpyRows(f)
    ...     rows.append(np.ones((2, 3), np.float32)); rows.finish()
    """

    # np.lib.format's version 1.0 header is padded to this many bytes.
    ALIGN = 64

    def __init__(self, f, dtype=np.float32):
        self.f, self.dtype = f, np.dtype(dtype)
        self.rows, self.dimension, self.reserved = 0, None, None

    def append(self, rows):
        rows = np.ascontiguousarray(rows, self.dtype)
        if rows.ndim != 2 or (self.dimension is not None and rows.shape[1] != self.dimension):
            raise ValueError(f"rows of shape {rows.shape}; expected (n, {self.dimension or 'dimension'})")
        if self.dimension is None:
            self.dimension = rows.shape[1]
            self.reserved = len(self._header(np.iinfo(np.int64).max))
            self.f.write(self._header(0, self.reserved))
        self.f.write(rows.tobytes())
        self.rows += len(rows)

    def finish(self):
        """Writes the header with the row count; the file is then a whole `.npy` array."""
        if self.dimension is None:
            raise ValueError("no rows were written")
        self.f.seek(0)
        self.f.write(self._header(self.rows, self.reserved))

    def _header(self, rows, length=None):
        """numpy's format 1.0 header of a `(rows, dimension)` array, padded to `length` bytes
        (default: the next multiple of `ALIGN`)."""
        fields = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                  "shape": (rows, self.dimension)}
        text = "{" + "".join(f"{key!r}: {value!r}, " for key, value in sorted(fields.items())) + "}"
        start = np.lib.format.magic(1, 0)
        used = len(start) + 2 + len(text) + 1
        length = length or -(-used // self.ALIGN) * self.ALIGN
        text += " " * (length - used) + "\n"
        return start + len(text).to_bytes(2, "little") + text.encode("latin1")


def json_lines_file(path):
    """Whether `path` is a JSON Lines file of objects (what `kbert predict --output` writes):
    its first and last lines are JSON objects."""
    try:
        with open(path, "rb") as f:
            first = f.readline()
            f.seek(max(0, os.path.getsize(path) - 65536))
            last = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
        return all(isinstance(json.loads(line), dict) for line in (first, last))
    except (OSError, ValueError):
        return False
