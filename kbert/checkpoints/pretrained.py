"""`load_pretrained`: a BERT encoder from any checkpoint kbert reads, by folder or name."""

import collections
import os

from kbert.checkpoints.google import load_google_checkpoint
from kbert.checkpoints.huggingface import load_hf_checkpoint, resolve_checkpoint

# The file that marks a google-research/bert checkpoint folder.
GOOGLE_CONFIG_FILE = "bert_config.json"

PretrainedCheckpoint = collections.namedtuple(
    "PretrainedCheckpoint", ["config", "vocabulary", "lowercase", "encoder", "folder"]
)


def load_pretrained(name_or_path, dtype=None):
    """Loads a Hugging Face or google-research/bert checkpoint's encoder.

    Args:
        name_or_path: str. A Hugging Face folder (`config.json`, `vocab.txt`,
            `model.safetensors`), a google-research/bert folder
            (`bert_config.json`, `vocab.txt`, `bert_model.ckpt`), or a packaged
            name such as "all-minilm-l6-v2".
        dtype: dtype policy of the encoder.

    Returns:
        `PretrainedCheckpoint(config, vocabulary, lowercase, encoder, folder)`;
        `folder` is the checkpoint's folder (where a packaged name resolves).

    Example:
    >>> checkpoint = load_pretrained("all-minilm-l6-v2")  # doctest: +SKIP
    """
    folder = resolve_checkpoint(name_or_path)
    if os.path.isfile(os.path.join(folder, GOOGLE_CONFIG_FILE)):
        checkpoint = load_google_checkpoint(folder, heads=False, dtype=dtype)
    else:
        checkpoint = load_hf_checkpoint(folder, dtype=dtype)
    return PretrainedCheckpoint(
        checkpoint.config, checkpoint.vocabulary, checkpoint.lowercase, checkpoint.encoder, folder
    )
