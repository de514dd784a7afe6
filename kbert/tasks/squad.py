"""SQuAD in plain Python and NumPy: the reader and google-research/bert's pre- and
post-processing (`run_squad.py`). Contexts as words and pieces with character
offsets are `squad_text`'s; the official evaluation scripts' metrics `squad_eval`'s.

What differs from `run_squad.py`, and why:

| step | run_squad.py | here |
| --- | --- | --- |
| words | split on whitespace only | split on whitespace, and each CJK character a word of its own, as the tokenizer splits it (a Chinese context would otherwise be one word, and an answer's word span the whole context) |
| "could not find answer" check | `" ".join(words)` contains the answer | the context's text over the answer's words, whitespace runs as one space: the same string for space-separated text, and right for CJK words, which touch |
| WordPiece | google's `FullTokenizer` | `kbert.text.WordPieceTokenizer` (Hugging Face's ids; google's differs on special tokens written in the text) |
| answer text | `get_final_text`: the WordPieces aligned back to the words by a heuristic that falls back to whole words | the context between the character offsets of the first and last WordPiece (what Hugging Face's offset mapping gives) |
| no valid span (v1.1) | the string "empty" | no answer |
| v2.0, no valid non-null span | crashes | no answer |

`tests/test_question_answering.py` holds each step to an independent
transcription of `run_squad.py` and the character offsets to Hugging Face
`tokenizers`' on every context of the samples.
"""

import json
import math
import re

import numpy as np

from kbert.fileio import read_json
from kbert.tasks import inference
from kbert.tasks.records import QuestionExample
from kbert.tasks.squad_text import WORD_SEPARATORS, character_classes

# A served answer's offsets when there is none.
NO_OFFSET = -1
# run_squad.py's flags: --max_query_length, --doc_stride, --n_best_size,
# --max_answer_length, --null_score_diff_threshold.
MAX_QUERY_LENGTH = 64
DOC_STRIDE = 128
N_BEST_SIZE = 20
MAX_ANSWER_LENGTH = 30
NULL_SCORE_DIFF_THRESHOLD = 0.0


# === Reading ===


def read_squad_json(path, targets=True):
    """The questions of a SQuAD-format JSON file (v1.1, or v2.0 with `is_impossible`).

    Args:
        path: str. `{"data": [{"paragraphs": [{"context", "qas": [{"id",
            "question", "answers": [{"text", "answer_start"}],
            "is_impossible"}]}]}]}`.
        targets: bool. Require answers (not needed to predict).

    Returns:
        list of `QuestionExample`s: `id`, `question`, `context`, `answers`
        (list of `{"text", "answer_start"}`), `is_impossible` (bool), `line` (None).

    Raises:
        ValueError: one line naming the file and the question id (or the
            article and paragraph) and what is wrong.
    """
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f'{path} is not SQuAD-shaped: expected a JSON object with a "data" list of articles')
    examples = []
    for a, article in enumerate(data["data"]):
        where = f"{path}, article {a}"
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise ValueError(f'{where} is not SQuAD-shaped: expected an object with a "paragraphs" list')
        for p, paragraph in enumerate(article["paragraphs"]):
            where = f"{path}, article {a}, paragraph {p}"
            if not isinstance(paragraph, dict):
                raise ValueError(f"{where} is not SQuAD-shaped: expected an object")
            context, qas = paragraph.get("context"), paragraph.get("qas")
            if not isinstance(context, str) or not isinstance(qas, list):
                raise ValueError(f'{where} is not SQuAD-shaped: expected a "context" string and a "qas" list')
            for q, qa in enumerate(qas):
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
                    raise ValueError(f'{where}, question {q} is not SQuAD-shaped: expected an object with an "id" string')
                examples.append(parse_example(path, qa, context, targets, None))
    return checked_examples(path, examples, targets)


def read_jsonl(path, targets=False):
    """Questions from JSON Lines: one `{"question", "context"}` object per line.

    `id` is optional (default: the line number); with `targets`, `answers`
    (and `is_impossible`) as in SQuAD.
    """
    examples = []
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number} is not valid JSON: {error}") from None
            if not isinstance(record, dict):
                raise ValueError(f'{path}, line {number}: expected an object with "question" and "context"')
            record = {"id": f"line-{number}", **record}
            if not isinstance(record["id"], str):
                raise ValueError(f'{path}, line {number}: "id" is {record["id"]!r}; expected a string')
            examples.append(parse_example(f"{path}, line {number}", record, record.get("context"), targets, number))
    if not examples:
        raise ValueError(f"{path} holds no questions")
    return checked_examples(path, examples, targets)


def parse_example(where, qa, context, targets, line):
    """One question record (SQuAD's `qa`, a JSON Lines record, or Python values) as an
    example; `ValueError` naming `where` and what is wrong with it."""
    qid = qa["id"]
    where = f"{where}: question {qid!r}"
    question = qa.get("question")
    # An empty question is read as run_squad.py reads it (CMRC 2018's trial set has one).
    if not isinstance(question, str):
        raise ValueError(f'{where}: "question" is {question!r:.80}; expected a string')
    if not isinstance(context, str) or not character_classes().word.search(context):
        raise ValueError(f'{where}: "context" is {context!r:.80}; expected a non-empty string')
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise ValueError(f'{where}: "is_impossible" is {impossible!r}; expected true or false')
    answers = qa.get("answers", [])
    if not isinstance(answers, list):
        raise ValueError(f'{where}: "answers" is {answers!r:.80}; expected a list')
    for answer in answers:
        if not (isinstance(answer, dict) and isinstance(answer.get("text"), str)
                and isinstance(answer.get("answer_start"), int) and not isinstance(answer["answer_start"], bool)):
            raise ValueError(f'{where}: answer {answer!r:.80}; expected {{"text": str, "answer_start": int}}')
        start, text = answer["answer_start"], answer["text"]
        if not text.strip() or start < 0 or context[start : start + len(text)] != text:
            raise ValueError(
                f"{where}: answer {text!r:.60} is not at its answer_start={start} in the context "
                f"(which reads {context[max(start, 0) : max(start, 0) + len(text)]!r:.60} there)"
            )
    if targets and impossible and answers:
        raise ValueError(f"{where} is marked is_impossible but has {len(answers)} answers")
    if targets and not impossible and not answers:
        raise ValueError(f'{where} has no answers; expected "answers", or "is_impossible": true (SQuAD v2.0)')
    return QuestionExample(
        id=qid,
        question=question,
        context=context,
        answers=[{"text": a["text"], "answer_start": a["answer_start"]} for a in answers],
        is_impossible=impossible,
        line=line,
    )


def checked_examples(path, examples, targets):
    """`examples`, or `ValueError` naming `path` if it holds none or repeats a question id."""
    if not examples:
        raise ValueError(f"{path} holds no questions")
    seen = set()
    for example in examples:
        if example.id in seen:
            raise ValueError(f"{path}: question id {example.id!r} appears twice; ids key the answers")
        seen.add(example.id)
    return examples


# === Answers and windows ===


def answer_token_span(context, answer, answer_ids):
    """The WordPiece span of a gold answer, as run_squad.py trains on it.

    The answer's characters give its words; the words' pieces are narrowed by
    `improve_answer_span` to the answer's own pieces where they occur.

    Args:
        context: `Context`.
        answer: dict `text`, `answer_start`.
        answer_ids: list of int. The answer text's WordPiece ids.

    Returns:
        `(start, end)` piece indices, or None where run_squad.py skips the
        answer ("Could not find answer": the words' text does not hold the
        answer once whitespace runs are single spaces).
    """
    start_char = answer["answer_start"]
    end_char = start_char + len(answer["text"]) - 1
    first_word, last_word = context.word_of_char(start_char), context.word_of_char(end_char)
    actual = " ".join(
        _separated(context.text[context.word_starts[first_word] : context.word_ends[last_word]])
    )
    if actual.find(" ".join(answer["text"].split())) == -1:
        return None
    start = int(context.first_piece[first_word])
    end = int(context.first_piece[last_word + 1]) - 1
    return improve_answer_span(context.ids, start, end, answer_ids)


def _separated(text):
    return [part for part in re.split(f"[{re.escape(WORD_SEPARATORS)}]+", text) if part]


def improve_answer_span(ids, start, end, answer_ids):
    """run_squad.py's `_improve_answer_span`: the first sub-span of `[start, end]`
    whose pieces are exactly the answer's, else `(start, end)`.

    The reference compares space-joined tokens for every start and end; two
    joins are equal exactly when the token sequences are, so only the end
    `start + len(answer) - 1` can match.
    """
    length = len(answer_ids)
    answer_ids = list(answer_ids)
    for new_start in range(start, end - length + 2):
        if length and ids[new_start : new_start + length].tolist() == answer_ids:
            return new_start, new_start + length - 1
    return start, end


def doc_windows(num_tokens, max_tokens_for_doc, doc_stride):
    """run_squad.py's doc spans: `(start, length)` windows of at most
    `max_tokens_for_doc` pieces, each `min(length, doc_stride)` after the last."""
    windows, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_for_doc)
        windows.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return windows


def max_context(windows, num_tokens):
    """run_squad.py's `_check_is_max_context` for every piece of every window.

    A piece's score in a window is `min(left, right) + 0.01 * length`; the
    first window of the highest score is its max-context window. Computed in
    one pass over the windows (the reference scans every window for every
    piece).

    Returns:
        list of bool arrays, one per window, one entry per piece in it.
    """
    best = np.full(num_tokens, -math.inf)
    owner = np.zeros(num_tokens, np.int64)
    for index, (start, length) in enumerate(windows):
        position = np.arange(start, start + length)
        score = np.minimum(position - start, start + length - 1 - position) + 0.01 * length
        better = score > best[position]
        best[position[better]] = score[better]
        owner[position[better]] = index
    return [owner[start : start + length] == index for index, (start, length) in enumerate(windows)]


# === Post-processing ===


def best_answer(rows, n_best_size, max_answer_length, version_2):
    """run_squad.py's `write_predictions` for one question.

    Args:
        rows: list of dicts, one per window of the question, each `start_logits`
            and `end_logits` (float arrays over the packed sequence), `offset`
            (position of the window's first piece), `length` (pieces in the
            window), `max_context` (bool per piece), `first` (index of the
            window's first piece in the context).
        n_best_size, max_answer_length: int.
        version_2: bool. Score the null answer too.

    Returns:
        dict: `best` (the best non-null candidate: `start` and `end` piece
        indices in the context and `score`, or None), `null_score` (v2.0: the
        smallest start + end logit at [CLS]), `nbest` (list of `(start, end,
        score)`, None for the null answer, in rank order, before deduplication
        by text, which the caller does).
    """
    prelim = []
    null_score = None
    for row in rows:
        start_logits = np.asarray(row["start_logits"], np.float64)
        end_logits = np.asarray(row["end_logits"], np.float64)
        if version_2:
            score = start_logits[0] + end_logits[0]
            if null_score is None or score < null_score:
                null_score, null_logits = score, (start_logits[0], end_logits[0])
        starts = _best_indexes(start_logits, n_best_size)
        ends = _best_indexes(end_logits, n_best_size)
        offset, length = row["offset"], row["length"]
        in_doc_start = (starts >= offset) & (starts < offset + length)
        in_doc_end = (ends >= offset) & (ends < offset + length)
        is_max = np.zeros(len(starts), bool)
        is_max[in_doc_start] = row["max_context"][starts[in_doc_start] - offset]
        valid = (
            (in_doc_start & is_max)[:, None]
            & in_doc_end[None, :]
            & (ends[None, :] >= starts[:, None])
            & (ends[None, :] - starts[:, None] + 1 <= max_answer_length)
        )
        for i, j in zip(*np.nonzero(valid)):  # row-major: start rank, then end rank
            start, end = int(starts[i]), int(ends[j])
            prelim.append((
                start_logits[start] + end_logits[end],
                row["first"] + start - offset,
                row["first"] + end - offset,
            ))
    if version_2:
        prelim.append((null_logits[0] + null_logits[1], None, None))
    # Stable, as Python's `sorted(..., reverse=True)` in the reference.
    order = sorted(range(len(prelim)), key=lambda k: -prelim[k][0])
    nbest = [(prelim[k][1], prelim[k][2], prelim[k][0]) for k in order]
    best = next(({"start": s, "end": e, "score": score} for s, e, score in nbest if s is not None), None)
    return {"best": best, "null_score": null_score, "nbest": nbest}


def _best_indexes(logits, n_best_size):
    """The `n_best_size` highest logits' indexes, the lower index first on ties."""
    return np.argsort(-logits, kind="stable")[:n_best_size]


def nbest_prediction(context, result, n_best_size):
    """run_squad.py's n-best list of one question: deduplicated by text, with
    softmax probabilities; the best non-null entry and the null entry."""
    nbest, seen = [], set()
    for start, end, score in result["nbest"]:
        if len(nbest) >= n_best_size:
            break
        text = "" if start is None else context.text[context.piece_starts[start] : context.piece_ends[end]]
        if start is not None and text in seen:
            continue
        seen.add(text)
        char_start = None if start is None else int(context.piece_starts[start])
        char_end = None if start is None else int(context.piece_ends[end])
        nbest.append({"text": text, "start": char_start, "end": char_end, "score": float(score)})
    if result["null_score"] is not None and "" not in seen:
        nbest.append({"text": "", "start": None, "end": None, "score": float(result["null_score"])})
    for entry, probability in zip(nbest, inference.softmax([entry["score"] for entry in nbest], np.float64)):
        entry["probability"] = probability
    best = next((entry for entry in nbest if entry["text"]), None)
    null = next((entry for entry in nbest if not entry["text"]), None)
    prediction = {"best": best, "null": null if result["null_score"] is not None else None, "null_score_diff": None}
    if result["null_score"] is not None:
        prediction["null_score_diff"] = float(result["null_score"]) - best["score"] if best else float("inf")
    return prediction


def served_predictions(outputs):
    """Predictions from a question-answering SavedModel's `serving_default` outputs
    (answers chosen in the graph, `kbert.export.question_answering_graph`)."""
    predictions = []
    null_diffs = outputs.get("null_score_diff")
    for i, text in enumerate(outputs["answer"]):
        text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        start, end = int(outputs["answer_start"][i]), int(outputs["answer_end"][i])
        found = start != NO_OFFSET
        predictions.append({
            "answer": {
                "text": text,
                "start": start if found else None,
                "end": end if found else None,
                "score": float(outputs["score"][i]) if found else None,
            },
            "best_score": float(outputs["best_score"][i]),
            "null_score_diff": None if null_diffs is None else float(null_diffs[i]),
        })
    return predictions


def best_score(prediction):
    """The best span's score of a prediction (`decode`'s, or one a signature served), or None."""
    if "best_score" in prediction:
        return prediction["best_score"]
    return prediction["best"]["score"] if prediction.get("best") else None
