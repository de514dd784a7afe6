"""`export_model`: one model folder to every artefact its task has, each verified.

Output folder (written aside under a temporary name, renamed at the end):

| path | artefact |
| --- | --- |
| `1/`, `models.config` | SavedModel for TF Serving (`kbert.export.savedmodel`) |
| `tflite/model_<quantization>.tflite` | token-id TFLite models (`kbert.export.tflite`) |
| `tflite/model_text.tflite` | the string-in TFLite model (tf-text custom ops) |
| `onnx/model.onnx`, `onnx/model_int8.onnx` | fused ONNX, and its dynamic int8 version (`kbert.export.onnx`) |
| `mediapipe/` | for tasks MediaPipe runs: the `.tflite` with MediaPipe's metadata (`kbert.export.mediapipe`) |
| `vocab.txt` and the task's files (`labels.txt`) | what a client of the token models needs |
| `rest_example.json`, `rest_example.md` | a TF Serving REST predict request and its response (the .md keeps TF Serving's number formatting) |
| `report.json`, `report.md` | the verification report (`kbert.export.verify`) |
| `.kbert-manifest.json` | the files kbert wrote: what `--overwrite` may replace (`kbert.fileio`) |

Every artefact runs on the same examples as the Keras model; the task says
what it must reproduce and what a quantized one may lose (`Serving.judge`, `kbert.export.serving`).
"""

import os
import shutil

import numpy as np
import tensorflow as tf

from kbert.export import onnx as onnx_export
from kbert.export import savedmodel, tflite, verify
from kbert.export.options import (
    CALIBRATED,
    DEFAULT_CALIBRATION_EXAMPLES,
    DEFAULT_LATENCY_RUNS,
    DEFAULT_THREADS,
    EXPORT_FOLDER_NAMES,
    FORMATS,
    QUANTIZATIONS,
    REPORT_FILE,
    SUPPORTED,
    VOCAB_ASSET,
    check_export,
    is_export_folder,
    parse_names,
    task_formats,
)
from kbert.export.serving import serving_for
from kbert.fileio import staged_folder
from kbert.modelfolder import open_model
from kbert.tasks.base import INFERENCE_BATCH_SIZE as BATCH_SIZE
from kbert.text import save_vocab

# Examples in the REST example.
REST_EXAMPLES = 2


def export_model(
    model_dir,
    out,
    data,
    formats=None,
    quantizations=QUANTIZATIONS,
    calibration=None,
    max_examples=None,
    calibration_examples=DEFAULT_CALIBRATION_EXAMPLES,
    threads=DEFAULT_THREADS,
    latency_runs=DEFAULT_LATENCY_RUNS,
    options=None,
    overwrite=False,
    cache_dir=None,
    log=print,
    task=None,
    sequence_length=None,
):
    """Exports `model_dir` to `out` in every requested format and verifies each artefact.

    Args:
        model_dir: str. A folder written by `kbert finetune`; with `task`
            naming a task that needs no training, also a pretrained checkpoint
            (`kbert.modelfolder.open_model`).
        out: str. The export folder, e.g. "saved_models/debian"; its base name
            is the TF Serving model name. A new or empty folder, or (with
            `overwrite`) an earlier export; anything else is refused.
        data: str. Labelled data in the task's format to verify on (dev set).
        formats: str ("savedmodel,onnx"), sequence of `FORMATS`, or None for
            every format the task has (`task_formats`).
        quantizations: str or sequence of `QUANTIZATIONS`; each format gets
            those it supports (`SUPPORTED`).
        calibration: str or None. Data whose inputs calibrate "int8" and
            "16x8" (the training set); defaults to `data`.
        max_examples: int or None. Verify on the first this many examples only.
        calibration_examples: int. Calibration examples used at most.
        threads: int. Threads of every runtime, for verification and latency.
        latency_runs: int. Timed batch-1 runs per artefact (after warm-up).
        options: dict. The task's data options; default: as the model was trained.
        overwrite: bool. Replace `out` if it is an earlier export.
        cache_dir: str. Where MediaPipe's private environments live.
        log: callable taking one str, for progress lines.
        task: str or None. The task to export (default: the model folder's).
        sequence_length: int or None. Packed length (default: the model's own).

    Returns:
        dict. The report, also written to `out/report.json` and `out/report.md`;
        `report["passed"]` is False when an artefact exceeds its budget.

    Example:
    >>> report = export_model("runs/debian-minilm", "saved_models/debian",
    ...                       data="data/debian-packages/dev.csv")  # doctest: +SKIP
    """
    for key, value in (("threads", threads), ("latency_runs", latency_runs), ("calibration_examples", calibration_examples)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r}; expected a positive integer")
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples={max_examples!r}; expected a positive integer or None")
    quantizations = check_export(model_dir, out, data, calibration, formats, quantizations, overwrite)
    name = os.path.basename(os.path.normpath(out))

    folder = _load_model_folder(model_dir, task, options, sequence_length)
    task = folder.task
    plan = _plan(task, formats, quantizations, log)
    options = folder.use_options(options)
    examples = task.read(data, options)[:max_examples]
    task.check(examples, data)
    calibration_set = None
    if any(q in CALIBRATED for _, q in plan):
        calibration_set = task.read(calibration or data, options, targets=False)[:calibration_examples]
    _set_tf_threads(threads)

    with staged_folder(out, is_export_folder, overwrite, what="export", known_names=EXPORT_FOLDER_NAMES) as staging:
        scratch = os.path.join(staging, ".scratch")
        os.makedirs(scratch)
        report = _export(
            folder, staging, scratch, name, plan, examples, calibration_set, threads, latency_runs,
            cache_dir, log,
        )
        shutil.rmtree(scratch)
        report.update(
            model=model_dir,
            data=data,
            calibration=(calibration or data) if calibration_set else None,
            calibration_examples=len(calibration_set) if calibration_set else 0,
        )
        markdown = verify.write_report(
            report, os.path.join(staging, REPORT_FILE), os.path.join(staging, "report.md")
        )
    log(markdown)
    return report


def _plan(task, formats, quantizations, log):
    """The `(format, quantization)` steps to run: those the task has and supports.

    A step the task cannot convert (`Serving.tflite_unsupported`), or a
    quantization it has no metric budget for, is logged and skipped;
    `ValueError` if no step is left.
    """
    available = task_formats(task)
    formats = parse_names(formats or available, FORMATS, "format")
    missing = [f for f in formats if f not in available]
    if missing:
        raise ValueError(
            f"task {task.name!r} has no {missing[0]} export; it exports to {', '.join(available)}"
        )
    unsupported = {("tflite", q): why for q, why in serving_for(task).tflite_unsupported().items()}
    plan = [(f, q) for f in formats for q in quantizations if q in SUPPORTED[f]]
    for step in plan:  # a quantized artefact is judged by what the task allows it to lose
        if step[1] != "none" and step[1] not in task.budgets:
            unsupported.setdefault(step, f"task {task.name!r} declares no {task.metric} budget for it (Task.budgets)")
    skipped = [step for step in plan if step in unsupported]
    plan = [step for step in plan if step not in unsupported]
    if skipped and not plan:
        raise ValueError(f"{skipped[0][0]} {skipped[0][1]}: {unsupported[skipped[0]]}")
    for step in skipped:
        log(f"{step[0]} {step[1]}: skipped: {unsupported[step]}")
    if not plan:
        raise ValueError(
            f"formats {', '.join(formats)} have no quantization among {', '.join(quantizations)}; "
            + "; ".join(f"{f} supports {', '.join(SUPPORTED[f])}" for f in formats)
        )
    return plan


def _load_model_folder(model_dir, task, options, sequence_length):
    """`open_model`, with every failure as a one-line `ValueError`."""
    try:
        return open_model(model_dir, task, options, sequence_length)
    except ValueError as error:
        raise ValueError(str(error).strip().splitlines()[0]) from None


def _set_tf_threads(threads):
    """Pins TensorFlow's thread pools; only possible before TensorFlow first runs."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # already initialised: the report states the pools TensorFlow has


def _in_batches(call, features):
    """`call` on `BATCH_SIZE` rows at a time; its dict outputs concatenated."""
    rows = len(next(iter(features.values())))
    chunks = [call({k: v[i : i + BATCH_SIZE] for k, v in features.items()}) for i in range(0, rows, BATCH_SIZE)]
    return {name: np.concatenate([np.asarray(chunk[name]) for chunk in chunks]) for name in chunks[0]}


def _export(folder, staging, scratch, name, plan, examples, calibration_set, threads, latency_runs, cache_dir, log):
    """Writes every artefact of `plan` into `staging`, each held to the Keras model; the report."""
    reference = _keras_reference(folder, examples, staging, latency_runs, log)
    _write_client_files(folder, staging)
    formats = {f for f, _ in plan}
    entries, onnx_fusions = [], None
    if "savedmodel" in formats or "onnx" in formats:
        keep = "savedmodel" in formats
        base = staging if keep else os.path.join(scratch, "savedmodel")
        log("SavedModel: tracing and saving")
        version_dir = savedmodel.export_savedmodel(folder, base, name, examples, scratch)
        loaded = savedmodel.load_savedmodel(version_dir)
        if keep:
            entries += _verify_savedmodel(reference, name, version_dir, loaded)
        if "onnx" in formats:
            onnx_entries, onnx_fusions = _write_onnx(reference, folder, version_dir, loaded, plan, scratch, threads)
            entries += onnx_entries
    tflite_quantizations = [q for f, q in plan if f == "tflite"]
    if tflite_quantizations:
        entries += _write_tflite(reference, folder, tflite_quantizations, calibration_set, scratch, threads)
        if "none" in tflite_quantizations and serving_for(folder.task).tflite_text_variant:
            entries += _write_tflite_text(reference, folder, scratch, threads)
    if "mediapipe" in formats:
        entries += _write_mediapipe(reference, folder, cache_dir)
    return _report(reference, folder, name, entries, onnx_fusions, threads, latency_runs)


def _keras_reference(folder, examples, staging, latency_runs, log):
    """Runs the float32 Keras model on `examples`: its outputs, figures and latency."""
    task = folder.task
    encoded = task.encode(examples, targets=False)
    one = {key: value[:1] for key, value in encoded.features.items()}
    # Artefacts compute in float32; a model trained under mixed precision is
    # held to its float32 twin (same weights), and its own figures reported.
    model = folder.float32_model()
    outputs = task.run(model, encoded.features, BATCH_SIZE)
    tf_threads = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
    reference = verify.KerasReference(
        task, examples, encoded, one, outputs, task.decode(examples, encoded, outputs),
        staging, latency_runs, tf_threads, log,
    )
    keras_figures = reference.keras
    keras_figures.update(reference.figures(predictions=reference.predictions))
    keras_figures["compute_dtype"] = "float32"
    keras_figures["latency"] = _latency(lambda: model.predict_on_batch(one), latency_runs, tf_threads)
    if model is not folder.model:
        trained = task.run(folder.model, encoded.features, BATCH_SIZE)
        keras_figures["as_trained"] = {
            "compute_dtype": folder.compute_dtype, **serving_for(task).agreement(trained, outputs), **reference.figures(trained)
        }
    return reference


def _write_client_files(folder, staging):
    """What a client of the token models needs: `vocab.txt` and the task's files."""
    save_vocab(folder.vocabulary, os.path.join(staging, VOCAB_ASSET))
    for file_name, content in serving_for(folder.task).assets().items():
        with open(os.path.join(staging, file_name), "w", encoding="utf-8") as f:
            f.write(content)


def _verify_savedmodel(reference, name, version_dir, loaded):
    """The SavedModel's entry (text signature, tokens signature, warm-up requests
    run), and its REST example written beside it."""
    task, examples = reference.task, reference.examples
    text_fn = loaded.signatures[savedmodel.TEXT_SIGNATURE]
    tokens_fn = loaded.signatures[savedmodel.TOKENS_SIGNATURE]
    savedmodel.saved_model_cli_show(version_dir, task.text_inputs, sorted(text_fn.structured_outputs))

    def call_text(strings):
        return text_fn(**{k: tf.constant(v) for k, v in strings.items()})

    text_outputs = serving_for(task).text_outputs(call_text, examples, BATCH_SIZE)
    token_outputs = _in_batches(
        lambda batch: tokens_fn(**{k: tf.constant(v) for k, v in batch.items()}), reference.features
    )
    for request in savedmodel.read_warmup_requests(version_dir):
        text_fn(**{k: tf.make_ndarray(v) for k, v in request.inputs.items()})
    one_tensors = {k: tf.constant(v) for k, v in reference.one.items()}
    latency = _latency(lambda: tokens_fn(**one_tensors), reference.latency_runs, reference.tf_threads)
    first = {k: v[:1] for k, v in serving_for(task).strings(examples[:1]).items()}
    text_latency = _latency(lambda: call_text(first), reference.latency_runs, reference.tf_threads)
    entry = reference.artefact(
        version_dir, "savedmodel", "none", "text", text_outputs, latency,
        max_abs_diff_tokens=serving_for(task).agreement(token_outputs, reference.outputs)["max_abs_diff"],
        text_latency=text_latency,
        signatures=[savedmodel.TEXT_SIGNATURE, savedmodel.TOKENS_SIGNATURE],
    )
    instances = [_shorten(task.serving_request(e)) for e in examples[:REST_EXAMPLES]]
    request, response = savedmodel.rest_predict_example(loaded, instances)
    _write_rest_example(reference.staging, name, request, response)
    return [entry]


def _write_onnx(reference, folder, version_dir, loaded, plan, scratch, threads):
    """The ONNX models of `plan` converted from the SavedModel, fused, and their entries.

    Returns:
        (entries, fusions): the report entries, and `optimize_onnx`'s fusion counts.
    """
    reference.log("ONNX: converting with tf2onnx and fusing with onnxruntime")
    tokens_fn = loaded.signatures[savedmodel.TOKENS_SIGNATURE]
    # The numbers served, and the task's own outputs whatever their dtype (fill-mask's word ids).
    numeric = [n for n, spec in tokens_fn.structured_outputs.items()
               if spec.dtype.is_floating or n in folder.task.outputs]
    onnx_dir = os.path.join(reference.staging, "onnx")
    os.makedirs(onnx_dir)
    raw = os.path.join(scratch, "raw.onnx")
    onnx_export.convert_savedmodel_to_onnx(version_dir, raw, numeric)
    keep_fused = ("onnx", "none") in plan
    fused = os.path.join(onnx_dir if keep_fused else scratch, "model.onnx")
    fusions = onnx_export.optimize_onnx(raw, fused, folder.config)
    paths = {"none": fused} if keep_fused else {}
    if ("onnx", "dynamic") in plan:
        paths["dynamic"] = os.path.join(onnx_dir, "model_int8.onnx")
        onnx_export.quantize_onnx(fused, paths["dynamic"])
    outputs_of = reference.task.outputs
    entries = []
    for quantization, path in paths.items():
        runner = onnx_export.OnnxRunner(path, threads)
        outputs = _in_batches(lambda batch: runner.run(batch, outputs_of), reference.features)
        latency = _latency(lambda: runner.run(reference.one, outputs_of), reference.latency_runs, threads)
        entries.append(
            reference.artefact(path, "onnx", quantization, "tokens", outputs, latency, opset=onnx_export.ONNX_OPSET)
        )
    return entries, fusions


def _write_tflite(reference, folder, quantizations, calibration_set, scratch, threads):
    """The token-id TFLite model in each of `quantizations`, and their entries."""
    task = folder.task
    source = os.path.join(scratch, "tflite_tokens")
    reference.log("TFLite: writing the converter's SavedModel")
    tflite.write_token_source(task, folder.model, folder.sequence_length, source)
    calibration = task.encode(calibration_set, targets=False).features if calibration_set else None
    entries = []
    for quantization in quantizations:
        reference.log(f"TFLite: converting ({quantization})")
        path = os.path.join(reference.staging, "tflite", f"model_{quantization}.tflite")
        model_bytes = tflite.convert_tokens(source, quantization, calibration, threads)
        ops = tflite.check_ops(model_bytes)
        tflite.write_bytes(path, model_bytes)
        runner = tflite.TfliteRunner(path, threads)
        latency = _latency(lambda: runner.run(reference.one), reference.latency_runs, threads)
        entries.append(
            reference.artefact(path, "tflite", quantization, "tokens", runner.run(reference.features), latency, ops=ops)
        )
    return entries


def _write_tflite_text(reference, folder, scratch, threads):
    """The string-in TFLite model (tf-text's tokenizer inside), and its entry."""
    task, examples = folder.task, reference.examples
    reference.log("TFLite: converting the text variant")
    source = os.path.join(scratch, "tflite_text")
    tflite.write_text_source(folder, source)
    model_bytes = tflite.convert_text(source)
    ops = tflite.check_ops(model_bytes, allowed_custom=tflite.TEXT_CUSTOM_OPS)
    path = os.path.join(reference.staging, "tflite", "model_text.tflite")
    tflite.write_bytes(path, model_bytes)
    runner = tflite.TfliteRunner(path, threads, text=True)
    first = {k: v[:1] for k, v in serving_for(task).strings(examples[:1]).items()}
    latency = _latency(lambda: runner.run_text(first), reference.latency_runs, threads)
    outputs = serving_for(task).text_outputs(runner.run_text, examples, 1)
    # Held to Keras where its tokenizer gives kbert's word pieces (when
    # the strings are the outputs' rows); the others are counted.
    differ = tflite.text_token_differences(folder, serving_for(task).strings(examples))
    rows = len(reference.outputs[task.outputs[0]])
    agree = ~differ if len(differ) == rows else np.ones(rows, bool)
    return [reference.artefact(
        path, "tflite", "none", "text", outputs, latency,
        **serving_for(task).agreement({k: v[agree] for k, v in outputs.items()}, {k: v[agree] for k, v in reference.outputs.items()}),
        texts_whose_token_ids_differ=int(differ.sum()),
        ops=ops, tokenizer="tf-text FastBertTokenizer",
    )]


def _write_mediapipe(reference, folder, cache_dir):
    """The task's on-device files (`kbert.export.on_device`), and their entries."""
    from kbert.export import mediapipe, on_device

    reference.log("MediaPipe: writing the file with MediaPipe's metadata and running it")
    entries = []
    for entry in on_device.export_for_task(
        folder, os.path.join(reference.staging, mediapipe.FOLDER), reference.examples, reference.outputs, cache_dir
    ):
        entry.update(reference.judged(predictions=entry.pop("predictions")))
        entry["non_finite"] = reference.non_finite(entry.pop("outputs"))
        entry["path"] = os.path.relpath(entry["path"], reference.staging)
        entries.append(reference.judge(entry))
    return entries


def _report(reference, folder, name, entries, onnx_fusions, threads, latency_runs):
    """The report of the run, before `export_model` adds its inputs."""
    task = folder.task
    return {
        "name": name,
        "task": task.name,
        "metric": task.metric,
        "metric_scale": task.metric_scale,
        "figures": list(reference.figures(predictions=reference.predictions)),
        "sequence_length": folder.sequence_length,
        "examples": len(reference.examples),
        "threads": threads,
        "latency_runs": latency_runs,
        "machine": verify.machine(),
        "keras": reference.keras,
        "artefacts": entries,
        "onnx_fusions": onnx_fusions,
        "onnx_all_blocks_fused": (
            None if onnx_fusions is None else onnx_export.all_blocks_fused(onnx_fusions, folder.config)
        ),
        "passed": all(entry["passed"] for entry in entries),
    }


def _latency(call, runs, threads):
    """`verify.measure_latency` of `call`, with the threads it ran on."""
    latency = verify.measure_latency(call, runs)
    latency["threads"] = threads
    return latency


def _shorten(instance):
    """Each string of a REST instance cut after its first sentence: short enough for a README."""
    return {name: _first_sentence(text) for name, text in instance.items()}


def _first_sentence(text):
    first = text.split(". ")[0]
    if first == text and text.endswith(("?", "!")):  # a question stays one
        return text
    return first.rstrip(".") + "."


def _write_rest_example(staging, name, request, response):
    import json

    with open(os.path.join(staging, "rest_example.json"), "w", encoding="utf-8") as f:
        json.dump({"request": json.loads(request), "response": json.loads(response)}, f, indent=2, ensure_ascii=False)
    with open(os.path.join(staging, "rest_example.md"), "w", encoding="utf-8") as f:
        f.write(
            f"POST /v1/models/{name}:predict\n\n```json\n{request}\n```\n\n"
            f"Response:\n\n```json\n{response}\n```\n"
        )
