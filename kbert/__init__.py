"""kbert: BERT for Keras 3, from raw text to TF Serving, TFLite and ONNX.

The model code (`kbert.config`, `kbert.layers`, `kbert.models`) uses `keras.ops`
only and runs on any Keras backend; text preprocessing (`kbert.text`) is
TensorFlow. The names below load on first use, so `import kbert` (and the
`kbert` command's `--help`) does not import Keras or TensorFlow. Imported
after Keras on TensorFlow (the default backend), kbert registers `TaskModel`
at once, so that `keras.saving.load_model` reads a saved one with no other
step; elsewhere, name `kbert.TaskModel` first.
"""

import importlib
import sys

from kbert.lazy import lazy_names
from kbert.quiet import hold_startup_lines_on_import

__version__ = "0.1.0"

_EXPORTS = {
    "PRESETS": "kbert.config",
    "TaskModel": "kbert.training.task_model",
    "AtomicBackup": "kbert.fitting.backup",
    "BertConfig": "kbert.config",
    "register_preset": "kbert.config",
    "bert_classifier": "kbert.models",
    "bert_embedder": "kbert.models",
    "bert_encoder": "kbert.models",
    # What `kbert finetune`, `distill` and `export` run, by the same names.
    "finetune": "kbert.training.finetune",
    "distill": "kbert.training.distill",
    "export_model": "kbert.export.exporter",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
# TensorFlow's start-up lines are held back when it first loads (`kbert.quiet`).
hold_startup_lines_on_import()


# Keras on TensorFlow has loaded TensorFlow already: TaskModel, whose
# preprocessing is TensorFlow, costs little more. Under JAX alone the model
# code runs without TensorFlow, and nothing is imported here.
if sys.modules.get("keras") is not None and sys.modules.get("tensorflow") is not None:
    importlib.import_module(_EXPORTS["TaskModel"])
