"""Optimisers, schedules and the fine-tuning loop."""

from kbert.training.optimizers import WarmupPolynomialDecay, make_optimizer

__all__ = ["WarmupPolynomialDecay", "make_optimizer"]
