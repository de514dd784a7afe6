"""Reading and writing pretrained checkpoints."""

from kbert.checkpoints.huggingface import (
    HuggingFaceCheckpoint,
    config_from_hf,
    config_to_hf,
    load_hf_checkpoint,
    load_hf_weights,
    resolve_checkpoint,
    save_hf_checkpoint,
)

__all__ = [
    "HuggingFaceCheckpoint",
    "config_from_hf",
    "config_to_hf",
    "load_hf_checkpoint",
    "load_hf_weights",
    "resolve_checkpoint",
    "save_hf_checkpoint",
]
