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
from kbert.checkpoints.keras_hub import config_from_keras_hub, from_keras_hub, to_keras_hub
from kbert.checkpoints.pretrained import PretrainedCheckpoint, checkpoint_lowercase, load_pretrained

__all__ = [
    "HuggingFaceCheckpoint",
    "PretrainedCheckpoint",
    "checkpoint_lowercase",
    "config_from_hf",
    "config_from_keras_hub",
    "config_to_hf",
    "from_keras_hub",
    "load_hf_checkpoint",
    "load_hf_weights",
    "load_pretrained",
    "resolve_checkpoint",
    "save_hf_checkpoint",
    "to_keras_hub",
]
