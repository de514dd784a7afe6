"""Runs MediaPipe's and tflite-support's own tools, inside their environments.

Not imported by kbert: `mediapipe_env.run_worker` runs this file with the
python of a `mediapipe_env.ToolEnvironment`, as

    python -I mediapipe_worker.py COMMAND REQUEST.json REPLY.json

It imports nothing of kbert (and no TensorFlow), only the tool the command needs:

| command | environment | does |
| --- | --- | --- |
| `write_mediapipe` | MEDIAPIPE | metadata by MediaPipe's `text_classifier.MetadataWriter` |
| `write_task_library` | TFLITE_SUPPORT | metadata by tflite-support's `bert_nl_classifier.MetadataWriter` |
| `read_metadata` | MEDIAPIPE | the metadata as JSON and the packed file names |
| `classify_mediapipe` | MEDIAPIPE | scores from `mediapipe.tasks.python.text.TextClassifier` |
| `classify_task_library` | TFLITE_SUPPORT | scores from `tflite_support.task.text.BertNLClassifier` |
| `write_bert_features` | MEDIAPIPE | metadata by MediaPipe's generic `metadata_writer.MetadataWriter`: a BERT text input and feature outputs (text embedder, question answerer), or labelled ones (token classifier) |
| `answer_task_library` | TFLITE_SUPPORT | answers from `tflite_support.task.text.BertQuestionAnswerer` |
| `embed_mediapipe` | MEDIAPIPE | vectors from `mediapipe.tasks.python.text.TextEmbedder` |
"""

import json
import os
import shutil
import sys
import tempfile
import time
import zipfile

# The names the associated files get inside the model (the writers use the
# base name of the file they are given).
VOCAB_NAME = "vocab.txt"
LABELS_NAME = "labels.txt"


def write_mediapipe(request):
    from mediapipe.tasks.python.metadata.metadata_writers import metadata_writer
    from mediapipe.tasks.python.metadata.metadata_writers import text_classifier

    def writer(model, vocab, names):
        return text_classifier.MetadataWriter.create_for_bert_model(
            model,
            tokenizer=metadata_writer.BertTokenizer(vocab),
            labels=metadata_writer.Labels().add(request["labels"]),
            ids_name=names["ids"],
            mask_name=names["mask"],
            segment_name=names["segment_ids"],
        )

    return _populate(request, writer)


def _populate(request, writer):
    """Runs a MediaPipe metadata writer, `writer(model bytes, vocab path, tensor names)`,
    on the request's model and writes the result to `request["out"]`."""
    with open(request["model"], "rb") as f:
        model = bytearray(f.read())
    with tempfile.TemporaryDirectory() as tmp:
        vocab = _copy(request["vocab"], os.path.join(tmp, VOCAB_NAME))
        content, metadata = writer(model, vocab, request["tensor_names"]).populate()
    _write_atomically(request["out"], content)
    return {"metadata": json.loads(metadata)}


def embed_mediapipe(request):
    """Each text's vector from MediaPipe's `TextEmbedder`, as the model gives it."""
    from mediapipe.tasks.python.core.base_options import BaseOptions
    from mediapipe.tasks.python.text import text_embedder

    # The model normalises (or not) itself; MediaPipe must not change its vectors.
    options = text_embedder.TextEmbedderOptions(
        base_options=BaseOptions(model_asset_path=request["model"]), l2_normalize=False, quantize=False
    )
    rows, times = [], []
    with text_embedder.TextEmbedder.create_from_options(options) as embedder:
        for text in request["texts"]:
            start = time.perf_counter()
            result = embedder.embed(text)
            times.append(time.perf_counter() - start)
            rows.append([float(value) for value in result.embeddings[0].embedding])
    return {"embeddings": rows, "times": times}


def write_task_library(request):
    _load_libusb()
    from tflite_support.metadata_writers import bert_nl_classifier, metadata_info

    with open(request["model"], "rb") as f:
        model = bytearray(f.read())
    with tempfile.TemporaryDirectory() as tmp:
        vocab = _copy(request["vocab"], os.path.join(tmp, VOCAB_NAME))
        labels = os.path.join(tmp, LABELS_NAME)
        with open(labels, "w", encoding="utf-8") as f:
            f.write("".join(label + "\n" for label in request["labels"]))
        names = request["tensor_names"]
        writer = bert_nl_classifier.MetadataWriter.create_for_inference(
            model,
            metadata_info.BertTokenizerMd(vocab),
            [labels],
            ids_name=names["ids"],
            mask_name=names["mask"],
            segment_name=names["segment_ids"],
        )
        content = writer.populate()
        metadata = writer.get_metadata_json()
    _write_atomically(request["out"], content)
    return {"metadata": json.loads(metadata)}


def write_bert_features(request):
    """No MediaPipe writer exists for text embedding, question answering or token
    classification: the generic one, a BERT text input and one output per entry of
    `outputs` (a name: a feature output, as `TextEmbedder` and
    `BertQuestionAnswerer` read it; `{"name", "description", "labels"}`: the
    labels packed on it as `labels.txt`)."""
    from mediapipe.tasks.python.metadata.metadata_writers import metadata_writer

    def writer(model, vocab, names):
        writer = (
            metadata_writer.MetadataWriter.create(model)
            .add_general_info(request["name"], request["description"])
            .add_bert_text_input(
                metadata_writer.BertTokenizer(vocab),
                ids_name=names["ids"],
                mask_name=names["mask"],
                segment_name=names["segment_ids"],
            )
        )
        # Output metadata pairs with the model's outputs by position.
        for output in request["outputs"]:
            if isinstance(output, str):
                writer.add_feature_output(name=output)
            else:
                labels = metadata_writer.Labels().add(output["labels"], exported_filename=LABELS_NAME)
                writer.add_classification_output(
                    labels, name=output["name"], description=output.get("description")
                )
        return writer

    return _populate(request, writer)


def answer_task_library(request):
    _load_libusb()
    from tflite_support.task import text

    answerer = text.BertQuestionAnswerer.create_from_file(request["model"])
    answers, times = [], []
    for question, context in zip(request["questions"], request["contexts"]):
        start = time.perf_counter()
        result = answerer.answer(context, question)
        times.append(time.perf_counter() - start)
        answers.append([
            {"text": a.text, "start": a.pos.start, "end": a.pos.end, "logit": a.pos.logit}
            for a in result.answers
        ])
    return {"answers": answers, "times": times}


def read_metadata(request):
    from mediapipe.tasks.python.metadata import metadata

    displayer = metadata.MetadataDisplayer.with_model_file(request["model"])
    return {
        "metadata": json.loads(displayer.get_metadata_json()),
        "associated_files": sorted(displayer.get_packed_associated_file_list()),
    }


def classify_mediapipe(request):
    from mediapipe.tasks.python.core.base_options import BaseOptions
    from mediapipe.tasks.python.text import text_classifier

    options = text_classifier.TextClassifierOptions(
        base_options=BaseOptions(model_asset_path=request["model"]), max_results=-1
    )
    with text_classifier.TextClassifier.create_from_options(options) as classifier:
        return _classify_all(classifier.classify, request["texts"], _packed_labels(request["model"]))


def classify_task_library(request):
    _load_libusb()
    from tflite_support.task import text

    classifier = text.BertNLClassifier.create_from_file(request["model"])
    return _classify_all(classifier.classify, request["texts"], _packed_labels(request["model"]))


def _classify_all(classify, texts, labels):
    """Scores in label order, one row per text, and the time each text took.

    Categories are matched by name: `BertNLClassifier` leaves `index` at 0.
    """
    position = {label: i for i, label in enumerate(labels)}
    rows, times = [], []
    for text in texts:
        start = time.perf_counter()
        result = classify(text)
        times.append(time.perf_counter() - start)
        row = [None] * len(labels)
        for category in result.classifications[0].categories:
            row[position[category.category_name]] = category.score
        rows.append(row)
    return {"scores": rows, "times": times}


def _packed_labels(model):
    """The label file packed in the model (the metadata's zip archive)."""
    with zipfile.ZipFile(model) as packed:
        return packed.read(LABELS_NAME).decode("utf-8").splitlines()


def _load_libusb():
    """tflite-support's native modules link libusb-1.0; libusb-package ships one."""
    import ctypes

    import libusb_package

    ctypes.CDLL(str(libusb_package.get_library_path()), mode=ctypes.RTLD_GLOBAL)


def _copy(source, destination):
    shutil.copyfile(source, destination)
    return destination


def _write_atomically(path, content):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".kbert-", suffix=".tflite", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        # mkstemp makes the file private; the user's umask decides, as for open().
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


COMMANDS = {
    "write_mediapipe": write_mediapipe,
    "write_task_library": write_task_library,
    "read_metadata": read_metadata,
    "classify_mediapipe": classify_mediapipe,
    "classify_task_library": classify_task_library,
    "write_bert_features": write_bert_features,
    "answer_task_library": answer_task_library,
    "embed_mediapipe": embed_mediapipe,
}


def main(argv):
    if len(argv) != 4 or argv[1] not in COMMANDS:
        sys.exit(f"usage: {argv[0]} {{{','.join(COMMANDS)}}} REQUEST.json REPLY.json")
    with open(argv[2], encoding="utf-8") as f:
        request = json.load(f)
    reply = COMMANDS[argv[1]](request)
    with open(argv[3], "w", encoding="utf-8") as f:
        json.dump(reply, f)


if __name__ == "__main__":
    main(sys.argv)
