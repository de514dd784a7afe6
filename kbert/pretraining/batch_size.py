"""What a pretraining batch needs, checked before any work: no more sequences
than the records hold, and no more memory than the machine has.

No TensorFlow here: `kbert pretrain` refuses a batch before TensorFlow loads.
"""

import glob
import os

from kbert.config import PRESETS, BertConfig, resolve_checkpoint
from kbert.fileio import read_json
from kbert.pretraining.records_folder import METADATA_FILE, num_records

# What one training step keeps for its backward pass, at least. Korthikanti et
# al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
# section 4.1: a transformer layer keeps s*b*h*(34 + 5*a*s/h) bytes of
# activations with 16-bit activations and 1-byte dropout masks (s: sequence
# length, b: batch, h: hidden size, a: heads). kbert keeps more (LayerNorm,
# softmax and logits in float32; everything in float32 training), so a batch
# this count puts above the machine's memory cannot run, whatever the dtype.
BYTES_PER_TOKEN_AND_WIDTH = 34
BYTES_PER_ATTENTION_SCORE = 5
# The masked-LM head's float32 logits over the vocabulary and their gradient.
BYTES_PER_LOGIT = 2 * 4
# Devices whose own memory holds the activations (NVIDIA and AMD GPUs, TPUs):
# there the machine's memory says nothing about a batch.
ACCELERATOR_DEVICES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/accel[0-9]*")
# Where a cgroup v2 container's memory limit is read.
CGROUP_MEMORY_MAX = "/sys/fs/cgroup/memory.max"
GB = 1e9


def check_batch_size(batch_size, records, shape, seq_len, max_predictions, labels):
    """Refuses a batch larger than the records hold, or one whose activations
    cannot fit in the machine's memory (on a machine without accelerators).

    Args:
        batch_size: int. Sequences per step (global).
        records: the records read (a folder with `pretraining_data.json` says
            how many sequences it holds), or None (raw text: not known).
        shape: `BertConfig`, or None where the model's shape is not known.
        seq_len, max_predictions: int. The records' lengths, or the ones asked for.
        labels: (str, str). How messages name the batch size and the
            records ("--batch-size 64", "--records runs/records").

    Raises:
        ValueError: one line naming the batch size, what it was held to and
            the largest batch that passes.
    """
    batch_label, records_label = labels
    count = num_records(records)
    if count is not None and batch_size > count:
        raise ValueError(
            f"{batch_label} is larger than the {count} sequences {records_label} holds (num_instances in its "
            f"{METADATA_FILE}); expected at most {count}"
        )
    if shape is None or _has_accelerator():
        return
    memory = machine_memory()
    per_sequence = activation_bytes(1, seq_len, max_predictions, shape)
    if memory is not None and batch_size * per_sequence > memory:
        largest = int(memory // per_sequence)
        expected = (f"expected a batch of at most {largest}" if largest else
                    "even one sequence does not fit: expected a smaller model or shorter sequences")
        raise ValueError(
            f"{batch_label} needs at least {batch_size * per_sequence / GB:.1f} GB of "
            f"activations ({shape.num_layers} layers of {shape.hidden_size}, {seq_len} tokens a sequence), more "
            f"than the {memory / GB:.1f} GB of memory of this machine; {expected}"
        )


def activation_bytes(batch_size, seq_len, max_predictions, shape):
    """The bytes a training step keeps for its backward pass, at least (see `BYTES_PER_TOKEN_AND_WIDTH`)."""
    tokens = batch_size * seq_len
    per_layer = (tokens * shape.hidden_size * BYTES_PER_TOKEN_AND_WIDTH
                 + BYTES_PER_ATTENTION_SCORE * shape.num_heads * seq_len * tokens)
    return shape.num_layers * per_layer + batch_size * max_predictions * shape.vocab_size * BYTES_PER_LOGIT


def model_shape(init, vocab_size):
    """The `BertConfig` a run starting from `init` trains, for its size only:
    a preset name, a `BertConfig`, a BertConfig .json file (read here: a bad
    one is refused now), or a checkpoint folder or packaged name (its
    `config.json` or `bert_config.json`); None where that cannot be read
    (loading the checkpoint names what is wrong)."""
    if isinstance(init, BertConfig) or init in PRESETS:
        config = init if isinstance(init, BertConfig) else PRESETS[init]
        return config.replace(vocab_size=vocab_size)
    if str(init).endswith(".json") and os.path.isfile(init):
        return BertConfig.from_json(init).replace(vocab_size=vocab_size)
    try:
        folder = resolve_checkpoint(init)
        for name in ("config.json", "bert_config.json"):
            if os.path.isfile(os.path.join(folder, name)):
                values = read_json(os.path.join(folder, name))
                return BertConfig(vocab_size=vocab_size, hidden_size=values["hidden_size"],
                                  num_layers=values["num_hidden_layers"], num_heads=values["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        pass
    return None


def machine_memory():
    """Bytes of memory this process may use: the machine's, or its container's
    limit (cgroup v2) where lower; None where neither can be read."""
    try:
        sizes = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    except (ValueError, OSError, AttributeError):
        sizes = []
    try:
        with open(CGROUP_MEMORY_MAX) as f:
            sizes.append(int(f.read().strip()))
    except (OSError, ValueError):  # no cgroup v2, or "max": no limit
        pass
    return min(sizes) if sizes else None


def _has_accelerator():
    return any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICES)
