"""TFLite (LiteRT) models: token ids of a fixed length in, builtin ops only.

The Keras model goes through `keras.export.ExportArchive` into a SavedModel
with one endpoint on `(1, sequence_length)` int32 inputs, traced from
`kbert.export.graph.model_outputs(..., target="tflite")` (the Keras
model's variables, quantization-friendly op forms; the task's outputs), which
`tf.lite.TFLiteConverter` converts once per quantization:

| quantization | converter settings | stored | computed |
| --- | --- | --- | --- |
| `none` | builtin ops | float32 | float32 |
| `fp16` | `Optimize.DEFAULT`, `supported_types=[float16]` | float16 weights | float32 |
| `dynamic` | `Optimize.DEFAULT` | int8 weights | int8 matmuls, activations quantized per run |
| `int8` | the float model, then AI Edge Quantizer: static int8 on `INT8_STATIC_OPS`, dynamic on the feed-forward outputs (`INT8_DYNAMIC_SCOPE`), calibration | int8 weights of every matmul, int8 embedding tables | int8 matmuls (static activations; the feed-forward output's quantized per run), float32 LayerNorm, softmax, GELU and attention |
| `16x8` | `EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8` (float fallback for the mask's Cast) | int8 weights | int16 activations; LiteRT's reference kernels, no XNNPACK: ~50x slower than `dynamic` on CPU |

The text variant takes the task's raw strings (one of each, batch 1): tf-text's
`FastBertTokenizer` (`FastBertNormalize` and `FastWordpieceTokenizeWithOffsets`,
tf-text's TFLite custom ops) then the task's packing in builtin ops
(`Serving.tflite_text_features`). Its normaliser folds
compatibility characters (`²` -> `2`, `ﬂ` -> `fl`, Greek final `ς` -> `σ`)
that Hugging Face's BERT normaliser keeps, so its ids can differ from
`kbert.text.WordPieceTokenizer`'s on such text; the report counts the
verification texts where they do (`text_token_differences`) and holds the
variant to Keras on the others.
"""

import contextlib
import io
import os
import tempfile
import warnings

import keras
import numpy as np
import tensorflow as tf

from kbert.config import ENCODER_INPUTS
from kbert.export.graph import FEED_FORWARD_OUTPUT, model_outputs
from kbert.export.options import CALIBRATED, DEFAULT_THREADS, SUPPORTED
from kbert.export.serving import serving_for

TFLITE_QUANTIZATIONS = SUPPORTED["tflite"]
# The int8 recipe, applied with Google's AI Edge Quantizer to the float
# model. Measured on the Debian classifier (MiniLM-L6, length 128, 950 dev
# texts, 100 calibration texts; tools/benchmarks/benchmark_int8.py, 2 loaded cores):
# 22.3 MiB, accuracy 86.95 (float 86.63), 99.2% top-1 agreement with the
# float file, 7.4 ms against dynamic int8's 7.2 ms in the same run.
# - the FULLY_CONNECTED matmuls: int8 weights (per output channel) and int8
#   activations with ranges from calibration (static);
# - except each block's feed-forward output matmul (`FEED_FORWARD_OUTPUT`),
#   whose input, the GELU's output, has one channel 4x larger than the rest
#   (25 against <= 5.8 in MiniLM's first block): with it static too, one
#   range for all channels cost a point (85.68) and 4% of agreement (95.3%);
#   it keeps int8 weights, its activations quantized per run (dynamic);
# - the GATHERs: int8 embedding tables (11 of the 22 MiB);
# - float32: LayerNorm, softmax, GELU and the attention BATCH_MATMULs. The
#   converter's full-integer int8 of these fails at run time (the softmax
#   renormalisation divides by an int8 zero) and took 50 ms; with int8
#   BATCH_MATMULs (no XNNPACK kernel) the file took 17.8 ms.
# Static int8 matmuls run no faster than dynamic ones on XNNPACK; what stays
# float is the same in both, so int8 is not faster than `dynamic` here.
INT8_STATIC_OPS = ("FULLY_CONNECTED", "GATHER")
INT8_DYNAMIC_SCOPE = rf"(^|;){FEED_FORWARD_OUTPUT}(_\d+)?/"
# The custom ops of the text variant, all registered by
# `tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS`.
TEXT_CUSTOM_OPS = ("FastBertNormalize", "FastWordpieceTokenizeWithOffsets")
ENDPOINT = "serve"


# === Conversion ===


def write_token_source(task, model, sequence_length, folder):
    """Writes the SavedModel the token variants are converted from.

    One endpoint on `(1, sequence_length)` int32 inputs named `ENCODER_INPUTS`,
    returning the task's outputs (`task.outputs`).
    """
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        ENDPOINT,
        lambda features: model_outputs(task, model, features, target="tflite"),
        input_signature=[
            {name: tf.TensorSpec([1, sequence_length], tf.int32, name=name) for name in ENCODER_INPUTS}
        ],
    )
    archive.write_out(folder, verbose=False)


def convert_tokens(source, quantization, calibration=None, threads=DEFAULT_THREADS):
    """Converts the SavedModel of `write_token_source` to TFLite bytes.

    Args:
        source: str. The SavedModel folder.
        quantization: str. One of `TFLITE_QUANTIZATIONS`.
        calibration: for "int8" and "16x8": a dict of int32 `(n, length)`
            arrays named `ENCODER_INPUTS`, fed one row at a time.
        threads: int. Interpreter threads for the int8 calibration.
    """
    if quantization not in TFLITE_QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r}; expected one of {TFLITE_QUANTIZATIONS}")
    check_calibration(quantization, calibration)
    converter = tf.lite.TFLiteConverter.from_saved_model(source)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantization == "none":
        return converter.convert()
    if quantization == "int8":
        return quantize_int8(converter.convert(), calibration, threads)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantization == "fp16":
        converter.target_spec.supported_types = [tf.float16]
        return converter.convert()
    if quantization == "dynamic":
        return converter.convert()
    converter.representative_dataset = _representative_dataset(calibration)
    if quantization == "16x8":
        # The mask's int32 -> float32 Cast has no 16x8 kernel and stays float.
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
            tf.lite.OpsSet.TFLITE_BUILTINS,
        ]
    return converter.convert()


def check_calibration(quantization, calibration):
    """Refuses a calibrated quantization (`CALIBRATED`) without calibration rows."""
    if quantization in CALIBRATED and (calibration is None or not len(calibration[ENCODER_INPUTS[0]])):
        raise ValueError(f"quantization={quantization!r} needs calibration examples; got none")


def _representative_dataset(calibration):
    rows = len(calibration[ENCODER_INPUTS[0]])

    def generate():
        for index in range(rows):
            yield {name: calibration[name][index : index + 1] for name in ENCODER_INPUTS}

    return generate


def quantize_int8(model_bytes, calibration, threads=DEFAULT_THREADS):
    """The int8 model of a float TFLite model (`INT8_STATIC_OPS`, `INT8_DYNAMIC_SCOPE`).

    Args:
        model_bytes: bytes. A float model of `convert_tokens`.
        calibration: dict of int32 `(n, length)` arrays named `ENCODER_INPUTS`.
        threads: int. Interpreter threads while calibrating.
    """
    from ai_edge_litert import interpreter
    from ai_edge_quantizer import qtyping, quantizer

    signature = next(iter(interpreter.Interpreter(model_content=model_bytes).get_signature_list()))
    model = quantizer.Quantizer(bytearray(model_bytes))
    for op in INT8_STATIC_OPS:
        model.add_static_config(
            ".*", qtyping.TFLOperationName(op), activation_num_bits=8, weight_num_bits=8
        )
    # Added last, so it takes precedence for the matmuls it names.
    model.add_dynamic_config(INT8_DYNAMIC_SCOPE, qtyping.TFLOperationName.FULLY_CONNECTED, 8)
    rows = len(calibration[ENCODER_INPUTS[0]])
    dataset = [
        {name: np.asarray(calibration[name][i : i + 1], np.int32) for name in ENCODER_INPUTS}
        for i in range(rows)
    ]
    # The quantizer draws progress bars on stderr and warns that its
    # interpreters keep every tensor (which it needs): neither helps an export log.
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ranges = model.calibrate({signature: dataset}, num_threads=threads)
        result = model.quantize(ranges, enable_progress_bar=False, enable_progress_report=False)
    return bytes(result.quantized_model)


def write_text_source(folder, out):
    """Writes the SavedModel of the text variant: the task's strings in, its outputs out.

    Args:
        folder: `kbert.modelfolder.ModelFolder`.
        out: str. The SavedModel folder to write.
    """
    task, model = folder.task, folder.model
    wordpiece = text_tokenizer(folder)

    def serve(*strings):
        # Batch 1: one string per input, tokenized, packed with builtin ops.
        ids = [wordpiece.tokenize(text).flat_values for text in strings]
        features = serving_for(task).tflite_text_features(ids)
        return model_outputs(task, model, features, target="tflite")

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        ENDPOINT,
        serve,
        input_signature=[tf.TensorSpec([1], tf.string, name=name) for name in task.text_inputs],
    )
    archive.write_out(out, verbose=False)


def text_tokenizer(folder):
    """The text variant's tokenizer: tf-text's `FastBertTokenizer` on the folder's vocabulary."""
    import tensorflow_text as tf_text

    return tf_text.FastBertTokenizer(
        vocab=list(folder.vocabulary),
        token_out_type=tf.int32,
        unknown_token=folder.tokenizer.unknown_token,
        lower_case_nfd_strip_accents=folder.lowercase,
    )


def text_token_differences(folder, strings):
    """Where the text variant's tokenizer gives other word pieces than kbert's.

    Args:
        folder: `kbert.modelfolder.ModelFolder`.
        strings: dict input name -> list of str (`Serving.strings`).

    Returns:
        bool array, one per row of `strings`: True where any of its strings differs.
    """
    fast = text_tokenizer(folder)
    rows = len(next(iter(strings.values())))
    differ = np.zeros(rows, bool)
    for texts in strings.values():
        ours = folder.tokenizer(tf.constant(texts)).to_list()
        theirs = fast.tokenize(tf.constant(texts)).to_list()
        differ |= np.array([a != b for a, b in zip(ours, theirs)], bool)
    return differ


def convert_text(source):
    """Converts the text SavedModel: builtin ops plus tf-text's custom ops."""
    converter = tf.lite.TFLiteConverter.from_saved_model(source)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    converter.allow_custom_ops = True
    return converter.convert()


def tflite_ops(model_bytes):
    """Sorted names of the operators a .tflite model uses (custom ops by code)."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(model_bytes, 0)
    names = {
        code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")
    }
    ops = set()
    for index in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(index)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == schema.BuiltinOperator.CUSTOM:
            ops.add(code.CustomCode().decode("utf-8"))
        else:
            ops.add(names[builtin])
    return sorted(ops)


def check_ops(model_bytes, allowed_custom=()):
    """Raises `ValueError` if the model uses Flex ops or custom ops not in `allowed_custom`."""
    from ai_edge_litert import schema_py_generated as schema

    builtin = {name for name in vars(schema.BuiltinOperator) if not name.startswith("_")}
    extra = [op for op in tflite_ops(model_bytes) if op not in builtin and op not in allowed_custom]
    if extra:
        raise ValueError(f"TFLite model uses non-builtin ops {extra}")
    return tflite_ops(model_bytes)


# === Running ===


class TfliteRunner:
    """Runs a .tflite model from this module with `ai_edge_litert`.

    Args:
        path: str. The .tflite file.
        threads: int. Interpreter threads (XNNPACK's too).
        text: bool. A text variant: registers tf-text's custom ops.
    """

    def __init__(self, path, threads, text=False):
        from ai_edge_litert import interpreter

        if text:
            import tensorflow_text as tf_text

            self.interpreter = interpreter.InterpreterWithCustomOps(
                custom_op_registerers=tf_text.tflite_registrar.SELECT_TFTEXT_OPS,
                model_path=path,
                num_threads=threads,
            )
        else:
            self.interpreter = interpreter.Interpreter(model_path=path, num_threads=threads)
        self.runner = self.interpreter.get_signature_runner()
        self.threads = threads

    def run(self, features):
        """Outputs (dict by name) for int32 `(rows, length)` arrays, one row at a time."""
        rows = len(features[ENCODER_INPUTS[0]])
        return _stack(
            [
                self.runner(**{name: np.asarray(features[name][i : i + 1], np.int32) for name in ENCODER_INPUTS})
                for i in range(rows)
            ]
        )

    def run_text(self, strings):
        """Outputs (dict by name) for string inputs, a dict name -> list of str, one row at a time."""
        names = list(strings)
        rows = len(strings[names[0]])
        return _stack(
            [
                self.runner(**{name: np.array([strings[name][i].encode("utf-8")], dtype=object) for name in names})
                for i in range(rows)
            ]
        )


def _stack(rows):
    return {name: np.concatenate([row[name] for row in rows]) for name in rows[0]}


def scratch_folder(parent):
    """A temporary folder for intermediate SavedModels, inside `parent`."""
    return tempfile.mkdtemp(prefix=".tflite-", dir=parent)


def write_bytes(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
