"""Pretraining data: vocabulary learning, google-format TFRecords, dynamic masking."""

import gzip
import os
import random

import numpy as np
import pytest
import tensorflow as tf

from kbert.pretraining import (
    learn_vocabulary,
    make_dynamic_masking_dataset,
    make_pretraining_dataset,
    read_metadata,
    write_pretraining_data,
)
from kbert.fileio import read_manifest
from kbert.text import SPECIAL_TOKENS, WordPieceTokenizer

WORDS = (
    "the a package library tool for and of with to in server client daemon network "
    "file files configuration python perl module modules support supports provides "
    "command line interface graphical editor game games data database café naïve "
    "Résumé Über übersetzung mail web browser plugin plugins utility utilities "
    "development documentation runtime shared static fast simple small"
).split()
# google-research/bert's run_pretraining.py `name_to_features`, written out here
# so the test does not read the library's copy.
MAX_SEQ_LENGTH = 32
MAX_PREDICTIONS = 6
GOOGLE_FEATURES = {
    "input_ids": tf.io.FixedLenFeature([MAX_SEQ_LENGTH], tf.int64),
    "input_mask": tf.io.FixedLenFeature([MAX_SEQ_LENGTH], tf.int64),
    "segment_ids": tf.io.FixedLenFeature([MAX_SEQ_LENGTH], tf.int64),
    "masked_lm_positions": tf.io.FixedLenFeature([MAX_PREDICTIONS], tf.int64),
    "masked_lm_ids": tf.io.FixedLenFeature([MAX_PREDICTIONS], tf.int64),
    "masked_lm_weights": tf.io.FixedLenFeature([MAX_PREDICTIONS], tf.float32),
    "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
}


def sentence(rng):
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 9))]
    return " ".join(words).capitalize() + rng.choice([".", "!", ", ok."])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A gzip corpus: 60 documents of 3..8 sentences, blank lines between them."""
    rng = random.Random(0)
    documents = [[sentence(rng) for _ in range(rng.randint(3, 8))] for _ in range(60)]
    path = str(tmp_path_factory.mktemp("corpus") / "corpus.txt.gz")
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(document) for document in documents) + "\n")
    return path, documents


@pytest.fixture(scope="module")
def vocabulary(corpus):
    return learn_vocabulary(corpus[0], 300, min_count=2)


def test_vocabulary_special_tokens_first_and_consistent_with_tokenizer(corpus, vocabulary):
    path, documents = corpus
    assert tuple(vocabulary[:5]) == SPECIAL_TOKENS == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert 50 < len(vocabulary) <= 300 and len(set(vocabulary)) == len(vocabulary)
    # Lower-cased and accent-stripped as the tokenizer normalises: no upper
    # case, no accents, and the corpus tokenizes without a single [UNK].
    assert "resume" in vocabulary or "res" in vocabulary
    assert not any(t != t.lower() for t in vocabulary[5:])
    assert not any(c in "".join(vocabulary) for c in "éïüÜ")
    tokenizer = WordPieceTokenizer(vocabulary, lowercase=True)
    lines = [line for document in documents for line in document]
    ids = tokenizer(tf.constant(lines)).flat_values.numpy()
    assert tokenizer.unk_id not in ids
    # Lines in memory give the vocabulary of the file they came from.
    assert learn_vocabulary(lines, 300, min_count=2) == vocabulary


def test_cased_vocabulary_keeps_case_and_accents(corpus):
    vocabulary = learn_vocabulary(corpus[1][0] * 10, 100, lowercase=False, min_count=2)
    assert any(t != t.lower() for t in vocabulary[5:])


def test_vocabulary_size_is_validated():
    with pytest.raises(ValueError, match="size=3"):
        learn_vocabulary(["some text"], 3)


@pytest.fixture(scope="module")
def records(corpus, vocabulary, tmp_path_factory):
    """Records written twice with one seed and once with another."""
    options = dict(
        max_seq_length=MAX_SEQ_LENGTH,
        max_predictions_per_seq=MAX_PREDICTIONS,
        dupe_factor=3,
        num_shards=3,
        num_workers=1,
        progress=False,
    )
    root = tmp_path_factory.mktemp("records")
    first = write_pretraining_data(corpus[0], vocabulary, str(root / "a"), **options)
    again = write_pretraining_data(corpus[0], vocabulary, str(root / "b"), **options)
    other = write_pretraining_data(
        corpus[0], vocabulary, str(root / "c"), random_seed=7, **options
    )
    return first, again, other


def read_bytes(paths):
    result = []
    for path in paths:
        with open(path, "rb") as f:
            result.append(f.read())
    return result


def test_same_seed_gives_byte_identical_shards(records):
    first, again, other = records
    assert [os.path.basename(p) for p in first] == [
        f"pretraining-{i:05d}-of-00003.tfrecord" for i in range(3)
    ]
    assert read_bytes(first) == read_bytes(again)
    assert read_bytes(first) != read_bytes(other)
    # Written beside, then renamed: nothing else is left behind, and the manifest lists it all.
    folder = os.path.dirname(first[0])
    names = [os.path.basename(p) for p in first] + ["vocab.txt", "pretraining_data.json"]
    assert sorted(os.listdir(folder)) == sorted(names + [".kbert-manifest.json"])
    assert read_manifest(folder) == set(names)
    assert sorted(os.listdir(os.path.dirname(folder))) == ["a", "b", "c"]


@pytest.mark.slow
def test_parallel_workers_write_the_same_bytes(corpus, vocabulary, records, tmp_path):
    paths = write_pretraining_data(
        corpus[0],
        vocabulary,
        str(tmp_path),
        max_seq_length=MAX_SEQ_LENGTH,
        max_predictions_per_seq=MAX_PREDICTIONS,
        dupe_factor=3,
        num_shards=3,
        num_workers=2,
        progress=False,
    )
    assert read_bytes(paths) == read_bytes(records[0])


def test_records_parse_with_google_feature_spec(records, vocabulary):
    cls_id, sep_id = vocabulary.index("[CLS]"), vocabulary.index("[SEP]")
    examples = [
        tf.io.parse_single_example(raw, GOOGLE_FEATURES)
        for raw in tf.data.TFRecordDataset(records[0][0])
    ]
    assert len(examples) > 20
    for example in examples:
        values = {name: value.numpy() for name, value in example.items()}
        ids, mask = values["input_ids"], values["input_mask"]
        length = int(mask.sum())
        assert mask[:length].all() and not mask[length:].any()
        assert ids[0] == cls_id and ids[length - 1] == sep_id and not ids[length:].any()
        weights = values["masked_lm_weights"]
        count = int(weights.sum())
        assert 1 <= count <= MAX_PREDICTIONS and weights[:count].all()
        positions = values["masked_lm_positions"]
        assert not positions[count:].any() and not values["masked_lm_ids"][count:].any()
        assert (0 < positions[:count]).all() and (positions[:count] < length - 1).all()
        assert values["next_sentence_labels"][0] in (0, 1)


def test_metadata_and_overwrite(records):
    folder = os.path.dirname(records[0][0])
    metadata = read_metadata(folder)
    assert metadata["max_seq_length"] == MAX_SEQ_LENGTH
    assert metadata["num_instances"] == sum(metadata["shards"].values()) > 0
    with pytest.raises(ValueError, match="overwrite"):
        write_pretraining_data(["unused"], ["[CLS]", "[SEP]", "[MASK]"], folder)


def test_a_folder_kbert_did_not_write_is_never_written(corpus, vocabulary, records, tmp_path):
    """Records go only into a new or empty folder, or over records of an earlier call (with overwrite)."""
    (tmp_path / "vocab.txt").write_text("my words\n")
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=r"is not empty and is not a kbert records folder; kbert replaces only"):
            write_pretraining_data(corpus[0], vocabulary, str(tmp_path), overwrite=overwrite, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["vocab.txt"] and (tmp_path / "vocab.txt").read_text() == "my words\n"


def test_make_pretraining_dataset(records):
    folder = os.path.dirname(records[0][0])
    dataset = make_pretraining_dataset(folder, batch_size=4, shuffle=False, repeat=False)
    assert not dataset.options().autotune.enabled  # see kbert.text.datasets
    features, labels, weights = next(iter(dataset))
    assert {k: tuple(v.shape) for k, v in features.items()} == {
        "token_ids": (4, MAX_SEQ_LENGTH),
        "segment_ids": (4, MAX_SEQ_LENGTH),
        "padding_mask": (4, MAX_SEQ_LENGTH),
        "masked_lm_positions": (4, MAX_PREDICTIONS),
    }
    assert all(v.dtype == tf.int32 for v in features.values())
    assert tuple(labels["masked_lm"].shape) == (4, MAX_PREDICTIONS)
    assert tuple(labels["next_sentence"].shape) == (4,)
    np.testing.assert_array_equal(weights["next_sentence"], np.ones(4))
    first = tf.io.parse_single_example(
        next(iter(tf.data.TFRecordDataset(records[0][0]))), GOOGLE_FEATURES
    )
    np.testing.assert_array_equal(features["token_ids"][0], first["input_ids"])
    np.testing.assert_array_equal(weights["masked_lm"][0], first["masked_lm_weights"])
    with pytest.raises(ValueError, match="seq_len=64"):
        make_pretraining_dataset(folder, batch_size=4, seq_len=64)


def test_dynamic_masking_draws_new_masks_each_pass(corpus, vocabulary):
    lines = [line for document in corpus[1] for line in document]
    seq_len, batch_size = 24, 8
    dataset = make_dynamic_masking_dataset(
        lines, vocabulary, batch_size, seq_len, max_predictions=5, shuffle_buffer=0
    )
    assert not dataset.options().autotune.enabled
    # All lines fit one block, so a pass is its tokens cut into seq_len - 2.
    tokenizer = WordPieceTokenizer(vocabulary, split_special_tokens=True)
    per_pass = tokenizer(tf.constant(lines)).flat_values.shape[0] // (seq_len - 2)
    assert per_pass >= 30
    num_batches = -(-2 * per_pass // batch_size)
    ids, positions, labels, weights = [], [], [], []
    for features, batch_labels, batch_weights in dataset.take(num_batches):
        assert not batch_weights["next_sentence"].numpy().any()
        ids.append(features["token_ids"].numpy())
        positions.append(features["masked_lm_positions"].numpy())
        labels.append(batch_labels["masked_lm"].numpy())
        weights.append(batch_weights["masked_lm"].numpy())
    ids, positions, labels, weights = (np.concatenate(x) for x in (ids, positions, labels, weights))
    assert (ids[:, 0] == vocabulary.index("[CLS]")).all()
    assert (ids[:, -1] == vocabulary.index("[SEP]")).all()
    # ceil(0.15 × 22 maskable tokens) = 4 predictions, in slots 0..3 of 5.
    np.testing.assert_array_equal(weights, np.tile([1.0, 1, 1, 1, 0], (len(ids), 1)))
    real = positions[:, :4]
    assert (real > 0).all() and (real < seq_len - 1).all()

    original = ids.copy()
    np.put_along_axis(original, real, labels[:, :4], axis=1)
    # The second pass brings back the same sequences with other masks.
    first, second = slice(0, per_pass), slice(per_pass, 2 * per_pass)
    np.testing.assert_array_equal(original[first], original[second])
    assert (positions[first] != positions[second]).any(axis=1).mean() > 0.5

    picked = np.take_along_axis(ids, real, axis=1)
    share_masked = (picked == vocabulary.index("[MASK]")).mean()
    share_kept = (picked == labels[:, :4]).mean()
    # ~250 predictions: 80% ± 3 standard deviations.
    assert 0.7 < share_masked < 0.9 and 0.03 < share_kept < 0.2


@pytest.mark.parametrize("whole_word_masking", [False, True])
def test_dynamic_masking_draws_the_same_masks_from_the_same_seed(corpus, vocabulary, whole_word_masking):
    """Each batch's choice is one random draw, so the seed alone fixes the masks: tf-text's
    `RandomItemSelector` shuffles row by row in parallel iterations, in the order their
    threads run, and gave other masks from the same seed."""
    import keras

    lines = [line for document in corpus[1] for line in document]

    def masks():
        keras.utils.set_random_seed(0)
        dataset = make_dynamic_masking_dataset(
            lines, vocabulary, 16, 24, 5, shuffle_buffer=0, whole_word_masking=whole_word_masking
        )
        return np.stack([features["token_ids"].numpy() for features, _, _ in dataset.take(40)])

    np.testing.assert_array_equal(masks(), masks())


def test_dynamic_whole_word_masking_predicts_every_piece_of_a_chosen_word(corpus):
    lines = [line for document in corpus[1] for line in document]
    # Small enough that many words are split into pieces.
    vocabulary = learn_vocabulary(corpus[0], 100, min_count=2)
    seq_len, max_predictions = 32, 8
    dataset = make_dynamic_masking_dataset(
        lines, vocabulary, 16, seq_len, max_predictions, shuffle_buffer=0, repeat=False,
        whole_word_masking=True,
    )
    continuation = np.array([token.startswith("##") for token in vocabulary])
    mask_id = vocabulary.index("[MASK]")
    budget = min(max_predictions, int(np.ceil(0.15 * (seq_len - 2))))  # 5
    words_masked = multi_piece_words = pieces = pieces_masked = 0
    for features, labels, weights in dataset:
        ids = features["token_ids"].numpy()
        for row in range(len(ids)):
            count = int(weights["masked_lm"][row].numpy().sum())
            assert 1 <= count <= budget
            positions = features["masked_lm_positions"][row].numpy()[:count]
            assert (np.diff(positions) > 0).all() and positions[0] >= 1
            assert positions[-1] < seq_len - 1
            original = ids[row].copy()
            original[positions] = labels["masked_lm"][row].numpy()[:count]
            # google's grouping: a word is a piece and the ## pieces after it;
            # the first body position starts a word even when it is a ## piece.
            starts = ~continuation[original]
            starts[[0, 1, seq_len - 1]] = True
            word = np.cumsum(starts)
            chosen = set(word[positions])
            assert set(positions) == set(np.flatnonzero(np.isin(word, list(chosen))))
            words_masked += len(chosen)
            multi_piece_words += sum((word == w).sum() > 1 for w in chosen)
            pieces += count
            pieces_masked += int((ids[row][positions] == mask_id).sum())
    assert words_masked > 200 and multi_piece_words > 20
    # Each piece of a chosen word is replaced on its own, 80% by [MASK].
    assert 0.7 < pieces_masked / pieces < 0.9
