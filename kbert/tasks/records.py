"""The records a task hands the rest of kbert: its examples, its options, its
encoded rows, rows made on the fly.

An example is what a user thinks of as one item (a text, a pair, a sentence
of words, a question); each kind is a frozen dataclass whose `line` names
where it came from (the record's line in its file, or its 1-based place
among Python inputs; None for texts given on the command line).
`dataclasses.replace` makes a changed copy.
"""

import dataclasses

import numpy as np

from kbert.config import ENCODER_INPUTS


@dataclasses.dataclass(frozen=True)
class TextExample:
    """One or two texts and what they are labelled with (text and pair tasks).

    Attributes:
        texts: tuple of str, one per `Task.text_inputs`.
        target: a label name, a score, or None (unlabelled).
        line: int or None.
    """

    texts: tuple
    target: object = None
    line: int = None


@dataclasses.dataclass(frozen=True)
class WordsExample:
    """A sentence as words, and their tags (token classification).

    Attributes:
        words: list of str.
        tags: list of str, one per word, or None (untagged).
        lines: list of int, each word's line in its file, or None.
        line: int or None. The sentence's first line.
        text: str or None. The raw text the words were cut from (`kbert
            predict TEXT`), whose characters `starts` and `ends` index.
        starts, ends: lists of int, each word's span in `text`, or None.
        document: int or None. Consecutive sentences of the same number are
            one document (a file's, up to a `-DOCSTART-` line), read
            together under `--context document`; None: the sentence is
            read alone (a raw text).
    """

    words: list
    tags: list = None
    lines: list = None
    line: int = None
    text: str = None
    starts: list = None
    ends: list = None
    document: int = None


@dataclasses.dataclass(frozen=True)
class QuestionExample:
    """A question about a context, and its answers (SQuAD's extractive question answering).

    Attributes:
        id: str. Keys the answer in predictions and SQuAD's scripts.
        question, context: str.
        answers: list of SQuAD's `{"text", "answer_start"}` dicts (none to predict).
        is_impossible: bool. SQuAD 2.0: the context holds no answer.
        line: int or None.
    """

    id: str
    question: str
    context: str
    answers: list = dataclasses.field(default_factory=list)
    is_impossible: bool = False
    line: int = None


@dataclasses.dataclass(frozen=True)
class Option:
    """A data option a task takes (a `--flag` of finetune, evaluate and predict).

    Options of the same `name` in several tasks mean the same thing.
    """

    name: str
    help: str
    default: object = None
    # The values it may take (checked when the command line is parsed), or None.
    choices: tuple = None


@dataclasses.dataclass
class Encoded:
    """Examples as model inputs.

    Attributes:
        features: dict of int32 `(rows, sequence_length)` arrays named `ENCODER_INPUTS`.
        targets: array or dict of arrays, one per row, or None without targets.
        example_of_row: int `(rows,)`: the example each row comes from (tasks
            that window long inputs have several rows per example).
        extra: what the task's `decode` needs besides (offsets, windows).
        learned: bool `(rows,)`: the rows a model learns from (training and
            validation), or None for all (question answering leaves out
            the windows of questions whose answer cannot be found).
        group_size: int. Rows that must stay together, in order, in every
            training and validation batch: rows `k * group_size` to
            `(k + 1) * group_size - 1` are group `k` (a multiple-choice
            example's options, whose loss compares them). 1: each row alone.
    """

    features: dict
    targets: object = None
    example_of_row: np.ndarray = None
    extra: object = None
    learned: np.ndarray = None
    group_size: int = 1

    def __post_init__(self):
        rows = len(self.features[ENCODER_INPUTS[0]])
        if self.example_of_row is None:
            self.example_of_row = np.arange(rows)
        check_group_size(self.group_size, rows)

    def __len__(self):
        return len(self.example_of_row)


@dataclasses.dataclass
class Rows:
    """Training rows made one at a time (`Task.training_rows`), for sets too big to hold packed.

    Attributes:
        lengths: int `(rows,)`. Each row's used length.
        row: callable(int) -> `(features, targets)`: the row's int32 1-D
            arrays named `ENCODER_INPUTS`, and a dict of int32 scalars
            named `targets`.
        targets: the names of the targets.
        group_size: int. Rows that stay together, as `Encoded.group_size`.
    """

    lengths: np.ndarray
    row: object
    targets: tuple
    group_size: int = 1

    def __post_init__(self):
        check_group_size(self.group_size, len(self.lengths))


def check_group_size(group_size, rows):
    """`ValueError` unless `group_size` is a positive integer that divides `rows`."""
    if not isinstance(group_size, int) or group_size < 1 or rows % group_size:
        raise ValueError(f"group_size={group_size!r}; expected a positive integer that divides the {rows} rows")
