"""Token-classification data files: CoNLL columns and JSON Lines, read into sentences.

Each sentence is a `WordsExample` (`words`, `tags` or None, `lines`, `line`),
with the file line of every word, so that errors name them.
"""

import json
import re

from kbert.tabular import read_text
from kbert.tasks.records import WordsExample

# CoNLL-2003's document separator line.
DOCSTART = "-DOCSTART-"
# Lines a text file's CoNLL look is judged on (`looks_like_conll`).
CONLL_SNIFF_LINES = 50
# A tag as CoNLL files end their lines with: O, or a scheme prefix and a type.
_TAG = re.compile(r"O|[BIESLU]-[A-Za-z]\S*")
# The most columns a CoNLL line has (CoNLL-2003: token, POS, chunk, tag).
CONLL_MAX_COLUMNS = 5


def read_conll(path, targets):
    """CoNLL sentences: one token a line, whitespace-separated columns, tag last.

    Each `-DOCSTART-` line begins a new document (`WordsExample.document`);
    a file without them is one.
    """
    examples, words, tags, lines = [], [], [], []
    document = 0

    def close():
        if words:
            examples.append(WordsExample(
                words=list(words), tags=list(tags) if targets else None,
                lines=list(lines), line=lines[0], document=document,
            ))
            words.clear(), tags.clear(), lines.clear()

    for number, line in enumerate(read_text(path).splitlines(), 1):
        fields = line.split("\t")
        if len(fields) > 1 and any(" " in field.strip() for field in fields):
            # A CoNLL column is one token; a tab-separated field with spaces
            # is a sentence: a CSV/TSV data file of another task.
            raise ValueError(
                f"{path}, line {number}: a column holds words with spaces ({_short(line)}); expected "
                "CoNLL, one token a line with its tag last (a data file of another task?)"
            )
        columns = line.split()
        if not columns or columns[0] == DOCSTART:
            close()
            if columns:  # -DOCSTART-
                document += 1
            continue
        if targets and len(columns) < 2:
            raise ValueError(
                f"{path}, line {number}: {columns[0]!r} has no tag; expected 'token ... tag' columns"
            )
        words.append(columns[0])
        tags.append(columns[-1])
        lines.append(number)
    close()
    return examples


def _short(line, most=60):
    line = line.strip().replace("\t", " | ")
    return repr(line if len(line) <= most else line[: most - 3] + "...")


def looks_like_conll(lines):
    """The first line of `lines` (1-based) if they look like CoNLL, one token and its tag a line; else None.

    A text file `predict` reads as one text a line is refused when it is
    CoNLL: every non-blank line of its first `CONLL_SNIFF_LINES` has two or
    more columns and a tag (O, B-X, I-X, ...) last, or one is -DOCSTART-.
    """
    sample = [(number, line.split()) for number, line in enumerate(lines[:CONLL_SNIFF_LINES], 1) if line.strip()]
    if any(columns[0] == DOCSTART for _, columns in sample):
        return 1
    if sample and all(2 <= len(columns) <= CONLL_MAX_COLUMNS and _TAG.fullmatch(columns[-1]) for _, columns in sample):
        return sample[0][0]
    return None


def read_jsonl(path, targets):
    """JSON Lines sentences: `{"tokens": [...], "tags": [...]}` a line; the file is one document."""
    examples = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}, line {number}: not valid JSON ({error})") from None
        keys = ("tokens", "tags") if targets else ("tokens",)
        if not isinstance(record, dict) or any(key not in record for key in keys):
            raise ValueError(f"{path}, line {number}: expected an object with {' and '.join(map(repr, keys))}")
        words = record["tokens"]
        if not isinstance(words, list):
            raise ValueError(
                f"{path}, line {number}: 'tokens' is a {type(words).__name__}; expected a list of "
                'token strings, such as ["EU", "rejects", "German", "call"]'
            )
        if not words:
            raise ValueError(f"{path}, line {number}: an empty sentence; expected a list of tokens")
        if not all(isinstance(word, str) and word.strip() for word in words):
            raise ValueError(f"{path}, line {number}: every token must be a non-blank string")
        tags = record.get("tags") if targets else None
        if targets and (
            not isinstance(tags, list)
            or len(tags) != len(words)
            or not all(isinstance(tag, str) for tag in tags)
        ):
            raise ValueError(
                f"{path}, line {number}: {len(words)} tokens need as many string tags; "
                f"got {json.dumps(tags)[:80]}"
            )
        examples.append(WordsExample(words=words, tags=tags, lines=[number] * len(words), line=number, document=0))
    return examples
