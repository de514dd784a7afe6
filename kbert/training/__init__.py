"""Optimisers, schedules and the fine-tuning loop."""

from kbert.fitting.optimizers import (
    FusedAdamW,
    LayerwiseAdamW,
    WarmupPolynomialDecay,
    layerwise_multipliers,
    make_optimizer,
)

__all__ = ["FusedAdamW", "LayerwiseAdamW", "WarmupPolynomialDecay", "layerwise_multipliers", "make_optimizer"]
