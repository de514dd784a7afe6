"""`token-classification`'s serving adapter: raw texts in, each word's tag and offsets out.

`serving_default` splits each text into words as `kbert predict` does, packs
them in the task's windows and gathers each word's logits at its first piece;
the verification places the served word logits back at `encode`'s rows and
compares tag probabilities where both give them.
"""

import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.export.serving_base import Serving
from kbert.tasks.inference import softmax
from kbert.tasks.token_classification import FLOAT_F1_BUDGET, word_offsets


class TokenServing(Serving):
    """Tags per word: `tags`, `scores`, `starts`, `ends`, `word_logits`; `labels.txt` shipped."""

    on_device = "token_classifier"
    # Raw text needs windows and character offsets, which a TFLite model of
    # builtin and tf-text ops cannot compute (see docs/tasks/token-classification.md).
    tflite_text_variant = False
    # Float32: tag probabilities within FLOAT_TOLERANCE, and F1 within
    # FLOAT_F1_BUDGET either way (rounding may flip a near tie).
    float_metric_change = FLOAT_F1_BUDGET

    def features(self, strings):
        """Windows of the raw texts' words, with what `outputs` needs to gather them."""
        word_ids, starts, ends = self.task.tokenizer.words_with_offsets(strings["text"])
        windows = self.task.windows(word_ids)
        return {
            **{name: windows[name] for name in ENCODER_INPUTS},
            "word_row": windows["word_row"],
            "word_position": windows["word_position"],
            "word_splits": word_ids.row_splits,
            "starts": starts.flat_values,
            "ends": ends.flat_values,
        }

    def outputs(self, features, outputs):
        """`serve_tokens`: the logits. `serving_default`: per text, its words' tags and offsets.

        Word outputs are padded to the batch's most words: `tags` with "",
        `starts` and `ends` with -1, `scores` and `word_logits` with 0.
        """
        import tensorflow as tf

        logits = outputs["logits"]
        if "word_row" not in features:
            return {"logits": logits}
        at = tf.stack([features["word_row"], features["word_position"]], axis=-1)
        word_logits = tf.gather_nd(logits, at)
        probabilities = tf.nn.softmax(word_logits, axis=-1)
        ids = tf.argmax(word_logits, axis=-1)

        def per_text(values, padding):
            ragged = tf.RaggedTensor.from_row_splits(values, features["word_splits"], validate=False)
            return ragged.to_tensor(default_value=padding)

        return {
            "tags": per_text(tf.gather(tf.constant(self.task.tags), ids), ""),
            "scores": per_text(tf.reduce_max(probabilities, axis=-1), 0.0),
            "starts": per_text(features["starts"], tf.constant(-1, tf.int64)),
            "ends": per_text(features["ends"], tf.constant(-1, tf.int64)),
            "word_logits": per_text(word_logits, 0.0),
        }

    def assets(self):
        return {"labels.txt": "".join(tag + "\n" for tag in self.task.tags)}

    def text_outputs(self, call, examples, batch_size):
        """The SavedModel's word logits placed at `encode`'s rows and positions.

        The signature splits each text into words itself; a pre-split word
        (CoNLL's "1996-08-22") may be several of its words, and is read from
        the first, whose first piece is the same (and, for BIOES, from its
        last part's, the word `word_parts - 1` on). Sentences `encode` reads
        together (`context` "document") are sent as one text, joined by
        spaces, as an app would send the document. Returns `logits` and
        `compared`, the positions it filled (where agreement is measured).
        """
        encoded = self.task.encode(examples, targets=False)
        logits = np.zeros(encoded.features["token_ids"].shape + (len(self.task.tags),), np.float32)
        compared = np.zeros(encoded.features["token_ids"].shape, bool)
        texts = self.strings(examples)["text"]
        groups = self.task.read_together(examples)
        # Each example's text and where it begins in its group's text.
        offsets = np.zeros(len(examples), np.int64)
        for group in groups:
            offsets[group] = np.cumsum([0] + [len(text) + 1 for text in texts[group]][:-1])
        extra = encoded.extra
        for begin in range(0, len(groups), batch_size):
            batch = groups[begin : begin + batch_size]
            result = call({"text": [" ".join(texts[group]) for group in batch]})
            served_starts = np.asarray(result["starts"])
            word_logits = np.asarray(result["word_logits"])
            for i, group in enumerate(batch):
                index = {int(s): j for j, s in enumerate(served_starts[i]) if s >= 0}
                for e in range(group.start, group.stop):
                    words = range(extra["word_splits"][e], extra["word_splits"][e + 1])
                    for word, start in zip(words, offsets[e] + np.asarray(word_offsets(examples[e])[1])):
                        if start not in index:
                            continue
                        at = extra["word_row"][word], extra["word_position"][word]
                        logits[at] = word_logits[i, index[start]]
                        compared[at] = True
                        # Its last part (BIOES reads it): the served word as many on.
                        end = index[start] + extra["word_parts"][word] - 1
                        if end < len(served_starts[i]) and served_starts[i][end] >= 0:
                            at = extra["word_end_row"][word], extra["word_end_position"][word]
                            logits[at] = word_logits[i, end]
                            compared[at] = True
        return {"logits": logits, "compared": compared}

    def scores(self, outputs):
        return softmax(outputs["logits"])

    def agreement(self, outputs, reference):
        """Largest difference of tag probabilities, where both give them (`compared`)."""
        difference = np.abs(self.scores(outputs) - self.scores(reference))
        for compared in (outputs.get("compared"), reference.get("compared")):
            if compared is not None:
                difference = np.where(compared[..., None], difference, 0.0)
        return {"max_abs_diff": float(difference.max()) if difference.size else 0.0}
