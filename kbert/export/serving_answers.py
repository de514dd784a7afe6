"""`question-answering`'s serving adapter: a question and a context in, the answer out.

`serving_default` windows the context and picks the answer in TensorFlow ops
(`kbert.export.question_answering_graph`); `serve_tokens`, ONNX and the
TFLite token models give the two logits per row. Artefacts are judged by
their logits and by whether they give every question the Keras model's answer.
"""

import numpy as np

from kbert.export.serving_base import FLOAT_TOLERANCE, Bound, Serving
from kbert.tasks.squad import best_score


class AnswerServing(Serving):
    """Answers: `answer`, `answer_start`, `answer_end`, `score` (v2.0: `null_score_diff`)."""

    on_device = "bert_question_answerer"
    # One packed row is not one question: windows need the SavedModel.
    tflite_text_variant = False
    # Float32: logits within FLOAT_TOLERANCE (a signature that answers gives
    # scores instead: a score adds two logits) and every answer the Keras
    # model's. Quantized: F1, in points already (the official scripts').
    float_bounds = (
        Bound("max_abs_diff", FLOAT_TOLERANCE),
        Bound("max_abs_score_diff", 2 * FLOAT_TOLERANCE, missing=0.0),
        Bound("answer_agreement", 1.0, at_least=True, missing=1.0),
    )
    metric_in_points = True

    def features(self, strings):
        from kbert.export.question_answering_graph import windowed_features

        return windowed_features(self.task, strings["question"], strings["context"])

    def outputs(self, features, outputs):
        if "example_of_row" not in features:  # serve_tokens: rows in, logits out
            return dict(outputs)
        from kbert.export.question_answering_graph import best_answers

        return best_answers(self.task, features, outputs)

    def text_outputs(self, call, examples, batch_size):
        """The answers `serving_default` chose, one per question (see `decode`)."""
        strings = self.strings(examples)
        chunks = []
        for start in range(0, len(examples), batch_size):
            result = call({name: values[start : start + batch_size] for name, values in strings.items()})
            chunks.append({name: np.asarray(value) for name, value in result.items()})
        return {name: np.concatenate([chunk[name] for chunk in chunks]) for name in chunks[0]}

    def agreement(self, outputs, reference):
        """The logits' largest difference, where the artefact gives logits."""
        if "answer" in outputs:
            return {}
        return super().agreement(outputs, reference)

    def prediction_agreement(self, predictions, reference):
        """The share of questions given the same answer (text, and offsets where
        the artefact gives them), and the largest difference of the best span's
        score and of the null score difference (None where it gives neither)."""
        same, diffs = [], []
        for prediction, expected in zip(predictions, reference):
            mine, theirs = self.task.answer(prediction), self.task.answer(expected)
            keys = ("text",) if mine["start"] is None and mine["text"] else ("text", "start", "end")
            same.append(all(mine[k] == theirs[k] for k in keys))
            for a, b in ((best_score(prediction), best_score(expected)),
                         (prediction.get("null_score_diff"), expected.get("null_score_diff"))):
                if a is not None and b is not None and np.isfinite(a) and np.isfinite(b):
                    diffs.append(abs(a - b))
        return {"answer_agreement": float(np.mean(same)), "max_abs_score_diff": float(max(diffs)) if diffs else None}

    def judge(self, entry, reference_figures):
        """BertQuestionAnswerer's file (`kbert.export.question_answerer`), which
        answers by rules of its own: its logits within `FLOAT_TOLERANCE` of the
        Keras model's, and on ASCII questions (where its inputs are kbert's)
        its best answer the one its rules pick from the Keras logits. Any
        other artefact: `Serving.judge`.
        """
        if "emulation" not in entry:
            entry.setdefault("max_abs_diff", entry.get("max_abs_score_diff") or 0.0)
            return super().judge(entry, reference_figures)
        emulation = entry["emulation"]
        entry["budget"] = (
            f"logits within {FLOAT_TOLERANCE:g}; on ASCII questions the runtime's answer is its "
            "rules' on the Keras logits"
        )
        entry["passed"] = bool(
            entry["max_abs_diff"] <= FLOAT_TOLERANCE
            and emulation["top_answer_agreement"] in (1.0, None)
            and emulation["max_abs_logit_diff"] <= 2 * FLOAT_TOLERANCE
        )
        return entry
