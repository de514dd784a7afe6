"""Token-classifier `.tflite` files that carry their vocabulary and tags (MediaPipe's metadata).

No MediaPipe or TFLite Task Library task runs token classification, so the
files keep the plain contract an app codes against, and `check_contract`
reads each file back to hold it to it:

| point | why |
| --- | --- |
| one subgraph, three int32 inputs `[1, L]` named `ids`, `mask`, `segment_ids` in the metadata | BERT's inputs, named as MediaPipe's BERT preprocessing finds them; `L` fixed |
| one float32 output `[1, L, C]` named `logits` in the metadata | every piece's tag logits; the app reads each word's first piece |
| `vocab.txt` packed as the input's `BertTokenizerOptions`, `[PAD]` first | the app's WordPiece, padding with id 0 |
| `labels.txt` packed on the output (`TENSOR_AXIS_LABELS`) | tag `i` is line `i` |

`kbert export --formats mediapipe` writes, into `OUT/mediapipe/`,
`token_classifier.tflite` (float32), `token_classifier_fp16.tflite` and
`token_classifier_dynamic.tflite` (the conversions of `kbert.export.tflite`)
and `labels.txt`. MediaPipe's generic `MetadataWriter` writes the metadata,
in its environment (`kbert.export.mediapipe_env`); MediaPipe's
`MetadataDisplayer` reads it back; the LiteRT interpreter runs each file on
the verification examples.
"""

import os
import tempfile

from kbert.config import ENCODER_INPUTS
from kbert.export import mediapipe, mediapipe_contract, mediapipe_env, tflite, verify
from kbert.export.options import DEFAULT_LATENCY_RUNS, DEFAULT_THREADS
from kbert.export.serving import serving_for
from kbert.fileio import write_file

FILES = {
    "none": "token_classifier.tflite",
    "fp16": "token_classifier_fp16.tflite",
    "dynamic": "token_classifier_dynamic.tflite",
}
OUTPUT_NAME = "logits"
TOKENIZER = "BertTokenizerOptions"


def export_token_classifier(folder, out, examples, reference, cache_dir=None):
    """Writes the `FILES` and `labels.txt` into `out` and runs each file on `examples`.

    Args:
        folder: `kbert.modelfolder.ModelFolder` of a token-classification model.
        out: str. A new folder.
        examples: the task's examples.
        reference: dict. The float32 Keras model's outputs on `examples`.
        cache_dir: str. Where MediaPipe's environment lives.

    Returns:
        list of report entries, one per file: `path`, `format`, `quantization`,
        `input`, `runtime`, `max_abs_diff`, `predictions`, `outputs` (the
        file's logits on each encoded row), `latency`, `contract`.
    """
    task = folder.task
    mediapipe_contract.check_vocabulary(folder.vocabulary)
    mediapipe_contract.check_labels(task.tags, len(task.tags))
    os.makedirs(out)
    mediapipe_env.ensure_environment(mediapipe_env.MEDIAPIPE, cache_dir)
    encoded = task.encode(examples, targets=False)
    one = {name: value[:1] for name, value in encoded.features.items()}
    entries = []
    with tempfile.TemporaryDirectory(prefix="kbert-token-classifier-") as tmp:
        source = os.path.join(tmp, "source")
        tflite.write_token_source(task, folder.model, folder.sequence_length, source)
        for quantization, file_name in FILES.items():
            path = os.path.join(out, file_name)
            content = tflite.convert_tokens(source, quantization)
            write_token_classifier(content, folder.vocabulary, task.tags, path, cache_dir)
            contract = check_contract(path, folder.vocabulary, task.tags, folder.sequence_length, cache_dir)
            runner = tflite.TfliteRunner(path, DEFAULT_THREADS)
            outputs = runner.run(encoded.features)
            latency = verify.measure_latency(lambda: runner.run(one), DEFAULT_LATENCY_RUNS)
            latency["threads"] = DEFAULT_THREADS
            entries.append({
                "path": path,
                "format": "mediapipe",
                "quantization": quantization,
                "input": "tokens",
                "runtime": "litert",
                **serving_for(task).agreement(outputs, reference),
                "predictions": task.decode(examples, encoded, outputs),
                "outputs": outputs,
                "latency": latency,
                "contract": contract,
            })
    write_file(
        os.path.join(out, mediapipe.LABELS_FILE),
        lambda f: f.write("".join(tag + "\n" for tag in task.tags)),
        "w",
        encoding="utf-8",
    )
    return entries


def write_token_classifier(content, vocabulary, tags, path, cache_dir=None):
    """Has MediaPipe's generic writer pack `vocabulary` and `tags` into the `.tflite` bytes `content`."""
    mediapipe.write_bert_features(
        content,
        vocabulary,
        [{"name": OUTPUT_NAME, "description": "tag logits of every piece", "labels": list(tags)}],
        path,
        cache_dir,
        name="kbert token classifier",
        description="BERT token classification: a tag for each WordPiece; read each word's first piece.",
    )


def check_contract(path, vocabulary, tags, sequence_length, cache_dir=None):
    """Reads `path` back; `ValueError` listing every point of the table it breaks.

    Returns:
        dict. The contract as read (`inputs`, `output`, `associated_files`).
    """
    contract = mediapipe_contract.read_contract(path, cache_dir)
    shape = [1, sequence_length]
    expected_inputs = sorted(
        (name, mediapipe_contract.METADATA_INPUT_NAMES[name], "int32", shape, shape) for name in ENCODER_INPUTS
    )
    got_inputs = sorted(
        (t["signature_name"], t["metadata_name"], t["dtype"], t["shape"], t["shape_signature"])
        for t in contract["inputs"]
    )
    output = [[t["metadata_name"], t["dtype"], t["shape"], t["shape_signature"]] for t in contract["outputs"]]
    logits_shape = [1, sequence_length, len(tags)]
    checks = [
        (contract["subgraphs"] == 1, f"{contract['subgraphs']} subgraphs; expected 1"),
        (got_inputs == expected_inputs, f"inputs {got_inputs}; expected {expected_inputs}"),
        (
            output == [[OUTPUT_NAME, "float32", logits_shape, logits_shape]],
            f"outputs {output}; expected one {OUTPUT_NAME!r} float32 {logits_shape}",
        ),
        (contract["tokenizer"] == TOKENIZER, f"input process unit {contract['tokenizer']!r}; expected {TOKENIZER}"),
        (contract["vocabulary"] == list(vocabulary), "the packed vocab.txt is not the model's vocabulary"),
        (contract["labels"] == list(tags), f"packed labels {contract['labels'][:10]}; expected {list(tags)}"),
    ]
    problems = [message for passed, message in checks if not passed]
    if problems:
        raise ValueError(f"{path} breaks the token-classifier contract: " + "; ".join(problems))
    return {
        "inputs": [
            {k: t[k] for k in ("signature_name", "metadata_name", "dtype", "shape")} for t in contract["inputs"]
        ],
        "output": {"metadata_name": OUTPUT_NAME, "dtype": "float32", "shape": logits_shape},
        "associated_files": contract["associated_files"],
    }

