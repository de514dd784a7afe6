"""`TextTask`: the tasks whose examples are one or two texts, read from CSV or TSV."""

import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.tabular import read_table
from kbert.tasks.base import ENCODE_CHUNK, Task
from kbert.tasks.records import Encoded


class TextTask(Task):
    """A task whose examples are one or two texts, packed as BERT's segments.

    Examples are dicts `{"texts": (str,) or (str, str), "target": ..., "line": int}`
    read from a CSV or TSV file: the texts from the columns the options
    `text_options` name, the target from the column `target_option` names.
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
        rows = read_table(path, columns + ([target] if targets else []))
        return [
            {
                "texts": tuple(row[column] for column in columns),
                "target": cls.parse_target(row[target], path, row.line) if targets else None,
                "line": row.line,
            }
            for row in rows
        ]

    def examples_from_texts(self, texts):
        width = len(self.text_inputs)
        if len(texts) % width:
            raise ValueError(
                f"task {self.name!r} takes texts in groups of {width} "
                f"({', '.join(self.text_inputs)}); got {len(texts)}"
            )
        return [
            {"texts": tuple(texts[i : i + width]), "target": None, "line": None}
            for i in range(0, len(texts), width)
        ]

    def targets(self, examples):
        """The training targets of `examples`, an array with one row each."""
        raise NotImplementedError

    def encode(self, examples, targets=True):
        import tensorflow as tf

        chunks = []
        for start in range(0, len(examples), ENCODE_CHUNK):
            batch = examples[start : start + ENCODE_CHUNK]
            segments = tuple(
                tf.constant([example["texts"][i] for example in batch])
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
        return dict(zip(self.text_inputs, example["texts"]))
