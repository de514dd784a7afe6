"""What MediaPipe's `TextClassifier` and `TextEmbedder` (and the TFLite Task
Library) require of a `.tflite` file, read back from the file and checked point by point.

MediaPipe (and the TFLite Task Library's `BertNLClassifier`) tokenize the text
themselves and feed a BERT model whose file carries the vocabulary and labels in
its metadata. What the classifier's runtime relies on, and what `check_contract` tests:

| point | why |
| --- | --- |
| one subgraph | the task runs subgraph 0 |
| three int32 inputs of shape `[1, L]`, `L` fixed | an input of dynamic length crashes MediaPipe on texts longer than `L` |
| metadata names `ids`, `mask`, `segment_ids` on the right tensors | the runtime finds its inputs by these names; a wrong mapping runs without error and gives wrong scores |
| one float32 output `[1, N]` holding probabilities | the runtime reports the output as scores, applying no softmax |
| labels packed in output order | category `i` is named by line `i` |
| `[PAD]` is id 0 in the packed vocabulary | the runtime pads with id 0 |
| output metadata named `score` (MediaPipe) or `probability` (Task Library) | `BertNLClassifier` 0.4.4 looks the output up by the name `probability`, and crashes (SIGSEGV) on MediaPipe's `score`; MediaPipe runs either |

A `TextEmbedder` file keeps the inputs' rows (and the vocabulary's) and has one
float32 output `[1, hidden]`, the text's vector (pooling and normalisation in
the model), named `embedding` in the metadata (`check_embedder_contract`).

The writers (`kbert.export.mediapipe`) check what they are given with
`check_vocabulary`, `check_labels` and `check_sequence_length`, and what they
wrote with the contract's checks; the on-device question answerer and token
classifier (`kbert.export.question_answerer`, `kbert.export.token_classifier`)
read their files back with `read_contract`.
"""

import os
import zipfile

import numpy as np
from ai_edge_litert import schema_py_generated as tflite_schema
from ai_edge_litert.interpreter import Interpreter

from kbert.config import ENCODER_INPUTS
from kbert.export import mediapipe_env
from kbert.export.mediapipe_worker import LABELS_NAME, VOCAB_NAME

# The metadata name of each kbert input; MediaPipe's BERT preprocessor and the
# Task Library find their inputs by these names.
METADATA_INPUT_NAMES = {"token_ids": "ids", "padding_mask": "mask", "segment_ids": "segment_ids"}
# The output's metadata name each runtime's writer gives (see the table above).
OUTPUT_METADATA_NAMES = {"mediapipe": "score", "task_library": "probability"}
# The metadata name of a TextEmbedder file's output.
EMBEDDING_OUTPUT_NAME = "embedding"
RUNTIMES = tuple(OUTPUT_METADATA_NAMES)
# The runtimes pad with id 0, so the vocabulary must hold [PAD] there.
PAD_TOKEN = "[PAD]"
# Probabilities from the LiteRT interpreter, MediaPipe and the Task Library
# match a float32 Keras model's on the same token ids to rounding: measured
# 3.7e-6 at most over the dev set for fine-tuned MiniLM-L6 (L=128), 3e-8 for
# the tests' tiny model. A sum of probabilities is 1 to as much.
PROBABILITY_TOLERANCE = 1e-5


def check_contract(path, vocabulary, labels, sequence_length, runtime="mediapipe", cache_dir=None,
                   distribution=True):
    """Reads `path` back and raises `ValueError` listing every broken point.

    Checks each row of the module's table against the file: the LiteRT
    interpreter for tensors, MediaPipe's `MetadataDisplayer` for the metadata,
    the packed files for vocabulary and labels, and two inputs run through the
    interpreter for probabilities: one distribution (a softmax), or with
    `distribution=False` one probability per label (a multi-label model's sigmoids).

    Returns:
        dict. `read_contract(path)`.
    """
    contract = read_contract(path, cache_dir)
    problems = contract_problems(contract, vocabulary, labels, sequence_length, runtime)
    if not problems:
        problems = probability_problems(path, len(vocabulary), sequence_length, distribution)
    if problems:
        raise ValueError(f"{path} breaks the {runtime} contract:\n- " + "\n- ".join(problems))
    return contract


def check_embedder_contract(path, vocabulary, sequence_length, width, cache_dir=None):
    """Reads `path` back and raises `ValueError` listing what breaks `TextEmbedder`'s
    rules: the BERT text input, and one float32 `[1, width]` output named `embedding`.

    Returns:
        dict. `read_contract(path)`.
    """
    contract = read_contract(path, cache_dir)
    problems = input_problems(contract, vocabulary, sequence_length) + output_problems(
        contract, width, EMBEDDING_OUTPUT_NAME
    )
    if problems:
        raise ValueError(f"{path} breaks the TextEmbedder contract:\n- " + "\n- ".join(problems))
    return contract


def contract_problems(contract, vocabulary, labels, sequence_length, runtime="mediapipe"):
    """What in `contract` (from `read_contract`) breaks the table; list of str."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime={runtime!r}; expected one of {list(RUNTIMES)}")
    problems = input_problems(contract, vocabulary, sequence_length)
    problems += output_problems(contract, len(labels), OUTPUT_METADATA_NAMES[runtime], runtime)
    if contract["labels"] != list(labels):
        problems.append(f"packed labels {contract['labels']}; expected {list(labels)}")
    return problems


def input_problems(contract, vocabulary, sequence_length):
    """What in `contract` breaks the rules of MediaPipe's BERT text input; list of str.

    One subgraph; the three int32 `[1, L]` inputs named `ids`, `mask`,
    `segment_ids` in the metadata; BERT's tokenizer with `vocabulary`, `[PAD]` first.
    """
    problems = []
    if contract["subgraphs"] != 1:
        problems.append(f"{contract['subgraphs']} subgraphs; expected 1")
    inputs = contract["inputs"]
    if sorted(str(i["signature_name"]) for i in inputs) != sorted(ENCODER_INPUTS):
        problems.append(
            f"inputs {[i['signature_name'] for i in inputs]}; expected {list(ENCODER_INPUTS)}"
        )
    for tensor in inputs:
        name = tensor["signature_name"]
        expected = METADATA_INPUT_NAMES.get(name)
        if tensor["metadata_name"] != expected:
            problems.append(
                f"input {name!r} is named {tensor['metadata_name']!r} in the metadata; "
                f"expected {expected!r}"
            )
        if tensor["dtype"] != "int32":
            problems.append(f"input {name!r} is {tensor['dtype']}; expected int32")
        for key in ("shape", "shape_signature"):
            if tensor[key] != [1, sequence_length]:
                problems.append(
                    f"input {name!r} has {key} {tensor[key]}; expected [1, {sequence_length}]"
                )
    if contract["tokenizer"] != "BertTokenizerOptions":
        problems.append(
            f"input process unit {contract['tokenizer']!r}; expected BertTokenizerOptions"
        )
    if contract["vocabulary"][:1] != [PAD_TOKEN]:
        problems.append(
            f"the packed vocabulary starts {contract['vocabulary'][:1]}; expected [{PAD_TOKEN!r}]"
        )
    if contract["vocabulary"] != list(vocabulary):
        problems.append("the packed vocabulary differs from the model's")
    return problems


def output_problems(contract, width, metadata_name, runtime="mediapipe"):
    """What in `contract` breaks the rule of one float32 `[1, width]` output named
    `metadata_name` in the metadata; list of str."""
    outputs = contract["outputs"]
    problems = [] if len(outputs) == 1 else [f"{len(outputs)} outputs; expected 1"]
    for tensor in outputs:
        if tensor["dtype"] != "float32":
            problems.append(f"output is {tensor['dtype']}; expected float32")
        for key in ("shape", "shape_signature"):
            if tensor[key] != [1, width]:
                problems.append(f"output has {key} {tensor[key]}; expected [1, {width}]")
        if tensor["metadata_name"] != metadata_name:
            problems.append(
                f"output is named {tensor['metadata_name']!r} in the metadata; "
                f"{runtime} expects {metadata_name!r}"
            )
    return problems


def check_sequence_length(sequence_length):
    """`ValueError` unless `sequence_length` is a fixed `L` that holds [CLS] and [SEP]."""
    if not isinstance(sequence_length, int) or sequence_length < 2:
        raise ValueError(
            f"sequence_length={sequence_length!r}; expected an int >= 2 ([CLS] and [SEP])"
        )


def check_vocabulary(vocabulary):
    """`ValueError` unless `vocabulary` is one MediaPipe's BERT tokenizer can pack and pad with."""
    if not vocabulary or vocabulary[0] != PAD_TOKEN:
        raise ValueError(
            f"vocabulary starts with {list(vocabulary[:1])}; MediaPipe pads with id 0, "
            f"so id 0 must be {PAD_TOKEN!r}"
        )
    missing = [t for t in ("[UNK]", "[CLS]", "[SEP]") if t not in vocabulary]
    if missing:
        raise ValueError(f"vocabulary lacks {missing}, which MediaPipe's BERT tokenizer uses")


def check_labels(labels, num_classes):
    """`ValueError` unless `labels` name the `num_classes` outputs, each packable as one line."""
    if len(labels) != num_classes:
        raise ValueError(f"{len(labels)} labels for a model of {num_classes} classes")
    bad = [label for label in labels if not label or "\n" in label or "\r" in label]
    if bad:
        raise ValueError(f"labels {bad!r} cannot be written one per line")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels {list(labels)} repeat a name; the runtimes match scores by name")


def probability_problems(path, vocab_size, sequence_length, distribution=True):
    """Runs a padded and a random full input through `path` with the LiteRT
    interpreter; each output row must be a probability distribution (or, without
    `distribution`, probabilities)."""
    rng = np.random.default_rng(0)
    full = rng.integers(1, vocab_size, (1, sequence_length)).astype("int32")
    short = np.where(np.arange(sequence_length) < 3, full, 0).astype("int32")
    problems = []
    for ids in (short, full):
        features = {
            "token_ids": ids,
            "padding_mask": (ids != 0).astype("int32"),
            "segment_ids": np.zeros_like(ids),
        }
        row = interpreter_scores(path, features)[0]
        outside = row.min() < 0 or row.max() > 1
        if distribution and (outside or abs(row.sum() - 1) > PROBABILITY_TOLERANCE):
            problems.append(
                f"output {np.round(row, 4).tolist()} is not a probability distribution "
                "(no softmax in the model?)"
            )
        elif outside:
            problems.append(f"output {np.round(row, 4).tolist()} holds values outside [0, 1] (no sigmoid in the model?)")
    return problems


def read_contract(path, cache_dir=None):
    """What a runtime sees in `path`: tensors, metadata names, packed files.

    Returns:
        dict with `subgraphs`; `inputs` (in subgraph order) and `outputs`, each a
        list of dicts `signature_name`, `tensor_name`, `metadata_name`, `dtype`,
        `shape`, `shape_signature`; `tokenizer` (the input process unit);
        `associated_files`; `vocabulary` and `labels` (the packed files' lines).
    """
    with open(path, "rb") as f:
        content = f.read()
    flatbuffer = tflite_schema.Model.GetRootAs(content, 0)
    interpreter = Interpreter(model_content=content)
    signature = interpreter.get_signature_runner()
    signature_names = {
        tensor["index"]: name
        for side in (signature.get_input_details(), signature.get_output_details())
        for name, tensor in side.items()
    }
    metadata = mediapipe_env.run_worker(
        mediapipe_env.MEDIAPIPE, "read_metadata", {"model": os.path.abspath(path)}, cache_dir
    )
    subgraph = metadata["metadata"]["subgraph_metadata"][0]

    def tensors(details, tensor_metadata):
        names = [m.get("name") for m in tensor_metadata]
        names += [None] * (len(details) - len(names))
        return [
            {
                "signature_name": signature_names.get(d["index"]),
                "tensor_name": d["name"],
                "metadata_name": name,
                "dtype": np.dtype(d["dtype"]).name,
                "shape": d["shape"].tolist(),
                "shape_signature": d["shape_signature"].tolist(),
            }
            for d, name in zip(details, names)
        ]

    process_units = subgraph.get("input_process_units", [])
    with zipfile.ZipFile(path) as packed:
        files = packed.namelist()
        vocabulary = packed_lines(packed, VOCAB_NAME) if VOCAB_NAME in files else []
        labels = packed_lines(packed, LABELS_NAME) if LABELS_NAME in files else []
    return {
        "subgraphs": flatbuffer.SubgraphsLength(),
        "inputs": tensors(interpreter.get_input_details(), subgraph.get("input_tensor_metadata", [])),
        "outputs": tensors(interpreter.get_output_details(), subgraph.get("output_tensor_metadata", [])),
        "tokenizer": process_units[0].get("options_type") if process_units else None,
        "associated_files": metadata["associated_files"],
        "vocabulary": vocabulary,
        "labels": labels,
    }


def interpreter_scores(path, features):
    interpreter = Interpreter(model_path=path)
    runner = interpreter.get_signature_runner()
    (output,) = runner.get_output_details()
    rows = [
        runner(**{name: features[name][i : i + 1] for name in ENCODER_INPUTS})[output][0]
        for i in range(len(features["token_ids"]))
    ]
    return np.asarray(rows, "float32").reshape(len(rows), -1)


def packed_lines(packed, name):
    return packed.read(name).decode("utf-8").splitlines()
