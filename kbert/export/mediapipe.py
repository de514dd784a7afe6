"""`.tflite` files that MediaPipe's `TextClassifier` and `TextEmbedder` run on raw text.

`kbert export` writes them into `OUT/mediapipe/` for tasks whose
`Serving.on_device` (`kbert.export.serving`) is "text_classifier" or "text_embedder"
(`kbert.export.on_device`), and verifies them with MediaPipe itself; what each
file must be, and its checks, are `kbert.export.mediapipe_contract`'s.

MediaPipe ships no writer for `TextEmbedder` files; its generic
`MetadataWriter` (`add_bert_text_input`, `add_feature_output`) writes what
`TextEmbedder` reads. `TextEmbedder` runs with `l2_normalize` off, so the
vectors are the model's own.

The metadata is written by MediaPipe's (or tflite-support's) own writer, in an
environment of its own (`kbert.export.mediapipe_env`).
"""

import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter

from kbert.config import ENCODER_INPUTS
from kbert.export import mediapipe_env, tflite
from kbert.export.graph import model_outputs, task_encoder
from kbert.export.mediapipe_contract import (
    EMBEDDING_OUTPUT_NAME, METADATA_INPUT_NAMES, RUNTIMES, check_contract, check_embedder_contract,
    check_labels, check_sequence_length, check_vocabulary,
)
from kbert.export.mediapipe_worker import LABELS_NAME, VOCAB_NAME
from kbert.export.serving import serving_for
from kbert.fileio import write_file

# The export's subfolder, and file names in it and in the Android app's assets.
FOLDER = "mediapipe"
MEDIAPIPE_FILE = "text_classifier.tflite"
EMBEDDER_FILE = "text_embedder.tflite"
TASK_LIBRARY_FILE = "bert_nl_classifier.tflite"
LABELS_FILE = LABELS_NAME
# A multi-label classifier's decision threshold, beside its labels (the Android app reads it).
THRESHOLD_FILE = "threshold.txt"
# The signature output; MediaPipe reads the tensor by the metadata, not by this.
_OUTPUT_NAME = "probabilities"
_WORKER_COMMANDS = {
    "mediapipe": ("write_mediapipe", "classify_mediapipe", mediapipe_env.MEDIAPIPE),
    "task_library": ("write_task_library", "classify_task_library", mediapipe_env.TFLITE_SUPPORT),
}


def export_text_classifier(folder, out, examples, reference, cache_dir=None, task_library=True):
    """Writes a classifier's files for the on-device runtimes into `out`, and runs them.

    | file | for |
    | --- | --- |
    | `text_classifier.tflite` | MediaPipe `TextClassifier` (MediaPipe's metadata writer) |
    | `bert_nl_classifier.tflite` | Task Library `BertNLClassifier` (tflite-support's writer) |
    | `labels.txt` | the labels in output order, one per line (the Android app reads it) |

    Args:
        folder: `kbert.modelfolder.ModelFolder` of a task whose `mediapipe`
            is "text_classifier".
        out: str. A new folder.
        examples: the task's examples to run the runtimes on.
        reference: dict. The float32 Keras model's outputs on `examples`.
        cache_dir: str. Where the tools' environments live.
        task_library: bool. Also write and run `bert_nl_classifier.tflite`.

    Returns:
        list of report entries, one per file: `path`, `format`, `runtime`,
        `max_abs_diff` (probabilities, where MediaPipe's token ids equal
        kbert's), `top1_agreement`, `predictions` and `outputs` (probabilities), `latency`,
        the file's `contract` and the tokenizer comparison.
    """
    task = folder.task
    (input_name,) = task.text_inputs
    texts = serving_for(task).strings(examples)[input_name]
    os.makedirs(out)
    paths = {"mediapipe": os.path.join(out, MEDIAPIPE_FILE)}
    if task_library:
        paths["task_library"] = os.path.join(out, TASK_LIBRARY_FILE)
    # Created up front and side by side: a first run spends most of its time in pip.
    mediapipe_env.ensure_environments([_WORKER_COMMANDS[r][2] for r in paths], cache_dir)
    contracts = write_text_classifier(
        folder.model, folder.vocabulary, task.labels, folder.sequence_length, paths, task, cache_dir
    )
    _write_text(os.path.join(out, LABELS_FILE), "".join(f"{label}\n" for label in task.labels))
    for name, content in serving_for(task).on_device_files().items():
        _write_text(os.path.join(out, name), content)
    keras_probs = serving_for(task).scores(reference)
    tokenization, ids_differ = compare_tokenizers(folder, examples, texts, cache_dir)
    entries = []
    for runtime, path in paths.items():
        probs, times = classify(path, texts, runtime, cache_dir)
        agree = ~ids_differ
        entries.append({
            **_runtime_entry(path, runtime, contracts[runtime], times, tokenization),
            "max_abs_diff": _max_abs(probs[agree] - keras_probs[agree]),
            "top1_agreement": float(np.mean(probs.argmax(-1) == keras_probs.argmax(-1))),
            "top1_disagreements_where_token_ids_agree": int(
                np.sum((probs.argmax(-1) != keras_probs.argmax(-1)) & agree)
            ),
            "predictions": probs,
            "outputs": {"scores": probs},
        })
    return entries


def _runtime_entry(path, runtime, contract, times, tokenization):
    """What every on-device file's report entry holds: where, how it ran, its contract."""
    return {
        "path": path,
        "format": "mediapipe",
        "quantization": "none",
        "input": "text",
        "runtime": runtime,
        "latency": {"median_ms": round(float(np.median(times)) * 1e3, 3), "runs": len(times)},
        "tokenization": tokenization,
        "contract": {
            "inputs": [
                {k: t[k] for k in ("signature_name", "metadata_name", "dtype", "shape")}
                for t in contract["inputs"]
            ],
            "output": {k: contract["outputs"][0][k] for k in ("metadata_name", "dtype", "shape")},
            "associated_files": contract["associated_files"],
        },
    }


def export_text_embedder(folder, out, examples, reference, cache_dir=None):
    """Writes a text-embedding model for MediaPipe's `TextEmbedder` into `out`, and runs it.

    | file | for |
    | --- | --- |
    | `text_embedder.tflite` | MediaPipe `TextEmbedder` (MediaPipe's generic metadata writer) |

    Args:
        folder: `kbert.modelfolder.ModelFolder` of a task whose `mediapipe` is
            "text_embedder": one text input, one output, the text's vector.
        out: str. A new folder.
        examples: the task's examples; `Serving.strings` gives one text
            per row of `task.encode`.
        reference: dict. The float32 Keras model's outputs on `examples`.
        cache_dir: str. Where MediaPipe's environment lives.

    Returns:
        list of one report entry: `path`, `format`, `runtime`, the task's
        `agreement` on the texts where MediaPipe's token ids equal kbert's,
        `min_cosine_all_texts`, `predictions` (the task's, from MediaPipe's
        vectors), `outputs` (the vectors), `latency`, the file's `contract` and the tokenizer comparison.
    """
    task = folder.task
    (input_name,) = task.text_inputs
    (output,) = task.outputs
    texts = serving_for(task).strings(examples)[input_name]
    os.makedirs(out)
    path = os.path.join(out, EMBEDDER_FILE)
    contract = write_text_embedder(folder.model, folder.vocabulary, folder.sequence_length, task, path, cache_dir)
    tokenization, ids_differ = compare_tokenizers(folder, examples, texts, cache_dir)
    vectors, times = embed(path, texts, cache_dir)
    agree = ~ids_differ
    expected = np.asarray(reference[output], "float32")
    encoded = task.encode(examples, targets=False)
    return [{
        **_runtime_entry(path, "mediapipe", contract, times, tokenization),
        **serving_for(task).agreement({output: vectors[agree]}, {output: expected[agree]}),
        "min_cosine_all_texts": serving_for(task).agreement({output: vectors}, {output: expected}).get("min_cosine"),
        "predictions": task.decode(examples, encoded, {output: vectors}),
        "outputs": {output: vectors},
    }]


def write_text_embedder(model, vocabulary, sequence_length, task, path, cache_dir=None):
    """Writes `model` as a `.tflite` with MediaPipe's TextEmbedder metadata.

    Args:
        model: keras.Model. A text-embedding task's model (token ids -> vector).
        vocabulary: list of str. The WordPiece vocabulary, `[PAD]` first.
        sequence_length: int. The fixed input length `L`.
        task: the `Task` whose model this is (one output: the vector).
        path: str. The file to write (written aside, then renamed into place).
        cache_dir: str. Where MediaPipe's environment lives.

    Returns:
        dict. The file's contract, as `check_embedder_contract` read it back.
    """
    check_vocabulary(vocabulary)
    check_sequence_length(sequence_length)
    task_encoder(model)
    (output,) = task.outputs
    content = _to_tflite(
        lambda features: model_outputs(task, model, features, target="tflite")[output],
        sequence_length,
        tracked=model,
    )
    write_bert_features(
        content, vocabulary, [EMBEDDING_OUTPUT_NAME], path, cache_dir,
        name=f"kbert {task.name}", description=f"kbert {task.name} model: WordPiece text in, one vector out",
    )
    return check_embedder_contract(path, vocabulary, sequence_length, int(model.output.shape[-1]), cache_dir)


def embed(path, texts, cache_dir=None):
    """Vectors of `texts` from MediaPipe's `TextEmbedder` on `path`.

    Returns:
        (vectors, times): float32 `(len(texts), dimension)`, and MediaPipe's
        wall time for each text, in seconds.
    """
    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty; expected at least one text")
    reply = mediapipe_env.run_worker(
        mediapipe_env.MEDIAPIPE, "embed_mediapipe", {"model": os.path.abspath(path), "texts": texts}, cache_dir
    )
    return np.asarray(reply["embeddings"], "float32").reshape(len(texts), -1), reply["times"]


def compare_tokenizers(folder, examples, texts, cache_dir=None):
    """Where MediaPipe's BERT tokenizer gives the model other inputs than kbert's.

    Args:
        folder: `kbert.modelfolder.ModelFolder`.
        examples: the task's examples; `texts` are their strings, one per row
            of `task.encode`.
        texts: list of str.
        cache_dir: str.

    Returns:
        `(report, ids_differ)`: a dict with `texts_whose_token_ids_differ` and
        the first differing tokens of up to 10 `examples`, and a bool array,
        one per text.
    """
    kbert_ids = folder.task.encode(examples, targets=False).features
    mediapipe_ids = mediapipe_token_ids(folder.vocabulary, folder.sequence_length, texts, cache_dir)
    ids_differ = np.zeros(len(texts), bool)
    for name in ENCODER_INPUTS:
        ids_differ |= np.any(kbert_ids[name] != mediapipe_ids[name], axis=1)
    report = {
        "texts": len(texts),
        "texts_whose_token_ids_differ": int(ids_differ.sum()),
        "examples": _token_differences(texts, kbert_ids, mediapipe_ids, folder.vocabulary, ids_differ),
    }
    return report, ids_differ


def write_text_classifier(model, vocabulary, labels, sequence_length, paths, task, cache_dir=None):
    """Writes `model` as `.tflite` files with its probabilities and each runtime's metadata.

    Args:
        model: keras.Model. A classification task's model (token ids -> logits).
        vocabulary: list of str. The WordPiece vocabulary, `[PAD]` first.
        labels: list of str. Class names in output order.
        sequence_length: int. The fixed input length `L`.
        paths: dict. Runtime -> file to write (written aside, then renamed into
            place): "mediapipe" (MediaPipe's writer, for `TextClassifier`) and/or
            "task_library" (tflite-support's writer, for `BertNLClassifier`). The
            model is converted once for all of them.
        task: the classification `Task` whose model this is.
        cache_dir: str. Where the writers' environments live (see
            `mediapipe_env.ensure_environment`).

    Returns:
        dict. Runtime -> the file's contract, as `check_contract` read it back.
    """
    unknown = sorted(set(paths) - set(RUNTIMES))
    if unknown or not paths:
        raise ValueError(f"paths for runtimes {sorted(paths)}; expected some of {list(RUNTIMES)}")
    check_vocabulary(vocabulary)
    check_labels(labels, model.output.shape[-1])
    content = probability_tflite(model, sequence_length, task)
    contracts = {}
    for runtime, path in paths.items():
        _write_with_metadata(content, vocabulary, labels, path, runtime, cache_dir)
        contracts[runtime] = check_contract(
            path, vocabulary, labels, sequence_length, runtime, cache_dir,
            distribution=serving_for(task).one_label,
        )
    return contracts


def probability_tflite(model, sequence_length, task):
    """The plain `.tflite` (no metadata) of `model` with its task's probabilities on top
    (`probabilities` of its serving adapter: a softmax, or each label's sigmoid).

    Float32, builtin ops only, fixed `(1, sequence_length)` int32 inputs. The
    forward pass is `kbert.export.graph.model_outputs(target="tflite")`,
    the one `kbert export` converts, which reads the variables as float32 (so
    a model trained under mixed precision exports in float32 too).
    """
    check_sequence_length(sequence_length)
    task_encoder(model)  # a ValueError for a model that is not a kbert task model
    return _to_tflite(
        lambda features: serving_for(task).probabilities(model_outputs(task, model, features, target="tflite")["logits"]),
        sequence_length,
        tracked=model,
    )


def classify(path, texts, runtime="mediapipe", cache_dir=None):
    """Scores of `texts` from the runtime itself: MediaPipe's `TextClassifier` or
    the Task Library's `BertNLClassifier`.

    Returns:
        (scores, times): float32 `(len(texts), num_classes)` in label order,
        and the runtime's wall time for each text, in seconds.
    """
    _, command, spec = _WORKER_COMMANDS[runtime]
    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty; expected at least one text")
    reply = mediapipe_env.run_worker(
        spec, command, {"model": os.path.abspath(path), "texts": texts}, cache_dir
    )
    return np.asarray(reply["scores"], "float32").reshape(len(texts), -1), reply["times"]


def mediapipe_token_ids(vocabulary, sequence_length, texts, cache_dir=None):
    """The inputs MediaPipe's own tokenizer gives the model for each of `texts`.

    MediaPipe does not expose them, so a probe model is written through the
    same export path as a classifier, with the same metadata, whose "scores"
    are its three inputs cast to float32 (exact for ids below 2**24), and run
    by `TextClassifier`.

    Returns:
        dict of int32 `(len(texts), sequence_length)` arrays keyed like kbert's
        inputs: `token_ids`, `segment_ids`, `padding_mask`.
    """
    texts = list(texts)
    check_vocabulary(vocabulary)
    if len(vocabulary) >= 2**24:
        raise ValueError(f"{len(vocabulary)} tokens; the probe is exact below 2**24 ids")
    check_sequence_length(sequence_length)
    labels = [str(i) for i in range(len(ENCODER_INPUTS) * sequence_length)]
    with tempfile.TemporaryDirectory(prefix="kbert-probe-") as tmp:
        path = os.path.join(tmp, "probe.tflite")
        _write_with_metadata(
            _to_tflite(_echo, sequence_length), vocabulary, labels, path, "mediapipe", cache_dir
        )
        scores, _ = classify(path, texts, "mediapipe", cache_dir)
    ids = np.rint(scores).astype("int32").reshape(len(texts), len(ENCODER_INPUTS), sequence_length)
    return {name: ids[:, i] for i, name in enumerate(ENCODER_INPUTS)}


# === Helpers ===


def _write_with_metadata(content, vocabulary, labels, path, runtime, cache_dir):
    """Has `runtime`'s classifier writer add metadata to the `.tflite` bytes `content`."""
    write_command, _, spec = _WORKER_COMMANDS[runtime]
    _worker_write(write_command, spec, content, vocabulary, path, cache_dir, labels=list(labels))


def write_bert_features(content, vocabulary, outputs, path, cache_dir=None, name="", description=""):
    """Writes the `.tflite` bytes `content` to `path` with MediaPipe's generic metadata.

    A BERT text input (the tokenizer, `vocabulary`, the inputs named `ids`,
    `mask`, `segment_ids`) and one output per entry of `outputs`, in the model's
    output order: a name gives a feature output (what `TextEmbedder` and
    `BertQuestionAnswerer` read), a dict `{"name", "description", "labels"}` an
    output with its labels packed as `labels.txt` (the token classifier).
    """
    _worker_write(
        "write_bert_features", mediapipe_env.MEDIAPIPE, content, vocabulary, path, cache_dir,
        outputs=list(outputs), name=name, description=description,
    )


def _worker_write(command, spec, content, vocabulary, path, cache_dir, **request):
    """Runs the worker's writer `command` on the `.tflite` bytes `content`, writing `path`.

    `request` adds the command's own fields to the model, vocabulary, input
    tensor names and output path every writer takes.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: no such folder for {path}")
    with tempfile.TemporaryDirectory(prefix="kbert-mediapipe-") as tmp:
        plain = os.path.join(tmp, "plain.tflite")
        vocab = os.path.join(tmp, VOCAB_NAME)
        with open(plain, "wb") as f:
            f.write(content)
        with open(vocab, "w", encoding="utf-8") as f:
            f.write("".join(token + "\n" for token in vocabulary))
        request = {
            **request,
            "model": plain,
            "vocab": vocab,
            "tensor_names": _metadata_tensor_names(content),
            "out": os.path.abspath(path),
            **request,
        }
        mediapipe_env.run_worker(spec, command, request, cache_dir)


def _to_tflite(forward, sequence_length, tracked=None):
    """Converts `forward` (dict of `(1, L)` int32 tensors -> one float32 tensor) to
    `.tflite` bytes with `kbert.export.tflite`'s converter: float32, builtin ops.

    The endpoint names its output for what it holds (probabilities, or a probe's
    ids), not `logits` as `tflite.write_token_source` does.
    """
    signature = {
        name: tf.TensorSpec((1, sequence_length), tf.int32, name=name) for name in ENCODER_INPUTS
    }
    archive = keras.export.ExportArchive()
    if tracked is not None:
        archive.track(tracked)
    archive.add_endpoint(
        tflite.ENDPOINT, lambda features: {_OUTPUT_NAME: forward(features)}, [signature]
    )
    with tempfile.TemporaryDirectory(prefix="kbert-savedmodel-") as tmp:
        archive.write_out(tmp, verbose=False)
        return tflite.convert_tokens(tmp, "none")


def _metadata_tensor_names(content):
    """`{"ids": tensor name, "mask": ..., "segment_ids": ...}` from the signature.

    The converter orders and names the subgraph's inputs its own way (e.g.
    segment_ids, token_ids, padding_mask); the signature says which is which.
    """
    inputs = Interpreter(model_content=content).get_signature_runner().get_input_details()
    if sorted(inputs) != sorted(ENCODER_INPUTS):
        raise ValueError(f"converted inputs {sorted(inputs)}; expected {sorted(ENCODER_INPUTS)}")
    return {METADATA_INPUT_NAMES[key]: details["name"] for key, details in inputs.items()}


def _echo(features):
    """The probe's forward pass: its three inputs, as float32, side by side."""
    return tf.concat([tf.cast(features[name], tf.float32) for name in ENCODER_INPUTS], axis=1)


def _write_text(path, text):
    write_file(path, lambda f: f.write(text), "w", encoding="utf-8")


def _max_abs(diff):
    return float(np.max(np.abs(diff))) if diff.size else 0.0


def _token_differences(texts, kbert_ids, mediapipe_ids, vocabulary, ids_differ, limit=10):
    """The first differing tokens of the first `limit` texts whose ids differ."""
    examples = []
    for i in np.flatnonzero(ids_differ)[:limit]:
        a, b = kbert_ids["token_ids"][i], mediapipe_ids["token_ids"][i]
        first = int(np.flatnonzero(a != b)[0]) if np.any(a != b) else 0
        window = slice(max(0, first - 2), first + 6)
        examples.append(
            {
                "text": texts[i][:200],
                "position": first,
                "kbert": [vocabulary[t] for t in a[window]],
                "mediapipe": [vocabulary[t] for t in b[window]],
            }
        )
    return examples
