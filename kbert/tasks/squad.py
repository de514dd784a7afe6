"""SQuAD in plain Python and NumPy: the reader, google-research/bert's pre- and
post-processing (`run_squad.py`), and the official evaluation scripts' metrics.

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

import collections
import functools
import json
import math
import re
import string
import unicodedata

import numpy as np

from kbert.fileio import read_json

# run_squad.py's flags: --max_query_length, --doc_stride, --n_best_size,
# --max_answer_length, --null_score_diff_threshold.
MAX_QUERY_LENGTH = 64
DOC_STRIDE = 128
N_BEST_SIZE = 20
MAX_ANSWER_LENGTH = 30
NULL_SCORE_DIFF_THRESHOLD = 0.0
# run_squad.py's `is_whitespace`: the characters that separate words.
WORD_SEPARATORS = " \t\r\n\u202f"


def _python_class(re2_class):
    """An RE2 character class of `kbert.text.tokenizer` as a Python `re` class."""
    return re.sub(r"\\x\{([0-9A-Fa-f]+)\}", lambda m: f"\\U{int(m.group(1), 16):08x}", re2_class)


_Characters = collections.namedtuple(
    "_Characters", "word is_cjk punctuation control whitespace nonspacing_mark"
)


@functools.cache
def _characters():
    """The tokenizer's own character classes as Python patterns.

    The same tables, so that the words and offsets here split text exactly
    where its ids do. Compiled on first use: they live in the TensorFlow
    tokenizer's module, and `kbert.tasks` loads without TensorFlow so that the
    command line's `--help` is instant.
    """
    from kbert.text import tokenizer as wordpiece

    cjk = _python_class(wordpiece._CJK)
    return _Characters(
        # A word: a CJK character, or a run of characters that are neither
        # separators nor CJK.
        word=re.compile(f"{cjk}|[^{re.escape(WORD_SEPARATORS)}{cjk[1:-1]}]+"),
        is_cjk=re.compile(cjk),
        punctuation=re.compile(_python_class(wordpiece._PUNCTUATION)),
        control=re.compile(_python_class(wordpiece._CONTROL)),
        whitespace=re.compile(_python_class(wordpiece._WHITESPACE)),
        nonspacing_mark=re.compile(_python_class(wordpiece._NONSPACING_MARKS)),
    )


# === Reading ===


def read_squad_json(path, targets=True):
    """The questions of a SQuAD-format JSON file (v1.1, or v2.0 with `is_impossible`).

    Args:
        path: str. `{"data": [{"paragraphs": [{"context", "qas": [{"id",
            "question", "answers": [{"text", "answer_start"}],
            "is_impossible"}]}]}]}`.
        targets: bool. Require answers (not needed to predict).

    Returns:
        list of dicts `id`, `question`, `context`, `answers` (list of
        `{"text", "answer_start"}`), `is_impossible` (bool), `line` (None).

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
                examples.append(_example(path, qa, context, targets, None))
    return _checked(path, examples, targets)


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
            examples.append(_example(f"{path}, line {number}", record, record.get("context"), targets, number))
    if not examples:
        raise ValueError(f"{path} holds no questions")
    return _checked(path, examples, targets)


def _example(where, qa, context, targets, line):
    qid = qa["id"]
    where = f"{where}: question {qid!r}"
    question = qa.get("question")
    # An empty question is read as run_squad.py reads it (CMRC 2018's trial set has one).
    if not isinstance(question, str):
        raise ValueError(f'{where}: "question" is {question!r:.80}; expected a string')
    if not isinstance(context, str) or not _characters().word.search(context):
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
    return {
        "id": qid,
        "question": question,
        "context": context,
        "answers": [{"text": a["text"], "answer_start": a["answer_start"]} for a in answers],
        "is_impossible": impossible,
        "line": line,
    }


def _checked(path, examples, targets):
    if not examples:
        raise ValueError(f"{path} holds no questions")
    seen = set()
    for example in examples:
        if example["id"] in seen:
            raise ValueError(f"{path}: question id {example['id']!r} appears twice; ids key the answers")
        seen.add(example["id"])
    return examples


# === Words, WordPieces and their character offsets ===


class Context:
    """A context split into words (run_squad.py's `doc_tokens`) and WordPieces.

    Attributes:
        text: str.
        word_starts, word_ends: int arrays. Each word's characters `[start, end)`.
        ids: int32 array. The WordPiece ids of the words, in order.
        first_piece: int array, one more than the words: the first piece of
            each word (`orig_to_tok_index`); the last entry is `len(ids)`.
        piece_starts, piece_ends: int arrays. Each piece's characters in `text`.
        fallbacks: int. Words whose pieces could not be placed one by one and
            were each given the span of their unit or word (see `_piece_spans`).
    """

    def __init__(self, text, word_spans, word_ids, pieces, lowercase, max_chars):
        self.text = text
        self.word_starts = np.array([s for s, _ in word_spans], np.int64)
        self.word_ends = np.array([e for _, e in word_spans], np.int64)
        lengths = [len(ids) for ids in word_ids]
        self.first_piece = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.ids = np.fromiter((i for ids in word_ids for i in ids), np.int32, int(self.first_piece[-1]))
        starts, ends = [], []
        self.fallbacks = 0
        for (word_start, word_end), tokens in zip(word_spans, pieces):
            spans, fallback = _piece_spans(text[word_start:word_end], tokens, lowercase, max_chars)
            self.fallbacks += fallback
            starts += [word_start + s for s, _ in spans]
            ends += [word_start + e for _, e in spans]
        self.piece_starts = np.array(starts, np.int64)
        self.piece_ends = np.array(ends, np.int64)

    def __len__(self):
        return len(self.ids)

    def word_of_char(self, char):
        """run_squad.py's `char_to_word_offset[char]`: the word at or before `char`."""
        return int(np.searchsorted(self.word_starts, char, side="right")) - 1


def split_words(text):
    """The `(start, end)` character spans of `text`'s words."""
    return [m.span() for m in _characters().word.finditer(text)]


def tokenize_contexts(tokenizer, texts):
    """`Context`s of `texts`, all their words tokenized in one call."""
    spans = [split_words(text) for text in texts]
    words = [text[s:e] for text, text_spans in zip(texts, spans) for s, e in text_spans]
    word_ids = tokenize(tokenizer, words)
    vocabulary = tokenizer.vocabulary
    contexts, at = [], 0
    for text, text_spans in zip(texts, spans):
        ids = word_ids[at : at + len(text_spans)]
        at += len(text_spans)
        pieces = [[vocabulary[i] for i in word] for word in ids]
        contexts.append(Context(text, text_spans, ids, pieces, tokenizer.lowercase, tokenizer.max_chars_per_word))
    return contexts


def tokenize(tokenizer, texts):
    """WordPiece ids of each of `texts`: a list of lists of int."""
    if not texts:
        return []
    ragged = tokenizer(np.array(texts, dtype=object))
    flat = ragged.flat_values.numpy().tolist()
    bounds = ragged.row_splits.numpy().tolist()
    return [flat[bounds[i] : bounds[i + 1]] for i in range(len(texts))]


def _normalize_char(char, lowercase):
    """What the tokenizer's normaliser makes of one character (`WordPieceTokenizer._normalize`)."""
    characters = _characters()
    if characters.control.match(char):
        return ""
    if not lowercase:
        return char
    decomposed = unicodedata.normalize("NFD", char)
    stripped = "".join(c for c in decomposed if not characters.nonspacing_mark.match(c))
    return stripped.replace("Σ", "σ").lower()


def _units(word, lowercase, special):
    """The pieces of text the tokenizer runs WordPiece on, within `word`.

    Returns:
        list of `(normalized, owner)`: the unit's normalized text and, for each
        of its characters, the index in `word` of the character it comes from.
        Units are special tokens kept whole, CJK and punctuation characters
        alone, and runs of other characters; whitespace (inside a run_squad.py
        word, e.g. U+00A0) separates them.
    """
    characters = _characters()
    units = []
    position = 0
    for part in special.split(word):
        if special.fullmatch(part):
            units.append((part, list(range(position, position + len(part)))))
            position += len(part)
            continue
        run, owner = [], []
        for index, char in enumerate(part, position):
            alone = characters.is_cjk.match(char) or characters.punctuation.match(char)
            if alone or characters.whitespace.match(char):
                if run:
                    units.append(("".join(run), owner))
                    run, owner = [], []
                if alone:
                    normalized = _normalize_char(char, lowercase)
                    units.append((normalized, [index] * len(normalized)))
                continue
            normalized = _normalize_char(char, lowercase)
            run.append(normalized)
            owner += [index] * len(normalized)
        if run:
            units.append(("".join(run), owner))
        position += len(part)
    return [unit for unit in units if unit[0]]


def _piece_spans(word, pieces, lowercase, max_chars):
    """Character spans of a word's WordPieces, relative to the word.

    Each unit of `_units` gives the pieces up to the next one that does not
    start with "##"; a piece spans the characters its normalized text comes
    from (characters the normaliser drops at its edges excluded, as in
    Hugging Face's offsets). A unit whose pieces do not spell its normalized
    text gives each of them the unit's span, and a word whose units and
    pieces do not pair up gives each piece the word's span: the answer then
    widens, as run_squad.py's falls back to whole words.

    Returns:
        (list of `(start, end)`, bool: a fallback was needed).
    """
    if not pieces:
        return [], False
    if word.isascii() and word.isalnum():  # most words: no normalisation to follow
        units = [(word.lower() if lowercase else word, range(len(word)))]
    else:
        units = _units(word, lowercase, _special_pattern())
    groups = []
    for piece in pieces:
        if groups and piece.startswith("##"):
            groups[-1].append(piece[2:])
        else:
            groups.append([piece])
    if len(groups) != len(units):
        return [(0, len(word))] * len(pieces), True
    spans, fallback = [], False
    for (normalized, owner), group in zip(units, groups):
        whole = (owner[0], owner[-1] + 1)
        if len(group) == 1:  # one piece, or [UNK]
            spans.append(whole)
        elif len(normalized) > max_chars or "".join(group) != normalized:
            spans += [whole] * len(group)
            fallback = True
        else:
            at = 0
            for text in group:
                spans.append((owner[at], owner[at + len(text) - 1] + 1))
                at += len(text)
    return spans, fallback


_SPECIAL = {}


def _special_pattern():
    """The special tokens the tokenizer keeps whole when written in the text."""
    if "pattern" not in _SPECIAL:
        tokens = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
        _SPECIAL["pattern"] = re.compile("(" + "|".join(re.escape(t) for t in tokens) + ")")
    return _SPECIAL["pattern"]


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


def softmax(scores):
    """run_squad.py's `_compute_softmax`."""
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(score - top) for score in scores]
    total = sum(exps)
    return [value / total for value in exps]


# === The official evaluation scripts ===
#
# SQuAD v1.1 (`evaluate-v1.1.py`) and v2.0 (`evaluate-v2.0.py`) by Rajpurkar
# et al., function for function; figures are percentages, as they print them.


def normalize_answer(text):
    """Lower-cases, removes punctuation, the articles a/an/the and extra whitespace."""
    text = text.lower()
    text = "".join(c for c in text if c not in _ASCII_PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


_ASCII_PUNCTUATION = set(string.punctuation)


def exact_match_v1(prediction, gold):
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_v1(prediction, gold):
    prediction_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0
    precision = same / len(prediction_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_v1_metrics(golds, predictions):
    """evaluate-v1.1.py: `exact_match` and `f1`, each the max over the gold answers.

    Args:
        golds: list of lists of str, the gold answers of each question.
        predictions: list of str.
    """
    exact = f1 = 0.0
    for answers, prediction in zip(golds, predictions):
        exact += max(exact_match_v1(prediction, a) for a in answers)
        f1 += max(f1_v1(prediction, a) for a in answers)
    total = len(golds)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def _tokens_v2(text):
    return normalize_answer(text).split() if text else []


def exact_v2(gold, prediction):
    return int(normalize_answer(gold) == normalize_answer(prediction))


def f1_v2(gold, prediction):
    gold_tokens, prediction_tokens = _tokens_v2(gold), _tokens_v2(prediction)
    common = collections.Counter(gold_tokens) & collections.Counter(prediction_tokens)
    same = sum(common.values())
    if not gold_tokens or not prediction_tokens:
        # No-answer on either side: 1 if both are, else 0.
        return int(gold_tokens == prediction_tokens)
    if same == 0:
        return 0
    precision = same / len(prediction_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_v2_metrics(golds, predictions, null_odds=None):
    """evaluate-v2.0.py: `exact_match`, `f1`, `HasAns_*`, `NoAns_*`, and with
    `null_odds` (its --na-prob-file) the `best_*` figures and thresholds.

    Args:
        golds: list of lists of str ([] for an unanswerable question).
        predictions: list of str ("" for no answer).
        null_odds: list of float or None. The null score minus the best
            span's score of each question (run_squad.py's null_odds.json).

    The script's --na-prob-thresh is left at its default, which on score
    differences would override predictions: `exact_match` and `f1` score the
    predictions as given.
    """
    exact_raw, f1_raw, has_answer = [], [], []
    for answers, prediction in zip(golds, predictions):
        has_answer.append(bool(answers))
        gold = [a for a in answers if normalize_answer(a)] or [""]
        exact_raw.append(max(exact_v2(a, prediction) for a in gold))
        f1_raw.append(max(f1_v2(a, prediction) for a in gold))
    metrics = _eval_dict(exact_raw, f1_raw, range(len(golds)), "")
    for name, wanted in (("HasAns_", True), ("NoAns_", False)):
        subset = [i for i, has in enumerate(has_answer) if has == wanted]
        if subset:
            metrics.update(_eval_dict(exact_raw, f1_raw, subset, name))
    if null_odds is not None:
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            best, threshold = find_best_threshold(predictions, raw, null_odds, has_answer)
            metrics[f"best_{name}"], metrics[f"best_{name}_thresh"] = best, threshold
    return metrics


def _eval_dict(exact_raw, f1_raw, subset, prefix):
    subset = list(subset)
    total = len(subset)
    exact_name = "exact" if prefix else "exact_match"
    return {
        f"{prefix}{exact_name}": 100.0 * sum(exact_raw[i] for i in subset) / total,
        f"{prefix}f1": 100.0 * sum(f1_raw[i] for i in subset) / total,
        f"{prefix}total": total,
    }


def find_best_threshold(predictions, scores, null_odds, has_answer):
    """evaluate-v2.0.py's `find_best_thresh`: the null-odds threshold that
    maximises the score, sweeping the questions from the lowest odds up."""
    score = best = sum(1 for has in has_answer if not has)
    threshold = 0.0
    for i in sorted(range(len(null_odds)), key=lambda i: null_odds[i]):
        if has_answer[i]:
            score += scores[i]
        elif predictions[i]:
            score -= 1
        if score > best:
            best, threshold = score, null_odds[i]
    return 100.0 * best / len(scores), threshold
