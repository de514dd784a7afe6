"""`TextTask`: the tasks whose examples are one or two texts, read from CSV or TSV."""

import math
import numbers

import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.tabular import check_text, check_texts, iter_table
from kbert.tasks.base import ENCODE_CHUNK, Task
from kbert.tasks.records import Encoded, TextExample


class TextTask(Task):
    """A task whose examples are one or two texts, packed as BERT's segments.

    Examples are `TextExample`s, `texts` one or two str, read from a CSV or
    TSV file: the texts from the columns the options `text_options` name, the
    target from the column `target_option` names.
    """

    # Names of the options that give the text columns, and the target column.
    text_options = ()
    target_option = None

    @classmethod
    def parse_target(cls, value, path, line):
        """The target of one record from its column's string."""
        return value

    @classmethod
    def read(cls, path, options=None, targets=True):
        options = cls.resolve_options(options)
        columns = [options[name] for name in cls.text_options]
        target = options[cls.target_option]
        rows = iter_table(path, columns + ([target] if targets else []))
        return [
            TextExample(
                texts=tuple(row[column] for column in columns),
                target=cls.parse_target(row[target], path, row.line) if targets else None,
                line=row.line,
            )
            for row in rows
        ]

    def examples_from_texts(self, texts):
        check_texts(texts)
        width = len(self.text_inputs)
        if len(texts) % width:
            raise ValueError(
                f"task {self.name!r} takes texts in groups of {width} "
                f"({', '.join(self.text_inputs)}); got {len(texts)}"
            )
        return [
            TextExample(texts=tuple(texts[i : i + width]))
            for i in range(0, len(texts), width)
        ]

    def examples_from_inputs(self, x, y=None):
        """Examples from Python values (`kbert.TaskModel`).

        Args:
            x: texts: a list or array of strings or, for a task of two texts,
                a tuple of two such lists (`text_inputs`).
            y: None, or one target per example: label names (`labels`;
                an integer is the label of that name, refused where it
                could be read as another label's position: `_targets`), or
                scores.
        """
        width = len(self.text_inputs)
        if width == 1:
            columns = (_strings(x, "x"),)
        elif isinstance(x, (tuple, list)) and len(x) == width and not isinstance(x[0], str):
            columns = tuple(_strings(column, f"x[{i}]") for i, column in enumerate(x))
        else:
            raise ValueError(
                f"task {self.name!r} takes {width} texts an example; give x as a tuple of "
                f"{width} lists ({', '.join(self.text_inputs)})"
            )
        rows = len(columns[0])
        if any(len(column) != rows for column in columns):
            raise ValueError(f"x's columns hold {[len(c) for c in columns]} texts; expected equal counts")
        targets = [None] * rows if y is None else _targets(y, rows, self.settings().get("labels"))
        return [TextExample(texts=tuple(column[i] for column in columns), target=targets[i], line=i + 1)
                for i in range(rows)]

    def targets(self, examples):
        """The training targets of `examples`, an array with one row each."""
        raise NotImplementedError

    def encode(self, examples, targets=True):
        import tensorflow as tf

        chunks = []
        for start in range(0, len(examples), ENCODE_CHUNK):
            batch = examples[start : start + ENCODE_CHUNK]
            segments = tuple(
                tf.constant([example.texts[i] for example in batch])
                for i in range(len(self.text_inputs))
            )
            chunks.append(self.preprocessor(segments))
        features = {
            name: np.concatenate([chunk[name].numpy() for chunk in chunks]).astype(np.int32)
            for name in ENCODER_INPUTS
        }
        return Encoded(features, self.targets(examples) if targets else None)

    def serving_request(self, example):
        """The inputs of `example` by name, as `serving_default` and `predict` take them."""
        return dict(zip(self.text_inputs, example.texts))


def _strings(values, name):
    """`values` (a list, an array or one string) as a list of non-blank str; `ValueError` naming `name`."""
    values = np.asarray(values, dtype=object).reshape(-1).tolist()
    wrong = [value for value in values if not isinstance(value, str)]
    if wrong:
        raise ValueError(f"{name} holds {type(wrong[0]).__name__} {wrong[0]!r:.80}; expected strings")
    for i, value in enumerate(values):
        check_text(value, f"{name}[{i}]")
    return values


def _targets(y, rows, labels):
    """`rows` targets from `y`: label names (`labels`), or scores (`labels` None).

    An integer target is a label's name (1 is the label "1"), never a position
    in `labels`: `labels=n` names its labels "0" to "n-1", where the two agree.
    An integer that names no label (labels ["neg", "pos"]), or whose label
    sits at another position (labels ["1", "0"]), is refused: one reading of
    it would train the model on the wrong label.
    """
    values = np.asarray(y, dtype=object).reshape(-1).tolist()
    if len(values) != rows:
        raise ValueError(f"y holds {len(values)} targets for {rows} examples")
    if labels is None:
        wrong = [v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v)]
        if wrong:
            raise ValueError(f"y holds {type(wrong[0]).__name__} {wrong[0]!r:.80}; expected finite numbers (scores)")
        return [float(value) for value in values]
    for i, value in enumerate(values):
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            _check_integer_label(i, int(value), labels)
    return [str(value) for value in values]


def _check_integer_label(i, value, labels):
    """`ValueError` unless the integer target `y[i]` names a label at its own position (if any)."""
    name = str(value)
    if name not in labels:
        raise ValueError(
            f"y[{i}] is the integer {value}, and no label is named {name!r} (labels {labels!r:.200}); "
            "give y as label names: an integer is read as a name, never as a position"
        )
    if 0 <= value < len(labels) and labels[value] != name:
        raise ValueError(
            f"y[{i}] is the integer {value}: the label named {name!r} is at position {labels.index(name)}, "
            f"but position {value} holds {labels[value]!r} (labels {labels!r:.200}); give y as label names (strings)"
        )
