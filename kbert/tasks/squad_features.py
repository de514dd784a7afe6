"""run_squad.py's features of SQuAD questions: each question's pieces and windows, packed as rows.

A `Question` holds one question compactly (its context's WordPieces shared
with the other questions of its paragraph); `pack_row` makes the packed row
of one of its windows, so that training can make rows one at a time
(`QuestionAnswering.training_rows`) and `encode` all at once.
"""

import numpy as np

from kbert.tasks import squad, squad_text
from kbert.tasks.base import ENCODE_CHUNK


class Question:
    """One question as run_squad.py's features need it.

    Attributes:
        query: int32 array. The question's pieces, cut to `max_query_length`.
        context: `squad_text.Context`, shared by the questions of a paragraph.
        windows: list of `(start, length)` piece windows of the context.
        target: `(start, end)` pieces of the first answer, `(-1, -1)` for an
            unanswerable question, None for one whose answer run_squad.py
            cannot find (skipped in training) or without targets.
        answer: str or None. The first answer's text.
        skipped: bool. No target.
    """

    __slots__ = ("query", "context", "windows", "target", "answer", "skipped")

    def __init__(self, query, context, windows, target, answer=None):
        self.query, self.context, self.windows = query, context, windows
        self.target, self.answer = target, answer
        self.skipped = target is None


def train_figures(questions, rows):
    """What `training_rows` made of the training questions (for metrics.json)."""
    answerable = [q for q in questions if q.target != (-1, -1)]
    return {
        "train_questions": len(questions),
        "train_questions_skipped": sum(q.skipped for q in questions),
        "train_answerable": len(answerable),
        # Trained on all the same, as run_squad.py does ("Japan" in "Japanese").
        "train_answers_the_tokenizer_changed": sum(
            not q.skipped and span_text(q.context, q.target) != q.answer.strip() for q in answerable
        ),
        "train_rows": int(len(rows)),
        "context_words_with_offset_fallback": sum({id(q.context): q.context.fallbacks for q in questions}.values()),
    }


def prepare(task, examples, targets=True):
    """run_squad.py's features of `examples`, compactly: one `Question` each.

    `task`: a `QuestionAnswering` (its tokenizer, sequence length,
    `max_query_length` and `doc_stride`).

    Tokenizes `ENCODE_CHUNK` questions at a time, each distinct context
    once.

    Raises:
        ValueError: naming the question id whose question leaves no room
            for the context in the sequence, or whose context has no
            WordPiece.
    """
    contexts = {}
    questions = []
    for chunk_start in range(0, len(examples), ENCODE_CHUNK):
        chunk = examples[chunk_start : chunk_start + ENCODE_CHUNK]
        new = sorted({e.context for e in chunk} - contexts.keys())
        contexts.update(zip(new, squad_text.tokenize_contexts(task.tokenizer, new)))
        queries = squad_text.tokenize(task.tokenizer, [e.question for e in chunk])
        answerable = [e for e in chunk if targets and e.answers]
        answer_ids = dict(zip(
            [id(e) for e in answerable],
            squad_text.tokenize(task.tokenizer, [e.answers[0]["text"] for e in answerable]),
        ))
        for example, query in zip(chunk, queries):
            questions.append(_question(task, example, query, contexts[example.context], targets, answer_ids))
    return questions


def _question(task, example, query, context, targets, answer_ids):
    query = query[: task.max_query_length]
    room = task.sequence_length - len(query) - 3  # [CLS] question [SEP] context [SEP]
    if room < 1:
        raise ValueError(
            f"question {example.id!r}: its {len(query)} pieces (--max-query-length "
            f"{task.max_query_length}) with [CLS] and two [SEP] leave no room for the context "
            f"in --seq-len {task.sequence_length}"
        )
    if not len(context):
        raise ValueError(f"question {example.id!r}: the context has no WordPiece")
    span = None
    if targets and example.answers:
        # run_squad.py trains on the first answer.
        span = squad.answer_token_span(context, example.answers[0], answer_ids[id(example)])
    return Question(
        query=np.asarray(query, np.int32),
        context=context,
        windows=squad.doc_windows(len(context), room, task.doc_stride),
        target=None if not targets else (-1, -1) if not example.answers else span,
        answer=example.answers[0]["text"] if targets and example.answers else None,
    )


def pack_row(tokenizer, question, window):
    """The packed row of one window: `(token_ids, segment_ids, (start, end))`.

    The target points at [CLS] for an unanswerable question and for a
    window that does not hold the whole answer (run_squad.py); None
    without a target.
    """
    start, length = question.windows[window]
    offset = len(question.query) + 2
    ids = np.concatenate([
        [tokenizer.cls_id], question.query, [tokenizer.sep_id],
        question.context.ids[start : start + length], [tokenizer.sep_id],
    ]).astype(np.int32)
    segments = (np.arange(len(ids)) >= offset).astype(np.int32)
    target = None
    if question.target is not None:
        first, last = question.target
        inside = first >= start and last <= start + length - 1
        target = (first - start + offset, last - start + offset) if first >= 0 and inside else (0, 0)
    return ids, segments, target


def question_rows(questions, learned_only=False):
    """`(question, window)` int64 pairs `(rows, 2)`: every window of every question, or
    with `learned_only` those of the questions training learns from (not `skipped`)."""
    return np.array(
        [(q, w) for q, question in enumerate(questions)
         if not (learned_only and question.skipped) for w in range(len(question.windows))],
        np.int64,
    ).reshape(-1, 2)


def span_text(context, span):
    """The context's text from the first piece of `span` to its last."""
    return context.text[context.piece_starts[span[0]] : context.piece_ends[span[1]]]
