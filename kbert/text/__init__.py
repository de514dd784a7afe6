"""Text preprocessing for BERT in TensorFlow: WordPiece tokenization and packing.

Everything here is made of TensorFlow and tf-text ops, so it runs in `tf.data`,
in a SavedModel and under `tf.function`. The model code does not import it.
"""

from kbert.text.packer import BertPacker
from kbert.text.preprocessor import BertPreprocessor
from kbert.text.tokenizer import WordPieceTokenizer
from kbert.text.vocab import SPECIAL_TOKENS, load_vocab, save_vocab

__all__ = [
    "SPECIAL_TOKENS",
    "BertPacker",
    "BertPreprocessor",
    "WordPieceTokenizer",
    "load_vocab",
    "save_vocab",
]
