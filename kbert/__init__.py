"""kbert: BERT for Keras 3, from raw text to TF Serving, TFLite and ONNX.

The model code (`kbert.config`, `kbert.layers`, `kbert.models`) uses `keras.ops`
only and runs on any Keras backend; text preprocessing (`kbert.text`) is
TensorFlow and is imported on demand.
"""

from kbert.config import PRESETS, BertConfig, register_preset
from kbert.models import bert_classifier, bert_embedder, bert_encoder

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "BertConfig",
    "bert_classifier",
    "bert_embedder",
    "bert_encoder",
    "register_preset",
]
