"""`text-pair-classification`: two texts -> one of N labels (paraphrase, entailment).

Data: GLUE's files (MRPC, MNLI, QQP): a CSV or TSV file with the texts in
`--sentence1-column` and `--sentence2-column` (default `sentence1`,
`sentence2`) and the label in `--label-column`. The pair is packed as
google-research/bert does: `[CLS] a [SEP] b [SEP]`, segment ids 0 then 1,
truncated longest-first. `kbert evaluate` reports `accuracy`, `macro_f1`,
`per_class_f1` and, when a label is named `1`, `f1`: the F1 of that class,
as GLUE reports MRPC and QQP.

Where the label does not depend on the order (paraphrase, duplicate
questions), a model may read each pair both ways, `[CLS] a [SEP] b [SEP]`
and `[CLS] b [SEP] a [SEP]`, and average the two softmaxes (`pair_order`
"both"; `input_views`). Trained on one order, it is two views of each pair,
as an ensemble is of two models. `finetune` keeps it when it scores higher
on dev (`tune`); every exported graph repacks the pair in the graph and
reads both.
"""

import dataclasses

from kbert.logs import to_stderr
from kbert.recipes import Recipe
from kbert.tasks.classification import ClassificationTask
from kbert.tasks.task_config import TaskConfig, learned, option

# GLUE's binary tasks call the positive class "1" and report its F1.
POSITIVE_LABEL = "1"
# `pair_order`: (a, b) alone, or (a, b) and (b, a), their softmaxes averaged.
PAIR_ORDERS = ("given", "both")
# Chosen on MRPC dev over 5 seeds from epochs {3, 5, 8} x peak rates
# {3e-5, 5e-5, 1e-4, 2e-4} (tools/benchmarks/gpu_recipes.py, docs/benchmarks.md):
# 79.1 accuracy / 85.1 F1, 3.4 ± 0.3 points over BERT's own 3 epochs at 5e-5.
# First, 1,200 masked-LM steps on the training pairs' text (task-adaptive
# pretraining, docs/pretraining.md): on MRPC dev, seeds 0-3 on one CPU, each
# adapting with its own seed, 600 steps gave +0.9 ± 0.6 accuracy and
# +0.3 ± 0.4 F1 over the same recipe without them, and 1,200 a further
# +0.8 ± 0.4 / +0.5 ± 0.2 over 600 (3 seeds of 4 higher in accuracy, 4 of 4
# in F1).
RECIPE = Recipe(epochs=5, learning_rate=1e-4, batch_size=32, sequence_length=128, adapt_steps=1200)


@dataclasses.dataclass(frozen=True)
class PairColumns(TaskConfig):
    """The columns of a pair of texts, shared by the tasks that read pairs."""

    sentence1_column: str = option("column holding the first text of a pair", "sentence1")
    sentence2_column: str = option("column holding the second text of a pair", "sentence2")


class TextPairClassification(ClassificationTask):
    name = "text-pair-classification"
    hub_pipeline_tag = "text-classification"
    hf_pipeline = "text-classification"
    hf_architecture = "BertForSequenceClassification"
    hf_problem_types = ("single_label_classification", None)
    description = "two texts -> one of N labels; CSV/TSV with sentence1, sentence2 and label"

    @dataclasses.dataclass(frozen=True)
    class Config(PairColumns):
        labels: list = learned("class names, in output order", required=True)
        label_column: str = option("column holding the label", "label")
        pair_order: str = option(
            "read each pair as given, or both ways with the two softmaxes averaged, for labels the "
            "order does not change (paraphrase); default: the model's, which finetune chose on --dev",
            None, PAIR_ORDERS, former="given", tuned=True,
        )

    recipe = RECIPE
    text_options = ("sentence1_column", "sentence2_column")
    target_option = "label_column"
    text_inputs = ("sentence1", "sentence2")

    def input_views(self, features):
        if self.pair_order != "both":
            return [features]
        from kbert.layers import swap_pair

        return [features, swap_pair(features)]

    def merge_views(self, outputs):
        from kbert.layers import mean_probability_logits

        return {"logits": mean_probability_logits([view["logits"] for view in outputs])}

    def tune(self, examples, predictions, predict):
        """Unless `pair_order` was given: "both" when reading the dev pairs both ways
        scores higher in `metric` than as given, else "given"."""
        if self.pair_order is not None:
            return {}
        given = self.evaluate(examples, predictions)
        self.pair_order = "both"
        both = self.evaluate(examples, predict())
        if both[self.metric] <= given[self.metric]:
            self.pair_order = "given"
        to_stderr(
            f"kbert: the {given['n']} dev pairs read both ways score {self.metric} {both[self.metric]:.4f}, "
            f"as given {given[self.metric]:.4f}: the model reads pairs "
            f"{'both ways' if self.pair_order == 'both' else 'as given'} (--pair-order {self.pair_order})"
        )
        if self.pair_order == "both":
            return {**both, "pair_order": "both", "given_order": self.summary(given)}
        return {"pair_order": "given", "both_orders": self.summary(both)}

    def evaluate(self, examples, predictions):
        metrics = super().evaluate(examples, predictions)
        if POSITIVE_LABEL in self.labels:
            metrics["f1"] = metrics["per_class_f1"][POSITIVE_LABEL]
        return metrics
