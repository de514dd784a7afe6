"""Optimisers, schedules and the fine-tuning loop."""

from kbert.training.optimizers import (
    LayerwiseAdamW,
    WarmupPolynomialDecay,
    layerwise_multipliers,
    make_optimizer,
)

__all__ = ["LayerwiseAdamW", "WarmupPolynomialDecay", "layerwise_multipliers", "make_optimizer"]
