"""What a task's model predicts and how it learns, declared once: `Task.objective`.

An objective names the model's outputs, builds the encoder and its head layer
(`kbert.models.heads`), gives the loss and metrics for `model.compile` and
the loss of a distilled student, and checks that a loaded model fits the
task's settings. Tasks declare one and write only what is theirs: reading
data, encoding it, decoding and judging the predictions.

| objective | head | outputs | loss | tasks |
| --- | --- | --- | --- | --- |
| `Classes(field)` | Dense on the pooled [CLS] | `logits` | softmax cross-entropy | text, pair classification |
| `Score()` | Dense(1) on the pooled [CLS] | `score` | mean squared error | pair regression |
| `Tags(field)` | Dense on every position | `logits` | cross-entropy at tagged positions | token classification |
| `Spans()` | Dense(2) on every position | `start_logits`, `end_logits` | run_squad.py's | question answering |
| `Embedding()` | pooling, L2 norm | `embedding` | none: needs no training | sentence embeddings |
| `MaskedWords()` | a checkpoint's masked LM at each `[MASK]` | `word_ids`, `word_scores` | none: needs no training | fill-mask |

Keras and the models are imported on first use, so that listing the tasks
(`kbert --help`) imports neither.
"""

import numpy as np

from kbert.config import PADDING_LOGIT
from kbert.tasks.inference import softmax


class Objective:
    """The base: a task that writes `build_model` and `compile_args` itself needs no more."""

    # Names of the model's outputs.
    outputs = ("logits",)
    # True if the head reads `sequence_output` (every position); else the
    # export graph computes only [CLS] in the last block.
    reads_sequence = False
    # What pads per-token targets in padded batches (ignored by the loss).
    target_padding = 0
    # True if the head comes from the checkpoint (`load_pretrained(..., heads=True)`):
    # `build_model` is then given its `bert_pretrainer`.
    pretrained_heads = False
    # True if the head is a Dense on one vector per row, which
    # `kbert.training.probe` can fit first as a logistic regression
    # (`fit_probe`).
    linear_probe = False

    def build_model(self, task, encoder_or_config, dtype=None):
        """The task's model on `ENCODER_INPUTS`: the encoder and a float32 head layer named "head"."""
        raise NotImplementedError(f"task {task.name!r} declares no objective; write its build_model")

    def compile_args(self, task):
        """`loss` and `metrics` for `model.compile`."""
        raise NotImplementedError(f"task {task.name!r} declares no objective; write its compile_args")

    def distillation_loss(self, task, temperature, alpha):
        """The Keras loss a student trains on (`kbert.tasks.distillation`)."""
        raise ValueError(f"task {task.name!r} cannot be distilled yet (kbert distill)")

    def check_model(self, task, model, source):
        """Raises `ValueError` naming `source` if `model` does not fit `task`'s settings."""

    def decode(self, task, outputs):
        """One prediction per row from the model's outputs (tasks with more to do write `decode`)."""
        raise NotImplementedError(f"task {task.name!r} must write decode")


class Classes(Objective):
    """One of the names in the task's `field` (a `Config` list) per row, from the pooled [CLS]."""

    linear_probe = True

    def __init__(self, field="labels"):
        self.field = field

    def classes(self, task):
        return len(getattr(task, self.field))

    def build_model(self, task, encoder_or_config, dtype=None):
        from kbert.models import bert_classifier

        return bert_classifier(encoder_or_config, self.classes(task), dtype=dtype)

    def compile_args(self, task):
        import keras

        return {
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        }

    def distillation_loss(self, task, temperature, alpha):
        from kbert.tasks.distillation import SoftTargetLoss

        return SoftTargetLoss(temperature, alpha)

    def check_model(self, task, model, source):
        _check_units(model, self.classes(task), self.field, "classes", source)

    def decode(self, task, outputs):
        """Class probabilities, one row each."""
        return softmax(outputs["logits"])

    def probe_gap(self, targets, units):
        """Why the training rows' `targets` cannot fit a probe of `units` outputs, or None."""
        missing = units - len(np.unique(targets))
        return f"{missing} of the head's {units} classes have no training row" if missing else None

    def fit_probe(self, vectors, targets, units):
        """The head's kernel `(width, units)` and bias fitted as a multinomial logistic
        regression of the class ids `targets` on `vectors`, and its training accuracy."""
        regression = logistic_regression().fit(vectors, targets)
        kernel, bias = regression.coef_.T, regression.intercept_
        if units == 2:
            # One logit for class 1 against class 0: the softmax of two halves gives the same odds.
            kernel, bias = np.concatenate([-kernel, kernel], axis=1) / 2, np.concatenate([-bias, bias]) / 2
        return kernel, bias, regression.score(vectors, targets)


def logistic_regression():
    """The linear probe's regression (`kbert.training.probe`): scikit-learn's default L2
    penalty, the sum of the rows' losses plus half the squared weights over C=1."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=1.0, max_iter=5000)


class Score(Objective):
    """One real score per row from the pooled [CLS], trained with mean squared error (BERT's STS-B)."""

    outputs = ("score",)

    def build_model(self, task, encoder_or_config, dtype=None):
        from kbert.models import bert_regressor

        return bert_regressor(encoder_or_config, dtype=dtype)

    def compile_args(self, task):
        import keras

        return {
            "loss": keras.losses.MeanSquaredError(),
            "metrics": [keras.metrics.RootMeanSquaredError(name="rmse")],
        }

    def distillation_loss(self, task, temperature, alpha):
        """`alpha * MSE(gold) + (1 - alpha) * MSE(teacher's score)`; a score has no temperature."""
        from kbert.tasks.distillation import ScoreDistillationLoss

        return ScoreDistillationLoss(alpha)

    def check_model(self, task, model, source):
        _check_units(model, 1, "score", "scores", source)

    def decode(self, task, outputs):
        """float64 scores, one each."""
        return np.asarray(outputs["score"], np.float64).reshape(-1)


class Tags(Objective):
    """One of the names in the task's `field` per position; positions whose target is
    `ignored` (a word's later pieces, padding) count in neither loss nor metric."""

    reads_sequence = True

    def __init__(self, field, ignored, metric):
        """`metric`: returns the Keras metric class that skips `ignored` (defined
        on first use, so that listing the tasks imports no Keras)."""
        self.field, self.target_padding, self.metric = field, ignored, metric

    def build_model(self, task, encoder_or_config, dtype=None):
        import keras

        from kbert.models.encoder import as_encoder, encoder_inputs
        from kbert.models.heads import HEAD_LAYER, DenseHead

        encoder = as_encoder(encoder_or_config, dtype=dtype)
        # The tagger reads every position, never the pooled [CLS] vector: left
        # trainable, the pooler would get no gradient (and Keras warns of it).
        encoder.get_layer("pooler").trainable = False
        inputs = encoder_inputs()
        head = DenseHead(len(getattr(task, self.field)), "logits", "sequence_output", dropout_dtype=dtype,
                         name=HEAD_LAYER)
        return keras.Model(inputs=inputs, outputs=head(encoder(inputs), inputs), name="bert_token_classifier")

    def compile_args(self, task):
        import keras

        return {
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=self.target_padding),
            "metrics": [self.metric()(name="accuracy")],
        }

    def distillation_loss(self, task, temperature, alpha):
        """Per tagged position, as the fine-tuning loss counts them."""
        from kbert.tasks.distillation import SoftTargetLoss

        return SoftTargetLoss(temperature, alpha, ignored=self.target_padding)

    def check_model(self, task, model, source):
        _check_units(model, len(getattr(task, self.field)), self.field, "tags", source)


class Spans(Objective):
    """run_squad.py's span: start and end logits at every position, padding at `PADDING_LOGIT`."""

    outputs = ("start_logits", "end_logits")
    reads_sequence = True

    def build_model(self, task, encoder_or_config, dtype=None):
        import keras

        from kbert.models.encoder import as_encoder, encoder_inputs, rewire_encoder
        from kbert.models.heads import HEAD_LAYER, SpanHead

        encoder = rewire_encoder(as_encoder(encoder_or_config, dtype=dtype), first_token_only=False)
        # The span head reads every position, never the pooled [CLS] vector.
        encoder.get_layer("pooler").trainable = False
        inputs = encoder_inputs()
        return keras.Model(inputs, SpanHead(name=HEAD_LAYER)(encoder(inputs), inputs), name="bert_question_answering")

    def compile_args(self, task):
        import keras

        return {
            "loss": {name: keras.losses.SparseCategoricalCrossentropy(from_logits=True) for name in self.outputs},
            # run_squad.py: (start_loss + end_loss) / 2.
            "loss_weights": {name: 0.5 for name in self.outputs},
            "metrics": {name: [keras.metrics.SparseCategoricalAccuracy(name="accuracy")] for name in self.outputs},
        }

    def distillation_loss(self, task, temperature, alpha):
        from kbert.tasks.distillation import SpanDistillationLoss

        return SpanDistillationLoss(temperature, alpha, self.outputs, PADDING_LOGIT)

    def check_model(self, task, model, source):
        names = sorted(model.output) if isinstance(model.output, dict) else []
        if names != sorted(self.outputs):
            raise ValueError(f"{source}: the model outputs {names or model.output}; expected {list(self.outputs)}")


class Embedding(Objective):
    """A vector per row: token vectors pooled and normalised as the task's `pooling`
    and `normalize` fields say (sentence-transformers' embedding). Needs no training."""

    outputs = ("embedding",)
    reads_sequence = True

    def build_model(self, task, encoder_or_config, dtype=None):
        from kbert.models.embedder import bert_embedder

        return bert_embedder(encoder_or_config, dtype=dtype, pooling=task.pooling, normalize=task.normalize,
                             name="sentence_embedder")

    def compile_args(self, task):
        raise ValueError(f"task {task.name!r} needs no training")


class MaskedWords(Objective):
    """The `top_k` words a checkpoint's masked LM puts at each of a row's first
    `max_masks` `[MASK]`s, with their probabilities (`FillMaskHead`; the task's
    fields of those names). Needs no training: the head is the checkpoint's."""

    outputs = ("word_ids", "word_scores")
    reads_sequence = True
    pretrained_heads = True

    def build_model(self, task, source, dtype=None):
        """`source`: a `bert_pretrainer` (its masked LM), or an encoder or config (a fresh head)."""
        import keras

        from kbert.models.encoder import as_encoder, encoder_inputs
        from kbert.models.heads import HEAD_LAYER, FillMaskHead
        from kbert.models.pretrainer import BertPretrainer, head_hyperparameters

        settings = {"mask_id": task.tokenizer.mask_id, "max_masks": task.max_masks, "top_k": task.top_k,
                    "name": HEAD_LAYER}
        if isinstance(source, BertPretrainer):
            head, encoder = FillMaskHead.from_pretrainer(source, **settings), source.encoder
        else:
            encoder = as_encoder(source, dtype=dtype)
            activation, epsilon = head_hyperparameters(encoder)
            vocab_size = encoder.get_layer("token_embedding").input_dim
            head = FillMaskHead(vocab_size, activation=activation, layer_norm_epsilon=epsilon, **settings)
        inputs = encoder_inputs()
        return keras.Model(inputs, head(encoder(inputs), inputs), name="bert_fill_mask")

    def compile_args(self, task):
        raise ValueError(f"task {task.name!r} needs no training")


def _check_units(model, units, field, unit, source):
    """`ValueError` unless `model` outputs `units` values a row (position)."""
    outputs = model.output.shape[-1]
    if outputs != units:
        raise ValueError(f"{source} names {units} {field} but the model outputs {outputs} {unit}")
