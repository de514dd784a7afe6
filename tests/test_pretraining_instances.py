"""The port of google-research/bert's instance creation: golden values and statistics."""

import random

import numpy as np
import pytest

from kbert.pretraining.instances import (
    InstanceOptions,
    SpecialIds,
    create_training_instances,
)

VOCABULARY = (
    "[PAD] [UNK] [CLS] [SEP] [MASK] the cat sat on mat a dog ran far ##s ##ed away to park ##ing"
).split()
SPECIAL = SpecialIds.from_vocabulary(VOCABULARY)
DOCUMENTS = [
    [[5, 6, 7, 8, 5, 9], [10, 11, 12, 13], [5, 11, 14, 12, 16]],
    [[17, 18, 19], [5, 6, 15, 7], [10, 9, 14]],
    [[11, 12, 16, 17, 5, 18], [6, 7, 8, 10, 9]],
    [[13, 16, 14], [5, 18, 19, 12]],
]
# (tokens, segment_ids, masked_lm_positions, masked_lm_labels, is_random_next)
# of the first instances that google-research/bert's create_pretraining_data.py
# functions produce for DOCUMENTS (as token strings) with random.Random(12345),
# max_seq_length=16, dupe_factor=2, short_seq_prob=0.1, masked_lm_prob=0.2,
# max_predictions_per_seq=3. Recorded by running that script's code.
GOLDEN = {
    False: (
        11,
        [
            (
                "[CLS] [MASK] [MASK] ##s [SEP] the cat ##ed sat a [MASK] ##s [SEP]",
                [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1],
                [1, 2, 10],
                "far away mat",
                True,
            ),
            (
                "[CLS] to park [MASK] the cat ##ed [MASK] [SEP] [MASK] cat sat on the mat [SEP]",
                [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
                [3, 7, 9],
                "##ing sat the",
                True,
            ),
            (
                "[CLS] dog ran [MASK] to the park [SEP] [MASK] sat on [MASK] mat [SEP]",
                [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1],
                [3, 8, 11],
                "away cat a",
                False,
            ),
        ],
    ),
    True: (
        16,
        [
            (
                "[CLS] the dog ##s [MASK] away [SEP] [MASK] mat ##s [SEP]",
                [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
                [4, 7],
                "ran a",
                True,
            ),
            (
                "[CLS] far away ##s [SEP] [MASK] ran away [MASK] the park cat [MASK] on a [SEP]",
                [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
                [5, 8, 12],
                "dog to sat",
                True,
            ),
            (
                "[CLS] far [PAD] [MASK] [SEP] a dog ran far the dog ##s ran [MASK] [SEP]",
                [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
                [2, 3, 13],
                "away ##s away",
                True,
            ),
        ],
    ),
}


def words(ids):
    return " ".join(VOCABULARY[i] for i in ids)


@pytest.mark.parametrize("whole_word_masking", [False, True])
def test_matches_google_research_bert(whole_word_masking):
    options = InstanceOptions(
        max_seq_length=16,
        max_predictions_per_seq=3,
        masked_lm_prob=0.2,
        dupe_factor=2,
        short_seq_prob=0.1,
        whole_word_masking=whole_word_masking,
    )
    instances = create_training_instances(
        [list(map(list, d)) for d in DOCUMENTS], options, SPECIAL, random.Random(12345)
    )
    count, golden = GOLDEN[whole_word_masking]
    assert len(instances) == count
    for instance, expected in zip(instances, golden):
        tokens, segment_ids, positions, labels, is_random_next = expected
        assert words(instance.tokens) == tokens
        assert instance.segment_ids == segment_ids
        assert instance.masked_lm_positions == positions
        assert words(instance.masked_lm_labels) == labels
        assert instance.is_random_next == is_random_next


def random_corpus(seed, num_documents=300, vocab_size=1000):
    """Documents of 5..30 sentences of 3..12 ids (ids >= 700 are "##" pieces)."""
    rng = random.Random(seed)
    return [
        [
            [rng.randrange(5, vocab_size) for _ in range(rng.randint(3, 12))]
            for _ in range(rng.randint(5, 30))
        ]
        for _ in range(num_documents)
    ]


LARGE_VOCABULARY = (
    ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    + [f"w{i}" for i in range(695)]
    + [f"##p{i}" for i in range(300)]
)
LARGE_SPECIAL = SpecialIds.from_vocabulary(LARGE_VOCABULARY)


@pytest.fixture(scope="module")
def large_sample():
    options = InstanceOptions(max_seq_length=64, max_predictions_per_seq=40, dupe_factor=2)
    return options, create_training_instances(
        random_corpus(0), options, LARGE_SPECIAL, random.Random(1)
    )


def test_instances_are_well_formed(large_sample):
    options, instances = large_sample
    assert len(instances) > 2000
    for instance in instances:
        tokens, segments = instance.tokens, instance.segment_ids
        assert len(tokens) == len(segments) <= options.max_seq_length
        assert tokens[0] == LARGE_SPECIAL.cls_id and tokens[-1] == LARGE_SPECIAL.sep_id
        first_b = segments.index(1)
        assert tokens[first_b - 1] == LARGE_SPECIAL.sep_id and first_b >= 3
        assert segments == sorted(segments) and len(tokens) - first_b >= 2
        positions = instance.masked_lm_positions
        assert positions == sorted(set(positions))
        assert 1 <= len(positions) <= options.max_predictions_per_seq
        assert all(p not in (0, first_b - 1) for p in positions)
        assert positions[-1] < len(tokens) - 1


def test_masking_rate_and_80_10_10(large_sample):
    options, instances = large_sample
    num_tokens = sum(len(i.tokens) for i in instances)
    masked = kept = 0
    total = 0
    for instance in instances:
        for position, label in zip(instance.masked_lm_positions, instance.masked_lm_labels):
            total += 1
            token = instance.tokens[position]
            masked += token == LARGE_SPECIAL.mask_id
            kept += token == label
    # round(len × 0.15) predictions per instance, so the rate is 15% ± rounding.
    assert abs(total / num_tokens - options.masked_lm_prob) < 0.01
    assert total > 10000
    assert abs(masked / total - 0.8) < 0.015
    # A random replacement equals the label 1/vocab_size of the time.
    assert abs(kept / total - 0.1) < 0.01
    assert abs((total - masked - kept) / total - 0.1) < 0.01


def test_next_sentence_is_random_half_the_time():
    # Long documents of short sentences, so that a chunk of one sentence (whose
    # B is always random) is rare and the coin flip decides nearly every pair.
    rng = random.Random(5)
    corpus = [
        [[rng.randrange(5, 1000) for _ in range(rng.randint(3, 5))] for _ in range(60)]
        for _ in range(200)
    ]
    options = InstanceOptions(max_seq_length=64, dupe_factor=2, short_seq_prob=0.0)
    instances = create_training_instances(corpus, options, LARGE_SPECIAL, random.Random(1))
    share = np.mean([i.is_random_next for i in instances])
    # ~2400 pairs: one standard deviation is 0.01; document ends add ~0.015.
    assert len(instances) > 2000
    assert 0.47 < share < 0.55


def test_whole_word_masking_never_splits_a_word():
    options = InstanceOptions(
        max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1, whole_word_masking=True
    )
    instances = create_training_instances(
        random_corpus(2, num_documents=150), options, LARGE_SPECIAL, random.Random(3)
    )
    continuation = LARGE_SPECIAL.continuation
    multi_piece_words_masked = 0
    for instance in instances:
        original = list(instance.tokens)
        for position, label in zip(instance.masked_lm_positions, instance.masked_lm_labels):
            original[position] = label
        masked = set(instance.masked_lm_positions)
        word = []
        for index, token in enumerate(original + [LARGE_SPECIAL.sep_id]):
            special = token in (LARGE_SPECIAL.cls_id, LARGE_SPECIAL.sep_id)
            if special:
                continue  # [SEP] does not end a word in the original either
            if word and not continuation[token]:
                assert len({i in masked for i in word}) == 1, (word, masked)
                multi_piece_words_masked += len(word) > 1 and word[0] in masked
                word = []
            word.append(index)
        if word:
            assert len({i in masked for i in word}) == 1
        assert len(instance.masked_lm_positions) <= options.max_predictions_per_seq
    assert multi_piece_words_masked > 100


def test_same_seed_same_instances_other_seed_other():
    options = InstanceOptions(max_seq_length=32, dupe_factor=2)
    corpus = random_corpus(4, num_documents=30)
    first = create_training_instances(
        [list(d) for d in corpus], options, LARGE_SPECIAL, random.Random(9)
    )
    again = create_training_instances(
        [list(d) for d in corpus], options, LARGE_SPECIAL, random.Random(9)
    )
    other = create_training_instances(
        [list(d) for d in corpus], options, LARGE_SPECIAL, random.Random(10)
    )
    assert first == again
    assert first != other


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_seq_length", 4),
        ("max_predictions_per_seq", 0),
        ("masked_lm_prob", 1.5),
        ("dupe_factor", 0),
        ("short_seq_prob", -0.1),
    ],
)
def test_options_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        InstanceOptions(**{field: value})


def test_vocabulary_needs_special_tokens():
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        SpecialIds.from_vocabulary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])
