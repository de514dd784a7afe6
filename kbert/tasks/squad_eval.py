"""The official SQuAD evaluation scripts' metrics, function for function.

SQuAD v1.1 (`evaluate-v1.1.py`) and v2.0 (`evaluate-v2.0.py`) by Rajpurkar
et al.; figures are percentages, as they print them.
"""

import collections
import re
import string


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
        gold = _scored_answers(answers)
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


def _scored_answers(answers):
    """The gold answers a prediction is scored against: those with text left after
    normalising, or the empty answer when none has."""
    return [a for a in answers if normalize_answer(a)] or [""]


def tune_null_threshold(golds, texts, null_odds):
    """The null-odds threshold of the best F1 when each question answers its best
    span `texts[i]` unless its odds lie above the threshold (evaluate-v2.0.py's
    sweep of `find_best_threshold`). When answering nothing scores as well, the
    threshold goes below every odds, so that no question is answered.

    Args:
        golds: list of lists of str ([] for an unanswerable question).
        texts: list of str. Each question's best span, "" where it has none.
        null_odds: list of float. The null score minus that span's score.

    Returns:
        (best F1, threshold, F1 of answering nothing), the F1s in percent.
    """
    has_answer = [bool(answers) for answers in golds]
    f1 = [max(f1_v2(a, text) for a in _scored_answers(answers)) for answers, text in zip(golds, texts)]
    best, threshold = find_best_threshold(texts, f1, null_odds, has_answer)
    abstaining = 100.0 * has_answer.count(False) / len(has_answer)
    if best <= abstaining:
        threshold = min(null_odds) - 1.0
    return best, threshold, abstaining


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
