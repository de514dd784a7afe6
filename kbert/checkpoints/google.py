"""TF1 BERT checkpoints as google-research/bert published them.

A folder with `bert_config.json`, `vocab.txt` and a checkpoint `bert_model.ckpt`
(`.index` + `.data-*`) whose variables are named `bert/embeddings/...`,
`bert/encoder/layer_N/...`, `bert/pooler/dense/...` and, for the pretraining
heads, `cls/predictions/...` and `cls/seq_relationship/...`. The tensors are
read with `tf.train.load_checkpoint`; TensorFlow is needed here, not in the model.
"""

import collections
import json
import os

from kbert.config import BertConfig, read_checkpoint_vocabulary
from kbert.models.encoder import bert_encoder

CHECKPOINT_PREFIX = "bert_model.ckpt"

# google-research/bert's bert_config.json names the activation "gelu". The
# checkpoints were trained with the exact erf form (modeling.py later switched
# to the tanh approximation, which differs by up to ~1e-3); like Hugging Face,
# read "gelu" as exact.
_GOOGLE_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_approximate",
    "gelu_approximate": "gelu_approximate",
    "relu": "relu",
}

GoogleCheckpoint = collections.namedtuple(
    "GoogleCheckpoint", ["config", "vocabulary", "lowercase", "encoder", "pretrainer"]
)


def config_from_google(values):
    """A `BertConfig` from the dict of google-research/bert's `bert_config.json`."""
    required = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
    )
    missing = [key for key in required if key not in values]
    if missing:
        raise ValueError(f"bert_config.json lacks {missing}")
    activation = values.get("hidden_act", "gelu")
    if activation not in _GOOGLE_ACTIVATIONS:
        raise ValueError(
            f"hidden_act={activation!r} is not one of {sorted(_GOOGLE_ACTIVATIONS)}"
        )
    return BertConfig(
        vocab_size=values["vocab_size"],
        hidden_size=values["hidden_size"],
        num_layers=values["num_hidden_layers"],
        num_heads=values["num_attention_heads"],
        intermediate_size=values["intermediate_size"],
        max_position_embeddings=values.get("max_position_embeddings", 512),
        type_vocab_size=values.get("type_vocab_size", 2),
        hidden_dropout=values.get("hidden_dropout_prob", 0.1),
        attention_dropout=values.get("attention_probs_dropout_prob", 0.1),
        activation=_GOOGLE_ACTIVATIONS[activation],
        # tf.contrib.layers.layer_norm, which google-research/bert uses, has 1e-12.
        layer_norm_epsilon=values.get("layer_norm_eps", 1e-12),
        initializer_range=values.get("initializer_range", 0.02),
    )


def encoder_weight_map(encoder, num_layers):
    """(Google variable name, Keras variable, transpose) for every encoder weight."""

    def dense(name, layer):
        return [(f"{name}/kernel", layer.kernel, False), (f"{name}/bias", layer.bias, False)]

    def layer_norm(name, layer):
        return [(f"{name}/gamma", layer.gamma, False), (f"{name}/beta", layer.beta, False)]

    get = encoder.get_layer
    pairs = [
        ("bert/embeddings/word_embeddings", get("token_embedding").embeddings, False),
        ("bert/embeddings/position_embeddings", get("position_embedding").embeddings, False),
        ("bert/embeddings/token_type_embeddings", get("segment_embedding").embeddings, False),
        *layer_norm("bert/embeddings/LayerNorm", get("embeddings_layer_norm")),
    ]
    for index in range(num_layers):
        block = get(f"transformer_layer_{index}")
        prefix = f"bert/encoder/layer_{index}"
        attention = block.attention
        pairs += [
            *dense(f"{prefix}/attention/self/query", attention.query_dense),
            *dense(f"{prefix}/attention/self/key", attention.key_dense),
            *dense(f"{prefix}/attention/self/value", attention.value_dense),
            *dense(f"{prefix}/attention/output/dense", attention.output_dense),
            *layer_norm(f"{prefix}/attention/output/LayerNorm", block.attention_layer_norm),
            *dense(f"{prefix}/intermediate/dense", block.intermediate_dense),
            *dense(f"{prefix}/output/dense", block.output_dense),
            *layer_norm(f"{prefix}/output/LayerNorm", block.output_layer_norm),
        ]
    pairs += dense("bert/pooler/dense", get("pooler"))
    return pairs


def heads_weight_map(pretrainer):
    """(Google variable name, Keras variable, transpose) for the pretraining heads.

    The masked-LM projection is the token embedding itself (tied), so only its
    bias has a variable of its own. `cls/seq_relationship/output_weights` is
    stored `(2, hidden)`, the transpose of a Keras kernel.
    """
    masked_lm = pretrainer.get_layer("masked_lm")
    next_sentence = pretrainer.get_layer("next_sentence")
    return [
        ("cls/predictions/transform/dense/kernel", masked_lm.transform_dense.kernel, False),
        ("cls/predictions/transform/dense/bias", masked_lm.transform_dense.bias, False),
        ("cls/predictions/transform/LayerNorm/gamma", masked_lm.transform_layer_norm.gamma, False),
        ("cls/predictions/transform/LayerNorm/beta", masked_lm.transform_layer_norm.beta, False),
        ("cls/predictions/output_bias", masked_lm.output_bias, False),
        ("cls/seq_relationship/output_weights", next_sentence.kernel, True),
        ("cls/seq_relationship/output_bias", next_sentence.bias, False),
    ]


def find_checkpoint(folder):
    """The checkpoint prefix in `folder`: `bert_model.ckpt`, else the only/latest one."""
    import tensorflow as tf

    prefix = os.path.join(folder, CHECKPOINT_PREFIX)
    if os.path.isfile(prefix + ".index"):
        return prefix
    latest = tf.train.latest_checkpoint(folder)
    if latest:
        return latest
    indexes = sorted(name for name in os.listdir(folder) if name.endswith(".index"))
    if len(indexes) == 1:
        return os.path.join(folder, indexes[0][: -len(".index")])
    raise ValueError(
        f"no TensorFlow checkpoint in {folder}: expected {CHECKPOINT_PREFIX}.index "
        f"(found {indexes or 'no .index files'})"
    )


def load_google_weights(pairs, checkpoint_prefix):
    """Assigns checkpoint tensors to Keras variables; `pairs` from the weight maps."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(checkpoint_prefix)
    shapes = reader.get_variable_to_shape_map()
    for name, variable, transpose in pairs:
        if name not in shapes:
            raise ValueError(f"tensor {name!r} is missing from checkpoint {checkpoint_prefix}")
        value = reader.get_tensor(name)
        if transpose:
            value = value.T
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"tensor {name!r} has shape {tuple(value.shape)}"
                f"{' (transposed)' if transpose else ''}; the model expects "
                f"{tuple(variable.shape)}"
            )
        variable.assign(value.astype(variable.dtype))


def infer_lowercase(vocabulary):
    """Uncased vocabularies hold no upper-case letters outside `[SPECIAL]` tokens."""
    return not any(
        token != token.lower()
        for token in vocabulary
        if not (token.startswith("[") and token.endswith("]"))
    )


def load_google_checkpoint(folder, heads=True, lowercase=None, dtype=None):
    """Loads a google-research/bert checkpoint folder into kbert models.

    Args:
        folder: str. Holds `bert_config.json`, `vocab.txt` and the checkpoint
            (`bert_model.ckpt.index`/`.data-*`; another single prefix also works).
        heads: bool. Also load `cls/predictions` and `cls/seq_relationship`
            into a `bert_pretrainer` (to continue pretraining). With False the
            checkpoint need not have them and `pretrainer` is None.
        lowercase: bool or None. Whether the vocabulary is uncased; None infers
            it from the vocabulary (no upper-case tokens → uncased).
        dtype: dtype policy of the models.

    Returns:
        `GoogleCheckpoint(config, vocabulary, lowercase, encoder, pretrainer)`;
        `pretrainer.encoder is encoder`. Optimizer slots and `global_step` in
        the checkpoint are ignored.

    Raises:
        ValueError: a file is missing, or a tensor is missing or has the wrong
            shape (the message names the tensor).

    Example:
    >>> checkpoint = load_google_checkpoint("uncased_L-4_H-256_A-4")  # doctest: +SKIP
    >>> checkpoint.encoder.predict(...)  # doctest: +SKIP
    """
    config_path = os.path.join(folder, "bert_config.json")
    vocab_path = os.path.join(folder, "vocab.txt")
    for path in (config_path, vocab_path):
        if not os.path.isfile(path):
            raise ValueError(f"{path} not found; expected a google-research/bert checkpoint folder")
    try:
        with open(config_path) as f:
            config = config_from_google(json.load(f))
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path} is not valid JSON: {error}") from None
    vocabulary = read_checkpoint_vocabulary(vocab_path, config, "bert_config.json")
    if lowercase is None:
        lowercase = infer_lowercase(vocabulary)
    prefix = find_checkpoint(folder)

    if heads:
        from kbert.models.pretrainer import bert_pretrainer

        # Built from the config so the heads get its activation and epsilon.
        pretrainer = bert_pretrainer(config, dtype=dtype)
        encoder = pretrainer.encoder
        pairs = encoder_weight_map(encoder, config.num_layers) + heads_weight_map(pretrainer)
    else:
        pretrainer = None
        encoder = bert_encoder(config, dtype=dtype)
        pairs = encoder_weight_map(encoder, config.num_layers)
    load_google_weights(pairs, prefix)
    return GoogleCheckpoint(config, vocabulary, lowercase, encoder, pretrainer)
