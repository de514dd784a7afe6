"""Export a fine-tuned kbert model to TF Serving, TFLite, ONNX and MediaPipe, each verified.

One call (or `kbert export`) turns a model folder from `kbert finetune`, of
any task, into a SavedModel for TF Serving, TFLite models (float32,
dynamic-range int8 and int8 by default; float16, 16x8 and a string-in
variant on request), ONNX models (fused float32, dynamic int8) and, for tasks
an on-device runtime runs, a file with MediaPipe's metadata; it holds every
artefact to the Keras model on the task's dev data, by the task's own figure:

    from kbert.export import export_model
    report = export_model("runs/debian-minilm", "saved_models/debian",
                          data="data/debian-packages/dev.csv",
                          calibration="data/debian-packages/train.csv")

Modules: `graph` (the converter-friendly forward pass), `savedmodel`,
`tflite`, `onnx`, `on_device` (a task's on-device files: `mediapipe`,
`token_classifier`, `question_answerer`, checked by `mediapipe_contract`,
with `mediapipe_env` and `mediapipe_worker`: MediaPipe's tools in their own
environment), `web` (a page that runs the MediaPipe text file in a browser),
`verify` (latency, report), `exporter` (the whole run), `steps` (each artefact written and verified),
`resume` (the work folder: verified artefacts kept and reused), `options`
(names and defaults). The `kbert export` command is `kbert.cli.export`;
TensorFlow is imported on first use of `export_model`, so it builds its
parser without it.
"""

from kbert.export.options import FORMATS, QUANTIZATIONS, SUPPORTED

__all__ = ["FORMATS", "QUANTIZATIONS", "SUPPORTED", "export_model"]


def __getattr__(name):
    if name == "export_model":
        from kbert.export.exporter import export_model

        return export_model
    raise AttributeError(f"module 'kbert.export' has no attribute {name!r}")
