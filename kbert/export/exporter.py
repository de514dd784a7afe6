"""`export_model`: one fine-tuned model folder to every artefact, each verified.

Output folder (written aside under a temporary name, renamed at the end):

| path | artefact |
| --- | --- |
| `1/`, `models.config` | SavedModel for TF Serving (`kbert.export.savedmodel`) |
| `tflite/model_<quantization>.tflite` | token-id TFLite models (`kbert.export.tflite`) |
| `tflite/model_text.tflite` | the string-in TFLite model (tf-text custom ops) |
| `onnx/model.onnx`, `onnx/model_int8.onnx` | fused ONNX, and its dynamic int8 version (`kbert.export.onnx`) |
| `vocab.txt`, `labels.json` | what a client of the token models needs |
| `rest_example.json`, `rest_example.md` | a TF Serving REST predict request and its response (the .md keeps TF Serving's number formatting) |
| `report.json`, `report.md` | the verification report (`kbert.export.verify`) |
"""

import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from kbert.export import onnx as onnx_export
from kbert.export import savedmodel, tflite, verify
from kbert.export.options import (
    DEFAULT_CALIBRATION_EXAMPLES,
    DEFAULT_LATENCY_RUNS,
    DEFAULT_THREADS,
    FORMATS,
    QUANTIZATIONS,
    SUPPORTED,
    parse_names,
)
from kbert.fileio import replace_folder
from kbert.models.encoder import ENCODER_INPUTS
from kbert.text import save_vocab
from kbert.training.finetune import FinetunedModel, encode_labels, read_labelled_csv

# Texts in the REST example.
REST_EXAMPLE_TEXTS = 2
BATCH_SIZE = 64


def export_model(
    model_dir,
    out,
    data,
    formats=FORMATS,
    quantizations=QUANTIZATIONS,
    calibration=None,
    max_examples=None,
    calibration_examples=DEFAULT_CALIBRATION_EXAMPLES,
    threads=DEFAULT_THREADS,
    latency_runs=DEFAULT_LATENCY_RUNS,
    text_column="text",
    label_column="label",
    log=print,
):
    """Exports `model_dir` to `out` in every requested format and verifies each artefact.

    Args:
        model_dir: str. A folder written by `kbert finetune`.
        out: str. The export folder, e.g. "saved_models/debian"; its base name
            is the TF Serving model name. Replaced if it exists.
        data: str. A labelled CSV the artefacts are verified on (dev set).
        formats: str ("savedmodel,onnx") or sequence of `FORMATS`.
        quantizations: str or sequence of `QUANTIZATIONS`; each format gets
            those it supports (`SUPPORTED`).
        calibration: str or None. CSV whose texts calibrate "int8" and "16x8"
            (the training set); defaults to `data`.
        max_examples: int or None. Verify on the first this many texts only.
        calibration_examples: int. Calibration texts used at most.
        threads: int. Threads of every runtime, for verification and latency.
        latency_runs: int. Timed batch-1 runs per artefact (after warm-up).
        log: callable taking one str, for progress lines.

    Returns:
        dict. The report, also written to `out/report.json` and `out/report.md`;
        `report["passed"]` is False when an artefact exceeds its budget.

    Example:
    >>> report = export_model("runs/debian-minilm", "saved_models/debian",
    ...                       data="data/debian-packages/dev.csv")  # doctest: +SKIP
    """
    formats = parse_names(formats, FORMATS, "format")
    quantizations = parse_names(quantizations, QUANTIZATIONS, "quantization")
    plan = [(f, q) for f in formats for q in quantizations if q in SUPPORTED[f]]
    if not plan:
        raise ValueError(
            f"formats {', '.join(formats)} have no quantization among {', '.join(quantizations)}; "
            + "; ".join(f"{f} supports {', '.join(SUPPORTED[f])}" for f in formats)
        )
    for name, value in (("threads", threads), ("latency_runs", latency_runs), ("calibration_examples", calibration_examples)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}; expected a positive integer")
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples={max_examples!r}; expected a positive integer or None")
    name = os.path.basename(os.path.normpath(out))
    if not name or name in (".", ".."):
        raise ValueError(f"out={out!r}; expected a folder path whose base name names the model")

    finetuned = _load_model_folder(model_dir)
    for label in finetuned.labels:
        if not isinstance(label, str) or not label or "\n" in label:
            raise ValueError(f"{model_dir}: label {label!r} cannot be served; expected one-line names")
    texts, labels = read_labelled_csv(data, text_column, label_column)
    texts, labels = texts[:max_examples], labels[:max_examples]
    label_ids = encode_labels(labels, finetuned.labels, data)
    calibration_texts = None
    if any(q in ("int8", "16x8") for f, q in plan):
        source = calibration or data
        calibration_texts, _ = read_labelled_csv(source, text_column, require_labels=False)
        calibration_texts = [t for t in calibration_texts if t.strip()][:calibration_examples]
        if not calibration_texts:
            raise ValueError(f"{source} has no calibration texts (all empty)")
    _set_tf_threads(threads)

    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".kbert-export-", dir=parent)
    scratch = tempfile.mkdtemp(prefix=".kbert-scratch-", dir=parent)
    try:
        report = _export(
            finetuned, staging, scratch, name, plan, texts, label_ids, calibration_texts,
            threads, latency_runs, log,
        )
        report.update(
            model=model_dir,
            data=data,
            calibration=(calibration or data) if calibration_texts else None,
            calibration_examples=len(calibration_texts) if calibration_texts else 0,
        )
        markdown = verify.write_report(
            report, os.path.join(staging, "report.json"), os.path.join(staging, "report.md")
        )
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log(markdown)
    return report


def _load_model_folder(model_dir):
    """`FinetunedModel.load`, with every failure as a one-line `ValueError`."""
    try:
        return FinetunedModel.load(model_dir)
    except ValueError as error:
        raise ValueError(str(error).strip().splitlines()[0]) from None
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(
            f"{model_dir}: kbert.json or labels.json is not what kbert finetune writes "
            f"({type(error).__name__}: {error})"
        ) from None


def _set_tf_threads(threads):
    """Pins TensorFlow's thread pools; only possible before TensorFlow first runs."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # already initialised: the report states the pools TensorFlow has


def _export(finetuned, folder, scratch, name, plan, texts, label_ids, calibration_texts, threads, latency_runs, log):
    features = _features(finetuned, texts)
    one = {key: value[:1] for key, value in features.items()}
    # Artefacts compute in float32; a model trained under mixed precision is
    # held to its float32 twin (same weights), and its own figures reported.
    model = finetuned.float32_model()

    def keras_scores(model):
        return verify.softmax(
            np.concatenate(
                [
                    model.predict_on_batch({k: v[i : i + BATCH_SIZE] for k, v in features.items()})
                    for i in range(0, len(texts), BATCH_SIZE)
                ]
            )
        )

    reference = keras_scores(model)
    keras_figures = verify.compare(reference, reference, label_ids, finetuned.labels)
    keras_figures["compute_dtype"] = "float32"
    keras_figures["latency"] = verify.measure_latency(
        lambda: model.predict_on_batch(one), latency_runs
    )
    if model is not finetuned.model:
        trained = verify.compare(keras_scores(finetuned.model), reference, label_ids, finetuned.labels)
        keras_figures["as_trained"] = {"compute_dtype": finetuned.compute_dtype, **trained}
    tf_threads = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
    keras_figures["latency"]["threads"] = tf_threads
    save_vocab(finetuned.vocabulary, os.path.join(folder, "vocab.txt"))
    with open(os.path.join(folder, "labels.json"), "w") as f:
        json.dump(finetuned.labels, f, indent=2)

    entries = []

    def add(path, fmt, quantization, input_kind, scores, latency, **extra):
        entry = {
            "path": os.path.relpath(path, folder),
            "format": fmt,
            "quantization": quantization,
            "input": input_kind,
            **verify.compare(scores, reference, label_ids, finetuned.labels),
            "size_bytes": _size(path),
            "latency": latency,
            **extra,
        }
        entries.append(verify.judge(entry, keras_figures["accuracy"]))
        log(
            f"{entry['path']}: max abs diff {entry['max_abs_diff']:.2e}, accuracy "
            f"{100 * entry['accuracy']:.2f}%, {entry['latency']['median_ms']:.2f} ms"
        )

    formats = {f for f, _ in plan}
    onnx_fusions = None
    if "savedmodel" in formats or "onnx" in formats:
        keep = "savedmodel" in formats
        base = folder if keep else os.path.join(scratch, "savedmodel")
        log("SavedModel: tracing and saving")
        version_dir = savedmodel.export_savedmodel(finetuned, base, name, texts, scratch)
        if keep:
            loaded = savedmodel.load_savedmodel(version_dir)
            savedmodel.saved_model_cli_show(version_dir)
            text_fn = loaded.signatures[savedmodel.TEXT_SIGNATURE]
            tokens_fn = loaded.signatures[savedmodel.TOKENS_SIGNATURE]
            scores = np.concatenate(
                [text_fn(text=tf.constant(texts[i : i + BATCH_SIZE]))["scores"].numpy() for i in range(0, len(texts), BATCH_SIZE)]
            )
            token_scores = np.concatenate(
                [
                    tokens_fn(**{k: tf.constant(v[i : i + BATCH_SIZE]) for k, v in features.items()})["scores"].numpy()
                    for i in range(0, len(texts), BATCH_SIZE)
                ]
            )
            for request in savedmodel.read_warmup_requests(version_dir):
                text_fn(text=tf.make_ndarray(request.inputs[savedmodel.TEXT_INPUT]))
            one_tensors = {k: tf.constant(v) for k, v in one.items()}
            latency = verify.measure_latency(lambda: tokens_fn(**one_tensors), latency_runs)
            text_latency = verify.measure_latency(
                lambda: text_fn(text=tf.constant(texts[:1])), latency_runs
            )
            latency["threads"] = text_latency["threads"] = tf_threads
            add(
                version_dir, "savedmodel", "none", "text", scores, latency,
                max_abs_diff_tokens=float(np.abs(token_scores - reference).max()),
                text_latency=text_latency,
                signatures=[savedmodel.TEXT_SIGNATURE, savedmodel.TOKENS_SIGNATURE],
            )
            request, response = savedmodel.rest_predict_example(loaded, rest_example_texts(texts))
            with open(os.path.join(folder, "rest_example.json"), "w", encoding="utf-8") as f:
                json.dump({"request": json.loads(request), "response": json.loads(response)}, f, indent=2, ensure_ascii=False)
            with open(os.path.join(folder, "rest_example.md"), "w", encoding="utf-8") as f:
                f.write(_rest_markdown(name, request, response))

        if "onnx" in formats:
            log("ONNX: converting with tf2onnx and fusing with onnxruntime")
            onnx_dir = os.path.join(folder, "onnx")
            os.makedirs(onnx_dir)
            raw = os.path.join(scratch, "raw.onnx")
            onnx_export.convert_savedmodel_to_onnx(version_dir, raw)
            keep_fused = ("onnx", "none") in plan
            fused = os.path.join(onnx_dir if keep_fused else scratch, "model.onnx")
            onnx_fusions = onnx_export.optimize_onnx(raw, fused, finetuned.config)
            paths = {"none": fused} if keep_fused else {}
            if ("onnx", "dynamic") in plan:
                paths["dynamic"] = os.path.join(onnx_dir, "model_int8.onnx")
                onnx_export.quantize_onnx(fused, paths["dynamic"])
            for quantization, path in paths.items():
                runner = onnx_export.OnnxRunner(path, threads)
                logits = np.concatenate(
                    [runner.logits({k: v[i : i + BATCH_SIZE] for k, v in features.items()}) for i in range(0, len(texts), BATCH_SIZE)]
                )
                latency = verify.measure_latency(lambda: runner.logits(one), latency_runs)
                latency["threads"] = threads
                add(path, "onnx", quantization, "tokens", verify.softmax(logits), latency, opset=onnx_export.ONNX_OPSET)

    tflite_quantizations = [q for f, q in plan if f == "tflite"]
    if tflite_quantizations:
        tflite_dir = os.path.join(folder, "tflite")
        source = os.path.join(scratch, "tflite_tokens")
        log("TFLite: writing the converter's SavedModel")
        tflite.write_token_source(finetuned.model, finetuned.sequence_length, source)
        calibration = _features(finetuned, calibration_texts) if calibration_texts else None
        for quantization in tflite_quantizations:
            log(f"TFLite: converting ({quantization})")
            path = os.path.join(tflite_dir, f"model_{quantization}.tflite")
            model_bytes = tflite.convert_tokens(source, quantization, calibration)
            ops = tflite.check_ops(model_bytes)
            tflite.write_bytes(path, model_bytes)
            runner = tflite.TfliteRunner(path, threads)
            latency = verify.measure_latency(lambda: runner.logits(one), latency_runs)
            latency["threads"] = threads
            add(path, "tflite", quantization, "tokens", verify.softmax(runner.logits(features)), latency, ops=ops)
        if "none" in tflite_quantizations:
            log("TFLite: converting the text variant")
            source = os.path.join(scratch, "tflite_text")
            tflite.write_text_source(finetuned, source)
            model_bytes = tflite.convert_text(source)
            ops = tflite.check_ops(model_bytes, allowed_custom=tflite.TEXT_CUSTOM_OPS)
            path = os.path.join(tflite_dir, "model_text.tflite")
            tflite.write_bytes(path, model_bytes)
            runner = tflite.TfliteRunner(path, threads, text=True)
            latency = verify.measure_latency(lambda: runner.text_logits(texts[:1]), latency_runs)
            latency["threads"] = threads
            add(
                path, "tflite", "none", "text", verify.softmax(runner.text_logits(texts)), latency,
                ops=ops, tokenizer="tf-text FastBertTokenizer",
            )

    return {
        "name": name,
        "sequence_length": finetuned.sequence_length,
        "examples": len(texts),
        "threads": threads,
        "latency_runs": latency_runs,
        "keras": keras_figures,
        "artefacts": entries,
        "onnx_fusions": onnx_fusions,
        "onnx_all_blocks_fused": (
            None if onnx_fusions is None else onnx_export.all_blocks_fused(onnx_fusions, finetuned.config)
        ),
        "passed": all(entry["passed"] for entry in entries),
    }


def rest_example_texts(texts):
    """The first sentence of the first `REST_EXAMPLE_TEXTS` texts: short enough for a README."""
    return [text.split(". ")[0].rstrip(".") + "." for text in texts[:REST_EXAMPLE_TEXTS]]


def _features(finetuned, texts):
    """Packed int32 arrays for `texts`, by the model's own preprocessor."""
    batches = [finetuned.preprocessor(tf.constant(texts[i : i + 256])) for i in range(0, len(texts), 256)]
    return {name: np.concatenate([b[name].numpy() for b in batches]).astype(np.int32) for name in ENCODER_INPUTS}


def _size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(root, file)) for root, _, files in os.walk(path) for file in files
    )


def _rest_markdown(name, request, response):
    return (
        f"POST /v1/models/{name}:predict\n\n```json\n{request}\n```\n\n"
        f"Response:\n\n```json\n{response}\n```\n"
    )
