"""`multi-label-classification`: one text -> any number of N labels (tags, topics, flags).

Data: a CSV or TSV file with a header row, the text in `--text-column`
(default `text`) and the labels in `--labels-column` (default `labels`),
separated by `--label-separator` (default `;`); an empty cell is a text with
no label. Or, with `--label-columns a,b,c`, one column per label holding 1 (the
text has it) or 0. Label names are learned from the training file.

The head is one logit per label from the pooled [CLS] vector (the
`MultiLabels` objective), trained with binary cross-entropy, as Hugging
Face's `problem_type="multi_label_classification"`. A label is predicted
when its sigmoid probability reaches `threshold`, one for every label,
which `finetune` chooses on `--dev` (the best micro-F1) unless given; it is
stored with the model and used by `evaluate`, `predict` and every exported
artefact (MediaPipe's `score_threshold`). `kbert evaluate` reports micro-F1
(the metric exports are judged by), macro-F1, samples-F1, exact match and
each label's precision, recall, F1 and support.
"""

import dataclasses

import numpy as np

from kbert.logs import to_stderr
from kbert.recipes import Recipe
from kbert.tabular import iter_table, quoted
from kbert.tasks.base import METRIC_BUDGETS
from kbert.tasks.classification import check_labels
from kbert.tasks.objectives import Classes, logistic_regression
from kbert.tasks.records import TextExample
from kbert.tasks.task_config import TaskConfig, learned, option
from kbert.tasks.text_classification import FORMER_TRUNCATION, TRUNCATIONS
from kbert.tasks.text_task import TextTask

# docs/tasks/multi-label-classification.md: on the Debian tags' dev set, a
# random head learned the labels' base rates alone (dev micro-F1 0.30 after
# 5 epochs, seed 0); started as a linear probe (one logistic regression per
# label on the frozen [CLS] vectors), the head learns them all.
RECIPE = Recipe(epochs=5, learning_rate=1e-4, batch_size=32, sequence_length=128, probe_head=True)
# The thresholds `tune` tries: every hundredth between these.
THRESHOLDS = np.round(np.arange(0.05, 0.951, 0.01), 2)
# The threshold of a model that has none yet (before `tune`).
DEFAULT_THRESHOLD = 0.5


def sigmoid(logits):
    """float32 probabilities of float logits, computed in float64."""
    return (1.0 / (1.0 + np.exp(-np.asarray(logits, np.float64)))).astype(np.float32)


class MultiLabels(Classes):
    """Any of the names in the task's `field` per row: a sigmoid logit for each, trained
    with binary cross-entropy."""

    linear_probe = True

    def probe_gap(self, targets, units):
        """None while there are rows: a label no row has starts at its smoothed rate (`fit_probe`)."""
        return None if len(targets) else "no training rows"

    def fit_probe(self, vectors, targets, units):
        """One binary logistic regression per label; the training accuracy is the share
        of label decisions right at probability 0.5. A label every row has (or none
        has) gets no weights and the log-odds of its rate, smoothed by half a row."""
        kernel, bias = np.zeros((vectors.shape[1], units)), np.zeros(units)
        right = []
        for j in range(units):
            column = targets[:, j]
            if column.min() == column.max():
                rate = (column.sum() + 0.5) / (len(column) + 1)
                bias[j] = np.log(rate / (1 - rate))
                right.append(1.0)
                continue
            fit = logistic_regression().fit(vectors, column)
            kernel[:, j], bias[j] = fit.coef_[0], fit.intercept_[0]
            right.append(fit.score(vectors, column))
        return kernel, bias, float(np.mean(right))

    def compile_args(self, task):
        import keras

        return {"loss": keras.losses.BinaryCrossentropy(from_logits=True)}

    def distillation_loss(self, task, temperature, alpha):
        from kbert.tasks.distillation import SigmoidSoftTargetLoss

        return SigmoidSoftTargetLoss(temperature, alpha)

    def decode(self, task, outputs):
        """Each label's probability, one row each."""
        return sigmoid(outputs["logits"])


class MultiLabelClassification(TextTask):
    name = "multi-label-classification"
    hub_pipeline_tag = "text-classification"
    hf_pipeline = "text-classification"
    hf_architecture = "BertForSequenceClassification"
    hf_problem_types = ("multi_label_classification",)
    description = "one text -> any of N labels; CSV/TSV with text and labels (;-separated) columns"

    @dataclasses.dataclass(frozen=True)
    class Config(TaskConfig):
        labels: list = learned("label names, in output order", required=True)
        text_column: str = option("column holding the text", "text")
        labels_column: str = option("column holding a text's labels", "labels")
        label_separator: str = option("what separates the labels in --labels-column", ";")
        label_columns: str = option(
            "columns holding 1 or 0, one per label, separated by commas (default: none; the labels are in "
            "--labels-column)", None
        )
        truncate: str = option(
            "how a text longer than --seq-len pieces is cut: head_tail keeps its first and last "
            "halves, longest_first its start",
            TRUNCATIONS[0], TRUNCATIONS, former=FORMER_TRUNCATION,
        )
        threshold: float = option(
            "probability at which a label is predicted (default: tuned on --dev by finetune, then the "
            "model's)", None, tuned=True,
        )

    objective = MultiLabels("labels")
    metric = "micro_f1"
    metric_scale = 100
    budgets = METRIC_BUDGETS
    summary_keys = ("micro_f1", "macro_f1", "samples_f1", "exact_match", "n")
    recipe = RECIPE
    text_options = ("text_column",)
    target_option = "labels_column"
    text_inputs = ("text",)
    distills_unlabelled_text = True

    def configure(self):
        from kbert.text import BertPreprocessor

        check_labels(self.labels)
        _check_separator(self.label_separator)
        _label_columns(self.label_columns, self.text_column)
        _check_threshold(self.threshold)
        if self.truncate != self.preprocessor.packer.truncate:
            self.preprocessor = BertPreprocessor(self.tokenizer, self.sequence_length, truncate=self.truncate)

    @property
    def decision_threshold(self):
        return DEFAULT_THRESHOLD if self.threshold is None else self.threshold

    # === Data ===

    @classmethod
    def read(cls, path, options=None, targets=True):
        options = cls.resolve_options(options)
        text, column, separator = options["text_column"], options["labels_column"], options["label_separator"]
        _check_separator(separator)
        flags = _label_columns(options["label_columns"], text)
        columns = [text] + ((flags or [column]) if targets else [])
        rows = iter_table(path, columns, nonempty=[text])
        if not targets:
            return [TextExample(texts=(row[text],), target=None, line=row.line) for row in rows]
        if flags:
            return [
                TextExample(texts=(row[text],), target=tuple(f for f in flags if _flag(row, f, path)), line=row.line)
                for row in rows
            ]
        return [TextExample(texts=(row[text],), target=_split(row[column], separator), line=row.line) for row in rows]

    @classmethod
    def learn(cls, examples, source):
        labels = sorted({label for example in examples for label in example.target})
        if len(labels) < 2:
            raise ValueError(f"{source} has {len(labels)} distinct label(s) {labels}; need at least 2")
        return {"labels": labels}

    @classmethod
    def check_learned(cls, learned, examples, source):
        _label_matrix(learned["labels"], examples, source)

    def check(self, examples, source):
        self.targets(examples, source)

    def targets(self, examples, source="data"):
        """float32 `(examples, labels)`: 1 where the example has the label."""
        return _label_matrix(self.labels, examples, source)

    def examples_from_inputs(self, x, y=None):
        """Texts, and for each a list of label names (or None: none given)."""
        examples = super().examples_from_inputs(x)
        if y is None:
            return examples
        targets = list(y)
        if len(targets) != len(examples):
            raise ValueError(f"y holds {len(targets)} label lists for {len(examples)} texts")
        for i, target in enumerate(targets):
            if isinstance(target, str) or not all(isinstance(label, str) for label in target):
                raise ValueError(
                    f"y[{i}] is {target!r:.80}; expected a list of label names (strings), one list per text"
                )
        return [dataclasses.replace(e, target=tuple(t)) for e, t in zip(examples, targets)]

    # === Inference ===

    def selected(self, predictions):
        """bool `(examples, labels)`: the labels each example is given."""
        return np.asarray(predictions) >= self.decision_threshold

    def evaluate(self, examples, predictions):
        return multi_label_metrics(self.targets(examples) > 0, self.selected(predictions), self.labels)

    def tune(self, examples, predictions, predict):
        """Unless `threshold` was given or chosen before: the one of `THRESHOLDS`
        with the best dev micro-F1 (the lowest of equals)."""
        if self.threshold is not None:
            return {}
        gold = self.targets(examples) > 0
        scores = [multi_label_metrics(gold, np.asarray(predictions) >= t)["micro_f1"] for t in THRESHOLDS]
        best = int(np.argmax(scores))
        self.threshold = float(THRESHOLDS[best])
        to_stderr(
            f"kbert: threshold {self.threshold:g} gives the best micro-F1 on the {len(examples)} dev texts "
            f"({scores[best]:.4f}; at {DEFAULT_THRESHOLD:g}: "
            f"{scores[int(np.argmin(np.abs(THRESHOLDS - DEFAULT_THRESHOLD)))]:.4f})"
        )
        return {"threshold": self.threshold}

    def predict_json(self, examples, predictions):
        chosen = self.selected(predictions)
        return [
            {
                **self.serving_request(example),
                "labels": [label for label, on in zip(self.labels, picked) if on],
                "scores": {label: float(score) for label, score in zip(self.labels, row)},
            }
            for example, row, picked in zip(examples, predictions, chosen)
        ]


def multi_label_metrics(gold, predicted, label_names=None):
    """scikit-learn's multi-label figures, exact, with `zero_division=0`.

    Args:
        gold, predicted: bool `(examples, labels)`.
        label_names: list of str, or None to leave out the per-label figures.

    Returns:
        dict: `micro_f1` (F1 over every example-label decision), `macro_f1`
        (the labels' mean F1), `samples_f1` (the examples' mean F1; an example
        with no label, gold or predicted, scores 0), `exact_match` (examples
        whose labels are all right), `n`, and with `label_names` each label's
        `precision`, `recall`, `f1` and `support` (`per_label`).
    """
    gold, predicted = np.asarray(gold, bool), np.asarray(predicted, bool)
    hits = gold & predicted

    def f1(tp, gold_count, predicted_count):
        total = gold_count + predicted_count
        return np.divide(2.0 * tp, total, out=np.zeros_like(total, dtype=np.float64), where=total > 0)

    per_label_f1 = f1(hits.sum(0), gold.sum(0), predicted.sum(0))
    metrics = {
        "micro_f1": float(f1(np.array(hits.sum()), np.array(gold.sum()), np.array(predicted.sum()))),
        "macro_f1": float(per_label_f1.mean()),
        "samples_f1": float(f1(hits.sum(1), gold.sum(1), predicted.sum(1)).mean()) if len(gold) else 0.0,
        "exact_match": float(np.mean(np.all(gold == predicted, axis=1))) if len(gold) else 0.0,
        "n": int(len(gold)),
    }
    if label_names is not None:
        predicted_count, gold_count, tp = predicted.sum(0), gold.sum(0), hits.sum(0)
        metrics["per_label"] = {
            name: {
                "precision": float(tp[i] / predicted_count[i]) if predicted_count[i] else 0.0,
                "recall": float(tp[i] / gold_count[i]) if gold_count[i] else 0.0,
                "f1": float(per_label_f1[i]),
                "support": int(gold_count[i]),
            }
            for i, name in enumerate(label_names)
        }
    return metrics


def _split(cell, separator):
    """The label names of one cell: separated by `separator`, stripped, empty ones dropped."""
    return tuple(label.strip() for label in cell.split(separator) if label.strip())


def _label_matrix(labels, examples, source):
    """float32 `(examples, labels)` of `examples`' targets; `ValueError` naming
    `source`, the first unknown label's line and the unknown names."""
    index = {name: i for i, name in enumerate(labels)}
    matrix = np.zeros((len(examples), len(labels)), np.float32)
    for row, example in enumerate(examples):
        unknown = [label for label in example.target if label not in index]
        if unknown:
            raise ValueError(
                f"{source}, line {example.line}: label {unknown[0]!r} is not one the model knows; "
                f"expected some of {len(labels)} labels ({', '.join(labels[:5])}, ...)"
            )
        matrix[row, [index[label] for label in example.target]] = 1.0
    return matrix


def _label_columns(names, text_column):
    """The column names of `--label-columns` ("a,b,c"), or None where it is not given."""
    if names is None:
        return None
    columns = [name.strip() for name in str(names).split(",")]
    if not all(columns) or len(set(columns)) != len(columns) or text_column in columns:
        raise ValueError(f"label_columns={names!r}; expected distinct column names separated by commas, "
                         f"not the text column {text_column!r}")
    return columns


def _flag(row, column, path):
    """Whether `row`'s cell in the label column `column` says 1 (the text has the label)."""
    value = row[column]  # a string, or a JSON Lines number (`read_table` refuses booleans)
    cell = value.strip() if isinstance(value, str) else value
    if cell in ("1", 1):
        return True
    if cell in ("0", 0):
        return False
    raise ValueError(f"{path}, line {row.line}: column {column!r} holds {quoted(value)}; expected 1 or 0")


def _check_separator(separator):
    if not isinstance(separator, str) or not separator or separator.isspace() or "\n" in separator:
        raise ValueError(f"label_separator={separator!r}; expected a non-blank string on one line")


def _check_threshold(threshold):
    if threshold is not None and not (isinstance(threshold, float) and 0.0 < threshold < 1.0):
        raise ValueError(f"threshold={threshold!r}; expected a probability between 0 and 1 (exclusive)")
