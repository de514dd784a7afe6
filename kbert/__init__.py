"""kbert: BERT for Keras 3, from raw text to TF Serving, TFLite and ONNX.

The model code (`kbert.config`, `kbert.layers`, `kbert.models`) uses `keras.ops`
only and runs on any Keras backend; text preprocessing (`kbert.text`) is
TensorFlow. The names below load on first use, so `import kbert` (and the
`kbert` command's `--help`) does not import Keras or TensorFlow. Imported
after Keras (where TensorFlow is installed), kbert registers `TaskModel` at
once, so that `keras.saving.load_model` reads a saved one with no other step.
"""

import importlib
import sys

__version__ = "0.1.0"

_EXPORTS = {
    "PRESETS": "kbert.config",
    "TaskModel": "kbert.training.task_model",
    "AtomicBackup": "kbert.training.backup",
    "BertConfig": "kbert.config",
    "register_preset": "kbert.config",
    "bert_classifier": "kbert.models",
    "bert_embedder": "kbert.models",
    "bert_encoder": "kbert.models",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kbert' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)


if "keras" in sys.modules:
    try:
        importlib.import_module(_EXPORTS["TaskModel"])
    except ModuleNotFoundError as error:
        # The model code runs without TensorFlow (JAX alone); TaskModel, whose
        # preprocessing is TensorFlow, is then not there to register.
        if error.name not in ("tensorflow", "tensorflow_text"):
            raise
