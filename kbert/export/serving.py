"""Each task's serving adapter: `serving_for(task)`.

The exporter, the SavedModel writer, the TFLite and on-device writers and
the verification ask `serving_for(task)` (a `kbert.export.serving_base.Serving`)
for what they need of a task beyond its data and its model; they never test
a task's name. The adapter is chosen by the task's class, the nearest
registered class first: a new task gets `Serving`'s defaults (one or two
texts in, one row of outputs each), or adds its own adapter to `ADAPTERS`.
"""

import numpy as np

from kbert.export.serving_answers import AnswerServing
from kbert.export.serving_base import Bound, Serving
from kbert.export.serving_tokens import TokenServing
from kbert.tasks import (
    FillMask,
    QuestionAnswering,
    SentenceEmbedding,
    Task,
    TextClassification,
    TextPairClassification,
    TextPairRegression,
    TokenClassification,
)
from kbert.tasks.inference import softmax
from kbert.tasks.multi_label_classification import MultiLabelClassification, sigmoid
from kbert.tasks.sentence_embedding import MIN_COSINE, QUANTIZED_MIN_MEAN_COSINE, row_cosines

__all__ = ["ADAPTERS", "Serving", "serving_class", "serving_for"]


class ClassificationServing(Serving):
    """Labels: `scores`, `label` and `logits` served, `labels.txt` shipped,
    compared by probabilities and top-1 agreement."""

    # One label an example: the probabilities are one distribution (a softmax).
    one_label = True

    def probabilities(self, logits):
        """The served `scores` of `logits` (TensorFlow ops): a softmax over the classes."""
        import tensorflow as tf

        return tf.nn.softmax(logits, axis=-1)

    def outputs(self, features, outputs):
        import tensorflow as tf

        logits = outputs["logits"]
        return {
            "scores": self.probabilities(logits),
            "label": tf.gather(tf.constant(self.task.labels), tf.argmax(logits, axis=-1)),
            "logits": logits,
        }

    def assets(self):
        return {"labels.txt": "".join(label + "\n" for label in self.task.labels)}

    def scores(self, outputs):
        return softmax(outputs["logits"])

    def agreement(self, outputs, reference):
        scores, expected = self.scores(outputs), self.scores(reference)
        return {
            "max_abs_diff": float(np.abs(scores - expected).max()),
            "top1_agreement": float(np.mean(scores.argmax(-1) == expected.argmax(-1))),
        }


class TextClassifierServing(ClassificationServing):
    """Single texts also ship as MediaPipe's `TextClassifier` file."""

    on_device = "text_classifier"


class MultiLabelServing(TextClassifierServing):
    """Labels above the task's threshold: `labels` (their names joined by the
    task's separator, "" for none), `scores` (each label's probability) and
    `logits` served; compared by probabilities and by the labels chosen."""

    one_label = False

    def probabilities(self, logits):
        import tensorflow as tf

        return tf.sigmoid(logits)

    def outputs(self, features, outputs):
        import tensorflow as tf

        logits = outputs["logits"]
        scores = self.probabilities(logits)
        names = tf.broadcast_to(tf.constant(self.task.labels), tf.shape(logits))
        chosen = tf.ragged.boolean_mask(names, scores >= self.task.decision_threshold)
        labels = tf.strings.reduce_join(chosen, axis=-1, separator=self.task.label_separator)
        return {"labels": labels, "scores": scores, "logits": logits}

    def scores(self, outputs):
        return sigmoid(outputs["logits"])

    def on_device_files(self):
        """The threshold, which MediaPipe's model cannot hold: the app marks the
        labels whose score reaches it (MediaPipe's `score_threshold` option)."""
        from kbert.export.mediapipe import THRESHOLD_FILE

        return {THRESHOLD_FILE: f"{self.task.decision_threshold:g}\n"}

    def agreement(self, outputs, reference):
        scores, expected = self.scores(outputs), self.scores(reference)
        threshold = self.task.decision_threshold
        return {
            "max_abs_diff": float(np.abs(scores - expected).max()),
            "label_agreement": float(np.mean((scores >= threshold) == (expected >= threshold))),
        }


class RegressionServing(Serving):
    """One score a pair; the cross-cosine head's int32 pair split cannot take 16x8."""

    def outputs(self, features, outputs):
        import tensorflow as tf

        return {"score": tf.reshape(outputs["score"], [-1])}

    def tflite_unsupported(self):
        if self.task.head == "cross":
            return {}
        return {"16x8": "the cross-cosine head splits the pair with int32 arithmetic, whose "
                        "inputs LiteRT's 16x8 quantizer cannot calibrate (use dynamic or int8)"}


class EmbeddingServing(Serving):
    """One vector a text, every text of a pair its own row; judged by cosines."""

    on_device = "text_embedder"
    # Float32: every vector at cosine MIN_COSINE or more from Keras's. Quantized:
    # Spearman, which a vector's sign or scale does not change, and the vectors
    # near Keras's on average.
    float_bounds = (Bound("min_cosine", MIN_COSINE, at_least=True),)
    quantized_bounds = (Bound("mean_cosine", QUANTIZED_MIN_MEAN_COSINE, at_least=True),)

    def strings(self, examples):
        """Every text of `examples`, one per row of `encode`."""
        return {"text": [text for example in examples for text in example.texts]}

    def agreement(self, outputs, reference):
        vectors, expected = (np.asarray(o["embedding"], np.float64) for o in (outputs, reference))
        if not vectors.size:
            return {"max_abs_diff": 0.0, "min_cosine": 1.0, "mean_cosine": 1.0}
        cosines = row_cosines(vectors, expected)
        return {
            "max_abs_diff": float(np.abs(vectors - expected).max()),
            "min_cosine": float(cosines.min()),
            "mean_cosine": float(cosines.mean()),
        }


class FillMaskServing(Serving):
    """The words of each [MASK] served as strings beside their ids; compared by their
    probabilities and by the likeliest word."""

    # The string-in TFLite tokenizes with tf-text's FastBertTokenizer, which reads
    # "[MASK]" as "[", "mask", "]": the masks would never reach the model.
    tflite_text_variant = False

    def outputs(self, features, outputs):
        import tensorflow as tf

        ids = outputs["word_ids"]
        words = tf.gather(tf.constant(self.task.tokenizer.vocabulary), tf.maximum(ids, 0))
        return {**outputs, "words": tf.where(ids >= 0, words, "")}

    def tflite_unsupported(self):
        return {"16x8": "the head finds the [MASK]s by comparing int32 token ids, whose inputs LiteRT's "
                        "16x8 quantizer cannot calibrate (use dynamic or int8)"}

    def scores(self, outputs):
        return np.asarray(outputs["word_scores"], np.float32).reshape(len(outputs["word_scores"]), -1)

    def agreement(self, outputs, reference):
        ids, expected = (np.asarray(o["word_ids"])[..., 0] for o in (outputs, reference))
        real = expected >= 0
        return {
            "max_abs_diff": float(np.abs(self.scores(outputs) - self.scores(reference)).max()),
            "top1_agreement": float(np.mean(ids[real] == expected[real])) if real.any() else 1.0,
        }


# Each task class's adapter class; a subclass without its own takes its nearest
# base class's (`serving_class`).
ADAPTERS = {
    Task: Serving,
    TextClassification: TextClassifierServing,
    TextPairClassification: ClassificationServing,
    TextPairRegression: RegressionServing,
    SentenceEmbedding: EmbeddingServing,
    TokenClassification: TokenServing,
    QuestionAnswering: AnswerServing,
    FillMask: FillMaskServing,
    MultiLabelClassification: MultiLabelServing,
}


def serving_class(task_class):
    """The adapter class of `task_class`: its own in `ADAPTERS`, or its nearest base class's."""
    return next(ADAPTERS[base] for base in task_class.__mro__ if base in ADAPTERS)


def serving_for(task):
    """The serving adapter of `task`, a `kbert.tasks.Task` instance."""
    return serving_class(type(task))(task)
