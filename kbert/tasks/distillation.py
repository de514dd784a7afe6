"""Knowledge-distillation losses: a student learns the gold targets and its teacher's outputs.

A task picks its loss in `Task.distillation_loss`; `kbert.training.distill`
trains with it and never asks which task it is. The targets are a dict, one
row per encoded row (`distillation_targets`):

| key | what |
| --- | --- |
| `TARGET` | the task's own targets (`Task.encode`): class ids, label indicators, scores, tag ids, a span's start and end |
| `TEACHER` | the teacher's output on the same row (logits, a score, start and end logits) |
| `HARD_WEIGHT` | float32, 1 for a labelled row, 0 for one without a usable target (an unlabelled text; a question whose answer cannot be found) |

Each loss is the mean over the batch's counted positions (its rows, or the
tagged tokens of a per-token task) of

    alpha * hard_weight * hard + (1 - alpha) * soft

Imported when a task is distilled, so that listing the tasks imports no Keras.
"""

import keras
from keras import ops

TARGET = "target"
TEACHER = "teacher"
HARD_WEIGHT = "hard_weight"


def distillation_targets(targets, teacher_output, hard_weight):
    """The targets dict the losses below take (see the module docstring)."""
    return {TARGET: targets, TEACHER: teacher_output, HARD_WEIGHT: hard_weight}


class DistillationLoss(keras.losses.Loss):
    """`alpha * hard_weight * hard + (1 - alpha) * soft`, averaged over the counted positions.

    Subclasses compute `terms`. Positions that are not counted (ignored
    tokens, padding) weigh 0, and the others `positions / counted`, so
    Keras's "sum_over_batch_size" reduction (which also divides the loss among
    `tf.distribute` replicas) gives the mean over counted positions: what
    Keras's own losses do with a mask.

    Args:
        alpha: float in [0, 1]. The weight of the gold targets' loss.
    """

    def __init__(self, alpha, name="distillation"):
        super().__init__(name=name)
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha={alpha!r}; expected a number in [0, 1]")
        self.alpha = float(alpha)

    def terms(self, target, teacher, student):
        """`(hard, soft, counted)`, each of the student's outputs' shape less its last axis."""
        raise NotImplementedError

    def call(self, y_true, y_pred):
        student = ops.cast(y_pred, "float32")
        hard, soft, counted = self.terms(y_true[TARGET], ops.cast(y_true[TEACHER], "float32"), student)
        weight = ops.cast(y_true[HARD_WEIGHT], "float32")
        for _ in range(len(hard.shape) - 1):  # one weight a row, over a per-token task's tokens
            weight = ops.expand_dims(weight, -1)
        loss = self.alpha * weight * hard + (1.0 - self.alpha) * soft
        counted = ops.cast(counted, "float32")
        positions = ops.cast(ops.size(counted), "float32")
        return loss * counted * (positions / ops.maximum(ops.sum(counted), 1.0))

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha}


class SoftTargetLoss(DistillationLoss):
    """Cross-entropy on the gold class plus the softened teacher's KL divergence (Hinton et al., 2015).

    `soft = T^2 * KL(softmax(teacher / T) || softmax(student / T))`: the T^2
    keeps its gradients' scale as T changes ("Distilling the knowledge in a
    neural network", section 2).

    Args:
        temperature: float > 0. T.
        alpha: float in [0, 1]. The weight of the cross-entropy.
        ignored: int or None. A target that marks positions left out (per-token tasks).
    """

    def __init__(self, temperature, alpha, ignored=None, name="soft_target_distillation"):
        super().__init__(alpha, name=name)
        if not temperature > 0:
            raise ValueError(f"temperature={temperature!r}; expected a number above 0")
        self.temperature = float(temperature)
        self.ignored = ignored

    def terms(self, target, teacher, student):
        target = ops.cast(target, "int32")
        if self.ignored is None:
            counted = ops.ones_like(target, dtype="bool")
        else:
            counted = ops.not_equal(target, self.ignored)
        # The gold class's log-probability (a span's length varies with its batch).
        gold = ops.expand_dims(ops.where(counted, target, 0), -1)
        hard = -ops.squeeze(ops.take_along_axis(ops.log_softmax(student, axis=-1), gold, axis=-1), -1)
        t = self.temperature
        teacher_log = ops.log_softmax(teacher / t, axis=-1)
        kl = ops.sum(ops.exp(teacher_log) * (teacher_log - ops.log_softmax(student / t, axis=-1)), axis=-1)
        return hard, t * t * kl, counted

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature, "ignored": self.ignored}


class SigmoidSoftTargetLoss(DistillationLoss):
    """Each label's binary cross-entropy to the gold labels plus to the softened
    teacher's probabilities (multi-label classification).

    `soft = T^2 * BCE(sigmoid(teacher / T), sigmoid(student / T))`, the
    per-label analogue of `SoftTargetLoss`'s term; both are means over the labels.

    Args:
        temperature: float > 0. T.
        alpha: float in [0, 1]. The weight of the gold labels' cross-entropy.
    """

    def __init__(self, temperature, alpha, name="sigmoid_soft_target_distillation"):
        super().__init__(alpha, name=name)
        if not temperature > 0:
            raise ValueError(f"temperature={temperature!r}; expected a number above 0")
        self.temperature = float(temperature)

    def terms(self, target, teacher, student):
        t = self.temperature
        hard = ops.mean(ops.binary_crossentropy(ops.cast(target, "float32"), student, from_logits=True), axis=-1)
        soft = ops.mean(ops.binary_crossentropy(ops.sigmoid(teacher / t), student / t, from_logits=True), axis=-1)
        return hard, t * t * soft, ops.ones_like(hard, dtype="bool")

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature}


class ScoreDistillationLoss(DistillationLoss):
    """Squared error to the gold score plus squared error to the teacher's score (regression).

    Args:
        alpha: float in [0, 1]. The weight of the gold scores' error.
    """

    def __init__(self, alpha, name="score_distillation"):
        super().__init__(alpha, name=name)

    def terms(self, target, teacher, student):
        target = ops.cast(target, "float32")
        hard = ops.mean(ops.square(student - target), axis=-1)
        soft = ops.mean(ops.square(student - teacher), axis=-1)
        return hard, soft, ops.ones_like(hard, dtype="bool")


class SpanDistillationLoss(SoftTargetLoss):
    """`SoftTargetLoss` on a span's start and on its end, averaged over the two (question answering).

    run_squad.py's loss is the mean of the start and end cross-entropies over
    the window's positions; this is the same with the teacher's softened start
    and end distributions beside the gold positions. The student's outputs are
    a dict of `(batch, length)` logits, one per name in `outputs`, with padding
    at `padding_logit`; the targets' `TARGET` is the task's own dict of `(batch,)`
    gold positions under the same names, and `TEACHER` `(batch, length, 2)`,
    the teacher's start and end logits (cut and padded with the row, so a
    position the student pads is padding for the teacher too).

    Args:
        temperature, alpha: as for `SoftTargetLoss`.
        outputs: the names of the start and end logits, in that order.
        padding_logit: float. The logit of a padded position.
    """

    def __init__(self, temperature, alpha, outputs, padding_logit, name="span_distillation"):
        super().__init__(temperature, alpha, name=name)
        self.outputs = tuple(outputs)
        self.padding_logit = float(padding_logit)

    def call(self, y_true, y_pred):
        student = ops.stack([ops.cast(y_pred[name], "float32") for name in self.outputs], axis=1)
        target = ops.stack([y_true[TARGET][name] for name in self.outputs], axis=1)
        teacher = ops.transpose(ops.cast(y_true[TEACHER], "float32"), (0, 2, 1))
        teacher = ops.where(student <= self.padding_logit, self.padding_logit, teacher)
        return super().call({**y_true, TARGET: target, TEACHER: teacher}, student)

    def get_config(self):
        return {**super().get_config(), "outputs": self.outputs, "padding_logit": self.padding_logit}
