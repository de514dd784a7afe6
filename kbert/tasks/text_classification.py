"""`text-classification`: one text -> one of N labels (topic, sentiment, intent).

Data: a CSV or TSV file with a header row, the text in `--text-column`
(default `text`) and the label in `--label-column` (default `label`); label
names are learned from the training file. `kbert evaluate` reports
`accuracy`, `macro_f1` and `per_class_f1`.

A text longer than `--seq-len` pieces loses its middle (`--truncate
head_tail`, the default): it keeps its first half and its last half, as
Sun et al. (2019, "How to fine-tune BERT for text classification?") found
best for long documents; on the Debian task, where a quarter of the
descriptions are cut at 128 pieces, it gained a little dev accuracy and
macro-F1 over seeds (README, "Results"). `--truncate longest_first` keeps
the start, as Hugging Face, keras-hub and MediaPipe's on-device tokenizer do.
"""

import dataclasses

from kbert.recipes import Recipe
from kbert.tasks.classification import ClassificationTask
from kbert.tasks.task_config import TaskConfig, learned, option

# `BertPacker`'s strategies (kbert.text.packer.TRUNCATE_STRATEGIES), named
# here so that `kbert --help` imports no TensorFlow. A model folder written
# before the option existed names none: its texts were cut at the end.
TRUNCATIONS = ("head_tail", "longest_first")
FORMER_TRUNCATION = "longest_first"
# docs/benchmarks.md, text classification: 2 epochs at 1e-4 with texts cut in
# the middle (the `truncate` option's default) beat BERT's 3 epochs at 5e-5
# on the Debian task, and a head started as a linear probe gained dev
# accuracy over a random head on each of six seeds.
RECIPE = Recipe(epochs=2, learning_rate=1e-4, batch_size=32, sequence_length=128, probe_head=True)


class TextClassification(ClassificationTask):
    name = "text-classification"
    hub_pipeline_tag = "text-classification"
    hf_pipeline = "text-classification"
    hf_architecture = "BertForSequenceClassification"
    hf_problem_types = ("single_label_classification", None)
    description = "one text -> one of N labels; CSV/TSV with text and label columns"

    @dataclasses.dataclass(frozen=True)
    class Config(TaskConfig):
        labels: list = learned("class names, in output order", required=True)
        text_column: str = option("column holding the text", "text")
        label_column: str = option("column holding the label", "label")
        truncate: str = option(
            "how a text longer than --seq-len pieces is cut: head_tail keeps its first and last "
            "halves, longest_first its start",
            TRUNCATIONS[0], TRUNCATIONS, former=FORMER_TRUNCATION,
        )

    recipe = RECIPE
    text_options = ("text_column",)
    target_option = "label_column"
    text_inputs = ("text",)
    # One text per example: a raw text is an example without a label.
    distills_unlabelled_text = True

    def configure(self):
        from kbert.text import BertPreprocessor

        super().configure()
        if self.truncate != self.preprocessor.packer.truncate:
            self.preprocessor = BertPreprocessor(self.tokenizer, self.sequence_length, truncate=self.truncate)
