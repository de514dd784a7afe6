"""AdamW and LAMB with BERT's learning-rate schedule and weight-decay exclusions."""

import keras
from keras import ops

# google-research/bert's optimization.py: weight decay 0.01, no decay on
# LayerNorm and biases, AdamW epsilon 1e-6, global-norm clipping at 1.0.
DEFAULT_WEIGHT_DECAY = 0.01
DEFAULT_EPSILON = 1e-6
DEFAULT_GLOBAL_CLIPNORM = 1.0
# Variable-name fragments that are never decayed: Keras names LayerNorm
# variables "gamma"/"beta" and Dense/embedding biases "bias".
NO_DECAY = ("gamma", "beta", "bias")


@keras.saving.register_keras_serializable(package="kbert")
class WarmupPolynomialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `peak`, then polynomial decay to `end` (BERT's schedule).

    Args:
        peak: float. Learning rate at the end of warmup.
        total_steps: int. Step at which the rate reaches `end`.
        warmup_steps: int. Length of the linear warmup.
        end: float. Final learning rate.
        power: float. 1.0 gives BERT's linear decay.
    """

    def __init__(self, peak, total_steps, warmup_steps=0, end=0.0, power=1.0):
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                f"warmup_steps={warmup_steps} and total_steps={total_steps}: expected "
                "0 <= warmup_steps <= total_steps and total_steps >= 1"
            )
        if peak <= 0:
            raise ValueError(f"learning rate {peak} must be positive")
        self.peak = peak
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.end = end
        self.power = power

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = self.peak * step / max(self.warmup_steps, 1)
        decay_steps = max(self.total_steps - self.warmup_steps, 1)
        progress = ops.clip((step - self.warmup_steps) / decay_steps, 0.0, 1.0)
        decayed = (self.peak - self.end) * (1.0 - progress) ** self.power + self.end
        return ops.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return {
            "peak": self.peak,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "end": self.end,
            "power": self.power,
        }


def make_optimizer(
    name,
    learning_rate,
    total_steps,
    warmup_steps=0,
    weight_decay=DEFAULT_WEIGHT_DECAY,
    global_clipnorm=DEFAULT_GLOBAL_CLIPNORM,
    dtype=None,
):
    """Keras AdamW or LAMB on the warmup/decay schedule, decay off for LayerNorm and biases.

    Under the "mixed_float16" policy (`dtype`, or the global policy) the
    optimizer is wrapped in a `LossScaleOptimizer`: float16 gradients
    underflow without loss scaling, and Keras adds it by itself only when the
    model's own policy (not its layers') is float16.

    Args:
        name: str. "adamw" or "lamb".
        learning_rate: float. Peak learning rate.
        total_steps: int. Training steps (the schedule ends at 0 there).
        warmup_steps: int. Linear warmup steps.
        weight_decay: float. Decoupled weight decay.
        global_clipnorm: float or None. Clip gradients to this global norm.
        dtype: str or None. The dtype policy the model trains under.

    Example:
    >>> optimizer = make_optimizer("adamw", 5e-5, total_steps=1000, warmup_steps=100)
    """
    schedule = WarmupPolynomialDecay(learning_rate, total_steps, warmup_steps)
    if name == "adamw":
        optimizer = keras.optimizers.AdamW(
            learning_rate=schedule,
            weight_decay=weight_decay,
            epsilon=DEFAULT_EPSILON,
            global_clipnorm=global_clipnorm,
        )
    elif name == "lamb":
        optimizer = keras.optimizers.Lamb(
            learning_rate=schedule,
            weight_decay=weight_decay,
            epsilon=DEFAULT_EPSILON,
            global_clipnorm=global_clipnorm,
        )
    else:
        raise ValueError(f"optimizer {name!r} is not one of 'adamw', 'lamb'")
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    if keras.dtype_policies.get(dtype or keras.config.dtype_policy()).name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
