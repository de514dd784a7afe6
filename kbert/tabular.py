"""Reading CSV and TSV files strictly: every malformed row is an error naming its line.

Python's `csv` module, left to its defaults, reads an unclosed quote as one
field running to the end of the file, so rows merge silently and a phantom
label appears. Here a file is decoded as UTF-8 as a whole first (an invalid
byte names its line), then parsed with `strict=True`, and each record must
have exactly the header's number of fields.

Example:
>>> rows = read_table("data/debian-packages/dev.csv", ["text", "label"])  # doctest: +SKIP
>>> rows[0].line, rows[0]["label"]  # doctest: +SKIP
(2, 'games')
"""

import csv
import io
import os

from kbert.fileio import decode_utf8

# Delimiters by file extension; anything else is read as CSV.
DELIMITERS = {".tsv": "\t", ".csv": ","}


class Row(dict):
    """One record: its fields by column name, and `line`, the line it starts on."""

    def __init__(self, fields, line):
        super().__init__(fields)
        self.line = line


def read_table(path, required, optional=(), nonempty=None):
    """Reads the records of a CSV (`.csv`) or TSV (`.tsv`) file with a header row.

    Args:
        path: str. The file.
        required: sequence of str. Columns the header must name.
        optional: sequence of str. Columns read when present.
        nonempty: sequence of str. Columns whose every value must be non-blank
            (default: `required`).

    Returns:
        list of `Row`: the `required` and present `optional` columns of each
        record, with the line each record starts on.

    Raises:
        ValueError: one line naming the file (and line) for a missing file,
            bytes that are not UTF-8, an empty file, a missing column, a
            malformed record (unclosed quote, wrong number of fields), an
            empty value or a file with no records.
    """
    text = read_text(path)
    delimiter = DELIMITERS.get(os.path.splitext(path)[1].lower(), ",")
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
    except csv.Error as error:
        raise ValueError(f"{path}, line 1: malformed header ({error})") from None
    if not header:
        raise ValueError(f"{path} is empty; expected a header row naming {list(required)}")
    missing = [column for column in required if column not in header]
    if missing:
        raise ValueError(f"{path} has no column {missing[0]!r}; its columns are {header}")
    if len(set(header)) != len(header):
        raise ValueError(f"{path}: the header names a column twice: {header}")
    wanted = list(required) + [column for column in optional if column in header]
    positions = {column: header.index(column) for column in wanted}
    nonempty = list(required if nonempty is None else nonempty)
    rows = []
    end = reader.line_num
    while True:
        start = end + 1
        try:
            record = next(reader, None)
        except csv.Error as error:
            if "unexpected end of data" in str(error):
                raise ValueError(
                    f"{path}, line {start}: a quoted field opened in this record is never "
                    "closed; expected a closing quote"
                ) from None
            raise ValueError(f"{path}, line {start}: malformed record ({error})") from None
        end = reader.line_num
        if record is None:
            break
        if not record:
            continue  # a blank line
        if len(record) != len(header):
            raise ValueError(
                f"{path}, line {start}: {len(record)} fields; expected {len(header)} "
                f"({', '.join(header)})"
            )
        row = Row({column: record[index] for column, index in positions.items()}, start)
        for column in nonempty:
            if not row[column].strip():
                raise ValueError(f"{path}, line {start}: empty {column!r}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} has a header but no rows")
    return rows


def read_text(path):
    """The whole of a UTF-8 text file; `ValueError` naming the file and line otherwise."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    with open(path, "rb") as f:
        text = decode_utf8(f.read(), path, "a UTF-8 text file")
    return text[1:] if text.startswith("\ufeff") else text
