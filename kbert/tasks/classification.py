"""What the classification tasks share: label names, the [CLS] head, softmax, accuracy and F1.

Not a task itself: `text_classification` and `text_pair_classification` are.
"""

import numpy as np

from kbert.tabular import quoted
from kbert.tasks.base import METRIC_BUDGETS
from kbert.tasks.objectives import Classes
from kbert.tasks.text_task import TextTask


# A label column in which no value repeats holds texts or ids, not labels
# (a label column naming the text column): no class has two rows to learn
# from. Fewer rows than this are not judged (a toy set may have a label a
# row); a real set with many rare classes still repeats some.
LABELS_JUDGED_FROM = 20


def check_labels(labels):
    """Raises `ValueError` unless `labels` are at least 2 distinct one-line names."""
    if not isinstance(labels, list) or len(labels) < 2 or not all(
        isinstance(label, str) and label.strip() and "\n" not in label and "\r" not in label
        for label in labels
    ):
        raise ValueError(f"labels={labels!r:.200}; expected a list of at least 2 one-line names")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels={labels!r:.200} repeat a name")


def label_ids(labels, examples, source):
    """int32 index in `labels` of each of `examples`' labels; `ValueError` naming
    `source`, the first unknown label's line and the unknown names."""
    index = {name: i for i, name in enumerate(labels)}
    unknown = [e for e in examples if e.target not in index]
    if unknown:
        first = unknown[0]
        names = sorted({e.target for e in unknown})
        raise ValueError(
            f"{source}, line {first.line}: label {quoted(first.target, 40)} is not one the model "
            f"knows ({len(names)} unknown: {quoted(names, 20)}); expected one of {quoted(labels, 30)}"
        )
    return np.array([index[e.target] for e in examples], dtype="int32")


class ClassificationTask(TextTask):
    """One or two texts -> one of `labels` (a `Config` field), from the pooled [CLS] vector."""

    objective = Classes("labels")
    metric = "accuracy"
    metric_scale = 100
    budgets = METRIC_BUDGETS
    summary_keys = ("accuracy", "f1", "macro_f1", "n")

    def configure(self):
        check_labels(self.labels)

    @classmethod
    def learn(cls, examples, source):
        labels = sorted({example.target for example in examples})
        if len(labels) < 2:
            raise ValueError(f"{source} has {len(labels)} distinct label(s) {quoted(labels)}; need at least 2")
        if len(examples) >= LABELS_JUDGED_FROM and len(labels) == len(examples):
            raise ValueError(
                f"{source}: no label repeats in its {len(examples)} rows (such as {quoted(labels[0], 40)}); "
                "a label names a class of several rows: is the label column a text column?"
            )
        return {"labels": labels}

    @classmethod
    def check_learned(cls, learned, examples, source):
        label_ids(learned["labels"], examples, source)

    def check(self, examples, source):
        self.targets(examples, source)

    def targets(self, examples, source="data"):
        """int32 class ids of `examples`' labels; `ValueError` naming unknown ones."""
        return label_ids(self.labels, examples, source)

    # === Inference ===

    def evaluate(self, examples, predictions):
        return classification_metrics(
            self.targets(examples), np.asarray(predictions).argmax(axis=-1), self.labels
        )

    def predict_json(self, examples, predictions):
        return [
            {
                **self.serving_request(example),
                "label": self.labels[int(np.argmax(row))],
                "scores": {label: float(score) for label, score in zip(self.labels, row)},
            }
            for example, row in zip(examples, predictions)
        ]


def classification_metrics(label_ids, predicted_ids, label_names):
    """Accuracy, macro-F1 and per-class F1, exact.

    A class's F1 is 2 TP / (2 TP + FP + FN), and 0 for a class neither in
    `label_ids` nor predicted: scikit-learn's `f1_score` with `zero_division=0`
    over every class of `label_names` (Keras's `F1Score` adds an epsilon).
    """
    label_ids, predicted_ids = np.asarray(label_ids), np.asarray(predicted_ids)
    num_classes = len(label_names)
    true_positives = np.bincount(label_ids[label_ids == predicted_ids], minlength=num_classes)
    counted = np.bincount(label_ids, minlength=num_classes) + np.bincount(predicted_ids, minlength=num_classes)
    per_class = [2 * int(tp) / int(n) if n else 0.0 for tp, n in zip(true_positives, counted)]
    return {
        "accuracy": float(np.mean(label_ids == predicted_ids)),
        "macro_f1": float(np.mean(per_class)),
        "per_class_f1": dict(zip(label_names, per_class)),
        "n": int(len(label_ids)),
    }
