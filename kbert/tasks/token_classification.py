"""`token-classification`: a tag for every word (named-entity recognition), in BIO tags.

Data: CoNLL files (one token a line, its tag in the last column, a blank line
between sentences, `-DOCSTART-` lines skipped) or JSON Lines (`.jsonl`, one
`{"tokens": [...], "tags": [...]}` a line). Tag schemes IOB1, IOB2 and BIOES
are detected, or named with `--tag-scheme`; the tag names are learned from the
training file.

Alignment as BERT's paper (section 5.3): each word is WordPiece-tokenized, its
tag is the target of its first piece, and its other pieces are ignored by the
loss and the metric (the target `IGNORED`). A sentence of more than
`sequence_length - 2` pieces is cut into windows of that many pieces, each
starting `stride` pieces after the one before; every word is trained and
predicted from the window where its first piece has the most context
(google-research/bert's `_check_is_max_context`), so no word is dropped or
counted twice.

A data token with punctuation inside (CoNLL's `U.S.`, `1996-08-22`) is
several words in raw text. With `--word-split raw` (the default) training
splits it as raw text is split and tags each later part inside the token's
entity (`split_tags`), so that every word `predict` reads was trained; the
token is still evaluated, and its tag read, at its first piece.
`--word-split none` trains the token's first piece only, as the paper.

`kbert evaluate` reports entity-level `precision`, `recall` and `f1` (micro),
counted as CoNLL's `conlleval` and `seqeval` count them (an entity counts when
its type and both boundaries are exact; chunks are read from any scheme,
ill-formed sequences included, by conlleval's rules), figures per entity type,
and word `accuracy`.

Raw text (`kbert predict TEXT`, the SavedModel's `serving_default`) is split
into words with character offsets by `WordPieceTokenizer.words_with_offsets`,
whose pieces are the tokenizer's own on the whole text.
"""

import dataclasses

import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.recipes import Recipe
from kbert.tabular import check_text, check_texts
from kbert.tasks.base import INFERENCE_BATCH_SIZE, Task
from kbert.tasks.records import Encoded, WordsExample
from kbert.tasks.objectives import Tags
from kbert.tasks.task_config import TaskConfig, learned, option
from kbert.tasks.inference import batches_by_length, check_rows, run_full_length, softmax
from kbert.tasks.conll import read_conll, read_jsonl
from kbert.tasks.tagged_rows import documents, encode_words, joined, joined_rows, tag_ids
from kbert.tasks.tagging import (
    AUTO, IGNORED, OUTSIDE, PREFIXES, SCHEMES, check_scheme, chunks, detect_scheme, entity_metrics,
    joined_tag, parse_scheme, scheme_of_tags, tag_parts, tagged_accuracy_class,
)
from kbert.tasks.word_windows import word_windows

__all__ = ["TokenClassification", "IGNORED", "FLOAT_F1_BUDGET", "joined", "word_offsets"]

# Windows start every `sequence_length - 2` pieces times this fraction: each
# piece but those at a sentence's ends then has at least a quarter window of
# context on either side in its best window.
WINDOW_STRIDE_FRACTION = 0.5
# What an artefact may lose in entity F1 (a fraction) against the Keras model:
# a float32 one 0.1 point either way (rounding may flip a near tie), a
# quantized one half a point.
FLOAT_F1_BUDGET = 0.001
F1_BUDGETS = {"fp16": 0.005, "dynamic": 0.005, "int8": 0.005, "16x8": 0.005}
# `word_split`: how training splits a data token into the words it tags.
# "raw": as `predict` splits raw text (at punctuation, `U.S.` -> `U . S .`),
# each later word tagged inside the token's entity, so that the model has
# seen every word raw text gives it; "none": a token is one word, tagged at
# its first piece only (BERT's paper). A model folder written before the
# option existed names none: it was trained on whole tokens.
WORD_SPLITS = ("raw", "none")
FORMER_WORD_SPLIT = "none"
# `context`: what a sentence of a data file is read with. "document": the
# sentences around it, in file order, up to a -DOCSTART- line (a file
# without them is one document): each document is read in windows as one
# long sentence; training adds these windows to the sentences alone, so that
# a sentence given alone (raw text) reads as well as before. "sentence": each
# sentence alone. A model folder written before the option read sentences alone.
# docs/tasks/token-classification.md: at the recipe's 6 epochs, "document"
# gives 91.76 dev entity F1 (seeds 0-2), +0.45 ± 0.08 over sentences alone
# paired seed by seed, in 2.2 times the training time.
CONTEXTS = ("document", "sentence")
FORMER_CONTEXT = "sentence"
# docs/tasks/token-classification.md: MiniLM on CoNLL-2003 at 5e-5 in batches
# of 8 (run_ner.py's), dev entity F1 over seeds 0-2, each paired with 3 epochs
# (90.8): 6 epochs +0.51 ± 0.12 (91.31), 4 epochs +0.30 ± 0.05. 3 epochs are
# +0.57 above batch 32 at 1e-4, itself a point above batch 32 at 5e-5.
RECIPE = Recipe(epochs=6, learning_rate=5e-5, batch_size=8, sequence_length=128)


class TokenClassification(Task):
    """Words -> one tag each, from each word's first WordPiece."""

    name = "token-classification"
    hub_pipeline_tag = "token-classification"
    hf_pipeline = "token-classification"
    hf_architecture = "BertForTokenClassification"
    description = (
        "words -> a tag each (named entities); CoNLL files or JSON Lines of tokens and tags"
    )

    @dataclasses.dataclass(frozen=True)
    class Config(TaskConfig):
        tags: list = learned("tag names in output order, O first", required=True)
        scheme: str = learned(f"the training data's tag scheme, one of {', '.join(SCHEMES)} ({AUTO}: from the tags)", AUTO)
        tag_scheme: str = option("tag scheme: auto (detected), IOB1, IOB2 or BIOES", AUTO)
        word_split: str = option(
            "how training splits each data token: raw as predict splits raw text (U.S. -> "
            "U . S ., later words inside the token's entity), none keeps it one word",
            WORD_SPLITS[0], WORD_SPLITS, former=FORMER_WORD_SPLIT,
        )
        context: str = option(
            "what a data file's sentence is read with: document, the sentences around it in file "
            "order up to -DOCSTART- (trained on both), or sentence alone; raw texts are read alone",
            CONTEXTS[0], CONTEXTS, former=FORMER_CONTEXT,
        )

    recipe = RECIPE
    objective = Tags("tags", IGNORED, tagged_accuracy_class)
    metric = "f1"
    metric_scale = 100
    budgets = F1_BUDGETS
    summary_keys = ("f1", "precision", "recall", "accuracy", "n")

    @classmethod
    def settings_from_hf_labels(cls, labels, where):
        return {"tags": labels}

    def configure(self):
        tags = self.tags
        scheme = scheme_of_tags(tags, self.scheme)
        if scheme not in SCHEMES:
            raise ValueError(f"scheme={scheme!r}; expected one of {', '.join(SCHEMES)}")
        if (
            not isinstance(tags, list)
            or len(tags) < 2
            or len(set(tags)) != len(tags)
            or not all(isinstance(tag, str) for tag in tags)
        ):
            raise ValueError(f"tags={tags!r:.200}; expected a list of at least 2 distinct names")
        bad = [tag for tag in tags if tag != OUTSIDE and tag_parts(tag)[0] not in PREFIXES[scheme]]
        if bad:
            raise ValueError(f"tags {bad[:5]} are not {scheme} tags")
        if self.sequence_length < 3:
            raise ValueError(f"sequence_length={self.sequence_length}; a window needs at least one piece")
        self.config = dataclasses.replace(self.config, scheme=scheme)
        self.stride = max(1, int((self.sequence_length - 2) * WINDOW_STRIDE_FRACTION))
        self._tag_ids = {tag: index for index, tag in enumerate(tags)}

    # === Data ===

    @classmethod
    def read(cls, path, options=None, targets=True):
        """Sentences of a CoNLL file or, for `.jsonl`, a JSON Lines file.

        Returns:
            list of `WordsExample`s: `words`, `tags` (None without targets),
            `lines` (each word's line), `line`.
        """
        scheme = parse_scheme(cls.resolve_options(options)["tag_scheme"])
        reader = read_jsonl if path.lower().endswith(".jsonl") else read_conll
        examples = reader(path, targets)
        if not examples:
            raise ValueError(f"{path} holds no sentences")
        if targets:
            check_scheme(examples, scheme, path)
        return examples

    @classmethod
    def learn(cls, examples, source):
        names = {tag for example in examples for tag in example.tags}
        if names <= {OUTSIDE}:
            raise ValueError(f"{source} tags no entity (every tag is 'O'); nothing to learn")
        tags = [OUTSIDE] + sorted(names - {OUTSIDE}, key=lambda tag: tag_parts(tag)[::-1])
        return {"tags": tags, "scheme": detect_scheme(example.tags for example in examples)}

    @classmethod
    def check_learned(cls, learned, examples, source):
        tag_ids(learned["tags"], examples, source)

    def check(self, examples, source):
        self.tag_ids(examples, source)

    def tag_ids(self, examples, source="data"):
        """int32 tag ids of every word of `examples`, concatenated; `ValueError` naming an unknown tag."""
        return tag_ids(self.tags, examples, source, self._tag_ids)

    def examples_from_texts(self, texts):
        check_texts(texts)
        _, starts, ends = self.tokenizer.words_with_offsets(list(texts))
        splits = starts.row_splits.numpy()
        starts, ends = starts.flat_values.numpy().tolist(), ends.flat_values.numpy().tolist()
        examples = []
        for number, text in enumerate(texts, 1):
            first, last = (values[splits[number - 1] : splits[number]] for values in (starts, ends))
            if not first:
                raise ValueError(f"text {number} ({text[:40]!r}) has no words; expected a sentence")
            examples.append(WordsExample(
                text=text,
                words=[text[a:b] for a, b in zip(first, last)],
                starts=first,
                ends=last,
            ))
        return examples

    def examples_from_inputs(self, x, y=None):
        """Examples from Python values (`kbert.TaskModel`).

        Args:
            x: list. Raw texts (str), split into words as `predict` splits
                them, or lists of words (pre-split tokens, as CoNLL's).
            y: None, or one list of tags per list of words, a tag per word.
        """
        from kbert.tasks.tagging import scheme_error

        items = x.tolist() if isinstance(x, np.ndarray) else x
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"x is a {type(x).__name__}; expected a list of texts or of word lists")
        texts = [i for i, item in enumerate(items) if isinstance(item, str)]
        if y is not None and texts:
            raise ValueError(f"x[{texts[0]}] is a raw text, and y tags words; give x as lists of words")
        if y is not None and len(y) != len(items):
            raise ValueError(f"y holds {len(y)} tag lists for {len(items)} word lists")
        for i in texts:
            check_text(items[i], f"x[{i}]")
        raw = iter(self.examples_from_texts([items[i] for i in texts]) if texts else [])
        examples = []
        for i, words in enumerate(items):
            if isinstance(words, str):
                examples.append(next(raw))
                continue
            words = words.tolist() if isinstance(words, np.ndarray) else words
            if not (isinstance(words, (list, tuple)) and words
                    and all(isinstance(word, str) and word.strip() for word in words)):
                raise ValueError(f"x[{i}] is {words!r:.80}; expected a raw text or a list of words (non-blank strings)")
            tags = None
            if y is not None:
                tags = y[i].tolist() if isinstance(y[i], np.ndarray) else y[i]
                if not isinstance(tags, (list, tuple)) or len(tags) != len(words):
                    raise ValueError(f"y[{i}] is {tags!r:.80}; expected a list of {len(words)} tags, one per word")
                unknown = [tag for tag in tags if not isinstance(tag, str) or tag not in self._tag_ids]
                if unknown:
                    raise ValueError(f"y[{i}] holds the tag {unknown[0]!r:.40}; the model knows {self.tags}")
                error = scheme_error(tags, self.scheme)
                if error:
                    raise ValueError(f"y[{i}]: {error[1]}; the model's scheme is {self.scheme}")
                tags = list(tags)
            examples.append(WordsExample(
                words=list(words), tags=tags, lines=[i + 1] * len(words), line=i + 1, document=0,
            ))
        return examples

    # === Preprocessing ===

    def encode(self, examples, targets=True):
        """Windows of `examples`' pieces, each document's together under `context` "document";
        `extra` says where each word's first piece went (`kbert.tasks.tagged_rows.encode_words`)."""
        if self.context != "document":
            return encode_words(self, examples, targets)
        encoded = joined_rows(self, examples, self.read_together(examples), targets)
        encoded.extra["word_splits"] = np.cumsum([0] + [len(example.words) for example in examples])
        return encoded

    def training_rows(self, examples, packed=False):
        """Each sentence alone, and under `context` "document" the windows of each document too
        (`Encoded` always)."""
        alone = encode_words(self, examples)
        groups = [group for group in self.read_together(examples) if group.stop - group.start > 1]
        if not groups:
            return alone
        together = joined_rows(self, examples, groups, targets=True)
        return Encoded(
            {name: np.concatenate([alone.features[name], together.features[name]]) for name in ENCODER_INPUTS},
            np.concatenate([alone.targets, together.targets]),
            np.concatenate([alone.example_of_row, together.example_of_row]),
        )

    def read_together(self, examples):
        """Slices of `examples` read as one: each document under `context` "document", else each example."""
        if self.context != "document":
            return [slice(i, i + 1) for i in range(len(examples))]
        return documents(examples)

    def windows(self, word_ids):
        """`word_windows` of this task's length, stride and packer (TensorFlow ops)."""
        return word_windows(word_ids, self.sequence_length, self.stride, self.preprocessor.packer)

    # === Inference ===

    def run(self, model, features, batch_size=INFERENCE_BATCH_SIZE):
        """The logits, batch by batch of similar length (`batches_by_length`).

        Returns `logits` `(rows, sequence_length, tags)`, 0 past each batch's
        width, and `compared`, the positions that hold tokens (where
        artefacts are compared with it).
        """
        check_rows(features)
        logits = np.zeros(features["token_ids"].shape + (len(self.tags),), np.float32)
        for index, width in batches_by_length(features, batch_size, self.sequence_length):
            batch = {name: features[name][index, :width] for name in ENCODER_INPUTS}
            logits[index, :width] = run_full_length(model, batch, self.outputs, batch_size)["logits"]
        return {"logits": logits, "compared": features["padding_mask"] == 1}

    def decode(self, examples, encoded, outputs):
        """Each example's tags and their probabilities, read at its words' first pieces.

        Under BIOES a word cut into parts ends an entity where its last part
        does (`joined_tag`); its score is its first part's.
        """
        extra = encoded.extra
        logits = np.asarray(outputs["logits"])
        probabilities = softmax(logits[extra["word_row"], extra["word_position"]])
        ids = probabilities.argmax(axis=-1)
        scores = probabilities[np.arange(len(ids)), ids]
        tags = [self.tags[i] for i in ids]
        if self.scheme == "BIOES":
            ends = logits[extra["word_end_row"], extra["word_end_position"]].argmax(axis=-1)
            tags = [joined_tag(tag, self.tags[i]) for tag, i in zip(tags, ends)]
        splits = extra["word_splits"]
        return [
            {"tags": tags[a:b], "scores": scores[a:b].tolist()}
            for a, b in zip(splits[:-1], splits[1:])
        ]

    def evaluate(self, examples, predictions):
        gold = [example.tags for example in examples]
        predicted = [prediction["tags"] for prediction in predictions]
        return {**entity_metrics(gold, predicted), "n": len(examples)}

    def predict_json(self, examples, predictions):
        rows = []
        for example, prediction in zip(examples, predictions):
            text, starts, ends = word_offsets(example)
            entities = [
                {
                    "type": kind,
                    "start": starts[first],
                    "end": ends[last - 1],
                    "text": text[starts[first] : ends[last - 1]],
                    "score": float(np.mean(prediction["scores"][first:last])),
                }
                for kind, first, last in chunks(prediction["tags"])
            ]
            row = {"text": text, "entities": entities}
            if example.starts is None:  # pre-split: the words and their tags too
                row.update(tokens=example.words, tags=prediction["tags"])
            rows.append(row)
        return rows

    def serving_request(self, example):
        return {"text": word_offsets(example)[0]}


def word_offsets(example):
    """`(text, starts, ends)`: a raw example's text and word offsets, or a pre-split
    example's words joined by single spaces and their offsets in that text."""
    if example.starts is not None:
        return example.text, example.starts, example.ends
    starts, ends, position = [], [], 0
    for word in example.words:
        starts.append(position)
        ends.append(position + len(word))
        position += len(word) + 1
    return " ".join(example.words), starts, ends
