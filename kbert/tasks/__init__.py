"""BERT's tasks, one module each, behind the `Task` interface of `kbert.tasks.base`.

Adding a task is one module, its tests, and one line in `TASKS`.
"""

from kbert.tasks.base import Task
from kbert.tasks.fill_mask import FillMask
from kbert.tasks.multi_label_classification import MultiLabelClassification
from kbert.tasks.objectives import Classes, Embedding, MaskedWords, Objective, Score, Spans, Tags
from kbert.tasks.records import Encoded, Option, QuestionExample, Rows, TextExample, WordsExample
from kbert.tasks.question_answering import QuestionAnswering
from kbert.tasks.sentence_embedding import SentenceEmbedding
from kbert.tasks.text_classification import TextClassification
from kbert.tasks.text_pair_classification import TextPairClassification
from kbert.tasks.text_pair_regression import TextPairRegression
from kbert.tasks.token_classification import TokenClassification

TASKS = {
    task.name: task
    for task in (
        TextClassification,
        MultiLabelClassification,
        TextPairClassification,
        TextPairRegression,
        TokenClassification,
        QuestionAnswering,
        SentenceEmbedding,
        FillMask,
    )
}
DEFAULT_TASK = TextClassification.name
# The task `kbert embed` and `kbert search` run unless --task names another.
EMBEDDING_TASK = SentenceEmbedding.name

__all__ = [
    "DEFAULT_TASK", "EMBEDDING_TASK", "TASKS", "Classes", "Embedding", "Encoded", "FillMask", "MaskedWords",
    "Objective", "Option", "QuestionExample", "Rows", "Score", "Spans", "Tags", "Task", "TextExample", "WordsExample", "get_task",
]


def get_task(name):
    """The task class registered as `name`; `ValueError` naming the known ones."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(TASKS)}")
    return TASKS[name]
