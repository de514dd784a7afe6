"""The token-classification task: CoNLL reading, alignment, windows, offsets, metric, CLI, export.

References: the `tokenizers` library for words, ids and offsets; `seqeval`
for the entity metric; google-research/bert's `_check_is_max_context` (written
out below) for windows; the LiteRT interpreter and MediaPipe's metadata for
the exported files.
"""

import dataclasses
import json
import os
import random
import re

import numpy as np
import pytest
import tensorflow as tf

from kbert.cli import main
from kbert.modelfolder import ModelFolder
from kbert.tasks import TASKS, WordsExample
from kbert.tasks.tagging import chunks, entity_metrics, joined_tag, split_tags
from kbert.tasks.inference import batches_by_length
from kbert.tasks.token_classification import IGNORED, word_offsets
from kbert.training.batching import eval_dataset
from tests.task_harness import minilm_vocabulary, task_instance, write_task_folder
from tests.test_export_units import TINY

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONLL = os.path.join(REPO, "..", "shared", "data", "conll2003")
DOCS = os.path.join(REPO, "docs", "tasks", "token-classification.md")
NAME = "token-classification"
TAGS = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
# Whole CoNLL tokens, each sentence read alone (the window tests follow google-research/bert's on each).
SETTINGS = {"tags": TAGS, "scheme": "IOB2", "word_split": "none", "context": "sentence"}
# Text beyond CoNLL's: accents, CJK, Greek, control and zero-width characters,
# special tokens, punctuation inside words.
HARD_TEXTS = [
    "Zürich's Pérez met 東京大学 at Ελλάδα on 1996-08-22.",
    "  José\u200b Martí\t(Cuba)\n[MASK] O'Neil, ﬁnal: «Señor»!",
    "Σίσυφος\u00adΣ and naïve Ａｂｃ ½ \u0301x",
]


@pytest.fixture(scope="module")
def dev():
    return TASKS[NAME].read(os.path.join(CONLL, "dev.txt"))


def hugging_face(lowercase):
    import tokenizers

    vocabulary = list(minilm_vocabulary())
    return tokenizers.BertWordPieceTokenizer({t: i for i, t in enumerate(vocabulary)}, lowercase=lowercase)


# === Words, ids and offsets ===


@pytest.mark.parametrize("lowercase", [True, False])
def test_words_and_offsets_match_tokenizers(dev, lowercase):
    """Every dev sentence (words joined by spaces) and harder texts: the ids, and each
    word's character span, are those of Hugging Face's tokenizer."""
    texts = [" ".join(e.words) for e in dev] + HARD_TEXTS
    task = task_instance(NAME, SETTINGS, lowercase=lowercase)
    word_ids, starts, ends = task.tokenizer.words_with_offsets(texts)
    splits = starts.row_splits.numpy()
    pieces = word_ids.merge_dims(1, 2)
    ids = np.split(pieces.flat_values.numpy(), pieces.row_splits.numpy()[1:-1])
    spans = np.split(np.stack([starts.flat_values.numpy(), ends.flat_values.numpy()], 1), splits[1:-1])
    reference = hugging_face(lowercase).encode_batch(texts, add_special_tokens=False)
    for text, text_ids, text_spans, expected in zip(texts, ids, spans, reference):
        words = {}
        for word, (a, b) in zip(expected.word_ids, expected.offsets):
            words.setdefault(word, [a, b])[1] = b
        assert text_ids.tolist() == expected.ids, text
        assert text_spans.tolist() == list(words.values()), text


def test_raw_text_entities_have_exact_offsets(dev):
    """Each dev sentence as raw text: gold tags on its words give back every gold
    entity, with `text[start:end]` its words joined; accents and CJK too."""
    task = task_instance(NAME, SETTINGS, sequence_length=64)
    texts = [" ".join(e.words) for e in dev]
    examples = task.examples_from_texts(texts)
    predictions = []
    for raw, gold in zip(examples, dev):
        # Raw words are CoNLL's or pieces of them ("1996-08-22"): tag the first as
        # the CoNLL word, the others as its continuation.
        conll_starts = dict(zip(word_offsets(gold)[1], gold.tags))
        tags, inside = [], "O"
        for start in raw.starts:
            if start in conll_starts:
                tags.append(conll_starts[start])
                inside = "O" if tags[-1] == "O" else "I-" + tags[-1][2:]
            else:
                tags.append(inside)
        predictions.append({"tags": tags, "scores": [1.0] * len(tags)})
    rows = task.predict_json(examples, predictions)
    for row, gold in zip(rows, dev):
        expected = [(kind, " ".join(gold.words[a:b])) for kind, a, b in chunks(gold.tags)]
        assert [(e["type"], e["text"]) for e in row["entities"]] == expected
        assert all(row["text"][e["start"] : e["end"]] == e["text"] for e in row["entities"])
    text = "Zoë Saldaña flew from 東京 to São Paulo."
    (example,) = task.examples_from_texts([text])
    assert example.words == ["Zoë", "Saldaña", "flew", "from", "東", "京", "to", "São", "Paulo", "."]
    tags = ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O", "B-LOC", "I-LOC", "O"]
    (row,) = task.predict_json([example], [{"tags": tags, "scores": [0.5] * 10}])
    assert [(e["type"], e["start"], e["end"], e["text"]) for e in row["entities"]] == [
        ("PER", 0, 11, "Zoë Saldaña"), ("LOC", 22, 24, "東京"), ("LOC", 28, 37, "São Paulo")
    ]


# === Windows ===


def max_context_windows(count, budget, stride):
    """google-research/bert's doc spans and `_check_is_max_context` (run_squad.py),
    with its score min(left, right) + 0.01 * length scaled by 100."""
    spans, start = [], 0
    while start < count:
        length = min(count - start, budget)
        spans.append((start, length))
        if start + length == count:
            break
        start += min(length, stride)
    best = []
    for position in range(count):
        scores = [
            (100 * min(position - s, s + n - 1 - position) + n, -index)
            for index, (s, n) in enumerate(spans)
            if s <= position < s + n
        ]
        best.append(-max(scores)[1])
    return spans, best


@pytest.mark.parametrize("sequence_length", [8, 13, 32])
def test_windows_follow_bert_max_context(dev, sequence_length):
    """Long sentences are cut into google-research/bert's windows, each word read from
    its max-context window, once; gold logits there give back every entity."""
    task = task_instance(NAME, SETTINGS, sequence_length=sequence_length)
    examples = dev[:300]
    encoded = task.encode(examples)
    extra = encoded.extra
    words = [w for e in examples for w in e.words]
    piece_counts = np.maximum(task.tokenizer(tf.constant(words)).row_lengths().numpy(), 1).tolist()
    word = row = 0
    for index, example in enumerate(examples):
        counts = piece_counts[word : word + len(example.words)]
        spans, best = max_context_windows(sum(counts), sequence_length - 2, task.stride)
        assert list(encoded.example_of_row[row : row + len(spans)]) == [index] * len(spans)
        first_pieces = np.cumsum([0] + counts[:-1])
        for k, piece in enumerate(first_pieces):
            span_start = spans[best[piece]][0]
            assert extra["word_row"][word + k] == row + best[piece]
            assert extra["word_position"][word + k] == piece - span_start + 1
        word += len(counts)
        row += len(spans)
    assert row == len(encoded) and word == len(extra["word_row"])
    targets = encoded.targets
    assert (targets != -1).sum() == word  # each word a target once
    logits = np.where(np.arange(len(TAGS)) == targets[..., None], 10.0, 0.0)
    predictions = task.decode(examples, encoded, {"logits": logits})
    assert entity_metrics([e.tags for e in examples], [p["tags"] for p in predictions])["f1"] == 1.0


def test_batches_by_length_give_the_full_length_logits(dev):
    """`run` and the validation batches cut each batch to its longest row: the
    logits of every token are those of the model on full-length rows."""
    task = task_instance(NAME, SETTINGS, sequence_length=64)
    model = task.build_model(TINY)
    encoded = task.encode(dev[:150])
    full = model.predict(encoded.features, batch_size=64, verbose=0)
    outputs = task.run(model, encoded.features, batch_size=16)
    tokens = encoded.features["padding_mask"] == 1
    np.testing.assert_array_equal(outputs["compared"], tokens)
    np.testing.assert_allclose(outputs["logits"][tokens], full[tokens], atol=1e-5)
    widths = [width for _, width in batches_by_length(encoded.features, 16, task.sequence_length)]
    assert widths == sorted(widths) and widths[0] == 32 and widths[-1] == 64
    rows, dataset = 0, eval_dataset(task, encoded, 16)
    assert int(dataset.cardinality()) == len(widths)
    for features, targets in dataset:
        assert features["token_ids"].shape == targets.shape and targets.shape[1] in (32, 64)
        rows += len(targets)
    assert rows == len(encoded)


# === Metric ===


def to_scheme(tags, scheme):
    """IOB2 tags rewritten in `scheme`."""
    out = list(tags)
    if scheme == "IOB2":
        return out
    for kind, a, b in chunks(tags):
        if scheme == "IOB1":
            adjacent = a > 0 and tags[a - 1] != "O" and tags[a - 1][2:] == kind
            out[a] = ("B-" if adjacent else "I-") + kind
        else:
            inside = ["I-" + kind] * (b - a - 2)
            out[a:b] = ["S-" + kind] if b - a == 1 else ["B-" + kind] + inside + ["E-" + kind]
    return out


@pytest.mark.parametrize("scheme", ["IOB2", "IOB1", "BIOES"])
def test_entity_metric_equals_seqeval(dev, scheme):
    """Precision, recall, F1, per-type figures and accuracy exactly as seqeval's default
    (conlleval) mode, on predictions with ill-formed sequences (I- after O, stray E-)."""
    from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score
    from seqeval.metrics.sequence_labeling import get_entities

    rng = random.Random(scheme)
    gold = [to_scheme(e.tags, scheme) for e in dev]
    kinds = ["LOC", "MISC", "ORG", "PER"]
    vocabulary = ["O"] + [f"{p}-{k}" for p in "BIES" for k in kinds]
    predicted = [[rng.choice(vocabulary) if rng.random() < 0.1 else t for t in tags] for tags in gold]
    assert sum(t.startswith("I-") and (i == 0 or s[i - 1] == "O") for s in predicted for i, t in enumerate(s)) > 100
    for tags in predicted:
        assert [(k, a, b - 1) for k, a, b in chunks(tags)] == get_entities(tags)
    figures = entity_metrics(gold, predicted)
    assert figures["precision"] == pytest.approx(precision_score(gold, predicted), abs=1e-12)
    assert figures["recall"] == pytest.approx(recall_score(gold, predicted), abs=1e-12)
    assert figures["f1"] == pytest.approx(f1_score(gold, predicted), abs=1e-12)
    assert figures["accuracy"] == pytest.approx(accuracy_score(gold, predicted), abs=1e-12)
    report = classification_report(gold, predicted, output_dict=True)
    for kind in kinds:
        ours, theirs = figures["per_type"][kind], report[kind]
        assert (ours["precision"], ours["recall"], ours["f1"], ours["support"]) == pytest.approx(
            (theirs["precision"], theirs["recall"], theirs["f1-score"], theirs["support"]), abs=1e-12
        )
    assert figures["f1"] < 0.9 and entity_metrics(gold, gold)["f1"] == 1.0


def test_scheme_detection(dev):
    task_class = TASKS[NAME]
    for scheme in ("IOB2", "IOB1", "BIOES"):
        examples = [dataclasses.replace(e, tags=to_scheme(e.tags, scheme)) for e in dev[:500]]
        assert task_class.learn(examples, "dev")["scheme"] == scheme


# === Word split: training on the words raw text gives ===

# CoNLL tokens with punctuation inside, and the words raw text gives them.
SPLIT_WORDS = ["U.S.", "officials", "met", "Hewlett-Packard", "and", "Paris", "Saint-Germain",
               "on", "1996-08-22", "."]
SPLIT_TAGS = ["B-LOC", "O", "O", "B-ORG", "O", "B-ORG", "I-ORG", "O", "O", "O"]
SPLIT_PART_TAGS = {
    "IOB2": ["B-LOC", "I-LOC", "I-LOC", "I-LOC", "O", "O", "B-ORG", "I-ORG", "I-ORG", "O",
             "B-ORG", "I-ORG", "I-ORG", "I-ORG", "O", "O", "O", "O", "O", "O", "O"],
    "BIOES": ["B-LOC", "I-LOC", "I-LOC", "E-LOC", "O", "O", "B-ORG", "I-ORG", "E-ORG", "O",
              "B-ORG", "I-ORG", "I-ORG", "E-ORG", "O", "O", "O", "O", "O", "O", "O"],
}
BIOES_TAGS = ["O"] + [f"{p}-{k}" for k in ("LOC", "MISC", "ORG", "PER") for p in "BIES"]


def split_task(scheme, word_split="raw", sequence_length=32):
    tags = TAGS if scheme == "IOB2" else BIOES_TAGS
    return task_instance(NAME, {"tags": tags, "scheme": scheme, "word_split": word_split},
                         sequence_length=sequence_length)


def one_hot(encoded, task):
    """Logits that pick each trained position's target (O elsewhere)."""
    return {"logits": np.where(np.arange(len(task.tags)) == encoded.targets[..., None], 10.0, 0.0)}


@pytest.mark.parametrize(
    "tag, parts, expected",
    [
        ("B-PER", 3, ["B-PER", "I-PER", "I-PER"]),
        ("I-PER", 2, ["I-PER", "I-PER"]),
        ("O", 3, ["O", "O", "O"]),
        ("B-LOC", 1, ["B-LOC"]),
        ("S-LOC", 4, ["B-LOC", "I-LOC", "I-LOC", "E-LOC"]),
        ("S-LOC", 2, ["B-LOC", "E-LOC"]),
        ("B-ORG", 2, ["B-ORG", "I-ORG"]),
        ("E-ORG", 3, ["I-ORG", "I-ORG", "E-ORG"]),
        ("S-MISC", 1, ["S-MISC"]),
    ],
)
def test_split_tags(tag, parts, expected):
    """A token's later parts continue its entity; BIOES ends it at the last; `joined_tag` undoes it."""
    assert split_tags(tag, parts) == expected
    assert joined_tag(expected[0], expected[-1]) == tag


@pytest.mark.parametrize("scheme", ["IOB2", "BIOES"])
def test_word_split_trains_the_words_of_raw_text(scheme):
    """`U.S.`, `Hewlett-Packard`, `Saint-Germain` (an I- token), `1996-08-22` (O) are trained
    as raw text splits them; the ids and where each CoNLL word is read do not change."""
    tags = SPLIT_TAGS if scheme == "IOB2" else [
        "S-LOC", "O", "O", "S-ORG", "O", "B-ORG", "E-ORG", "O", "O", "O"
    ]
    example = WordsExample(SPLIT_WORDS, tags, list(range(1, 11)), 1)
    task, whole = split_task(scheme), split_task(scheme, "none")
    encoded, former = task.encode([example]), whole.encode([example])
    for name in ("token_ids", "segment_ids", "padding_mask"):
        np.testing.assert_array_equal(encoded.features[name], former.features[name])
    for name in ("word_row", "word_position", "word_splits"):
        np.testing.assert_array_equal(encoded.extra[name], former.extra[name])
    assert encoded.extra["word_parts"].tolist() == [4, 1, 1, 3, 1, 1, 3, 1, 5, 1]
    trained = encoded.targets[encoded.targets != IGNORED]
    assert [task.tags[i] for i in trained] == SPLIT_PART_TAGS[scheme]
    # "none": each token one word, trained at its first piece only.
    assert [whole.tags[i] for i in former.targets[former.targets != IGNORED]] == tags
    # The trained positions are those `predict` reads on the sentence as raw text.
    (raw,) = task.examples_from_texts([" ".join(SPLIT_WORDS)])
    read = task.encode([raw], targets=False).extra
    assert sorted(zip(read["word_row"], read["word_position"])) == sorted(
        zip(*np.nonzero(encoded.targets != IGNORED))
    )
    # Perfect part tags give back every CoNLL word's tag.
    (prediction,) = task.decode([example], encoded, one_hot(encoded, task))
    assert prediction["tags"] == tags


@pytest.mark.parametrize("scheme", ["IOB2", "BIOES"])
def test_word_split_keeps_evaluation_on_conll_words(dev, scheme):
    """On dev (windows at length 32): "raw" reads each CoNLL word where "none" does, so the
    same logits give the same tags (IOB2) and gold part tags give F1 1 (IOB2 and BIOES)."""
    examples = [dataclasses.replace(e, tags=to_scheme(e.tags, scheme)) for e in dev[:300]]
    task, whole = split_task(scheme), split_task(scheme, "none")
    encoded, former = task.encode(examples), whole.encode(examples)
    for name in ("token_ids", "padding_mask"):
        np.testing.assert_array_equal(encoded.features[name], former.features[name])
    np.testing.assert_array_equal(encoded.extra["word_row"], former.extra["word_row"])
    np.testing.assert_array_equal(encoded.extra["word_position"], former.extra["word_position"])
    assert (encoded.targets != IGNORED).sum() > (former.targets != IGNORED).sum()
    if scheme == "IOB2":
        shape = encoded.features["token_ids"].shape + (len(TAGS),)
        logits = {"logits": np.random.default_rng(0).normal(size=shape)}
        assert task.decode(examples, encoded, logits) == whole.decode(examples, former, logits)
    predictions = task.decode(examples, encoded, one_hot(encoded, task))
    gold = [e.tags for e in examples]
    assert [p["tags"] for p in predictions] == gold
    assert entity_metrics(gold, [p["tags"] for p in predictions])["f1"] == 1.0


def test_word_split_of_words_without_pieces():
    """A token of control characters only (U+200B) stays one [UNK] word; one with a piece
    after it, or a space inside (JSON Lines), is split around them; the ids do not change."""
    example = WordsExample(["\u200b", "U.S.", "\u200b-x", "New York"], ["O", "B-LOC", "B-PER", "B-LOC"], [1] * 4, 1)
    task, whole = split_task("IOB2"), split_task("IOB2", "none")
    encoded, former = task.encode([example]), whole.encode([example])
    np.testing.assert_array_equal(encoded.features["token_ids"], former.features["token_ids"])
    assert encoded.features["token_ids"][0, 1] == task.tokenizer.unk_id
    assert encoded.extra["word_parts"].tolist() == [1, 4, 2, 2]
    assert [task.tags[i] for i in encoded.targets[encoded.targets != IGNORED]] == [
        "O", "B-LOC", "I-LOC", "I-LOC", "I-LOC", "B-PER", "I-PER", "B-LOC", "I-LOC"
    ]


def test_word_split_setting_and_former_folders(tmp_path):
    """The split is stored with the model; a folder written before it trained whole tokens."""
    task = task_instance(NAME, SETTINGS)
    assert task.word_split == "none" and task.settings()["word_split"] == "none"
    task.use_options({"tag_scheme": "auto"})
    assert task.word_split == "none"
    task.use_options({"word_split": "raw"})
    assert task.settings()["word_split"] == "raw"
    assert TASKS[NAME].resolve_options({})["word_split"] == "raw"
    assert task_instance(NAME, {"tags": SETTINGS["tags"]}).word_split == "raw"  # a new model's
    config = TASKS[NAME].Config
    assert config.create(config.with_formers({"tags": SETTINGS["tags"]})).word_split == "none"  # a former folder's
    with pytest.raises(ValueError, match="word_split='bpe'; expected one of raw, none"):
        task.use_options({"word_split": "bpe"})
    folder = ModelFolder.load(write_task_folder(tmp_path / "model", NAME, SETTINGS, TINY))
    folder.use_options({})
    assert folder.task.word_split == "none"


# === Document context ===


def context_task(context="document", sequence_length=32):
    return task_instance(NAME, {**SETTINGS, "context": context}, sequence_length=sequence_length)


def test_conll_documents(tmp_path):
    """Each -DOCSTART- line begins a document; a file without them, and a JSON Lines file, is one."""
    path = tmp_path / "docs.txt"
    path.write_text("-DOCSTART- -X- O\n\nEU B-ORG\n\nrejects O\n-DOCSTART- -X- O\n\nPeter B-PER\n\nBlackburn B-PER\n")
    assert [e.document for e in TASKS[NAME].read(str(path))] == [1, 1, 2, 2]
    path.write_text("EU B-ORG\n\nrejects O\n")
    assert [e.document for e in TASKS[NAME].read(str(path))] == [0, 0]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"tokens": ["EU"], "tags": ["B-ORG"]}\n{"tokens": ["rejects"], "tags": ["O"]}\n')
    assert [e.document for e in TASKS[NAME].read(str(jsonl))] == [0, 0]


def test_document_context_reads_each_document_in_windows(dev):
    """Under "document" the sentences of each document are read in the windows of their words
    joined into one sentence, raw texts alone; every word's tag is read back at its sentence."""
    from kbert.tasks.token_classification import joined

    task, alone = context_task(), context_task("sentence")
    raw = task.examples_from_texts(["Peter Blackburn met the EU in Brussels ."])[0]
    first, second = dev[:40], [dataclasses.replace(e, document=1) for e in dev[40:70]]
    examples = first + [raw] + second
    encoded = task.encode(examples, targets=False)
    expected = alone.encode([joined(first), raw, joined(second)], targets=False)
    for name in ("token_ids", "padding_mask"):
        np.testing.assert_array_equal(encoded.features[name], expected.features[name])
    for name in ("word_row", "word_position"):
        np.testing.assert_array_equal(encoded.extra[name], expected.extra[name])
    assert len(encoded) < len(alone.encode(examples, targets=False))  # sentences share windows
    assert encoded.extra["word_splits"].tolist() == np.cumsum([0] + [len(e.words) for e in examples]).tolist()
    rows_of_raw = encoded.extra["word_row"][encoded.extra["word_splits"][40] : encoded.extra["word_splits"][41]]
    assert set(encoded.example_of_row[rows_of_raw]) == {40}
    assert (np.diff(encoded.example_of_row) >= 0).all()
    tagged = task.encode(first + second)
    predictions = task.decode(first + second, tagged, one_hot(tagged, task))
    assert [p["tags"] for p in predictions] == [e.tags for e in first + second]


def test_training_rows_add_document_windows(dev):
    """Training under "document" reads each sentence alone and in its document's windows, every
    word tagged in both; under "sentence" it is `encode`'s rows."""
    examples = dev[:50]
    task, alone = context_task(), context_task("sentence")
    rows, sentences, windows = task.training_rows(examples), alone.encode(examples), task.encode(examples)
    assert len(rows) == len(sentences) + len(windows)
    for name in ("token_ids", "padding_mask"):
        np.testing.assert_array_equal(rows.features[name], np.concatenate(
            [sentences.features[name], windows.features[name]]))
    words = sum(len(e.words) for e in examples)
    assert (rows.targets != IGNORED).sum() == 2 * words == 2 * (windows.targets != IGNORED).sum()
    plain = alone.training_rows(examples)
    np.testing.assert_array_equal(plain.features["token_ids"], sentences.features["token_ids"])
    raw = task.examples_from_texts(["Peter Blackburn met the EU ."])
    assert len(task.training_rows(task.examples_from_inputs([["EU", "rejects"]], [["B-ORG", "O"]]))) == 1
    assert len(task.encode(raw, targets=False)) == 1


def test_served_documents_land_where_encode_reads_them(tmp_path, dev):
    """The SavedModel's check sends each document as one text: every word's served logits land
    at the row and position `encode` reads it from, and equal the Keras model's there."""
    from kbert.export.savedmodel import ServingModule
    from kbert.export.serving import serving_for

    folder = ModelFolder.load(write_task_folder(tmp_path / "model", NAME, {**SETTINGS, "context": "document"}, TINY))
    folder.use_options({})
    task, serving = folder.task, serving_for(folder.task)
    examples = dev[:30] + [dataclasses.replace(e, document=1) for e in dev[30:45]]
    module = ServingModule(folder, {})
    served = serving.text_outputs(lambda strings: module.serve_text(tf.constant(strings["text"])), examples, 8)
    encoded = task.encode(examples, targets=False)
    words = encoded.extra["word_row"], encoded.extra["word_position"]
    assert served["compared"][words].all() and served["compared"].sum() == len(words[0])
    assert serving.agreement(served, task.run(folder.model, encoded.features))["max_abs_diff"] < 1e-4


def test_context_setting_and_former_folders(tmp_path):
    """The context is stored with the model (a new one reads documents);
    a folder written before it read sentences alone."""
    task = task_instance(NAME, SETTINGS)
    assert task.context == "sentence"
    task.use_options({"context": "document"})
    assert task.settings()["context"] == "document"
    assert TASKS[NAME].resolve_options({})["context"] == "document"
    assert task_instance(NAME, {"tags": TAGS}).context == "document"  # a new model's
    config = TASKS[NAME].Config
    assert config.create(config.with_formers({"tags": SETTINGS["tags"]})).context == "sentence"
    with pytest.raises(ValueError, match="context='page'; expected one of document, sentence"):
        task.use_options({"context": "page"})
    folder = ModelFolder.load(write_task_folder(tmp_path / "model", NAME, SETTINGS, TINY))
    folder.use_options({})
    assert folder.task.context == "sentence"
    folder.use_options({"context": "document"})  # evaluate --context document
    assert folder.task.context == "document"


# === Bad input: one line naming file and line, nothing written ===


def _finetune(tmp_path, train, dev=None, *extra):
    return main(["finetune", "--task", NAME, "--train", str(train), "--dev", str(dev or train),
                 "--init", "all-minilm-l6-v2", "--out", str(tmp_path / "model"), *extra])


@pytest.mark.parametrize(
    "name, content, extra, message",
    [
        ("a.txt", "EU NNP B-ORG\nrejects\n", (), "a.txt, line 2: 'rejects' has no tag"),
        ("a.txt", "EU B-ORG\n\nPeter B-PER\n", ("--tag-scheme", "bilou"), "tag scheme 'bilou' is unknown"),
        ("a.txt", "EU U-ORG\nx O\n", (), "a.txt, line 1: tag 'U-ORG' fits no supported scheme"),
        ("a.txt", "EU PER\nx O\n", (), "a.txt, line 1: tag 'PER' fits no supported scheme"),
        ("a.txt", "EU B-ORG\n\nthe O\nPeter I-PER\n", ("--tag-scheme", "IOB2"),
         "a.txt, line 4: 'I-PER' follows 'O'; IOB2 starts every entity with B-"),
        ("a.txt", "EU B-ORG\nsaid O\n", ("--tag-scheme", "BIOES"),
         "a.txt, line 1: 'B-ORG' is followed by 'O'; BIOES ends an entity with E-"),
        ("a.jsonl", '{"tokens": ["EU"], "tags": ["B-ORG"]}\n{"tokens": [], "tags": []}\n', (),
         "a.jsonl, line 2: an empty sentence"),
        ("a.jsonl", '{"tokens": ["EU", "x"], "tags": ["B-ORG"]}\n', (),
         "a.jsonl, line 1: 2 tokens need as many string tags"),
        ("a.txt", "the O\n", (), "tags no entity"),
        ("a.txt", "\n-DOCSTART- -X- O\n\n", (), "a.txt holds no sentences"),
    ],
)
def test_bad_training_data(tmp_path, capsys, name, content, extra, message):
    data = tmp_path / name
    data.write_text(content, encoding="utf-8")
    assert _finetune(tmp_path, data, None, *extra) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("kbert: error: ") and err.count("\n") == 1, err
    assert os.listdir(tmp_path) == [name]


# === Command line end to end ===


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """bert_tiny fine-tuned through the CLI on 160 CoNLL sentences at length 32 (windows)."""
    from kbert.checkpoints import resolve_checkpoint

    folder = tmp_path_factory.mktemp("ner")
    sentences = open(os.path.join(CONLL, "train.txt"), encoding="utf-8").read().split("\n\n")
    (folder / "train.txt").write_text("\n\n".join(sentences[:160]) + "\n", encoding="utf-8")
    # The dev file as JSON Lines, with its longest sentences.
    dev_sentences = sorted(TASKS[NAME].read(os.path.join(CONLL, "dev.txt")), key=lambda e: -len(e.words))[:40]
    (folder / "dev.jsonl").write_text(
        "".join(json.dumps({"tokens": e.words, "tags": e.tags}) + "\n" for e in dev_sentences),
        encoding="utf-8",
    )
    vocab = os.path.join(resolve_checkpoint("all-minilm-l6-v2"), "vocab.txt")
    out = str(folder / "model")
    assert main(["finetune", "--task", NAME, "--train", str(folder / "train.txt"),
                 "--dev", str(folder / "dev.jsonl"), "--init", "bert_tiny", "--vocab", vocab,
                 "--seq-len", "32", "--batch-size", "16", "--epochs", "2", "--lr", "2e-3",
                 "--out", out]) == 0
    return {"model": out, "dev": str(folder / "dev.jsonl"), "folder": folder}


def test_cli_evaluate_and_predict(trained, capsys):
    capsys.readouterr()
    assert main(["evaluate", "--model", trained["model"], "--data", trained["dev"]]) == 0
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert figures["n"] == 40 and figures["entities"] > 100
    assert {"precision", "recall", "f1", "accuracy", "per_type"} <= set(figures)
    stored = json.load(open(os.path.join(trained["model"], "metrics.json")))
    assert figures["f1"] == pytest.approx(stored["f1"], abs=1e-9)
    history = stored["history"]["loss"]
    assert history[-1] < history[0]
    text = "Peter Blackburn of the European Commission flew to Zürich and 東京."
    assert main(["predict", "--model", trained["model"], text]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["text"] == text
    for entity in row["entities"]:
        assert text[entity["start"] : entity["end"]] == entity["text"] and 0 < entity["score"] <= 1
    assert json.load(open(os.path.join(trained["model"], "kbert.json")))["task_settings"]["word_split"] == "raw"
    assert main(["predict", "--model", trained["model"], "--input", trained["dev"]]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 40 and all(len(r["tags"]) == len(r["tokens"]) for r in rows)
    unseen = trained["folder"] / "unseen.txt"
    unseen.write_text("Paris B-LOC\nwins O\n\nBob B-PERSON\n", encoding="utf-8")
    assert main(["evaluate", "--model", trained["model"], "--data", str(unseen)]) == 2
    err = capsys.readouterr().err
    assert "unseen.txt, line 4: tag 'B-PERSON' was not in the training data" in err and err.count("\n") == 1


# === Export ===


def docs_snippet(path):
    """The Python example of the docs' on-device section, on the model file `path`."""
    text = open(DOCS, encoding="utf-8").read()
    code = re.search(r"```python\n(.*?)```", text[text.index("## On device") :], re.S).group(1)
    documented = "saved_models/ner/mediapipe/token_classifier.tflite"
    assert documented in code
    return code.replace(documented, path)


@pytest.mark.slow
def test_export_savedmodel_onnx_and_packed_tflite(tmp_path):
    """Every artefact judged by entity F1; `serving_default` on raw strings gives Keras's
    tags and offsets; the packed `.tflite` keeps its contract; the docs' example runs it."""
    from kbert.export import export_model, savedmodel

    model_dir = write_task_folder(tmp_path / "model", NAME, SETTINGS, TINY, sequence_length=32)
    out = str(tmp_path / "export" / "ner")
    report = export_model(
        model_dir, out, data=os.path.join(CONLL, "dev.txt"), formats="savedmodel,onnx,mediapipe",
        quantizations="none,dynamic", max_examples=48, latency_runs=3, log=lambda line: None,
    )
    entries = {e["path"]: e for e in report["artefacts"]}
    assert sorted(entries) == sorted([
        "1", "onnx/model.onnx", "onnx/model_int8.onnx", "mediapipe/token_classifier.tflite",
        "mediapipe/token_classifier_fp16.tflite", "mediapipe/token_classifier_dynamic.tflite",
    ])
    assert report["metric"] == "f1" and report["keras"]["f1"] > 0.01
    assert report["passed"], [(e["path"], e["max_abs_diff"], e["f1"], e["budget"]) for e in report["artefacts"]]
    contract = entries["mediapipe/token_classifier.tflite"]["contract"]
    assert contract["output"] == {"metadata_name": "logits", "dtype": "float32", "shape": [1, 32, len(TAGS)]}
    assert sorted(t["metadata_name"] for t in contract["inputs"]) == ["ids", "mask", "segment_ids"]

    folder = ModelFolder.load(model_dir)
    texts = ["Zoë Saldaña flew from 東京 to São Paulo on Monday.", HARD_TEXTS[0], " ".join(["word"] * 40)]
    examples = folder.task.examples_from_texts(texts)
    expected = folder.task.predict_json(examples, folder.predict(examples))
    signature = savedmodel.load_savedmodel(os.path.join(out, "1")).signatures["serving_default"]
    served = signature(text=tf.constant(texts))
    for i, (example, row) in enumerate(zip(examples, expected)):
        count = len(example.words)
        assert served["starts"][i, :count].numpy().tolist() == example.starts
        assert served["ends"][i, :count].numpy().tolist() == example.ends
        tags = [t.decode() for t in served["tags"][i, :count].numpy()]
        entities = [(kind, example.starts[a], example.ends[b - 1]) for kind, a, b in chunks(tags)]
        assert entities == [(e["type"], e["start"], e["end"]) for e in row["entities"]]

    path = os.path.join(out, "mediapipe", "token_classifier.tflite")
    namespace = {}
    exec(docs_snippet(path), namespace)  # noqa: S102 (the documented example, run as written)
    for text, row in zip(texts[:2], expected):
        found = namespace["tag_entities"](path, text)
        assert [(e["type"], e["start"], e["end"], e["text"]) for e in found] == [
            (e["type"], e["start"], e["end"], e["text"]) for e in row["entities"]
        ]
        np.testing.assert_allclose([e["score"] for e in found], [e["score"] for e in row["entities"]], atol=1e-4)
