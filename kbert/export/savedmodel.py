"""A SavedModel for TF Serving: raw strings in, the task's answer out.

Layout written under the export folder (TF Serving's versioned layout):

| path | content |
| --- | --- |
| `1/saved_model.pb`, `1/variables/` | the graph: tokenizer, packer, model and the task's outputs |
| `1/assets/vocab.txt` (and the task's files, e.g. `labels.txt`) | for clients of the token signature |
| `1/assets.extra/tf_serving_warmup_requests` | `PredictionLog` records TF Serving replays at load time |
| `models.config` | a `ModelServerConfig` text proto naming the model |

Signatures:

| name | inputs | outputs |
| --- | --- | --- |
| `serving_default` | the task's string inputs (`text`; `sentence1`, `sentence2`; ...), `(batch,)` | the task's (`Serving.outputs`, `kbert.export.serving`): a classifier's `scores`, `label`, `logits` |
| `serve_tokens` | `token_ids`, `segment_ids`, `padding_mask`: int32 `(batch, length)` | the same |

The tokenizer is made of TensorFlow and tf-text ops; the TF Serving model
server links tf-text's ops, and a Python client must `import tensorflow_text`
before `tf.saved_model.load`.
"""

import json
import os
import subprocess
import sys

import tensorflow as tf

from kbert.config import ENCODER_INPUTS
from kbert.export.graph import model_outputs
from kbert.export.options import MODELS_CONFIG, VOCAB_ASSET
from kbert.export.serving import serving_for
from kbert.text import save_vocab

SERVING_VERSION = 1
TEXT_SIGNATURE = "serving_default"
TOKENS_SIGNATURE = "serve_tokens"
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
# TF Serving replays at most this many warm-up records; a few short ones are
# enough to trace the graph and fill the kernel caches.
MAX_WARMUP_REQUESTS = 4


class ServingModule(tf.Module):
    """The tf.Module saved as the SavedModel: both signatures and their assets.

    Args:
        folder: `kbert.modelfolder.ModelFolder`.
        assets: dict of file name -> path, shipped in `assets/`.
    """

    def __init__(self, folder, assets):
        super().__init__(name="kbert_serving")
        model, task = folder.model, folder.task
        # The weights alone: tracking the Keras model would also save the
        # optimizer's slots a compiled model carries (twice the weights' size).
        self.model_variables = [weight.value for weight in model.weights]
        self.asset_files = {name: tf.saved_model.Asset(path) for name, path in assets.items()}

        def outputs(features):
            return serving_for(task).outputs(features, model_outputs(task, model, features))

        def serve_text(*strings):
            return outputs(serving_for(task).features(dict(zip(task.text_inputs, strings))))

        self.serve_text = tf.function(
            serve_text,
            input_signature=[tf.TensorSpec([None], tf.string, name=name) for name in task.text_inputs],
        )
        self.serve_tokens = tf.function(
            outputs,
            input_signature=[
                {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in ENCODER_INPUTS}
            ],
        )


def export_savedmodel(folder, out, name, warmup_examples, scratch):
    """Writes `out/1/` (SavedModel with warm-up requests) and `out/models.config`.

    Args:
        folder: `kbert.modelfolder.ModelFolder`.
        out: str. The export folder (TF Serving's model base path).
        name: str. The model name TF Serving serves it under.
        warmup_examples: list of the task's examples, for the warm-up requests.
        scratch: str. A scratch folder for the asset files.

    Returns:
        str. The version folder.
    """
    assets = {VOCAB_ASSET: os.path.join(scratch, VOCAB_ASSET)}
    save_vocab(folder.vocabulary, assets[VOCAB_ASSET])
    for file_name, content in serving_for(folder.task).assets().items():
        assets[file_name] = os.path.join(scratch, file_name)
        with open(assets[file_name], "w", encoding="utf-8") as f:
            f.write(content)
    module = ServingModule(folder, assets)
    version_dir = os.path.join(out, str(SERVING_VERSION))
    tf.saved_model.save(
        module,
        version_dir,
        signatures={
            TEXT_SIGNATURE: module.serve_text.get_concrete_function(),
            TOKENS_SIGNATURE: module.serve_tokens.get_concrete_function(),
        },
    )
    requests = [folder.task.serving_request(e) for e in warmup_examples[:MAX_WARMUP_REQUESTS]]
    write_warmup_requests(version_dir, name, requests)
    write_models_config(os.path.join(out, MODELS_CONFIG), name)
    return version_dir


def write_models_config(path, name, base_path=None):
    """Writes a TF Serving `--model_config_file` for one model.

    `base_path` defaults to `/models/NAME`, where the tensorflow/serving image
    expects a model mounted; TF Serving needs an absolute path.
    """
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    model = config.model_config_list.config.add()
    model.name = name
    model.base_path = base_path or f"/models/{name}"
    model.model_platform = "tensorflow"
    with open(path, "w") as f:
        f.write(text_format.MessageToString(config))


def write_warmup_requests(version_dir, name, requests):
    """Writes `assets.extra/tf_serving_warmup_requests`: one PredictRequest each.

    Args:
        requests: list of dicts, input name -> one string (one instance).
    """
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    folder = os.path.join(version_dir, os.path.dirname(WARMUP_FILE))
    os.makedirs(folder, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(version_dir, WARMUP_FILE)) as writer:
        for inputs in requests:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=name, signature_name=TEXT_SIGNATURE),
            )
            for input_name, value in inputs.items():
                request.inputs[input_name].CopyFrom(tf.make_tensor_proto([value], dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())


def read_warmup_requests(version_dir):
    """The `PredictRequest`s of the warm-up file, in order."""
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    for record in tf.data.TFRecordDataset(os.path.join(version_dir, WARMUP_FILE)):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        requests.append(log.predict_log.request)
    return requests


def load_savedmodel(version_dir):
    """`tf.saved_model.load`, after registering the tf-text ops the graph uses."""
    import tensorflow_text  # noqa: F401  (registers RegexSplitWithOffsets and friends)

    return tf.saved_model.load(version_dir)


def saved_model_cli_show(version_dir, inputs, outputs):
    """Runs `saved_model_cli show --all` and checks it lists both signatures.

    Args:
        version_dir: str. The SavedModel.
        inputs, outputs: names the text signature must list.

    Returns the tool's output; raises `ValueError` with its first line of
    complaint if it fails or misses a signature.
    """
    return check_saved_model_cli(start_saved_model_cli(version_dir), version_dir, inputs, outputs)


def start_saved_model_cli(version_dir):
    """Starts `saved_model_cli show --all` on `version_dir` and returns the process:
    it spends seconds importing TensorFlow, which the caller can spend verifying."""
    tool = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    if not os.path.isfile(tool):
        raise ValueError(f"saved_model_cli not found beside {sys.executable}")
    return subprocess.Popen(
        [tool, "show", "--dir", version_dir, "--all"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )


def check_saved_model_cli(process, version_dir, inputs, outputs):
    """Waits for `start_saved_model_cli`'s `process`; its output, checked as
    `saved_model_cli_show` says."""
    try:
        output, errors = process.communicate()
    except BaseException:
        process.kill()
        process.wait()
        raise
    expected = [f"signature_def['{TEXT_SIGNATURE}']", f"signature_def['{TOKENS_SIGNATURE}']"]
    expected += [f"inputs['{name}']" for name in inputs] + [f"outputs['{name}']" for name in outputs]
    missing = [item for item in expected if item not in output]
    if process.returncode or missing:
        complaint = (errors.strip().splitlines() or ["no output"])[-1]
        raise ValueError(
            f"saved_model_cli show --all on {version_dir} failed (exit {process.returncode}, "
            f"missing {missing}): {complaint}"
        )
    return output


# === TF Serving's REST API ===


def rest_predict_example(loaded, instances):
    """The REST `predict` request for `instances` and the response TF Serving sends.

    The response is computed by running the loaded `serving_default` signature
    and writing its outputs the way TF Serving's row format does
    (`tensorflow_serving/util/json_tensor.cc`): one object per instance, keyed
    by output name, floats in their shortest round-trip form.

    Args:
        loaded: the object `load_savedmodel` returns.
        instances: list of dicts, input name -> str. An instance of a
            signature with one input is written as the bare string, as TF
            Serving accepts it.

    Returns:
        `(request, response)`: the two JSON bodies as str.
    """
    names = sorted(instances[0])
    rows = [instance[names[0]] if len(names) == 1 else instance for instance in instances]
    request = {"signature_name": TEXT_SIGNATURE, "instances": rows}
    outputs = loaded.signatures[TEXT_SIGNATURE](
        **{name: tf.constant([instance[name] for instance in instances]) for name in names}
    )
    rows = []
    for index in range(len(instances)):
        rows.append({name: _row_value(outputs[name][index].numpy()) for name in sorted(outputs)})
    body = ",\n".join("    " + _compact(row) for row in rows)
    response = '{\n  "predictions": [\n' + body + "\n  ]\n}"
    return json.dumps(request, indent=2, ensure_ascii=False), response


class _RawNumber(str):
    """A number already written as TF Serving writes it."""


def _row_value(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if value.ndim == 0 and value.dtype.kind in "iu":  # TF Serving writes integers as such
        return _RawNumber(str(int(value)))
    if value.ndim == 0:
        return _RawNumber(serving_float(float(value)))
    return [_row_value(item) for item in value]


def _compact(value):
    if isinstance(value, _RawNumber):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_compact(item) for item in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)}: {_compact(v)}" for k, v in value.items()) + "}"


def serving_float(value):
    """A float32 as TF Serving's JSON writer prints it.

    Six significant digits (`absl::StrCat`) if they give the float32 back, else
    nine (`max_digits10`); ".0" appended to whole numbers without an exponent.

    Example:
    >>> serving_float(0.5), serving_float(0.1), serving_float(2.0), serving_float(3e-05)
    ('0.5', '0.1', '2.0', '3e-05')
    """
    import numpy as np

    value = np.float32(value)
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return "-Infinity" if value < 0 else "Infinity"
    text = f"{float(value):.6g}"
    if np.float32(float(text)) != value:
        text = f"{float(value):.9g}"
    if "." not in text and "e" not in text:
        text += ".0"
    return text
