"""AdamW and LAMB with BERT's learning-rate schedule and weight-decay exclusions."""

import keras
from keras import ops

from kbert.recipes import Recipe

# google-research/bert's optimization.py: weight decay 0.01 (the recipes'),
# no decay on LayerNorm and biases, AdamW epsilon 1e-6, global-norm clipping at 1.0.
DEFAULT_WEIGHT_DECAY = Recipe.weight_decay
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


@keras.saving.register_keras_serializable(package="kbert")
class FusedAdamW(keras.optimizers.AdamW):
    """Keras's AdamW, with each variable's Adam update one fused kernel on TensorFlow.

    Keras's `Adam.update_step` is a dozen elementwise ops, each a pass over
    the variable, its moments and the gradient: on a CPU fine-tuning MiniLM
    they took a fifth of a step. On the TensorFlow backend this runs the same
    update (`m += (g - m)(1 - beta_1)`, `v += (g^2 - v)(1 - beta_2)`,
    `var -= lr sqrt(1 - beta_2^t) / (1 - beta_1^t) m / (sqrt(v) + epsilon)`)
    as TensorFlow's `ResourceApplyAdam`, one pass that also runs under XLA
    and in `tf.distribute` updates. The decoupled weight decay is one pass
    too (`var *= 1 - lr * wd`, where Keras makes three), and global-norm
    clipping keeps the token embeddings' gradient as the slices it comes in
    (Keras's scaling makes it a dense table). The same update
    as Keras's AdamW, to float32 rounding.
    EMA and serialization stay Keras's. Other backends (JAX) and `amsgrad`
    take Keras's own update.
    """

    def _fused(self):
        return keras.backend.backend() == "tensorflow" and not self.amsgrad

    def _clip_gradients(self, grads):
        if not self._fused() or (self.clipnorm and self.clipnorm > 0) or not self.global_clipnorm:
            return super()._clip_gradients(grads)
        import tensorflow as tf

        norm = tf.sqrt(tf.add_n([_squared_norm(g) for g in grads if g is not None]))
        # Keras's clip_by_global_norm: a NaN scale for a non-finite norm.
        scale = self.global_clipnorm * tf.minimum(1.0 / norm, 1.0 / self.global_clipnorm)
        scale = scale + (norm - norm)
        return [None if g is None else _scaled(g, scale) for g in grads]

    def _apply_weight_decay(self, variables):
        if self.weight_decay is None or not self._fused():
            return super()._apply_weight_decay(variables)
        for variable in variables:
            if self._use_weight_decay(variable):
                rate = ops.cast(self.learning_rate, variable.dtype) * self._multiplier(variable)
                variable.assign(variable * (1.0 - rate * ops.cast(self.weight_decay, variable.dtype)))

    def _multiplier(self, variable):
        """The factor on the learning rate of `variable` (layer-wise rates); 1 here."""
        return 1.0

    def update_step(self, gradient, variable, learning_rate):
        if not self._fused():
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        dtype = variable.dtype
        index = self._get_variable_index(variable)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        # A gather's gradient (the token embeddings) comes as IndexedSlices;
        # Keras's update densifies it too.
        gradient = tf.cast(tf.convert_to_tensor(gradient), dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=self._momentums[index].value.handle,
            v=self._velocities[index].value.handle,
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=gradient,
        )


@keras.saving.register_keras_serializable(package="kbert")
class LayerwiseAdamW(FusedAdamW):
    """AdamW whose learning rate is scaled per variable (layer-wise learning-rate decay).

    Args:
        lr_multipliers: dict of variable-path prefix -> factor on the learning
            rate (and on the decoupled weight decay, which AdamW scales by the
            rate). A variable whose path starts with no prefix gets 1.
        **kwargs: `keras.optimizers.AdamW`'s arguments.
    """

    def __init__(self, lr_multipliers=None, **kwargs):
        super().__init__(**kwargs)
        self.lr_multipliers = dict(lr_multipliers or {})

    def build(self, var_list):
        super().build(var_list)
        # By position: the update step may see a backend variable without a path.
        self._factors = [self._factor_of(variable.path) for variable in var_list]

    def _factor_of(self, path):
        return layerwise_factor(self.lr_multipliers, path)

    def _multiplier(self, variable):
        return self._factors[self._get_variable_index(variable)]

    def update_step(self, gradient, variable, learning_rate):
        factor = self._multiplier(variable)
        super().update_step(gradient, variable, learning_rate * factor if factor != 1.0 else learning_rate)

    def _apply_weight_decay(self, variables):
        if self.weight_decay is None or self._fused():
            return super()._apply_weight_decay(variables)
        for variable in variables:
            if self._use_weight_decay(variable):
                lr = ops.cast(self.learning_rate, variable.dtype) * self._multiplier(variable)
                wd = ops.cast(self.weight_decay, variable.dtype)
                variable.assign(variable - variable * wd * lr)

    def get_config(self):
        return {**super().get_config(), "lr_multipliers": self.lr_multipliers}


def _squared_norm(gradient):
    """The squared L2 norm of a gradient; of a gather's IndexedSlices, that of its
    values, as Keras's and TensorFlow's `global_norm` take it (google-research/bert
    clips with `tf.clip_by_global_norm`, so BERT's recipe counts a row gathered
    twice as two slices too)."""
    import tensorflow as tf

    if isinstance(gradient, tf.IndexedSlices):
        gradient = gradient.values
    return tf.reduce_sum(tf.square(gradient))


def _scaled(gradient, scale):
    """`gradient * scale`, an IndexedSlices kept as one."""
    import tensorflow as tf

    scale = tf.cast(scale, gradient.dtype)
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * scale, gradient.indices, gradient.dense_shape)
    return gradient * scale


def layerwise_multipliers(num_layers, decay):
    """Learning-rate factors of layer-wise decay (Clark et al., 2020, ELECTRA; Sun et al., 2019).

    The head and the pooler keep the full rate; block `i` of `num_layers` gets
    `decay ** (num_layers - i)`, the embeddings `decay ** (num_layers + 1)`:
    lower layers, which hold more general features, move less.

    Returns:
        dict of variable-path prefix -> factor, for `make_optimizer(lr_multipliers=)`.
    """
    if not 0 < decay <= 1:
        raise ValueError(f"layer decay {decay!r}; expected a number in (0, 1]")
    factors = {f"transformer_layer_{i}": decay ** (num_layers - i) for i in range(num_layers)}
    for name in ("token_embedding", "position_embedding", "segment_embedding", "embeddings_layer_norm"):
        factors[name] = decay ** (num_layers + 1)
    return factors


def layerwise_factor(multipliers, path):
    """The factor of `layerwise_multipliers` on the variable at `path` (1 if none names it)."""
    for prefix, factor in multipliers.items():
        if path.startswith(prefix + "/"):
            return factor
    return 1.0


def make_optimizer(
    name,
    learning_rate,
    total_steps,
    warmup_steps=0,
    weight_decay=DEFAULT_WEIGHT_DECAY,
    global_clipnorm=DEFAULT_GLOBAL_CLIPNORM,
    dtype=None,
    lr_multipliers=None,
    ema_momentum=None,
    fused=True,
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
        lr_multipliers: dict or None. Per-layer factors on the learning rate
            (`layerwise_multipliers`); AdamW only.
        ema_momentum: float or None. Keep an exponential moving average of the
            weights with this momentum, and end training on it (Keras's
            `use_ema`; `fit` writes the average into the model at the end).
        fused: bool. AdamW's update as one kernel a variable on TensorFlow
            (`FusedAdamW`, also under layer-wise rates); False gives Keras's
            `AdamW` itself.

    Example:
    >>> optimizer = make_optimizer("adamw", 5e-5, total_steps=1000, warmup_steps=100)
    """
    schedule = WarmupPolynomialDecay(learning_rate, total_steps, warmup_steps)
    common = {
        "learning_rate": schedule,
        "weight_decay": weight_decay,
        "epsilon": DEFAULT_EPSILON,
        "global_clipnorm": global_clipnorm,
    }
    if ema_momentum is not None:
        common.update(use_ema=True, ema_momentum=ema_momentum)
    if name == "adamw" and lr_multipliers:
        optimizer = LayerwiseAdamW(lr_multipliers=lr_multipliers, **common)
    elif name == "adamw":
        optimizer = (FusedAdamW if fused else keras.optimizers.AdamW)(**common)
    elif name == "lamb" and not lr_multipliers:
        optimizer = keras.optimizers.Lamb(**common)
    else:
        raise ValueError(f"optimizer {name!r} is not one of 'adamw', 'lamb' (layer-wise rates: adamw)")
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    if keras.dtype_policies.get(dtype or keras.config.dtype_policy()).name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
