"""Hugging Face BERT checkpoints (`config.json`, `vocab.txt`, `model.safetensors`).

No PyTorch needed: tensors are read and written with `safetensors.numpy`.
"""

import collections
import json
import os
import shutil
import tempfile

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from kbert.config import PRESETS, BertConfig, read_checkpoint_vocabulary, resolve_checkpoint
from kbert.fileio import check_new_folder, follow_umask
from kbert.logs import warn
from kbert.models.encoder import bert_encoder

# Hugging Face activation names -> kbert's. HF's "gelu" is the exact erf form.
_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_approximate", "gelu_pytorch_tanh": "gelu_approximate", "relu": "relu"}
_KBERT_ACTIVATIONS = {"gelu": "gelu", "gelu_approximate": "gelu_new", "relu": "relu"}

# Tensors a checkpoint may lack, whose weights then keep their initial values:
# `BertForMaskedLM` (what `run_mlm.py` saves after domain pretraining) has no
# pooler and no next-sentence head; Hugging Face too starts them anew.
MAY_BE_MISSING = ("pooler.dense.", "cls.seq_relationship.")

HuggingFaceCheckpoint = collections.namedtuple(
    "HuggingFaceCheckpoint", ["config", "vocabulary", "lowercase", "encoder", "pretrainer", "fresh"],
    defaults=(None, ()),
)


def warn_fresh(checkpoint, folder, trains, built=()):
    """Says on stderr which layers `checkpoint` started anew (`MAY_BE_MISSING`), and
    which the caller `built` anew for want of them (a `BertModel`'s pretraining
    heads), where a training run (`trains`: "fine-tuning", "pretraining") will train them."""
    fresh = tuple(checkpoint.fresh) + tuple(built)
    if fresh:
        them = "them" if len(fresh) > 1 else "it"
        warn(f"{folder} has no {', '.join(fresh)}; initialised anew, as "
             f"Hugging Face does ({trains} trains {them})")


def config_from_hf(hf_config):
    """A `BertConfig` from the dict of a Hugging Face `config.json`."""
    model_type = hf_config.get("model_type")
    architectures = hf_config.get("architectures") or []
    if model_type != "bert" or not all(a.startswith("Bert") for a in architectures):
        raise ValueError(
            f"unsupported architecture model_type={model_type!r} "
            f"architectures={architectures}; expected a BERT checkpoint"
        )
    if hf_config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"position_embedding_type={hf_config['position_embedding_type']!r}; "
            "only 'absolute' is supported"
        )
    activation = hf_config.get("hidden_act", "gelu")
    if activation not in _HF_ACTIVATIONS:
        raise ValueError(f"hidden_act={activation!r} is not one of {sorted(_HF_ACTIVATIONS)}")
    return BertConfig(
        vocab_size=hf_config["vocab_size"],
        hidden_size=hf_config["hidden_size"],
        num_layers=hf_config["num_hidden_layers"],
        num_heads=hf_config["num_attention_heads"],
        intermediate_size=hf_config["intermediate_size"],
        max_position_embeddings=hf_config.get("max_position_embeddings", 512),
        type_vocab_size=hf_config.get("type_vocab_size", 2),
        hidden_dropout=hf_config.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf_config.get("attention_probs_dropout_prob", 0.1),
        activation=_HF_ACTIVATIONS[activation],
        layer_norm_epsilon=hf_config.get("layer_norm_eps", 1e-12),
        initializer_range=hf_config.get("initializer_range", 0.02),
    )


def config_to_hf(config):
    """The Hugging Face `config.json` dict of a `BertConfig`."""
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "hidden_act": _KBERT_ACTIVATIONS[config.activation],
        "layer_norm_eps": config.layer_norm_epsilon,
        "initializer_range": config.initializer_range,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
    }


def _weight_map(encoder, num_layers):
    """(HF tensor name, Keras variable, transpose) for every encoder weight."""

    def dense(hf_name, layer):
        return [(f"{hf_name}.weight", layer.kernel, True), (f"{hf_name}.bias", layer.bias, False)]

    def layer_norm(hf_name, layer):
        return [(f"{hf_name}.weight", layer.gamma, False), (f"{hf_name}.bias", layer.beta, False)]

    get = encoder.get_layer
    pairs = [
        ("embeddings.word_embeddings.weight", get("token_embedding").embeddings, False),
        ("embeddings.position_embeddings.weight", get("position_embedding").embeddings, False),
        ("embeddings.token_type_embeddings.weight", get("segment_embedding").embeddings, False),
        *layer_norm("embeddings.LayerNorm", get("embeddings_layer_norm")),
    ]
    for index in range(num_layers):
        block = get(f"transformer_layer_{index}")
        prefix = f"encoder.layer.{index}"
        attention = block.attention
        pairs += [
            *dense(f"{prefix}.attention.self.query", attention.query_dense),
            *dense(f"{prefix}.attention.self.key", attention.key_dense),
            *dense(f"{prefix}.attention.self.value", attention.value_dense),
            *dense(f"{prefix}.attention.output.dense", attention.output_dense),
            *layer_norm(f"{prefix}.attention.output.LayerNorm", block.attention_layer_norm),
            *dense(f"{prefix}.intermediate.dense", block.intermediate_dense),
            *dense(f"{prefix}.output.dense", block.output_dense),
            *layer_norm(f"{prefix}.output.LayerNorm", block.output_layer_norm),
        ]
    pairs += dense("pooler.dense", get("pooler"))
    return pairs


def encoder_tensors(encoder, config, prefix="", pooler=True):
    """The encoder's weights as Hugging Face names them: name -> float32 numpy array.

    Args:
        encoder: the kbert encoder (`bert_encoder`, or a task model's "bert_encoder" layer).
        config: its `BertConfig`.
        prefix: str. Put before every name ("bert." in a task model's file).
        pooler: bool. Include `pooler.dense`; transformers' token-classification,
            question-answering and masked-LM classes have no pooler, and would
            name its tensors unexpected.
    """
    tensors = {}
    for hf_name, variable, transpose in _weight_map(encoder, config.num_layers):
        if not pooler and hf_name.startswith("pooler."):
            continue
        value = np.asarray(variable.numpy(), dtype="float32")
        tensors[prefix + hf_name] = np.ascontiguousarray(value.T if transpose else value)
    return tensors


def _heads_weight_map(pretrainer):
    """(HF tensor name, Keras variable, transpose) for the pretraining heads:
    `BertForPreTraining`'s `cls.predictions` (the masked LM, whose projection is
    the token embedding, tied) and `cls.seq_relationship` (next sentence), which
    `BertForMaskedLM` lacks."""
    masked_lm = pretrainer.get_layer("masked_lm")
    next_sentence = pretrainer.get_layer("next_sentence")
    return [
        ("cls.predictions.transform.dense.weight", masked_lm.transform_dense.kernel, True),
        ("cls.predictions.transform.dense.bias", masked_lm.transform_dense.bias, False),
        ("cls.predictions.transform.LayerNorm.weight", masked_lm.transform_layer_norm.gamma, False),
        ("cls.predictions.transform.LayerNorm.bias", masked_lm.transform_layer_norm.beta, False),
        ("cls.predictions.bias", masked_lm.output_bias, False),
        ("cls.seq_relationship.weight", next_sentence.kernel, True),
        ("cls.seq_relationship.bias", next_sentence.bias, False),
    ]


def _normalise_names(tensors):
    """Strips a `bert.` prefix and maps old `gamma`/`beta` names to `weight`/`bias`."""
    renamed = {}
    for name, value in tensors.items():
        if name.startswith("bert."):
            name = name[len("bert.") :]
        if "LayerNorm" in name:
            name = name.replace(".gamma", ".weight").replace(".beta", ".bias")
        renamed[name] = value
    return renamed


def hf_lowercase(folder):
    """Whether a Hugging Face folder's tokenizer lowercases: its `tokenizer_config.json`'s
    `do_lower_case`, True without one (as transformers' `BertTokenizer`)."""
    path = os.path.join(folder, "tokenizer_config.json")
    return bool(_read_json(path).get("do_lower_case", True)) if os.path.isfile(path) else True


def has_masked_lm(name_or_path):
    """Whether a Hugging Face checkpoint's `model.safetensors` holds a masked-LM head (`cls.predictions`)."""
    path = os.path.join(resolve_checkpoint(name_or_path), "model.safetensors")
    if not os.path.isfile(path):
        return False
    with safe_open(path, "np") as f:
        return any(name.startswith("cls.predictions.") for name in f.keys())


def load_hf_weights(encoder, config, path, pretrainer=None):
    """Assigns the tensors of a `model.safetensors` file to `encoder`'s variables,
    and to `pretrainer`'s heads if one is given (`load_hf_checkpoint`).

    Returns the names of the tensors the file lacks that may be missing (a
    `BertForMaskedLM`'s pooler and next-sentence head): those weights keep
    their initial values."""
    tensors = _normalise_names(load_file(path))
    pairs = _weight_map(encoder, config.num_layers)
    if pretrainer is not None:
        pairs += _heads_weight_map(pretrainer)
    fresh = []
    for hf_name, variable, transpose in pairs:
        if hf_name not in tensors and hf_name.startswith(MAY_BE_MISSING):
            fresh.append(hf_name)
            continue
        if hf_name not in tensors:
            needs = "; heads need a BertForPreTraining or BertForMaskedLM checkpoint" if hf_name.startswith("cls.") else ""
            raise ValueError(f"tensor {hf_name!r} is missing from {path}{needs}")
        value = tensors[hf_name]
        if transpose:
            value = value.T
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"tensor {hf_name!r} has shape {tuple(value.shape)}; "
                f"the model expects {tuple(variable.shape)}"
            )
        variable.assign(value.astype(variable.dtype))
    return fresh


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path} not found; expected a Hugging Face BERT checkpoint folder") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None


# The `BertConfig` fields a checkpoint may be loaded with other values of.
OVERRIDABLE = ("hidden_dropout", "attention_dropout")


def with_overrides(config, overrides):
    """`config` with the `OVERRIDABLE` fields in `overrides` replaced (validated by `BertConfig`)."""
    if not overrides:
        return config
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise ValueError(f"cannot override {unknown[0]!r} of a checkpoint; expected one of {OVERRIDABLE}")
    return config.replace(**overrides)


def read_hf_folder(name_or_path, overrides=None):
    """`(config, vocabulary, lowercase)` of a Hugging Face BERT folder (or packaged
    name), read without its weights; `ValueError` naming a file that is missing
    or disagrees with `config.json`. `overrides` as for `load_hf_checkpoint`."""
    folder = resolve_checkpoint(name_or_path)
    config = with_overrides(config_from_hf(_read_json(os.path.join(folder, "config.json"))), overrides)
    vocab_path = os.path.join(folder, "vocab.txt")
    for path in (vocab_path, os.path.join(folder, "model.safetensors")):
        if not os.path.isfile(path):
            raise ValueError(f"{path} not found; expected a Hugging Face BERT checkpoint folder")
    vocabulary = read_checkpoint_vocabulary(vocab_path, config, "config.json")
    return config, vocabulary, hf_lowercase(folder)


def load_hf_checkpoint(name_or_path, dtype=None, overrides=None, heads=False):
    """Loads a Hugging Face BERT folder into config, vocabulary and encoder.

    Args:
        name_or_path: a folder with `config.json`, `vocab.txt` and
            `model.safetensors`, or a name in `PACKAGED_CHECKPOINTS`.
        dtype: dtype policy of the encoder.
        overrides: dict or None. `BertConfig` fields that change nothing the
            weights hold (dropout rates, for fine-tuning), e.g.
            `{"attention_dropout": 0.0}`.
        heads: bool. Also load the masked-LM head (`cls.predictions`) and, if
            the file has it, the next-sentence head (`cls.seq_relationship`)
            into a `bert_pretrainer`: to fill in masked words or continue
            pretraining. A `BertForMaskedLM` file has no next-sentence head
            (nor a pooler, with or without `heads`): they keep their
            initial values, and `fresh` names them.

    Returns:
        `HuggingFaceCheckpoint(config, vocabulary, lowercase, encoder,
        pretrainer, fresh)`; `pretrainer` is None without `heads`, else its
        `.encoder` is `encoder`; `fresh` names the layers the file lacks
        (`MAY_BE_MISSING`), e.g. `("pooler.dense",)`; `warn_fresh` says so
        where training will train them (masked-word prediction reads
        neither). Build the tokenizer with
        `kbert.text.WordPieceTokenizer(vocabulary, lowercase)`.

    Example:
    >>> checkpoint = load_hf_checkpoint("all-minilm-l6-v2")  # doctest: +SKIP
    """
    folder = resolve_checkpoint(name_or_path)
    config, vocabulary, lowercase = read_hf_folder(folder, overrides)
    if heads:
        from kbert.models.pretrainer import bert_pretrainer

        # Built from the config, so that the heads get its activation and epsilon.
        pretrainer = bert_pretrainer(config, dtype=dtype)
        encoder = pretrainer.encoder
    else:
        pretrainer, encoder = None, bert_encoder(config, dtype=dtype)
    fresh = load_hf_weights(encoder, config, os.path.join(folder, "model.safetensors"), pretrainer)
    layers = tuple(sorted({name.rsplit(".", 1)[0] for name in fresh}))
    return HuggingFaceCheckpoint(config, vocabulary, lowercase, encoder, pretrainer, layers)


def save_hf_checkpoint(encoder, config, vocabulary, path, lowercase=True, pretrainer=None):
    """Writes `encoder` as a Hugging Face BERT folder (written aside, then renamed):
    a `BertModel`, or with `pretrainer` (a `bert_pretrainer` of `encoder`) a
    `BertForPreTraining` that keeps its masked-LM and next-sentence heads."""
    check_new_folder(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".kbert-", dir=parent)
    # BertForPreTraining names its encoder's tensors under `bert.`, its heads' under `cls.`.
    prefix = "" if pretrainer is None else "bert."
    pairs = [(prefix + name, variable, transpose) for name, variable, transpose in _weight_map(encoder, config.num_layers)]
    if pretrainer is not None:
        pairs += _heads_weight_map(pretrainer)
    try:
        tensors = {}
        for hf_name, variable, transpose in pairs:
            value = np.asarray(variable.numpy(), dtype="float32")
            tensors[hf_name] = np.ascontiguousarray(value.T if transpose else value)
        save_file(tensors, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
        hf_config = config_to_hf(config)
        if pretrainer is not None:
            hf_config["architectures"] = ["BertForPreTraining"]
        with open(os.path.join(staging, "config.json"), "w") as f:
            json.dump(hf_config, f, indent=2)
        with open(os.path.join(staging, "tokenizer_config.json"), "w") as f:
            json.dump({"do_lower_case": lowercase, "tokenizer_class": "BertTokenizer"}, f, indent=2)
        with open(os.path.join(staging, "vocab.txt"), "w", encoding="utf-8") as f:
            f.writelines(token + "\n" for token in vocabulary)
        follow_umask(staging)
        if os.path.exists(path):
            os.rmdir(path)
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def init_encoder(init, dtype=None, overrides=None):
    """An encoder from a checkpoint (folder or packaged name) or a shape preset.

    `overrides` as for `load_hf_checkpoint`. Returns `(config, encoder,
    vocabulary or None, lowercase)`; a preset gives a randomly initialised
    encoder and no vocabulary.
    """
    if init in PRESETS:
        config = with_overrides(PRESETS[init], overrides)
        return config, bert_encoder(config, dtype=dtype), None, True
    checkpoint = load_hf_checkpoint(init, dtype=dtype, overrides=overrides)
    warn_fresh(checkpoint, init, "fine-tuning")
    return checkpoint.config, checkpoint.encoder, checkpoint.vocabulary, checkpoint.lowercase


def read_init(init):
    """`(config, vocabulary or None, lowercase)` of what `init_encoder(init)`
    builds, read without its weights."""
    if init in PRESETS:
        return PRESETS[init], None, True
    return read_hf_folder(init)
