"""`load_pretrained`: a BERT encoder from any checkpoint kbert reads, by folder or name."""

import collections
import os

from kbert.checkpoints.google import infer_lowercase, load_google_checkpoint
from kbert.checkpoints.huggingface import hf_lowercase, load_hf_checkpoint, resolve_checkpoint

# The file that marks a google-research/bert checkpoint folder.
GOOGLE_CONFIG_FILE = "bert_config.json"

PretrainedCheckpoint = collections.namedtuple(
    "PretrainedCheckpoint", ["config", "vocabulary", "lowercase", "encoder", "folder", "pretrainer", "fresh"],
    defaults=(None, ()),
)


def load_pretrained(name_or_path, dtype=None, heads=False):
    """Loads a Hugging Face or google-research/bert checkpoint's encoder, and its
    pretraining heads if asked.

    Args:
        name_or_path: str. A Hugging Face folder (`config.json`, `vocab.txt`,
            `model.safetensors`), a google-research/bert folder
            (`bert_config.json`, `vocab.txt`, `bert_model.ckpt`), or a packaged
            name such as "all-minilm-l6-v2".
        dtype: dtype policy of the encoder.
        heads: bool. Also load the masked-LM head (Google's `cls/predictions`,
            Hugging Face's `cls.predictions`) and the next-sentence head into
            a `bert_pretrainer` sharing the encoder: to fill in masked words
            or continue pretraining. A checkpoint without them is refused.

    Returns:
        `PretrainedCheckpoint(config, vocabulary, lowercase, encoder, folder,
        pretrainer, fresh)`; `folder` is the checkpoint's folder (where a
        packaged name resolves); `pretrainer` is None without `heads`; `fresh`
        names the layers a Hugging Face `BertForMaskedLM` file lacks (its
        pooler, its next-sentence head), which keep their initial values.

    Example:
    >>> checkpoint = load_pretrained("all-minilm-l6-v2")  # doctest: +SKIP
    """
    folder = resolve_checkpoint(name_or_path)
    if os.path.isfile(os.path.join(folder, GOOGLE_CONFIG_FILE)):
        checkpoint, fresh = load_google_checkpoint(folder, heads=heads, dtype=dtype), ()
    else:
        checkpoint = load_hf_checkpoint(folder, dtype=dtype, heads=heads)
        fresh = checkpoint.fresh
    return PretrainedCheckpoint(
        checkpoint.config, checkpoint.vocabulary, checkpoint.lowercase, checkpoint.encoder, folder,
        checkpoint.pretrainer, fresh,
    )


def checkpoint_lowercase(name_or_path):
    """Whether a checkpoint's tokenizer lowercases, read from its folder without
    loading its weights: as `load_pretrained(name_or_path).lowercase`."""
    folder = resolve_checkpoint(name_or_path)
    if os.path.isfile(os.path.join(folder, GOOGLE_CONFIG_FILE)):
        with open(os.path.join(folder, "vocab.txt"), encoding="utf-8") as f:
            return infer_lowercase([line.rstrip("\n") for line in f])
    return hf_lowercase(folder)
