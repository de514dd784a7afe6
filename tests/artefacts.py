"""Exported files run by the tests themselves, apart from kbert's verification.

`kbert export` judges each file it writes (`report["passed"]`); a test that
asserted that verdict alone would pass whatever a bug in the judge let
through. Here each float32 file is loaded in its own runtime (TensorFlow's
SavedModel loader, onnxruntime, LiteRT's interpreter), run on the same token
inputs as the Keras model, and held to the Keras model's outputs.
"""

import os

import numpy as np

from kbert.config import ENCODER_INPUTS

# docs/export.md's budget for float32 files. The traced graph is within 1e-5
# of Keras (kbert.export.graph.GRAPH_TOLERANCE); conversion adds rounding.
FLOAT32_TOLERANCE = 1e-4
# Where `kbert export` writes each float32 file (docs/export.md, "What it writes").
FLOAT32_FILES = {"savedmodel": "1", "onnx": "onnx/model.onnx", "tflite": "tflite/model_none.tflite"}
# Rows each file is run on: enough to cover padding, short and long rows.
MAX_ROWS = 24


def token_inputs(folder, data, max_rows=MAX_ROWS):
    """The int32 `(rows, folder.sequence_length)` token inputs of `data`'s first
    `max_rows` rows (None: all), as the folder's task encodes them, padded to
    the model's length (the TFLite files' fixed length)."""
    task = folder.task
    examples = task.read(data, folder.use_options())
    features = task.encode(examples, targets=False).features
    length = folder.sequence_length
    return {name: np.pad(np.asarray(features[name][:max_rows], np.int32),
                         ((0, 0), (0, length - np.shape(features[name])[1])))
            for name in ENCODER_INPUTS}


def keras_outputs(folder, features):
    """The Keras model of `folder` called on `features` (each of the task's input
    views, joined by the task), float32 numpy arrays by output name."""
    import keras

    task, model = folder.task, folder.float32_model()

    def one_view(view):
        result = model({name: keras.ops.convert_to_tensor(value) for name, value in view.items()}, training=False)
        if not isinstance(result, dict):
            result = dict(zip(task.outputs, result if isinstance(result, (list, tuple)) else [result]))
        return result

    outputs = task.over_views(features, one_view)
    return {name: np.asarray(keras.ops.convert_to_numpy(value), np.float32) for name, value in outputs.items()}


def savedmodel_outputs(version_dir, features):
    """`serve_tokens` of the SavedModel (tf.saved_model.load; tf-text's ops registered first)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the text signature's ops)

    signature = tf.saved_model.load(version_dir).signatures["serve_tokens"]
    outputs = signature(**{name: tf.constant(features[name]) for name in ENCODER_INPUTS})
    return {name: value.numpy() for name, value in outputs.items() if value.dtype != tf.string}


def onnx_outputs(path, features):
    """Every output of the ONNX file, run by onnxruntime on the CPU."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    feed = {node.name: features[node.name] for node in session.get_inputs()}
    return dict(zip(names, session.run(names, feed)))


def tflite_outputs(path, features):
    """The TFLite file's signature run by LiteRT's interpreter, one row at a time
    (its inputs are `[1, length]`)."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path).get_signature_runner()
    rows = [runner(**{name: features[name][i:i + 1] for name in ENCODER_INPUTS})
            for i in range(len(features[ENCODER_INPUTS[0]]))]
    return {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}


def run_file(path, features):
    """The outputs of an exported file, in the runtime its kind needs."""
    if path.endswith(".onnx"):
        return onnx_outputs(path, features)
    if path.endswith(".tflite"):
        return tflite_outputs(path, features)
    return savedmodel_outputs(path, features)


def assert_matches_keras(outputs, reference, tolerance, what):
    """Every output `outputs` shares with the Keras `reference` is finite and within
    `tolerance` of it (max abs diff); returns `{name: diff}`."""
    shared = sorted(set(outputs) & set(reference))
    assert shared, f"{what}: no output named as the Keras model's {sorted(reference)}: {sorted(outputs)}"
    diffs = {}
    for name in shared:
        expected = reference[name]
        got = np.asarray(outputs[name], np.float32)
        assert got.size == expected.size, (what, name, got.shape, expected.shape)
        got = got.reshape(expected.shape)
        assert np.isfinite(got).all(), f"{what}: {name} holds NaN or infinity"
        diffs[name] = float(np.abs(got - expected).max())
        assert diffs[name] <= tolerance, f"{what}: {name} is {diffs[name]:.3g} from Keras's (> {tolerance})"
    return diffs


def check_files(model_dir, export_dir, data, files=None, max_rows=MAX_ROWS):
    """Runs files that `kbert export` wrote in `export_dir` for the model folder
    `model_dir` on `data`'s token inputs and holds each to the Keras model.

    Args:
        files: dict of path (relative to `export_dir`) -> the largest absolute
            difference allowed; default: every float32 file (`FLOAT32_FILES`)
            within `FLOAT32_TOLERANCE`.

    Returns:
        `{path: {output: max abs diff}}`.
    """
    from kbert.modelfolder import ModelFolder

    folder = ModelFolder.load(model_dir)
    features = token_inputs(folder, data, max_rows)
    reference = keras_outputs(folder, features)
    assert all(np.isfinite(value).all() for value in reference.values()), "the Keras model gives NaN or infinity"
    files = files or {path: FLOAT32_TOLERANCE for path in FLOAT32_FILES.values()}
    return {path: assert_matches_keras(run_file(os.path.join(export_dir, path), features), reference, tolerance, path)
            for path, tolerance in files.items()}
