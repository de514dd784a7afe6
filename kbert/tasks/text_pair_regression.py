"""`text-pair-regression`: two texts -> a real score (semantic similarity, STS-B).

Data: a CSV or TSV file with `sentence1`, `sentence2` and a numeric `score`
column (`--score-column`). The head is one linear output on the pooled [CLS]
vector trained with mean squared error on the raw score, as BERT's STS-B
recipe does. `kbert evaluate` reports `pearson`, `spearman` and `mse`.
"""

import math

import numpy as np

from kbert.tasks.base import Option, TextTask
from kbert.tasks.text_pair_classification import PAIR_OPTIONS

# A quantized artefact may lose this much Spearman correlation.
SPEARMAN_BUDGETS = {"fp16": 0.001, "dynamic": 0.005, "int8": 0.005, "16x8": 0.005}


class TextPairRegression(TextTask):
    name = "text-pair-regression"
    description = "two texts -> a score; CSV/TSV with sentence1, sentence2 and score"
    options = PAIR_OPTIONS + (Option("score_column", "column holding the numeric score", "score"),)
    text_options = ("sentence1_column", "sentence2_column")
    target_option = "score_column"
    text_inputs = ("sentence1", "sentence2")
    outputs = ("score",)
    metric = "spearman"
    budgets = SPEARMAN_BUDGETS

    @classmethod
    def parse_target(cls, value, path, line):
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise ValueError(f"{path}, line {line}: score {value!r} is not a finite number")
        return score

    @classmethod
    def learn(cls, examples, source):
        scores = {example["target"] for example in examples}
        if len(scores) < 2:
            raise ValueError(f"{source}: every score is {scores.pop()}; nothing to learn")
        return {}

    def check_model(self, model, source):
        if model.output.shape[-1] != 1:
            raise ValueError(f"{source}: the model has {model.output.shape[-1]} outputs; expected 1")

    def targets(self, examples):
        return np.array([[e["target"]] for e in examples], dtype="float32")

    def build_model(self, encoder_or_config, dtype=None):
        from kbert.models import bert_regressor

        return bert_regressor(encoder_or_config, dtype=dtype)

    def compile_args(self):
        import keras

        return {
            "loss": keras.losses.MeanSquaredError(),
            "metrics": [keras.metrics.RootMeanSquaredError(name="rmse")],
        }

    def head(self, model, encoder_outputs, features):
        return {"score": model.get_layer("score")(encoder_outputs["pooled_output"])}

    def distillation_loss(self, temperature, alpha):
        """`alpha * MSE(gold) + (1 - alpha) * MSE(teacher's score)`; a score has no temperature."""
        from kbert.tasks.distillation import ScoreDistillationLoss

        return ScoreDistillationLoss(alpha)

    def decode(self, examples, encoded, outputs):
        return np.asarray(outputs["score"], np.float64).reshape(-1)

    def evaluate(self, examples, predictions):
        gold = np.array([e["target"] for e in examples], np.float64)
        return regression_metrics(gold, np.asarray(predictions, np.float64))

    def predict_json(self, examples, predictions):
        return [
            {**self.input_json(example), "score": float(score)}
            for example, score in zip(examples, predictions)
        ]

    def serving_outputs(self, features, outputs):
        import tensorflow as tf

        return {"score": tf.reshape(outputs["score"], [-1])}


def rank(values):
    """Ranks from 1, ties given the mean of their ranks (as Spearman's rho needs)."""
    values = np.asarray(values)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    # Runs of equal values share the mean of the ranks they span.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values), np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def pearson(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float(np.dot(a, a) * np.dot(b, b)))
    return float(np.dot(a, b) / denominator) if denominator else 0.0


def regression_metrics(gold, predicted):
    """`pearson`, `spearman` (Pearson of the ranks) and `mse`, with `n`."""
    return {
        "pearson": pearson(gold, predicted),
        "spearman": pearson(rank(gold), rank(predicted)),
        "mse": float(np.mean((gold - predicted) ** 2)),
        "n": int(len(gold)),
    }
