"""The on-device files of a task: the writer its `Serving.on_device` kind names.

Each writer writes its files into a new folder, runs them with the runtime
that serves them, and returns report entries: MediaPipe's `TextClassifier`
and `TextEmbedder` (`kbert.export.mediapipe`), the TFLite Task Library's
`BertQuestionAnswerer` (`kbert.export.question_answerer`), and token
classifiers run by the LiteRT interpreter (`kbert.export.token_classifier`).
This module sits above the three, which share `kbert.export.mediapipe`'s
metadata writers and `kbert.export.mediapipe_contract`'s checks.
"""

from kbert.export import mediapipe, mediapipe_env, question_answerer, token_classifier
from kbert.export.serving import serving_for

EXPORTERS = {
    "text_classifier": mediapipe.export_text_classifier,
    "token_classifier": token_classifier.export_token_classifier,
    "bert_question_answerer": question_answerer.export_bert_question_answerer,
    "text_embedder": mediapipe.export_text_embedder,
}
# The tool environments each kind's writer and runtimes run in (`kbert.export.mediapipe_env`).
ENVIRONMENTS = {
    "text_classifier": (mediapipe_env.MEDIAPIPE, mediapipe_env.TFLITE_SUPPORT),
    "token_classifier": (mediapipe_env.MEDIAPIPE,),
    "bert_question_answerer": (mediapipe_env.MEDIAPIPE, mediapipe_env.TFLITE_SUPPORT),
    "text_embedder": (mediapipe_env.MEDIAPIPE,),
}


def environments(task):
    """The tool environments `task`'s on-device files need (none for a task without them)."""
    return ENVIRONMENTS.get(serving_for(task).on_device, ())


def export_for_task(folder, out, examples, reference, cache_dir=None):
    """Writes the on-device files of the task's kind into `out`, and runs them.

    Args:
        folder: `kbert.modelfolder.ModelFolder` whose `serving_for(task).on_device` is one
            of `EXPORTERS`.
        out: str. A new folder.
        examples: the task's examples to run the runtimes on.
        reference: dict. The float32 Keras model's outputs on `examples`.
        cache_dir: str. Where the tools' environments live.

    Returns:
        list of report entries (unjudged), one per file: `path`, `format`,
        `quantization`, `input`, `max_abs_diff`, `predictions` (in the task's
        prediction format, for its metrics), `outputs` (the runtime's numbers,
        a dict of arrays with a row per example or per encoded row, checked
        finite), `latency`, and what the kind adds.
    """
    kind = serving_for(folder.task).on_device
    if kind not in EXPORTERS:
        raise ValueError(
            f"task {folder.task.name!r} has no MediaPipe file; kinds: {', '.join(EXPORTERS)}"
        )
    return EXPORTERS[kind](folder, out, examples, reference, cache_dir)
