"""TensorFlow's start-up lines and kbert's expected retracing warnings, held back.

TensorFlow 2.21 writes its start-up lines (the oneDNN notice, CUDA probes on
a machine without a GPU, the CPU's instruction sets) through absl before
absl's logging is set up, where TF_CPP_MIN_LOG_LEVEL does not reach; on a
CPU machine one of them reads `E0000 ... failed call to cuInit`, like a
fault. So stderr is held while TensorFlow loads and lists its devices, and
every other line is passed on (`startup_lines_held`). The command line does
it first thing (`quiet_tensorflow`); `import kbert` has it done on the first
import of TensorFlow, by kbert or by the caller's `import keras`
(`hold_startup_lines_on_import`). oneDNN itself stays as it is
(TF_ENABLE_ONEDNN_OPTS changes numerics).

kbert runs a model on batches cut to their rows' length (a few widths), so
Keras's predict step traces once per width: TensorFlow's warning that it
"triggered tf.function retracing" is expected there, and dropped
(`drop_predict_retracing_warnings`).
"""

import contextlib
import importlib
import importlib.abc
import importlib.util
import logging
import os
import re
import sys
import tempfile

# TensorFlow's start-up lines that `startup_lines_held` drops.
TENSORFLOW_STARTUP = re.compile(
    r"absl::InitializeLog\(\) is called|port\.cc:\d+\] oneDNN custom operations|cudart_stub\.cc"
    r"|cuda_platform\.cc:\d+\] failed call to cuInit|cpu_feature_guard\.cc"
    r"|^To enable the following instructions|rebuild TensorFlow with the appropriate compiler flags"
)


@contextlib.contextmanager
def startup_lines_held():
    """Holds what is written to file descriptor 2 in the block; then passes on every
    line but TensorFlow's start-up lines."""
    with tempfile.TemporaryFile() as held:
        sys.stderr.flush()
        stderr = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(stderr, 2)
            os.close(stderr)
            held.seek(0)
            for line in held.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not TENSORFLOW_STARTUP.search(line):
                    sys.stderr.write(line)


def quiet_tensorflow():
    """Starts TensorFlow without its start-up lines and its C++ info and warning
    logs (the command line's), unless TF_CPP_MIN_LOG_LEVEL is set."""
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    with startup_lines_held():
        _list_devices(importlib.import_module("tensorflow"))


def _list_devices(tf):
    # The CUDA probe writes its lines when TensorFlow first lists its devices.
    tf.config.list_physical_devices()


class _QuietImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports TensorFlow, the first time anything imports it, with its start-up
    lines held back (`startup_lines_held`); then leaves the import system."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None:
            self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with startup_lines_held():
            self.loader.exec_module(module)
            _list_devices(module)


def hold_startup_lines_on_import():
    """Makes the first import of TensorFlow, by kbert or by the caller (`import keras`),
    hold back its start-up lines; nothing if it is loaded already or
    TF_CPP_MIN_LOG_LEVEL is set (the caller chose TensorFlow's logging)."""
    if "tensorflow" in sys.modules or "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    if not any(isinstance(finder, _QuietImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())


class _PredictRetracing(logging.Filter):
    """Drops TensorFlow's retracing warning about Keras's predict step."""

    def filter(self, record):
        message = record.getMessage()
        return not ("triggered tf.function retracing" in message and "make_predict_function" in message)


def drop_predict_retracing_warnings():
    """Installs `_PredictRetracing` on TensorFlow's logger, once."""
    import tensorflow as tf

    logger = tf.get_logger()
    if not any(isinstance(f, _PredictRetracing) for f in logger.filters):
        logger.addFilter(_PredictRetracing())
