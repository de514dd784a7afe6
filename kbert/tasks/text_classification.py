"""`text-classification`: one text -> one of N labels (topic, sentiment, intent).

Data: a CSV or TSV file with a header row, the text in `--text-column`
(default `text`) and the label in `--label-column` (default `label`); label
names are learned from the training file. `kbert evaluate` reports
`accuracy`, `macro_f1` and `per_class_f1`.
"""

from kbert.tasks.base import Option
from kbert.tasks.classification import ClassificationTask


class TextClassification(ClassificationTask):
    name = "text-classification"
    description = "one text -> one of N labels; CSV/TSV with text and label columns"
    options = (
        Option("text_column", "column holding the text", "text"),
        Option("label_column", "column holding the label", "label"),
    )
    text_options = ("text_column",)
    target_option = "label_column"
    text_inputs = ("text",)
    mediapipe = "text_classifier"
    # One text per example: a raw text is an example without a label.
    distills_unlabelled_text = True
