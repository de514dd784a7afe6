"""`Serving`: how a task's model is served and its artefacts verified, for tasks of texts.

A serving adapter (`kbert.export.serving.serving_for`) holds what the export
asks of a task beyond the task itself: the SavedModel's string features and
outputs, the files shipped beside it, the TFLite text variant's packing, the
on-device kind, and how an artefact's outputs are compared with the Keras
model's and judged. This base fits tasks whose examples are one or two texts
and whose outputs are one row each; `kbert.export.serving` adapts the rest.
"""

import dataclasses

import numpy as np

# A float32 artefact computes what Keras computes in another order: outputs
# agree to ~1e-6, so 1e-4 flags a wrong op, not rounding.
FLOAT_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class Bound:
    """One figure of an artefact's report entry held to a limit: at most `limit`, or at
    least it (`at_least`). A figure the entry lacks takes `missing`."""

    figure: str
    limit: float
    at_least: bool = False
    missing: float = None

    def holds(self, entry):
        value = entry.get(self.figure)
        value = self.missing if value is None else value
        return value >= self.limit if self.at_least else value <= self.limit

    def text(self):
        return f"{self.figure} {'>=' if self.at_least else '<='} {self.limit:g}"


class Serving:
    """The export side of `task`.

    Args:
        task: a `kbert.tasks.Task`.
    """

    # The on-device file a task's model also ships as, or None
    # (`kbert.export.on_device`): "text_classifier", "text_embedder",
    # "token_classifier" or "bert_question_answerer".
    on_device = None
    # Whether the export has a string-in TFLite variant (`tflite_text_features`):
    # one row per example, packed with builtin ops.
    tflite_text_variant = True

    def __init__(self, task):
        self.task = task

    # === Signatures ===

    def features(self, strings):
        """Encoder inputs from the `text_inputs` string tensors (TensorFlow ops)."""
        return self.task.preprocessor(tuple(strings[name] for name in self.task.text_inputs))

    def outputs(self, features, outputs):
        """The SavedModel signatures' outputs from the head's outputs.

        They must include each of the task's `outputs` (rows first, any
        trailing shape): ONNX and the verification read them back by those names.
        """
        return dict(outputs)

    def assets(self):
        """Files shipped in the SavedModel's `assets/` for clients: name -> text."""
        return {}

    def strings(self, examples):
        """The string inputs of `examples` for a text signature: name -> list of str."""
        requests = [self.task.serving_request(example) for example in examples]
        return {name: [request[name] for request in requests] for name in self.task.text_inputs}

    def text_outputs(self, call, examples, batch_size):
        """Runs a string-input artefact on `examples`; outputs aligned with `encode`'s rows.

        Args:
            call: callable(dict name -> list of str) -> dict of outputs.
            examples: the task's examples.
            batch_size: int. Strings (of each input) per call.

        Returns:
            dict keyed by the task's `outputs`, one row per string of
            `strings`. Adapters of tasks whose rows are not their examples
            either override this or give one string per row in `strings`.
        """
        strings, names = self.strings(examples), self.task.outputs
        rows = len(next(iter(strings.values())))
        chunks = []
        for start in range(0, rows, batch_size):
            result = call({name: values[start : start + batch_size] for name, values in strings.items()})
            chunks.append({name: np.asarray(result[name]) for name in names})
        return {name: np.concatenate([chunk[name] for chunk in chunks]) for name in names}

    # === TFLite ===

    def tflite_text_features(self, ids):
        """Encoder inputs `(1, sequence_length)` of the TFLite text variant.

        Args:
            ids: list of int32 1-D tensors, the WordPiece ids of each of
                `text_inputs` (tf-text's tokenizer), for one example.

        Only TFLite builtin ops (see `kbert.text.packer.pack_one`).
        """
        from kbert.text.packer import pack_one

        task = self.task
        tokenizer = task.tokenizer
        return pack_one(
            ids, task.sequence_length, tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id,
            truncate=task.preprocessor.packer.truncate,
        )

    def on_device_files(self):
        """Files written beside the on-device model besides its labels: name -> text. Default: none."""
        return {}

    def tflite_unsupported(self):
        """TFLite quantizations this model's graph cannot take: name -> why (the
        exporter skips them). Default: none."""
        return {}

    # === Verification ===

    def scores(self, outputs):
        """The numbers a float32 artefact must reproduce within `FLOAT_TOLERANCE`."""
        return np.concatenate([np.asarray(outputs[n], np.float32).reshape(len(outputs[n]), -1)
                               for n in self.task.outputs], axis=1)

    def agreement(self, outputs, reference):
        """How an artefact's outputs agree with the Keras model's: a JSON dict."""
        return {"max_abs_diff": float(np.abs(self.scores(outputs) - self.scores(reference)).max())}

    def prediction_agreement(self, predictions, reference):
        """How an artefact's predictions (`decode`'s) agree with the Keras model's.

        For tasks whose answer is more than their outputs (spans chosen
        across windows); a JSON dict, default empty.
        """
        return {}

    # What an artefact must keep, judged by `judge`: bounds on the figures of
    # its report entry, for float32 artefacts and on top of the metric's
    # budget for quantized ones.
    float_bounds = (Bound("max_abs_diff", FLOAT_TOLERANCE),)
    quantized_bounds = ()
    # A float32 artefact's metric may move this much either way (a fraction;
    # rounding may flip a near tie), or None: not judged.
    float_metric_change = None
    # Whether the task's metric is in points already (SQuAD's scripts' F1).
    metric_in_points = False

    def judge(self, entry, reference_figures):
        """Sets `entry["budget"]` and `entry["passed"]`: the adapter's bounds, and for a
        quantized artefact at most the task's `budgets[quantization]` of its `metric` lost."""
        task = self.task
        float32 = entry["quantization"] == "none"
        bounds = self.float_bounds if float32 else self.quantized_bounds
        texts = [bound.text() for bound in bounds]
        passed = all(bound.holds(entry) for bound in bounds)
        scale, unit = self._metric_units()
        change = None
        if not float32:
            budget = task.budgets[entry["quantization"]]
            texts.insert(0, f"{task.metric} drop <= {scale * budget:g}{unit}")
            change, limit = reference_figures[task.metric] - entry[task.metric], budget
        elif self.float_metric_change is not None:
            texts.append(f"{task.metric} within {scale * self.float_metric_change:g}{unit}")
            change = reference_figures[task.metric] - entry[task.metric]
            limit = self.float_metric_change
        if change is not None:
            entry["metric_drop"] = round(scale * change, 6)
            passed = passed and (abs(change) if float32 else change) <= limit + 1e-9
        entry["budget"] = ", ".join(texts)
        entry["passed"] = bool(passed)
        return entry

    def _metric_units(self):
        """`(scale, unit)` of the metric in budgets: 100 and " points" for a fraction
        shown in points, 1 and " points" for points already, else 1 and ""."""
        if self.task.metric_scale == 100:
            return 100, " points"
        return 1, " points" if self.metric_in_points else ""
