"""`question-answering`: a question and a context -> the answer's span in the context (SQuAD).

Data: SQuAD-format JSON, v1.1 or v2.0 (`is_impossible` questions have no
answer); `kbert predict` also reads JSON Lines of `{"question", "context"}`.
Pre- and post-processing are google-research/bert's `run_squad.py`
(`kbert.tasks.squad` lists the few differences): the context is split into
words, each word into WordPieces, and a context longer than the sequence into
windows `--doc-stride` pieces apart after the question (`--max-query-length`
pieces at most); the model scores each piece as the answer's start and end;
the best span of length `--max-answer-length` or less among the top
`--n-best-size` starts and ends of each window, counted in the window where
its start has the most context, is the answer, cut from the context by
character offsets. A v2.0 model answers nothing when the [CLS] score beats
the best span's by more than `--null-score-diff-threshold`, which `kbert
finetune` tunes on the dev set and stores. `kbert evaluate` reports the
official SQuAD scripts' `exact_match` and `f1` (v2.0: also `HasAns_*`,
`NoAns_*`, `best_*`).

The model: the encoder's every position -> one float32 `Dense(2)` ->
`start_logits`, `end_logits` (run_squad.py's `cls/squad/output_weights`,
Hugging Face's `qa_outputs`), padding positions at `PADDING_LOGIT`. Loss:
the mean of the start and end cross-entropies over the positions of the
window.

Export: `serving_default(question, context)` windows the context itself and
returns `answer`, `answer_start`, `answer_end` (characters; -1 and "" for no
answer), `score` and, for v2.0, `null_score_diff`; `serve_tokens`, ONNX and
the TFLite token models return the two logits per row. The `mediapipe`
format is a `.tflite` for the TFLite Task Library's `BertQuestionAnswerer`
(`kbert.export.question_answerer`).
"""

import dataclasses

import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.logs import warn
from kbert.recipes import Recipe
from kbert.tabular import check_text, check_texts
from kbert.tasks import squad, squad_eval
from kbert.tasks.base import Task
from kbert.tasks.squad_features import pack_row, prepare, question_rows, train_figures
from kbert.tasks.records import Encoded, QuestionExample, Rows
from kbert.tasks.objectives import Spans
from kbert.tasks.task_config import TaskConfig, learned, option

# Quantized artefacts may lose this much F1 (points) against the Keras model.
# One question of the 208 in the Normans sample moves F1 by up to 0.48 points;
# dynamic int8 BERT loses about a point of SQuAD F1 (onnxruntime's and
# Intel's published BERT-base figures), more for a 6-layer model.
F1_BUDGETS = {"fp16": 0.5, "dynamic": 2.0, "int8": 2.0, "16x8": 2.0}
# docs/tasks/question-answering.md, "The model learns": 10 epochs at 3e-4,
# batch 16, at run_squad.py's 384 pieces, took MiniLM to F1 82.8 on the
# 208-question SQuAD 2.0 sample it was trained on; 4 epochs at 1e-4 learned
# the null answer only. Measured on that sample alone: no full SQuAD run.
RECIPE = Recipe(epochs=10, learning_rate=3e-4, batch_size=16, sequence_length=384)
# Integer options, each at least 1.
_INTEGER_OPTIONS = ("doc_stride", "max_query_length", "max_answer_length", "n_best_size")
# The figures worth a line in a log, in this order.
SUMMARY = ("exact_match", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "n")


class QuestionAnswering(Task):
    """Extractive question answering, SQuAD v1.1 and v2.0 (run_squad.py's flags)."""

    name = "question-answering"
    hub_pipeline_tag = "question-answering"
    hf_pipeline = "question-answering"
    hf_architecture = "BertForQuestionAnswering"
    description = "question + context -> the answer's span; SQuAD v1.1/v2.0 JSON"

    @dataclasses.dataclass(frozen=True)
    class Config(TaskConfig):
        version_2_with_negative: bool = learned("questions may have no answer (SQuAD v2.0)", False)
        doc_stride: int = option("pieces between the starts of a long context's windows", squad.DOC_STRIDE)
        max_query_length: int = option("question pieces kept (the rest is cut)", squad.MAX_QUERY_LENGTH)
        max_answer_length: int = option("longest answer, in pieces", squad.MAX_ANSWER_LENGTH)
        n_best_size: int = option("start and end candidates per window", squad.N_BEST_SIZE)
        null_score_diff_threshold: float = option(
            "SQuAD v2.0: answer nothing when the [CLS] score beats the best span's by more than "
            "this (default: tuned on --dev by finetune, then the model's)", tuned=True,
        )

    recipe = RECIPE
    objective = Spans()
    text_inputs = ("question", "context")
    metric = "f1"
    metric_scale = 1.0  # the official scripts' figures are percentages already
    budgets = F1_BUDGETS
    summary_keys = SUMMARY

    @classmethod
    def settings_from_hf_labels(cls, labels, where):
        return {}

    def configure(self):
        if not isinstance(self.version_2_with_negative, bool):
            raise ValueError(f"version_2_with_negative={self.version_2_with_negative!r}; expected true or false")
        for name in _INTEGER_OPTIONS:
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected an integer of at least 1")
        if "train_figures" not in self.__dict__:
            self.train_figures = {}

    @property
    def threshold(self):
        """The null threshold answers are decided by: the config's, until chosen `squad`'s."""
        value = self.null_score_diff_threshold
        return squad.NULL_SCORE_DIFF_THRESHOLD if value is None else value

    # === Data ===

    @classmethod
    def read(cls, path, options=None, targets=True):
        if str(path).lower().endswith(".jsonl"):
            return squad.read_jsonl(path, targets)
        return squad.read_squad_json(path, targets)

    @classmethod
    def learn(cls, examples, source):
        if not any(example.answers for example in examples):
            raise ValueError(f"{source} has no answerable question; nothing to learn")
        return {"version_2_with_negative": any(example.is_impossible for example in examples)}

    def examples_from_texts(self, texts):
        if len(texts) % 2:
            raise ValueError(f"task {self.name!r} takes texts in pairs (question, context); got {len(texts)}")
        check_texts(texts)
        return [
            QuestionExample(id=f"text-{i // 2 + 1}", question=texts[i], context=texts[i + 1])
            for i in range(0, len(texts), 2)
        ]

    def examples_from_inputs(self, x, y=None):
        """Examples from Python values (`kbert.TaskModel`).

        Args:
            x: a list of `{"question", "context"}` dicts (an "id" string is
                optional; default "input-N"), or a pair `(questions, contexts)`.
            y: None, or one answer per question: `{"text", "answer_start"}`
                (a character offset into its context), a list of them, or None
                for no answer (SQuAD v2.0: `version_2_with_negative`).
        """
        if isinstance(x, (tuple, list)) and len(x) == 2 and all(
            isinstance(column, (tuple, list, np.ndarray)) for column in x
        ):
            questions, contexts = (list(column) for column in x)
            if len(questions) != len(contexts):
                raise ValueError(f"x holds {len(questions)} questions and {len(contexts)} contexts; expected as many")
            x = [{"question": q, "context": c} for q, c in zip(questions, contexts)]
        if not isinstance(x, (tuple, list)) or not all(isinstance(item, dict) for item in x):
            raise ValueError(
                f'x is {x!r:.80}; expected a list of {{"question", "context"}} dicts or a pair (questions, contexts)'
            )
        if y is not None and len(y) != len(x):
            raise ValueError(f"y holds {len(y)} answers for {len(x)} questions")
        examples = []
        for i, item in enumerate(x):
            record = {"id": f"input-{i + 1}", **item}
            if not isinstance(record["id"], str):
                raise ValueError(f'x[{i}]: "id" is {record["id"]!r:.40}; expected a string')
            # Here, not in `squad.parse_example`: a SQuAD file's empty question is read as run_squad.py reads it.
            for key in ("question", "context"):
                if isinstance(record.get(key), str):
                    check_text(record[key], f"x[{i}][{key!r}]")
            if y is not None:
                answers = [] if y[i] is None else [y[i]] if isinstance(y[i], dict) else y[i]
                if not isinstance(answers, list):
                    raise ValueError(
                        f'y[{i}] is {y[i]!r:.80}; expected {{"text", "answer_start"}}, a list of them, or None'
                    )
                if not answers and not self.version_2_with_negative:
                    raise ValueError(
                        f"y[{i}] is no answer; this model answers every question "
                        "(SQuAD v1.1): build it with version_2_with_negative=True"
                    )
                record.update(answers=answers, is_impossible=not answers)
            examples.append(squad.parse_example(f"x[{i}]", record, record.get("context"), y is not None, i + 1))
        return squad.checked_examples("x", examples, y is not None)

    # === Preprocessing ===

    def encode(self, examples, targets=True):
        return self._encoded(prepare(self, examples, targets), targets)

    def _encoded(self, questions, targets):
        """`Encoded` rows of every window of `questions` (`prepare`'s)."""
        rows = question_rows(questions)
        features = {name: np.zeros((len(rows), self.sequence_length), np.int32) for name in ENCODER_INPUTS}
        starts, ends = np.zeros(len(rows), np.int32), np.zeros(len(rows), np.int32)
        for index, (q, w) in enumerate(rows):
            ids, segments, target = pack_row(self.tokenizer, questions[q], w)
            features["token_ids"][index, : len(ids)] = ids
            features["segment_ids"][index, : len(ids)] = segments
            features["padding_mask"][index, : len(ids)] = 1
            if target is not None:
                starts[index], ends[index] = target
        return Encoded(
            features,
            {"start_logits": starts, "end_logits": ends} if targets else None,
            example_of_row=rows[:, 0],
            extra={"questions": questions, "windows": rows[:, 1]},
            learned=np.array([not questions[q].skipped for q in rows[:, 0]], bool) if targets else None,
        )

    def training_rows(self, examples, packed=False):
        """`Rows` made on the fly, so memory holds no `(rows, sequence_length)` arrays.

        The contexts' WordPieces are kept once each, ragged. Questions whose
        answer run_squad.py cannot find are left out, and counted in
        `train_figures`. `packed`: `encode`'s rows instead, those questions'
        windows kept and marked not learned (`Encoded.learned`).
        """
        questions = prepare(self, examples)
        rows = question_rows(questions, learned_only=True)
        if not len(rows):
            raise ValueError("no training question is left once unfindable answers are skipped")
        self.train_figures = train_figures(questions, rows)
        if packed:
            return self._encoded(questions, targets=True)

        def row(index):
            q, w = rows[index]
            ids, segments, (start, end) = pack_row(self.tokenizer, questions[q], int(w))
            features = {"token_ids": ids, "segment_ids": segments, "padding_mask": np.ones_like(ids)}
            return features, {"start_logits": np.int32(start), "end_logits": np.int32(end)}

        lengths = np.array([len(questions[q].query) + 3 + questions[q].windows[w][1] for q, w in rows])
        return Rows(lengths, row, self.outputs)

    # === Inference ===

    def decode(self, examples, encoded, outputs):
        """One prediction per question: its best span and, for v2.0, the null score.

        A prediction is a dict: `best` (`text`, `start`, `end` in characters,
        `score`, `probability`) or None, `null` (v2.0: `score`,
        `probability`) and `null_score_diff`; `answer` applies the
        threshold. Outputs of a text artefact (`kbert.export.serving`'s `text_outputs`),
        which chose their answers themselves, give `answer` as they chose it.
        """
        if "answer" in outputs:
            return squad.served_predictions(outputs)
        questions = encoded.extra["questions"]
        rows_of = [[] for _ in questions]
        for row, (q, w) in enumerate(zip(encoded.example_of_row, encoded.extra["windows"])):
            rows_of[q].append((row, w))
        predictions = []
        for question, rows in zip(questions, rows_of):
            masks = squad.max_context(question.windows, len(question.context))
            offset = len(question.query) + 2
            windows = [
                {
                    "start_logits": outputs["start_logits"][row],
                    "end_logits": outputs["end_logits"][row],
                    "offset": offset,
                    "length": question.windows[w][1],
                    "max_context": masks[w],
                    "first": question.windows[w][0],
                }
                for row, w in rows
            ]
            result = squad.best_answer(windows, self.n_best_size, self.max_answer_length, self.version_2_with_negative)
            predictions.append(squad.nbest_prediction(question.context, result, self.n_best_size))
        return predictions

    def answer(self, prediction):
        """The final answer of a prediction: dict `text` ("" for none), `start`, `end`, `score`."""
        if "answer" in prediction:
            return prediction["answer"]
        best, null = prediction["best"], prediction["null"]
        if null is not None and (best is None or prediction["null_score_diff"] > self.threshold):
            return {"text": "", "start": None, "end": None, "score": null["score"], "probability": null["probability"]}
        return best or {"text": "", "start": None, "end": None, "score": None, "probability": None}

    def evaluate(self, examples, predictions):
        golds = [[a["text"] for a in e.answers] for e in examples]
        texts = [self.answer(p)["text"] for p in predictions]
        if self.version_2_with_negative or any(e.is_impossible for e in examples):
            odds = [p.get("null_score_diff") for p in predictions]
            metrics = squad_eval.squad_v2_metrics(golds, texts, None if None in odds else odds)
            metrics["n"] = metrics.pop("total")
            metrics["null_score_diff_threshold"] = self.threshold
        else:
            metrics = {**squad_eval.squad_v1_metrics(golds, texts), "n": len(examples)}
        return metrics

    def tune(self, examples, predictions, predict):
        """v2.0: the null threshold of the best dev F1 (evaluate-v2.0.py's sweep),
        unless one was given (--null-score-diff-threshold) or chosen before.

        The sweep scores each question's best span as its answer (predictions
        made with no threshold), so that every threshold is scored as it would
        answer; when answering nothing is best, the threshold goes below
        every dev score difference.
        """
        tuned = dict(self.train_figures)  # what training_rows counted
        if not self.version_2_with_negative or self.null_score_diff_threshold is not None:
            return tuned
        best, threshold, abstaining = squad_eval.tune_null_threshold(
            [[a["text"] for a in e.answers] for e in examples],
            [p["best"]["text"] if p["best"] else "" for p in predictions],
            [p["null_score_diff"] for p in predictions],
        )
        if best <= abstaining:
            warn(
                f"answering nothing scores best on the {len(examples)} dev questions (F1 "
                f"{abstaining:.1f}, the share without an answer), so the model will answer none: it learned no "
                "answer worth giving; train on more questions, or for longer (--epochs)"
            )
        self.null_score_diff_threshold = float(threshold)
        return {**tuned, "null_score_diff_threshold": self.null_score_diff_threshold, "tuned_f1": best}

    def predict_json(self, examples, predictions):
        rows = []
        for example, prediction in zip(examples, predictions):
            answer = self.answer(prediction)
            row = {
                "id": example.id,
                "question": example.question,
                "answer": answer["text"] or None,
                "start": answer["start"],
                "end": answer["end"],
                "score": _float(answer["score"]),
                "probability": _float(answer.get("probability")),
            }
            if self.version_2_with_negative:
                row["null_score_diff"] = _float(prediction.get("null_score_diff"))
            rows.append(row)
        return rows

    def serving_request(self, example):
        return {"question": example.question, "context": example.context}

def _float(value):
    return None if value is None or not np.isfinite(value) else float(value)
