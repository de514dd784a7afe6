"""Training recipes: what a run trains with unless the caller says otherwise.

Each task owns its recipe (`Task.recipe`, a named constant in the task's
module, with where it comes from); distillation has one of its own here.
Plain data without TensorFlow, so that `kbert --help` shows them.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The epochs, peak learning rate, batch and packed length of a training run.

    Attributes:
        epochs: int. Passes over the training data.
        learning_rate: float. AdamW's peak rate, after warm-up.
        batch_size: int. Examples (rows, for tasks that window) per step; the
            global batch under a distribution strategy.
        sequence_length: int or None. Packed length; None: the model's own
            (distillation: the teacher's).
        warmup_fraction: float in [0, 1]. Share of the steps warming the rate
            up from 0 before its linear decay to 0.
        weight_decay: float. AdamW's decoupled weight decay (not on LayerNorm
            and biases).
        adapt_steps: int. Masked-LM steps on the training texts before
            fine-tuning (task-adaptive pretraining, `kbert.pretraining.adapt`);
            0: none.
        probe_head: bool. Start the head as a linear probe: a logistic
            regression fitted on the frozen encoder's vectors of the training
            texts, then fine-tune everything (`kbert.training.probe`).

    The data options a recipe was measured with (text classification's
    `--truncate head_tail`) are those options' defaults (`Task.options`).
    """

    epochs: int
    learning_rate: float
    batch_size: int = 32
    sequence_length: int = 128
    # google-research/bert's optimization.py: 10% warm-up, weight decay 0.01.
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    adapt_steps: int = 0
    probe_head: bool = False

    def override(self, **values):
        """This recipe with each value given (not None) in place of its own.

        Example:
        >>> recipe = Recipe(epochs=2, learning_rate=1e-4).override(epochs=None, learning_rate=3e-5)
        >>> recipe.epochs, recipe.learning_rate, recipe.warmup_fraction
        (2, 3e-05, 0.1)
        """
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})


# docs/distillation.md, the measured students: 3 epochs at 1e-4, batch 32, at
# the teacher's sequence length.
DISTILLATION = Recipe(epochs=3, learning_rate=1e-4, batch_size=32, sequence_length=None)


def check_adaptation(adapt_steps):
    """Raises `ValueError` naming `adapt_steps` if it is not a count of steps."""
    if not isinstance(adapt_steps, int) or adapt_steps < 0:
        raise ValueError(f"adapt_steps={adapt_steps!r}; expected an integer of 0 or more")


def check_probe(task_class, probe_head):
    """Raises `ValueError` if `probe_head` is set for a task whose head is not a
    classifier on one vector per row (`Objective.linear_probe`), or is not a bool."""
    if not isinstance(probe_head, bool):
        raise ValueError(f"probe_head={probe_head!r}; expected True or False")
    if probe_head and not task_class.objective.linear_probe:
        raise ValueError(
            f"probe_head=True: task {task_class.name!r} has no classifier head on the pooled [CLS] "
            "vector to start as a linear probe (text-classification and text-pair-classification have)"
        )
