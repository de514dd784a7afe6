"""`export_model`: one model folder to the artefacts its task has, each verified.

Output folder (built in a work folder beside it, `kbert.export.resume`, and
renamed into place at the end):

| path | artefact |
| --- | --- |
| `1/`, `models.config` | SavedModel for TF Serving (`kbert.export.savedmodel`) |
| `tflite/model_<quantization>.tflite` | token-id TFLite models (`kbert.export.tflite`) |
| `tflite/model_text.tflite` | the string-in TFLite model (tf-text custom ops) |
| `onnx/model.onnx`, `onnx/model_int8.onnx` | fused ONNX, and its dynamic int8 version (`kbert.export.onnx`) |
| `mediapipe/` | for tasks MediaPipe runs: the `.tflite` with MediaPipe's metadata (`kbert.export.mediapipe`) |
| `web/` | beside a MediaPipe text classifier or embedder: a page that runs it in a browser (`kbert.export.web`) |
| `huggingface/` | with `--formats huggingface` only: a transformers folder (`kbert.export.huggingface`) |
| `keras-hub/` | with `--formats keras-hub` only: a keras-hub preset (`kbert.export.keras_hub_preset`) |
| `vocab.txt` and the task's files (`labels.txt`) | what a client of the token models needs |
| `rest_example.json`, `rest_example.md` | a TF Serving REST predict request and its response (the .md keeps TF Serving's number formatting) |
| `report.json`, `report.md`, `report.png` | the verification report (`kbert.export.verify`), and its chart of each file's size, latency and metric (`kbert.plots`) |
| `README.md` | the model card, with each file's size, latency and metric (`kbert.modelcard`) |
| `.kbert-steps.json` | each verified step's fingerprint and files: what a later run may reuse (`kbert.export.resume`) |
| `.kbert-manifest.json` | the files kbert wrote: what `--overwrite` may replace (`kbert.fileio`) |

Every artefact runs on the same examples as the Keras model; the task says
what it must reproduce and what a quantized one may lose (`Serving.judge`, `kbert.export.serving`).
Each is written and verified in turn (`kbert.export.steps`); an interrupted
run keeps those verified, and the same command reuses them.
"""

import dataclasses
import hashlib
import os

import keras
import numpy as np
import tensorflow as tf

from kbert.export import onnx as onnx_export
from kbert.export import resume, steps, verify, web
from kbert.export.options import (
    CALIBRATED,
    DEFAULT_CALIBRATION_EXAMPLES,
    DEFAULT_LATENCY_RUNS,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_THREADS,
    FORMATS,
    ON_REQUEST,
    REPORT_FILE,
    SUPPORTED,
    VOCAB_ASSET,
    check_export,
    parse_names,
    task_formats,
)
from kbert.export.serving import serving_for
from kbert.logs import to_stderr
from kbert.modelcard import write_export_card
from kbert.modelfolder import open_model
from kbert.tasks.base import INFERENCE_BATCH_SIZE as BATCH_SIZE
from kbert.text import save_vocab

# The order artefacts are made and reported in: the SavedModel first (ONNX
# converts from it), the on-device files last (their first run installs tools).
STEP_ORDER = ("savedmodel", "onnx", "tflite", "mediapipe", "huggingface", "keras-hub")
# The TFLite text variant's step, after the token-id files.
TEXT_VARIANT = "text"
# Rows of the Keras reference pass between progress updates: a few batches,
# so rows still run in batches of similar length.
REFERENCE_ROWS_PER_CALL = 4 * BATCH_SIZE


def export_model(
    model_dir,
    out,
    data,
    formats=None,
    quantizations=None,
    calibration=None,
    max_examples=DEFAULT_MAX_EXAMPLES,
    calibration_examples=DEFAULT_CALIBRATION_EXAMPLES,
    threads=DEFAULT_THREADS,
    latency_runs=DEFAULT_LATENCY_RUNS,
    options=None,
    overwrite=False,
    cache_dir=None,
    log=None,
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
            every format the task has (`task_formats`); "huggingface" (a
            transformers folder) and "keras-hub" (a keras-hub preset) only
            when named (`ON_REQUEST`).
        quantizations: None or "recommended" (float32, dynamic int8, and
            int8 where the task has a budget for it), "all", or a str or
            sequence of `QUANTIZATIONS`; each format gets those it supports
            (`SUPPORTED`; `kbert.export.options.parse_quantizations`).
        calibration: str or None. Data whose inputs calibrate "int8" and
            "16x8" (the training set); defaults to `data`.
        max_examples: int or None. Verify on the first this many examples
            (default `DEFAULT_MAX_EXAMPLES`); None: on all of them.
        calibration_examples: int. Calibration examples used at most.
        threads: int. Threads of every runtime, for verification and latency.
        latency_runs: int. Timed batch-1 runs per artefact (after warm-up).
        options: dict. The task's data options; default: as the model was trained.
        overwrite: bool. Replace `out` if it is an earlier export (its
            artefacts made from the same inputs are reused).
        cache_dir: str. Where MediaPipe's private environments live.
        log: callable taking one str, for progress lines; default: standard
            error, with a progress bar on a terminal.
        task: str or None. The task to export (default: the model folder's).
        sequence_length: int or None. Packed length (default: the model's own).

    Returns:
        dict. The report, also written to `out/report.json` and `out/report.md`;
        `report["passed"]` is False when an artefact exceeds its budget.

    A run stopped on its way keeps the artefacts it verified in a folder
    beside `out` (`kbert.export.resume`); the same call reuses them.

    Example:
    >>> report = export_model("runs/debian-minilm", "saved_models/debian",
    ...                       data="data/debian-packages/dev.csv")  # doctest: +SKIP
    """
    for key, value in (("threads", threads), ("latency_runs", latency_runs), ("calibration_examples", calibration_examples)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r}; expected a positive integer")
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples={max_examples!r}; expected a positive integer or None")
    log = log or to_stderr
    quantizations, text_variant = check_export(model_dir, out, data, calibration, formats, quantizations, overwrite)
    name = os.path.basename(os.path.normpath(out))

    folder = _load_model_folder(model_dir, task, options, sequence_length)
    task = folder.task
    plan = _plan(task, formats, quantizations, log, text_variant)
    if any(fmt == "huggingface" for fmt, _ in plan):
        from kbert.export.huggingface import check_exportable

        check_exportable(folder)  # a head transformers cannot compute is refused before any work
    if any(fmt == "keras-hub" for fmt, _ in plan):
        from kbert.export import keras_hub_preset

        keras_hub_preset.check_exportable(folder)  # and one keras-hub cannot compute
    options = folder.use_options(options)
    examples = task.read(data, options)[:max_examples]
    task.check(examples, data)
    calibration_set = None
    if any(q in CALIBRATED for _, q in plan):
        calibration_set = task.read(calibration or data, options, targets=False)[:calibration_examples]
    _set_tf_threads(threads)

    work = resume.WorkFolder(out, overwrite, log)
    work.open()
    try:
        report = _export(folder, work, name, plan, examples, calibration_set, threads, latency_runs, cache_dir, log)
        report.update(
            model=model_dir,
            data=data,
            calibration=(calibration or data) if calibration_set else None,
            calibration_examples=len(calibration_set) if calibration_set else 0,
        )
        markdown = verify.write_report(
            report, os.path.join(work.path, REPORT_FILE), os.path.join(work.path, "report.md")
        )
        write_export_card(work.path, folder, report)  # README.md: the model card, with each file's figures
        work.finish()
    except BaseException:
        work.leave()
        raise
    log(markdown)
    return report


def _plan(task, formats, quantizations, log, text_variant=False):
    """The `(format, quantization)` steps to run, in `STEP_ORDER`: those the task
    has and supports, and `("tflite", TEXT_VARIANT)` for the string-in TFLite
    file where `text_variant`, "none" is planned and the task has one.

    A step the task cannot convert (`Serving.tflite_unsupported`), or a
    quantization it has no metric budget for, is logged and skipped;
    `ValueError` if no step is left.
    """
    available = task_formats(task)
    formats = parse_names(formats or available, FORMATS, "format")
    missing = [f for f in formats if f not in available and f not in ON_REQUEST]
    if missing:
        raise ValueError(
            f"task {task.name!r} has no {missing[0]} export; it exports to {', '.join(available)}"
        )
    unsupported = {("tflite", q): why for q, why in serving_for(task).tflite_unsupported().items()}
    ordered = sorted(formats, key=STEP_ORDER.index)
    plan = [(f, q) for f in ordered for q in quantizations if q in SUPPORTED[f]]
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
    if text_variant and ("tflite", "none") in plan and serving_for(task).tflite_text_variant:
        last = max(i for i, (f, _) in enumerate(plan) if f == "tflite")
        plan.insert(last + 1, ("tflite", TEXT_VARIANT))
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


def _export(folder, work, name, plan, examples, calibration_set, threads, latency_runs, cache_dir, log):
    """Makes (or reuses) every step of `plan` in `work`, each held to the Keras model; the report."""
    common = resume.fingerprint(
        model_fingerprint(folder), repr(examples), name, threads, latency_runs, resume.code_fingerprint()
    )
    reference = _keras_reference(folder, examples, work, common, latency_runs, log)
    keys = [_key(step) for step in plan]
    sources = steps.Sources(folder, work, name, examples, log, set(keys))
    calibration = folder.task.encode(calibration_set, targets=False).features if calibration_set else None
    calibrated = resume.fingerprint(repr(calibration_set)) if calibration_set else None
    records = []
    for (fmt, quantization), key in zip(plan, keys):
        fingerprint = resume.fingerprint(common, key, calibrated if quantization in CALIBRATED else None)

        def make(fmt=fmt, quantization=quantization):
            return _make(fmt, quantization, reference, sources, calibration, threads, cache_dir)

        records.append((key, work.step(key, fingerprint, _paths(fmt, quantization), make)))
    work.keep_only(keys + [resume.REFERENCE])
    _write_client_files(folder, work.path)
    # The browser page runs the verified MediaPipe text file; none for other tasks.
    web.write_page(folder.task, work.path, name, cache_dir, log)
    return _report(reference, folder, name, records, work.reused, threads, latency_runs)


def _key(step):
    return f"{step[0]}/{step[1]}"


def _paths(fmt, quantization):
    """What the step of `fmt` in `quantization` writes, relative to the export folder."""
    if fmt == "savedmodel":
        return ["1", "models.config", "rest_example.json", "rest_example.md"]
    if fmt == "onnx":
        return ["onnx/model.onnx" if quantization == "none" else "onnx/model_int8.onnx"]
    if fmt == "tflite":
        return [f"tflite/model_{quantization}.tflite"]
    if fmt in ("huggingface", "keras-hub"):
        return [fmt]
    return ["mediapipe"]


def _make(fmt, quantization, reference, sources, calibration, threads, cache_dir):
    """Runs the step of `fmt` in `quantization`: `(entries, extra)`."""
    if fmt == "savedmodel":
        return steps.savedmodel_step(reference, sources)
    if fmt == "onnx":
        return steps.onnx_step(reference, sources, quantization, threads)
    if fmt == "tflite" and quantization == TEXT_VARIANT:
        return steps.tflite_text_step(reference, sources, threads)
    if fmt == "tflite":
        used = calibration if quantization in CALIBRATED else None
        return steps.tflite_step(reference, sources, quantization, used, threads)
    if fmt == "huggingface":
        return steps.huggingface_step(reference, sources, threads)
    if fmt == "keras-hub":
        return steps.keras_hub_step(reference, sources)
    return steps.mediapipe_step(reference, sources, cache_dir)


def model_fingerprint(folder):
    """What makes the model: its weights, architecture, task settings, length and vocabulary."""
    digest = hashlib.sha256()
    for weight in folder.model.weights:
        digest.update(weight.path.encode("utf-8"))
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    task = folder.task
    return resume.fingerprint(
        digest.hexdigest(), task.name, task.settings(), dataclasses.asdict(folder.config),
        folder.sequence_length, folder.lowercase, folder.compute_dtype, folder.vocabulary,
    )


def _keras_reference(folder, examples, work, common, latency_runs, log):
    """The float32 Keras model on `examples` (`verify.KerasReference`): its
    outputs, figures and latency; kept in the work folder for a rerun."""
    task = folder.task
    encoded = task.encode(examples, targets=False)
    one = {key: value[:1] for key, value in encoded.features.items()}
    tf_threads = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
    path = os.path.join(work.path, resume.REFERENCE_FILE)

    def reference_of(outputs):
        return verify.KerasReference(
            task, examples, encoded, one, outputs, task.decode(examples, encoded, outputs),
            work.path, latency_runs, tf_threads, log,
        )

    def make():
        # Artefacts compute in float32; a model trained under mixed precision is
        # held to its float32 twin (same weights), and its own figures reported.
        model = folder.float32_model()
        outputs = _run_keras(task, model, encoded.features, log, "Keras: running the model on the examples")
        np.savez(path, **outputs)
        reference = reference_of(outputs)
        keras_figures = reference.figures(predictions=reference.predictions)
        keras_figures["compute_dtype"] = "float32"
        keras_figures["latency"] = steps.latency_of(lambda: model.predict_on_batch(one), latency_runs, tf_threads)
        if model is not folder.model:
            trained = _run_keras(task, folder.model, encoded.features, log, "Keras: running the model as trained")
            keras_figures["as_trained"] = {
                "compute_dtype": folder.compute_dtype, **serving_for(task).agreement(trained, outputs), **reference.figures(trained)
            }
        return [keras_figures], {}

    record = work.step(resume.REFERENCE, resume.fingerprint(common, resume.REFERENCE), [resume.REFERENCE_FILE], make)
    with np.load(path) as saved:
        reference = reference_of({name: saved[name] for name in saved.files})
    reference.keras.update(record["entries"][0])
    return reference


def _run_keras(task, model, features, log, what):
    """`task.run` on `features`, a few batches at a time, with its progress."""
    rows = len(next(iter(features.values())))
    chunks = []
    with steps.progress(log, what, total=rows) as advance:
        for start in range(0, rows, REFERENCE_ROWS_PER_CALL):
            chunk = {k: v[start : start + REFERENCE_ROWS_PER_CALL] for k, v in features.items()}
            chunks.append(task.run(model, chunk, BATCH_SIZE))
            advance(len(next(iter(chunk.values()))))
    return {name: np.concatenate([chunk[name] for chunk in chunks]) for name in chunks[0]}


def _write_client_files(folder, path):
    """What a client of the token models needs: `vocab.txt` and the task's files."""
    save_vocab(folder.vocabulary, os.path.join(path, VOCAB_ASSET))
    for file_name, content in serving_for(folder.task).assets().items():
        with open(os.path.join(path, file_name), "w", encoding="utf-8") as f:
            f.write(content)


def _report(reference, folder, name, records, reused, threads, latency_runs):
    """The report of the run, before `export_model` adds its inputs.

    Args:
        records: list of `(key, record)` of the plan's steps, in order.
        reused: the keys of the steps reused from an earlier run.
    """
    task = folder.task
    entries = [{**entry, "reused": key in reused} for key, record in records for entry in record["entries"]]
    fusions = next((r["extra"]["onnx_fusions"] for _, r in records if r["extra"].get("onnx_fusions")), None)
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
        "reused": [entry["path"] for entry in entries if entry["reused"]],
        "onnx_fusions": fusions,
        "onnx_all_blocks_fused": (
            None if fusions is None else onnx_export.all_blocks_fused(fusions, folder.config)
        ),
        "passed": all(entry["passed"] for entry in entries),
    }
