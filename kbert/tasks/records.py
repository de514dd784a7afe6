"""The records a task hands the rest of kbert: its options, its encoded rows, rows made on the fly."""

import dataclasses

import numpy as np

from kbert.config import ENCODER_INPUTS


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
