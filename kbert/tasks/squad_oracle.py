"""What a perfect model could answer of a SQuAD set under run_squad.py's rules.

`oracle_outputs` gives the logits a perfect model would give each row, and
each question's status: the ceiling of a figure on that set
(`tools/benchmarks/benchmark_qa.py`), and a check that decoding gives back
every answer these rules can give.
"""

import numpy as np

from kbert.tasks import squad, squad_text
from kbert.tasks.squad_features import span_text

# What `oracle_outputs` says of each question: a perfect model answers the
# first two; the others no model can answer under these rules.
ORACLE_STATUSES = (
    "answerable",
    "unanswerable",
    "not found by run_squad.py",  # its split() sees spaces the context's words do not have
    "changed by the tokenizer",  # an answer inside a word ("Japan" in "Japanese")
    "longer than max_answer_length",
    # Counted only where its start has the most context (a long answer near a window's end).
    "not whole in its start's max-context window",
)


def oracle_outputs(task, examples, encoded, peak=10.0):
    """The logits a perfect model would give `encoded`'s rows, and what it can answer.

    `task`: the `QuestionAnswering` that encoded them.

    Every row scores 0 everywhere but, for an answerable question,
    `peak` at the start and end pieces of its first gold answer that these
    rules can give back (in every window that holds it whole); for an
    unanswerable one, at [CLS].

    Returns:
        (dict of float32 `(rows, sequence_length)` arrays keyed by
        `outputs`, list of str: each question's `ORACLE_STATUSES` entry).
    """
    questions = encoded.extra["questions"]
    answer_ids = iter(squad_text.tokenize(task.tokenizer, [a["text"] for e in examples for a in e.answers]))
    spans, statuses = [], []
    for example, question in zip(examples, questions):
        found = [(_oracle_status(task, question, answer, next(answer_ids)), answer) for answer in example.answers]
        usable = [span for (status, span), _ in found if status == "answerable"]
        statuses.append("unanswerable" if not found else "answerable" if usable else found[0][0][0])
        spans.append(usable[0] if usable else None)
    start = np.zeros(encoded.features["token_ids"].shape, np.float32)
    end = np.zeros_like(start)
    for row, (q, w) in enumerate(zip(encoded.example_of_row, encoded.extra["windows"])):
        if statuses[q] == "unanswerable":
            start[row, 0] = end[row, 0] = peak
        elif spans[q] is not None:
            first, length = questions[q].windows[w]
            offset = len(questions[q].query) + 2
            if first <= spans[q][0] and spans[q][1] < first + length:
                start[row, spans[q][0] - first + offset] = peak
                end[row, spans[q][1] - first + offset] = peak
    return {"start_logits": start, "end_logits": end}, statuses


def _oracle_status(task, question, answer, answer_ids):
    """`(status, span)` of one gold answer (see `ORACLE_STATUSES`)."""
    span = squad.answer_token_span(question.context, answer, answer_ids)
    if span is None:
        return "not found by run_squad.py", None
    if span_text(question.context, span) != answer["text"].strip():
        return "changed by the tokenizer", None
    if span[1] - span[0] + 1 > task.max_answer_length:
        return "longer than max_answer_length", None
    masks = squad.max_context(question.windows, len(question.context))
    if not any(
        first <= span[0] and span[1] < first + length and mask[span[0] - first]
        for (first, length), mask in zip(question.windows, masks)
    ):
        return "not whole in its start's max-context window", None
    return "answerable", span
