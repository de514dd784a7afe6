"""`fill-mask`: the words a pretrained masked LM puts where a text says `[MASK]`.

Needs no training: `kbert evaluate`, `predict` and `export` take `--task
fill-mask` with a checkpoint that keeps its masked-LM head (a Hugging Face
`BertForMaskedLM` or `BertForPreTraining` folder, a google-research/bert
folder, or the `encoder/` folder `kbert pretrain` writes). Each `[MASK]` gets
the `--top-k` likeliest word pieces of the vocabulary with their
probabilities, as Hugging Face's fill-mask pipeline gives them; a text holds
at most `--max-masks` of them.

Data for `kbert evaluate` (and the export's verification): a CSV or TSV file
with the text in `--text-column` (default `text`) and the hidden words in
`--answers-column` (default `answers`), one per `[MASK]` in order, separated
by spaces, each one word piece of the vocabulary (a token of `vocab.txt` as
written, such as `##ing`, or a word that is one piece, such as `Paris`):

    text,answers
    the [MASK] of france is paris.,capital

The figures: `accuracy`, the share of `[MASK]`s whose likeliest word is the
hidden one, and `top_k_accuracy`, the share where it is among the `top_k`.
"""

import dataclasses

import numpy as np

from kbert.tasks.base import METRIC_BUDGETS
from kbert.tasks.objectives import MaskedWords
from kbert.tasks.task_config import TaskConfig, option
from kbert.tasks.text_task import TextTask

# How `[MASK]` is written in a text.
MASK = "[MASK]"


class FillMask(TextTask):
    """Texts with `[MASK]`s -> the likeliest words for each, from a checkpoint's masked LM."""

    name = "fill-mask"
    hub_pipeline_tag = "fill-mask"
    hf_pipeline = "fill-mask"
    description = (
        "the likeliest words for each [MASK] of a text (no training: --model takes a checkpoint "
        "with its masked-LM head); evaluated on CSV/TSV with text and answers"
    )

    @dataclasses.dataclass(frozen=True)
    class Config(TaskConfig):
        text_column: str = option("column holding the text", "text")
        answers_column: str = option("fill-mask: column holding the hidden words, one per [MASK]", "answers")
        top_k: int = option("fill-mask: words given for each [MASK]", 5, built=True)
        max_masks: int = option("fill-mask: the most [MASK]s a text may hold", 8, built=True)

    text_options = ("text_column",)
    target_option = "answers_column"
    objective = MaskedWords()
    metric = "accuracy"
    metric_scale = 100
    budgets = METRIC_BUDGETS
    summary_keys = ("accuracy", "top_k_accuracy", "n")
    trainable = False

    def configure(self):
        for name in ("top_k", "max_masks"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name}={value}; expected a positive integer")
        if self.top_k > self.tokenizer.vocabulary_size():
            raise ValueError(f"top_k={self.top_k}; the vocabulary holds {self.tokenizer.vocabulary_size()} words")

    @classmethod
    def parse_target(cls, value, path, line):
        return value.split()

    @classmethod
    def pretrained_settings(cls, checkpoint, options):
        """`top_k` and `max_masks` as given, else their defaults."""
        options = cls.resolve_options(options)
        return {"top_k": options["top_k"], "max_masks": options["max_masks"]}

    def check(self, examples, source):
        self.answer_ids(examples, source)

    def answer_ids(self, examples, source="data"):
        """int32 `(masks,)`: the id of every answer in order, a vocabulary token as
        written (`##ing`) or else the one word piece it tokenizes to (`Paris`);
        `ValueError` naming a text whose answers are not one per `[MASK]`, or an
        answer that is more than one word piece."""
        for example, count in zip(examples, self._mask_counts(examples)):
            given = 0 if example.target is None else len(example.target)
            if given != count:
                raise ValueError(f"{source}, line {example.line}: {given} answer(s) for {count} {MASK}(s); "
                                 "expected one each")
        vocabulary = {token: i for i, token in enumerate(self.tokenizer.vocabulary)}
        answers = [(example, word) for example in examples for word in example.target]
        spelled = [word for _, word in answers if word not in vocabulary]
        pieces = dict(zip(spelled, self.tokenizer(spelled).to_list() if spelled else []))
        for example, word in answers:
            if word not in vocabulary and len(pieces[word]) != 1:
                tokens = " ".join(self.tokenizer.id_to_token(i) for i in pieces[word])
                raise ValueError(
                    f"{source}, line {example.line}: answer {word!r} is {len(pieces[word])} word pieces "
                    f"({tokens}); each {MASK} stands for one word piece of the vocabulary: give it one "
                    f"{MASK} a piece, with the answers {tokens}, or a word of one piece"
                )
        return np.array([vocabulary[word] if word in vocabulary else pieces[word][0] for _, word in answers],
                        np.int32)

    def examples_from_inputs(self, x, y=None):
        """Examples from Python values (`kbert.TaskModel`).

        Args:
            x: texts with `[MASK]`s, a list or array of strings.
            y: None, or each text's hidden words: a string of words separated
                by spaces, or a list of words, one per `[MASK]`.
        """
        examples = super().examples_from_inputs(x)
        if y is None:
            return examples
        answers = [value.split() if isinstance(value, str) else list(value) for value in y]
        if len(answers) != len(examples):
            raise ValueError(f"y holds {len(answers)} answers for {len(examples)} texts")
        return [dataclasses.replace(example, target=words) for example, words in zip(examples, answers)]

    # === Preprocessing ===

    def _mask_counts(self, examples):
        """The `[MASK]`s of each text as the tokenizer reads them."""
        ids = self.tokenizer([example.texts[0] for example in examples])
        return [row.count(self.tokenizer.mask_id) for row in ids.to_list()]

    def encode(self, examples, targets=True):
        """One row a text; `ValueError` naming a text with no `[MASK]`, more than
        `max_masks`, or some cut off by `sequence_length`."""
        encoded = super().encode(examples, targets=False)
        packed = (encoded.features["token_ids"] == self.tokenizer.mask_id).sum(axis=1)
        for example, count, kept in zip(examples, self._mask_counts(examples), packed):
            where = f"line {example.line}" if example.line is not None else repr(example.texts[0][:60])
            if count == 0:
                raise ValueError(f"{where}: the text holds no {MASK}; expected one for each word to fill in")
            if count > self.max_masks:
                raise ValueError(f"{where}: the text holds {count} {MASK}s; at most {self.max_masks} (--max-masks)")
            if kept < count:
                raise ValueError(
                    f"{where}: {count - kept} of its {count} {MASK}(s) fall past the first {self.sequence_length} "
                    "word pieces; shorten the text or raise --seq-len"
                )
        return encoded

    # === Inference ===

    def decode(self, examples, encoded, outputs):
        """Per text, `{"ids", "scores"}`: `(masks, top_k)` arrays, likeliest first."""
        ids, scores = np.asarray(outputs["word_ids"]), np.asarray(outputs["word_scores"], np.float32)
        return [{"ids": ids[row][ids[row, :, 0] >= 0], "scores": scores[row][ids[row, :, 0] >= 0]}
                for row in range(len(ids))]

    def evaluate(self, examples, predictions):
        gold = self.answer_ids(examples)
        ids = np.concatenate([prediction["ids"] for prediction in predictions])
        return {
            "accuracy": float(np.mean(ids[:, 0] == gold)),
            "top_k_accuracy": float(np.mean((ids == gold[:, None]).any(axis=1))),
            "n": int(len(gold)),
            "texts": len(examples),
        }

    def predict_json(self, examples, predictions):
        """Each text, its candidates for every `[MASK]`, and the text with the likeliest filled in."""
        rows = []
        for example, prediction in zip(examples, predictions):
            masks = [[{"word": self.tokenizer.id_to_token(i), "score": float(s)} for i, s in zip(ids, scores)]
                     for ids, scores in zip(prediction["ids"], prediction["scores"])]
            filled = example.texts[0]
            for candidates in masks:
                filled = filled.replace(MASK, candidates[0]["word"].removeprefix("##"), 1)
            rows.append({"text": example.texts[0], "filled": filled, "masks": masks})
        return rows
