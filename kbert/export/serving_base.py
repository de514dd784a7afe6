"""`Serving`: how a task's model is served and its artefacts verified, for tasks of texts.

A serving adapter (`kbert.export.serving.serving_for`) holds what the export
asks of a task beyond the task itself: the SavedModel's string features and
outputs, the files shipped beside it, the TFLite text variant's packing, the
on-device kind, and how an artefact's outputs are compared with the Keras
model's and judged. This base fits tasks whose examples are one or two texts
and whose outputs are one row each; `kbert.export.serving` adapts the rest.
"""

import numpy as np

# A float32 artefact computes what Keras computes in another order: outputs
# agree to ~1e-6, so 1e-4 flags a wrong op, not rounding.
FLOAT_TOLERANCE = 1e-4


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

    def judge(self, entry, reference_figures):
        """Sets `entry["budget"]` and `entry["passed"]`.

        A float32 artefact must agree within `FLOAT_TOLERANCE`; a quantized one
        may lose at most the task's `budgets[quantization]` of its `metric`.
        """
        if entry["quantization"] == "none":
            entry["budget"] = f"max_abs_diff <= {FLOAT_TOLERANCE:g}"
            entry["passed"] = entry["max_abs_diff"] <= FLOAT_TOLERANCE
            return entry
        return self.judge_metric(entry, reference_figures)

    def judge_metric(self, entry, reference_figures):
        """A quantized artefact's judgement: at most `budgets[quantization]` of `metric` lost."""
        task = self.task
        budget = task.budgets[entry["quantization"]]
        drop = reference_figures[task.metric] - entry[task.metric]
        entry["metric_drop"] = round(task.metric_scale * drop, 6)
        unit = " points" if task.metric_scale == 100 else ""
        entry["budget"] = f"{task.metric} drop <= {task.metric_scale * budget:g}{unit}"
        entry["passed"] = bool(drop <= budget + 1e-9)
        return entry
