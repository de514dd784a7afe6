"""Reading tables strictly: every malformed row is an error naming its line.

One reader for every command, which decides by the extension (`TABLES`):
CSV, TSV (`.tsv`) or JSON Lines (`.jsonl`, one object a line, its keys the
columns). Python's `csv` module, left to its defaults, reads an unclosed
quote as one field running to the end of the file, so rows merge silently
and a phantom label appears. Here a file is decoded as UTF-8 a line at a
time (an invalid byte names its line; memory holds one line, not the
file), parsed with `strict=True`, and each record must have exactly the
header's number of fields. `quoted` keeps the user's data a message quotes
short.

Example:
>>> rows = read_table("data/debian-packages/dev.csv", ["text", "label"])  # doctest: +SKIP
>>> rows[0].line, rows[0]["label"]  # doctest: +SKIP
(2, 'games')
"""

import contextlib
import csv
import io
import json
import os
import re
import sys

from kbert.fileio import decode_utf8

# Delimiters by file extension; anything else is read as CSV.
DELIMITERS = {".tsv": "\t", ".csv": ","}
# The extensions every command reads as a table (columns by name): CSV, TSV, JSON Lines.
TABLES = (".csv", ".tsv", ".jsonl")
# The column of a table that commands reading texts alone take, unless told otherwise.
TEXT_COLUMN = "text"
# A message that quotes user data (a text, a header) shows at most this many
# characters of one value: enough to recognise it, and the line stays readable.
QUOTED_CHARACTERS = 60
# Streams read so far (standard input, a pipe), by path: a command reads its
# input twice (checked before TensorFlow loads, then used), a stream only once.
_STREAMS = {}


def check_text(value, where, what="text"):
    """Raises `ValueError` "`where`: empty `what`" if `value` is blank (empty or whitespace).

    The one rule for an empty text, which a model cannot read for anything:
    every reader and entry point (a data file's column, `kbert predict TEXT`,
    `kbert search QUERY`, a `.json` list of texts, `kbert.TaskModel`'s inputs)
    refuses it with this check.
    """
    if not value.strip():
        raise ValueError(f"{where}: empty {what}")


def check_texts(texts, name="text"):
    """`check_text` on each of `texts`, named "`name` 1", "`name` 2"... (command-line
    arguments, a task's raw inputs)."""
    for number, text in enumerate(texts, 1):
        check_text(text, f"{name} {number}")


class Row(dict):
    """One record: its fields by column name, and `line`, the line it starts on."""

    def __init__(self, fields, line):
        super().__init__(fields)
        self.line = line


def read_table(path, required, optional=(), nonempty=None):
    """Reads the records of a table: CSV (`.csv`, and any other name), TSV
    (`.tsv`) with a header row, or JSON Lines (`.jsonl`, one object a line,
    its keys the column names).

    Args:
        path: str. The file ("-": standard input).
        required: sequence of str. Columns the header (each object) must name.
        optional: sequence of str. Columns read when present.
        nonempty: sequence of str. Columns whose every value must be non-blank
            (default: `required`).

    Returns:
        list of `Row`: the `required` and present `optional` columns of each
        record, with the line each record starts on.

    Raises:
        ValueError: one line naming the file (and line) for a missing file,
            a folder, bytes that are not UTF-8, an empty file, a missing
            column, a malformed record (unclosed quote, wrong number of
            fields, a line that is not a JSON object), an empty value or a
            file with no records.
    """
    return list(iter_table(path, required, optional, nonempty))


def iter_table(path, required, optional=(), nonempty=None):
    """`read_table`'s rows, read from the file as they are used: memory holds
    one record of the file at a time (its errors come as the reader reaches them)."""
    records = _json_lines if is_json_lines(path) else _delimited
    nonempty = list(required if nonempty is None else nonempty)
    for line, fields in records(path, text_lines(path), list(required)):
        row = Row({column: fields[column] for column in [*required, *optional] if column in fields}, line)
        for column in nonempty:
            check_text(row[column], f"{path}, line {line}", repr(column))
        yield row


def read_column(path, column=None):
    """`(texts, lines)`: the texts in `column` (default `TEXT_COLUMN`) of the table
    `path` and the line each comes from, for commands that read texts alone
    (`kbert embed`, `kbert search`)."""
    column = column or TEXT_COLUMN
    rows = read_table(path, [column])
    return [row[column] for row in rows], [row.line for row in rows]


def is_table(path):
    """Whether `path` names a table by its extension (`TABLES`): what every
    command reads as columns rather than as one text a line."""
    return os.path.splitext(path)[1].lower() in TABLES


def is_json_lines(path):
    return os.path.splitext(path)[1].lower() == ".jsonl"


def _delimited(path, lines, required):
    """`(line, {column: value})` of each record of a CSV or TSV file with a header
    row, from `lines`, its lines with their endings (`text_lines`)."""
    delimiter = DELIMITERS.get(os.path.splitext(path)[1].lower(), ",")
    # A field may be as long as the file: the limit guards against a quote
    # left open, which strict parsing names instead.
    csv.field_size_limit(max(csv.field_size_limit(), _size(path)))
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
    except csv.Error as error:
        raise ValueError(f"{path}, line 1: malformed header ({error})") from None
    if not header:
        raise ValueError(f"{path} is empty; expected a header row naming {list(required)}")
    missing = [column for column in required if column not in header]
    if missing:
        raise ValueError(f"{path} has no column {missing[0]!r}; its columns are {quoted(header)}")
    if len(set(header)) != len(header):
        raise ValueError(f"{path}: the header names a column twice: {quoted(header)}")
    end, count = reader.line_num, 0
    while True:
        start = end + 1
        record = _next_record(reader, path, start)
        end = reader.line_num
        if record is None:
            break
        if not record:
            continue  # a blank line
        if len(record) != len(header):
            raise ValueError(
                f"{path}, line {start}: {len(record)} fields; expected {len(header)} ({quoted(header)[1:-1]})"
            )
        count += 1
        yield start, dict(zip(header, record))
    if not count:
        raise ValueError(f"{path} has a header but no rows")


def _next_record(reader, path, start):
    """The next record of a `csv.reader` (None at the end); `ValueError` naming line `start`."""
    try:
        return next(reader, None)
    except csv.Error as error:
        if "unexpected end of data" in str(error):
            raise ValueError(
                f"{path}, line {start}: a quoted field opened in this record is never "
                "closed; expected a closing quote"
            ) from None
        raise ValueError(f"{path}, line {start}: malformed record ({error})") from None


def _json_lines(path, lines, required):
    """`(line, {column: value})` of each JSON Lines record: one object a line (blank lines
    skipped), a value a string or a number (read as its JSON text, as a CSV holds it)."""
    count = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}, line {number}: not valid JSON ({error}); expected one object a line") from None
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}, line {number}: {quoted(record)} is not a JSON object; expected one with {required}"
            )
        missing = [column for column in required if column not in record]
        if missing:
            raise ValueError(f"{path}, line {number} has no key {missing[0]!r}; its keys are {quoted(list(record))}")
        count += 1
        yield number, {key: _json_field(value, path, number, key) for key, value in record.items()}
    if not count:
        raise ValueError(f"{path} holds no records; expected one JSON object a line with {required}")


def _json_field(value, path, line, key):
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return json.dumps(value)
    raise ValueError(f"{path}, line {line}: {key!r} is {quoted(value)}; expected a string or a number")


def read_text(path):
    """The whole of a UTF-8 text file ("-": standard input); `ValueError` naming the file and line otherwise."""
    text = decode_utf8(read_bytes(path), path, "a UTF-8 text file")
    return text[1:] if text.startswith("\ufeff") else text


def text_lines(path):
    """The lines of the UTF-8 text file `path` ("-": standard input), each with
    its ending ("\\n", "\\r\\n" or "\\r"), decoded as they are read; a byte-order
    mark dropped; `ValueError` naming the file and line of a byte that is not UTF-8."""
    with _binary_lines(path) as lines:
        for number, data in enumerate(lines, 1):
            text = decode_utf8(data, path, "a UTF-8 text file", first_line=number)
            if number == 1 and text.startswith("\ufeff"):
                text = text[1:]
            yield from _LONE_CR.split(text) if "\r" in text[:-2] else (text,)


# A carriage return that ends a line on its own (old Mac files), as Python's
# universal newlines read it: the binary file's lines end at "\n" only.
_LONE_CR = re.compile(r"(?<=\r)(?!\n)(?=.)", re.DOTALL)


def _binary_lines(path):
    """A context of the lines of `path` as bytes: read from the file as they are
    used, or from a stream's bytes, read once (`read_bytes`)."""
    if path != "-" and os.path.isfile(path):
        return open(path, "rb")
    return contextlib.nullcontext(io.BytesIO(read_bytes(path)))


def _size(path):
    """The size of the file `path` in bytes, or of a stream's bytes (`read_bytes`)."""
    if path != "-" and os.path.isfile(path):
        return os.path.getsize(path)
    return len(read_bytes(path))


def read_bytes(path):
    """The bytes of the file `path`; of standard input for "-", and of a path that is
    no regular file (a pipe, /dev/stdin) read as a stream: read once, then kept
    (`_STREAMS`). `ValueError` naming a folder or a missing file."""
    if os.path.isdir(path):
        raise ValueError(f"{path} is a folder; expected a file")
    if path != "-" and not os.path.exists(path):
        raise ValueError(f"{path}: no such file")
    if path != "-" and os.path.isfile(path):
        with open(path, "rb") as f:
            return f.read()
    if path not in _STREAMS:
        if path == "-":
            _STREAMS[path] = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                _STREAMS[path] = f.read()
    return _STREAMS[path]


def quoted(value, limit=QUOTED_CHARACTERS):
    """`repr(value)` for a message that quotes user data: a string cut to `limit`
    characters with an ellipsis, a list to the items that fit in twice that.

    Example:
    >>> quoted("a " * 40, 20)
    "'a a a a a a a a a…'"
    >>> quoted(["editors", "games", "net", "web"], 10)
    "['editors', 'games', … 2 more]"
    """
    if isinstance(value, (list, tuple)):
        shown = []
        for item in value:
            if shown and sum(len(s) + 2 for s in shown) + len(quoted(item, limit)) > 2 * limit:
                return "[" + ", ".join(shown) + f", … {len(value) - len(shown)} more]"
            shown.append(quoted(item, limit))
        return "[" + ", ".join(shown) + "]"
    text = repr(value)
    if len(text) <= limit:
        return text
    return text[: limit - 2] + "…" + text[-1] if isinstance(value, str) else text[: limit - 1] + "…"
