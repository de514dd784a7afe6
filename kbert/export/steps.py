"""The export's steps: each writes one artefact (or an on-device runtime's files)
into the work folder and runs it next to the Keras model (`kbert.export.verify`).

| step | writes | converted from |
| --- | --- | --- |
| `savedmodel` | `1/`, `models.config`, `rest_example.json`, `rest_example.md` | the model (`kbert.export.savedmodel`) |
| `onnx`, `onnx_int8` | `onnx/model.onnx`, `onnx/model_int8.onnx` | the SavedModel, then the fused file (`kbert.export.onnx`) |
| `tflite` | `tflite/model_<quantization>.tflite` | the converter's SavedModel (`kbert.export.tflite`) |
| `tflite_text` | `tflite/model_text.tflite` | a SavedModel with tf-text's tokenizer inside |
| `mediapipe` | `mediapipe/` | the model (`kbert.export.on_device`) |
| `huggingface` | `huggingface/` | the model's weights (`kbert.export.huggingface`) |
| `keras-hub` | `keras-hub/` | the model's weights (`kbert.export.keras_hub_preset`) |

Each returns `(entries, extra)`: the judged report entries, and what else the
report needs. `Sources` makes what several steps convert from, once, when a
step first needs it: an artefact the work folder already holds (reused) is
converted from where it lies.
"""

import contextlib
import json
import os

import numpy as np
import tensorflow as tf

from kbert.export import onnx as onnx_export
from kbert.export import savedmodel, tflite, verify
from kbert.export.serving import serving_for
from kbert.logs import Progress, Waiting
from kbert.tasks.base import INFERENCE_BATCH_SIZE as BATCH_SIZE

# Examples in the REST example.
REST_EXAMPLES = 2


class Sources:
    """What several steps convert from: the SavedModel, the fused ONNX file, the
    TFLite converter's SavedModel and the float32 TFLite model, each made once,
    in the work folder where the plan keeps it, else in its scratch folder.

    Args:
        folder: `kbert.modelfolder.ModelFolder`.
        work: `kbert.export.resume.WorkFolder`.
        name: str. The TF Serving model name.
        examples: the verification examples (the SavedModel's warm-up requests).
        log: callable taking one str.
        keep: set of the plan's step keys ("savedmodel/none", "onnx/none", ...): where
            one of them is a source, the work folder holds it, made or reused
            by this run (its step comes first).
    """

    def __init__(self, folder, work, name, examples, log, keep):
        self.folder, self.work, self.name, self.examples = folder, work, name, examples
        self.log, self.keep = log, keep
        self._savedmodel = self._fused = self._token_source = self._float_tflite = None

    def savedmodel(self):
        """`(version_dir, loaded)` of the SavedModel."""
        if self._savedmodel is None:
            base = self.work.path if "savedmodel/none" in self.keep else os.path.join(self.work.scratch, "savedmodel")
            version_dir = os.path.join(base, str(savedmodel.SERVING_VERSION))
            if not os.path.isdir(version_dir):
                with progress(self.log, "SavedModel: tracing and saving"):
                    savedmodel.export_savedmodel(self.folder, base, self.name, self.examples, self.work.scratch)
            with progress(self.log, "SavedModel: loading"):
                self._savedmodel = version_dir, savedmodel.load_savedmodel(version_dir)
        return self._savedmodel

    def fused_onnx(self):
        """`(path, fusions)` of the fused float32 ONNX file; `fusions` None where it was reused."""
        if self._fused is None:
            keep = "onnx/none" in self.keep
            path = os.path.join(self.work.path if keep else self.work.scratch, "onnx", "model.onnx")
            fusions = None
            if not os.path.exists(path):
                version_dir, loaded = self.savedmodel()
                os.makedirs(os.path.dirname(path), exist_ok=True)
                raw = os.path.join(self.work.scratch, "raw.onnx")
                with progress(self.log, "ONNX: converting the SavedModel with tf2onnx"):
                    onnx_export.convert_savedmodel_to_onnx(version_dir, raw, _numeric_outputs(loaded, self.folder.task))
                with progress(self.log, "ONNX: fusing with onnxruntime's BERT optimizer"):
                    fusions = onnx_export.optimize_onnx(raw, path, self.folder.config)
            self._fused = path, fusions
        return self._fused

    def float_tflite(self):
        """The float32 token-id TFLite model's bytes: `tflite/model_none.tflite` where
        this run made or reused it (its step comes first), else converted. int8
        quantizes this model."""
        if self._float_tflite is None:
            path = os.path.join(self.work.path, "tflite", "model_none.tflite")
            if "tflite/none" in self.keep and os.path.exists(path):
                with open(path, "rb") as f:
                    self._float_tflite = f.read()
            else:
                source = self.token_source()
                with progress(self.log, "TFLite: converting to float32"):
                    self._float_tflite = tflite.convert_tokens(source, "none")
        return self._float_tflite

    def token_source(self):
        """The SavedModel the token-id TFLite files are converted from."""
        if self._token_source is None:
            source = os.path.join(self.work.scratch, "tflite_tokens")
            with progress(self.log, "TFLite: writing the converter's SavedModel"):
                tflite.write_token_source(self.folder.task, self.folder.model, self.folder.sequence_length, source)
            self._token_source = source
        return self._token_source


def _numeric_outputs(loaded, task):
    """The numbers served, and the task's own outputs whatever their dtype (fill-mask's word ids)."""
    tokens_fn = loaded.signatures[savedmodel.TOKENS_SIGNATURE]
    return [n for n, spec in tokens_fn.structured_outputs.items() if spec.dtype.is_floating or n in task.outputs]


# === Steps ===


def savedmodel_step(reference, sources):
    """The SavedModel's entry (text signature, tokens signature, warm-up requests
    run, `saved_model_cli` listing both), and its REST example written beside it."""
    task, examples, log = reference.task, reference.examples, sources.log
    version_dir, loaded = sources.savedmodel()
    text_fn = loaded.signatures[savedmodel.TEXT_SIGNATURE]
    tokens_fn = loaded.signatures[savedmodel.TOKENS_SIGNATURE]
    # saved_model_cli spends seconds importing TensorFlow: it runs while the
    # signatures are verified, and is waited for before anything is timed.
    cli = savedmodel.start_saved_model_cli(version_dir)
    try:
        text_outputs, token_outputs = _savedmodel_outputs(reference, text_fn, tokens_fn, log)
    except BaseException:
        cli.kill()
        cli.wait()
        raise
    savedmodel.check_saved_model_cli(cli, version_dir, task.text_inputs, sorted(text_fn.structured_outputs))
    for request in savedmodel.read_warmup_requests(version_dir):
        text_fn(**{k: tf.make_ndarray(v) for k, v in request.inputs.items()})
    one_tensors = {k: tf.constant(v) for k, v in reference.one.items()}
    latency = latency_of(lambda: tokens_fn(**one_tensors), reference.latency_runs, reference.tf_threads)
    first = {k: v[:1] for k, v in serving_for(task).strings(examples[:1]).items()}
    text_latency = latency_of(lambda: _call_text(text_fn, first), reference.latency_runs, reference.tf_threads)
    entry = reference.artefact(
        version_dir, "savedmodel", "none", "text", text_outputs, latency,
        max_abs_diff_tokens=serving_for(task).agreement(token_outputs, reference.outputs)["max_abs_diff"],
        text_latency=text_latency,
        signatures=[savedmodel.TEXT_SIGNATURE, savedmodel.TOKENS_SIGNATURE],
    )
    instances = [_shorten(task.serving_request(e)) for e in examples[:REST_EXAMPLES]]
    request, response = savedmodel.rest_predict_example(loaded, instances)
    _write_rest_example(reference.staging, sources.name, request, response)
    return [entry], {}


def _savedmodel_outputs(reference, text_fn, tokens_fn, log):
    """The outputs of the text signature on the examples' strings and of the tokens signature on their rows."""
    task, examples = reference.task, reference.examples
    with progress(log, "1: verifying the text signature", total=_string_rows(task, examples)) as advance:
        text_outputs = serving_for(task).text_outputs(
            _counted(lambda strings: _call_text(text_fn, strings), advance), examples, BATCH_SIZE
        )
    with progress(log, "1: verifying the tokens signature", total=_rows(reference.features)) as advance:
        token_outputs = in_batches(
            lambda batch: tokens_fn(**{k: tf.constant(v) for k, v in batch.items()}), reference.features, advance
        )
    return text_outputs, token_outputs


def _call_text(text_fn, strings):
    return text_fn(**{k: tf.constant(v) for k, v in strings.items()})


def onnx_step(reference, sources, quantization, threads):
    """The fused ONNX file ("none") or its dynamic int8 version ("dynamic"), verified."""
    fused, fusions = sources.fused_onnx()
    path = fused
    if quantization == "dynamic":
        path = os.path.join(reference.staging, "onnx", "model_int8.onnx")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with progress(sources.log, "ONNX: quantizing to dynamic int8"):
            onnx_export.quantize_onnx(fused, path)
        if "onnx/none" in sources.keep:
            fusions = None  # the fused file's own step reports them
    outputs_of = reference.task.outputs
    runner = onnx_export.OnnxRunner(path, threads)
    entry = _verified(
        reference, sources.log, path, "onnx", quantization, lambda batch: runner.run(batch, outputs_of),
        threads, opset=onnx_export.ONNX_OPSET,
    )
    return [entry], {"onnx_fusions": fusions}


def tflite_step(reference, sources, quantization, calibration, threads):
    """The token-id TFLite file in `quantization`, verified.

    Args:
        calibration: dict of int32 arrays (encoded calibration examples) for
            "int8" and "16x8", else None.
    """
    path = os.path.join(reference.staging, "tflite", f"model_{quantization}.tflite")
    if quantization == "none":
        model_bytes = sources.float_tflite()
    elif quantization == "int8":  # the float32 file, quantized (`tflite.convert_tokens`)
        tflite.check_calibration(quantization, calibration)
        float_bytes = sources.float_tflite()
        with progress(sources.log, f"{_relative(reference, path)}: quantizing the float32 file"):
            model_bytes = tflite.quantize_int8(float_bytes, calibration, threads)
    else:
        source = sources.token_source()
        with progress(sources.log, f"{_relative(reference, path)}: converting"):
            model_bytes = tflite.convert_tokens(source, quantization, calibration, threads)
    ops = tflite.check_ops(model_bytes)
    tflite.write_bytes(path, model_bytes)
    runner = tflite.TfliteRunner(path, threads)
    return [_verified(reference, sources.log, path, "tflite", quantization, runner.run, threads, ops=ops)], {}


def tflite_text_step(reference, sources, threads):
    """The string-in TFLite file (tf-text's tokenizer inside), verified."""
    folder, examples, log = sources.folder, reference.examples, sources.log
    task = folder.task
    path = os.path.join(reference.staging, "tflite", "model_text.tflite")
    source = os.path.join(sources.work.scratch, "tflite_text")
    with progress(log, f"{_relative(reference, path)}: converting"):
        tflite.write_text_source(folder, source)
        model_bytes = tflite.convert_text(source)
    ops = tflite.check_ops(model_bytes, allowed_custom=tflite.TEXT_CUSTOM_OPS)
    tflite.write_bytes(path, model_bytes)
    runner = tflite.TfliteRunner(path, threads, text=True)
    first = {k: v[:1] for k, v in serving_for(task).strings(examples[:1]).items()}
    latency = latency_of(lambda: runner.run_text(first), reference.latency_runs, threads)
    with progress(log, f"{_relative(reference, path)}: verifying", total=_string_rows(task, examples)) as advance:
        outputs = serving_for(task).text_outputs(_counted(runner.run_text, advance), examples, BATCH_SIZE)
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
    )], {}


def mediapipe_step(reference, sources, cache_dir):
    """The task's on-device files (`kbert.export.on_device`), run in their runtimes."""
    from kbert.export import mediapipe, mediapipe_env, on_device

    folder, log = sources.folder, sources.log
    specs = on_device.environments(folder.task)
    if not all(mediapipe_env.is_ready(spec, cache_dir) for spec in specs):
        where = cache_dir or mediapipe_env.default_cache_dir()
        what = f"MediaPipe: installing its own Python environments in {where} (once, a few minutes; needs PyPI)"
        with progress(log, what):
            mediapipe_env.ensure_environments(specs, cache_dir)
    entries = []
    with progress(log, "MediaPipe: writing the files with MediaPipe's metadata and running them in their runtimes"):
        found = on_device.export_for_task(
            folder, os.path.join(reference.staging, mediapipe.FOLDER), reference.examples, reference.outputs, cache_dir
        )
    for entry in found:
        entry.update(reference.judged(predictions=entry.pop("predictions")))
        entry["non_finite"] = reference.non_finite(entry.pop("outputs"))
        entry["path"] = os.path.relpath(entry["path"], reference.staging)
        entries.append(reference.judge(entry))
    return entries, {}


def huggingface_step(reference, sources, threads):
    """The transformers folder (`kbert.export.huggingface`), run by transformers on
    PyTorch in a process of its own, on the rows the Keras model ran."""
    from kbert.export import huggingface

    path = os.path.join(reference.staging, huggingface.FOLDER)
    with progress(sources.log, "huggingface: writing the transformers folder"):
        head = huggingface.write_huggingface(sources.folder, path)
    with progress(sources.log, f"huggingface: running it with transformers' {head.architecture} on PyTorch"):
        ran = huggingface.run_transformers(sources.folder, path, head, reference, threads)
    entry = reference.artefact(path, "huggingface", "none", "tokens", ran.outputs, {**ran.latency, "threads": threads},
                               architecture=head.architecture, **ran.extra)
    return [huggingface.judge(entry, reference)], {}


def keras_hub_step(reference, sources):
    """The keras-hub preset (`kbert.export.keras_hub_preset`), loaded fresh by keras-hub
    and run on the rows the Keras model ran; held to kbert's model with keras-hub's GELU."""
    import dataclasses

    from kbert.export import keras_hub_preset

    folder, task = sources.folder, reference.task
    path = os.path.join(reference.staging, keras_hub_preset.FOLDER)
    with progress(sources.log, "keras-hub: writing the preset"):
        kind = keras_hub_preset.write_keras_hub(folder, path)
    with progress(sources.log, f"keras-hub: loading it with keras_hub.models.{kind}.from_preset and running it"):
        ran = keras_hub_preset.run_keras_hub(folder, path, kind, reference)
    # The rows' outputs are held to the twin's; the metric to the model's as trained (`judge`).
    twin = dataclasses.replace(reference, outputs=ran.twin,
                               predictions=task.decode(reference.examples, reference.encoded, ran.twin))
    latency = latency_of(lambda: ran.call(reference.one), reference.latency_runs, reference.tf_threads)
    entry = twin.artefact(path, "keras-hub", "none", "tokens", ran.outputs, latency, **ran.extra)
    return [keras_hub_preset.judge(entry, reference)], {}


# === Running and timing ===


@contextlib.contextmanager
def progress(log, what, total=None):
    """Logs `what`; while the block runs, its progress (`kbert.logs.Progress`
    over `total` rows, or `kbert.logs.Waiting` where the step cannot count);
    yields `advance(n)`, to call as rows are done."""
    log(what)
    if total is None:
        with Waiting(what, log):
            yield lambda n: None
    else:
        with Progress(what, total, "rows", log) as counter:
            yield counter.update


def _verified(reference, log, path, fmt, quantization, run, threads, **extra):
    """The judged entry of a token-input artefact: `run` (a dict of int32 rows ->
    outputs) on every verification row, and timed on the first."""
    with progress(log, f"{_relative(reference, path)}: verifying", total=_rows(reference.features)) as advance:
        outputs = in_batches(run, reference.features, advance)
    latency = latency_of(lambda: run(reference.one), reference.latency_runs, threads)
    return reference.artefact(path, fmt, quantization, "tokens", outputs, latency, **extra)


def in_batches(call, features, advance=None):
    """`call` on `BATCH_SIZE` rows at a time; its dict outputs concatenated.

    Args:
        advance: callable(int) or None. Told the rows done after each call.
    """
    rows = _rows(features)
    chunks = []
    for start in range(0, rows, BATCH_SIZE):
        chunks.append(call({k: v[start : start + BATCH_SIZE] for k, v in features.items()}))
        if advance:
            advance(min(BATCH_SIZE, rows - start))
    return {name: np.concatenate([np.asarray(chunk[name]) for chunk in chunks]) for name in chunks[0]}


def latency_of(call, runs, threads):
    """`verify.measure_latency` of `call`, with the threads it ran on."""
    latency = verify.measure_latency(call, runs)
    latency["threads"] = threads
    return latency


def _counted(call, advance):
    """`call` on a dict of string lists, telling `advance` how many rows it ran."""

    def counted(strings):
        result = call(strings)
        advance(len(next(iter(strings.values()))))
        return result

    return counted


def _rows(features):
    return len(next(iter(features.values())))


def _string_rows(task, examples):
    return len(next(iter(serving_for(task).strings(examples).values())))


def _relative(reference, path):
    return os.path.relpath(path, reference.staging)


def _shorten(instance):
    """Each string of a REST instance cut after its first sentence: short enough for a README."""
    return {name: _first_sentence(text) for name, text in instance.items()}


def _first_sentence(text):
    first = text.split(". ")[0]
    if first == text and text.endswith(("?", "!")):  # a question stays one
        return text
    return first.rstrip(".") + "."


def _write_rest_example(staging, name, request, response):
    with open(os.path.join(staging, "rest_example.json"), "w", encoding="utf-8") as f:
        json.dump({"request": json.loads(request), "response": json.loads(response)}, f, indent=2, ensure_ascii=False)
    with open(os.path.join(staging, "rest_example.md"), "w", encoding="utf-8") as f:
        f.write(
            f"POST /v1/models/{name}:predict\n\n```json\n{request}\n```\n\n"
            f"Response:\n\n```json\n{response}\n```\n"
        )
