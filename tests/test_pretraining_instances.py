"""The port of google-research/bert's instance creation against a transcription of the
original, and the statistics it must keep."""

import collections
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


# === A transcription of google-research/bert's create_pretraining_data.py ===
# (commit eedf571, master) `create_training_instances` after reading its files,
# `create_instances_from_document`, `create_masked_lm_predictions` and
# `truncate_seq_pair`, on token strings as the original works; FLAGS become
# arguments, and `do_whole_word_mask` one of them. Written here apart from
# kbert.pretraining.instances, which works on ids.

GoogleInstance = collections.namedtuple(
    "GoogleInstance", ["tokens", "segment_ids", "masked_lm_positions", "masked_lm_labels", "is_random_next"]
)
MaskedLmInstance = collections.namedtuple("MaskedLmInstance", ["index", "label"])


def google_create_training_instances(all_documents, vocab_words, max_seq_length, dupe_factor, short_seq_prob,
                                     masked_lm_prob, max_predictions_per_seq, do_whole_word_mask, rng):
    # Remove empty documents
    all_documents = [x for x in all_documents if x]
    rng.shuffle(all_documents)

    instances = []
    for _ in range(dupe_factor):
        for document_index in range(len(all_documents)):
            instances.extend(
                google_create_instances_from_document(
                    all_documents, document_index, max_seq_length, short_seq_prob,
                    masked_lm_prob, max_predictions_per_seq, vocab_words, do_whole_word_mask, rng))

    rng.shuffle(instances)
    return instances


def google_create_instances_from_document(all_documents, document_index, max_seq_length, short_seq_prob,
                                          masked_lm_prob, max_predictions_per_seq, vocab_words,
                                          do_whole_word_mask, rng):
    document = all_documents[document_index]

    # Account for [CLS], [SEP], [SEP]
    max_num_tokens = max_seq_length - 3

    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)

                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])

                tokens_b = []
                # Random next
                is_random_next = False
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)

                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break

                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                # Actual next
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)

                assert len(tokens_a) >= 1
                assert len(tokens_b) >= 1

                tokens = []
                segment_ids = []
                tokens.append("[CLS]")
                segment_ids.append(0)
                for token in tokens_a:
                    tokens.append(token)
                    segment_ids.append(0)

                tokens.append("[SEP]")
                segment_ids.append(0)

                for token in tokens_b:
                    tokens.append(token)
                    segment_ids.append(1)
                tokens.append("[SEP]")
                segment_ids.append(1)

                (tokens, masked_lm_positions, masked_lm_labels) = google_create_masked_lm_predictions(
                    tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, do_whole_word_mask, rng)
                instances.append(GoogleInstance(tokens, segment_ids, masked_lm_positions, masked_lm_labels,
                                                is_random_next))
            current_chunk = []
            current_length = 0
        i += 1

    return instances


def google_create_masked_lm_predictions(tokens, masked_lm_prob, max_predictions_per_seq, vocab_words,
                                        do_whole_word_mask, rng):
    cand_indexes = []
    for (i, token) in enumerate(tokens):
        if token == "[CLS]" or token == "[SEP]":
            continue
        if (do_whole_word_mask and len(cand_indexes) >= 1 and token.startswith("##")):
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])

    rng.shuffle(cand_indexes)

    output_tokens = list(tokens)

    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))

    masked_lms = []
    covered_indexes = set()
    for index_set in cand_indexes:
        if len(masked_lms) >= num_to_predict:
            break
        if len(masked_lms) + len(index_set) > num_to_predict:
            continue
        is_any_index_covered = False
        for index in index_set:
            if index in covered_indexes:
                is_any_index_covered = True
                break
        if is_any_index_covered:
            continue
        for index in index_set:
            covered_indexes.add(index)

            masked_token = None
            # 80% of the time, replace with [MASK]
            if rng.random() < 0.8:
                masked_token = "[MASK]"
            else:
                # 10% of the time, keep original
                if rng.random() < 0.5:
                    masked_token = tokens[index]
                # 10% of the time, replace with random word
                else:
                    masked_token = vocab_words[rng.randint(0, len(vocab_words) - 1)]

            output_tokens[index] = masked_token

            masked_lms.append(MaskedLmInstance(index=index, label=tokens[index]))
    assert len(masked_lms) <= num_to_predict
    masked_lms = sorted(masked_lms, key=lambda x: x.index)

    masked_lm_positions = []
    masked_lm_labels = []
    for p in masked_lms:
        masked_lm_positions.append(p.index)
        masked_lm_labels.append(p.label)

    return (output_tokens, masked_lm_positions, masked_lm_labels)


def google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break

        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1

        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


# === kbert's port against it ===


def assert_same_instances(documents, vocabulary, options, seed):
    """kbert's instances of `documents` (ids) are the transcription's of the same
    documents as token strings, from the same seed; returns how many."""
    special = SpecialIds.from_vocabulary(vocabulary)
    mine = create_training_instances([list(map(list, d)) for d in documents], options, special, random.Random(seed))
    theirs = google_create_training_instances(
        [[[vocabulary[i] for i in sentence] for sentence in d] for d in documents], list(vocabulary),
        options.max_seq_length, options.dupe_factor, options.short_seq_prob, options.masked_lm_prob,
        options.max_predictions_per_seq, options.whole_word_masking, random.Random(seed),
    )
    assert len(mine) == len(theirs)
    for instance, expected in zip(mine, theirs):
        assert [vocabulary[i] for i in instance.tokens] == expected.tokens
        assert instance.segment_ids == expected.segment_ids
        assert instance.masked_lm_positions == expected.masked_lm_positions
        assert [vocabulary[i] for i in instance.masked_lm_labels] == expected.masked_lm_labels
        assert instance.is_random_next == expected.is_random_next
    return len(mine)


@pytest.mark.parametrize("whole_word_masking", [False, True])
def test_matches_google_research_bert_on_a_small_corpus(whole_word_masking):
    """Short sequences and a high masking rate: truncation, random next sentences from
    documents of three sentences, and whole words that do not fit the budget."""
    options = InstanceOptions(max_seq_length=16, max_predictions_per_seq=3, masked_lm_prob=0.2, dupe_factor=2,
                              short_seq_prob=0.1, whole_word_masking=whole_word_masking)
    for seed in (12345, 0, 1, 2):
        assert assert_same_instances(DOCUMENTS, VOCABULARY, options, seed) >= 10


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


@pytest.mark.parametrize("whole_word_masking", [False, True])
def test_matches_google_research_bert_on_a_random_corpus(whole_word_masking):
    """Documents of 5..30 sentences, a third of the pieces "##": every instance the same,
    short targets (short_seq_prob 0.3) and the prediction budget's limit included."""
    options = InstanceOptions(max_seq_length=48, max_predictions_per_seq=5, dupe_factor=2, short_seq_prob=0.3,
                              whole_word_masking=whole_word_masking)
    assert assert_same_instances(random_corpus(7, num_documents=40), LARGE_VOCABULARY, options, seed=3) > 400


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
