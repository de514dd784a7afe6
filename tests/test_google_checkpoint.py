"""google-research/bert TF1 checkpoints: MiniLM written under Google's names, read back.

The checkpoint is written by TensorFlow's own TF1 `Saver` from the Hugging Face
tensors, renamed here by plain string rules, so the test does not reuse the
loader's weight map; the outputs are compared with the PyTorch reference.
"""

import json
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file

from kbert import BertConfig
from kbert.checkpoints import load_pretrained, resolve_checkpoint
from kbert.checkpoints.google import (
    encoder_weight_map,
    heads_weight_map,
    load_google_checkpoint,
)
from kbert.pretraining import bert_pretrainer

REFERENCE = os.path.join(
    os.path.dirname(__file__), "data", "minilm_reference", "minilm_reference.npz"
)
# tests/data/minilm_reference/README.md: a correct float32 forward pass lands
# within 1e-5..1e-4 of PyTorch's.
HIDDEN_TOLERANCE = 1e-4


def google_name(hf_name):
    """Hugging Face BERT tensor name -> (google-research/bert name, transpose)."""
    name = re.sub(r"^encoder\.layer\.(\d+)\.", r"encoder.layer_\1.", hf_name)
    name = "bert/" + name.replace(".", "/")
    if "LayerNorm" in name:
        return name.replace("/weight", "/gamma").replace("/bias", "/beta"), False
    if name.startswith("bert/embeddings/"):
        return name[: -len("/weight")], False
    # torch.nn.Linear stores (out, in); TF1 dense kernels are (in, out).
    if name.endswith("/weight"):
        return name[: -len("/weight")] + "/kernel", True
    return name, False


def write_tf1_checkpoint(prefix, tensors):
    """Saves `{name: array}` with tf.compat.v1's Saver, as google-research/bert did."""
    graph = tf.Graph()
    with graph.as_default():
        variables = [
            tf.compat.v1.Variable(value, name=name) for name, value in sorted(tensors.items())
        ]
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, prefix, write_meta_graph=False)


def write_folder(folder, config_values, vocabulary, tensors):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "bert_config.json"), "w") as f:
        json.dump(config_values, f)
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.writelines(token + "\n" for token in vocabulary)
    write_tf1_checkpoint(os.path.join(folder, "bert_model.ckpt"), tensors)


@pytest.fixture(scope="module")
def minilm_google(tmp_path_factory):
    """A Google-format folder of all-MiniLM-L6-v2 plus random pretraining heads."""
    source = resolve_checkpoint("all-minilm-l6-v2")
    with open(os.path.join(source, "config.json")) as f:
        hf_config = json.load(f)
    with open(os.path.join(source, "vocab.txt"), encoding="utf-8") as f:
        vocabulary = [line.rstrip("\n") for line in f]
    tensors = {}
    for hf_name, value in load_file(os.path.join(source, "model.safetensors")).items():
        if hf_name.endswith("position_ids"):
            continue
        name, transpose = google_name(hf_name)
        tensors[name] = np.ascontiguousarray(value.T if transpose else value)
    hidden, vocab_size = hf_config["hidden_size"], hf_config["vocab_size"]
    rng = np.random.default_rng(0)
    heads = {
        "cls/predictions/transform/dense/kernel": rng.normal(0, 0.05, (hidden, hidden)),
        "cls/predictions/transform/dense/bias": rng.normal(0, 0.05, (hidden,)),
        "cls/predictions/transform/LayerNorm/gamma": 1 + rng.normal(0, 0.05, (hidden,)),
        "cls/predictions/transform/LayerNorm/beta": rng.normal(0, 0.05, (hidden,)),
        "cls/predictions/output_bias": rng.normal(0, 0.05, (vocab_size,)),
        "cls/seq_relationship/output_weights": rng.normal(0, 0.05, (2, hidden)),
        "cls/seq_relationship/output_bias": rng.normal(0, 0.05, (2,)),
    }
    tensors.update({name: value.astype("float32") for name, value in heads.items()})
    # Keys of google-research/bert's bert_config.json (no model_type, no eps).
    config_values = {
        key: hf_config[key]
        for key in (
            "attention_probs_dropout_prob",
            "hidden_act",
            "hidden_dropout_prob",
            "hidden_size",
            "initializer_range",
            "intermediate_size",
            "max_position_embeddings",
            "num_attention_heads",
            "num_hidden_layers",
            "type_vocab_size",
            "vocab_size",
        )
    }
    folder = str(tmp_path_factory.mktemp("google") / "uncased_minilm")
    write_folder(folder, config_values, vocabulary, tensors)
    return folder, tensors


def test_checkpoint_has_google_variable_names(minilm_google):
    folder, tensors = minilm_google
    listed = dict(tf.train.list_variables(os.path.join(folder, "bert_model.ckpt")))
    assert listed == {name: list(value.shape) for name, value in tensors.items()}
    assert listed["bert/encoder/layer_5/attention/self/query/kernel"] == [384, 384]
    assert listed["cls/seq_relationship/output_weights"] == [2, 384]


def gelu(x):
    """The exact (erf) GELU of google-research/bert's released checkpoints."""
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def layer_norm(x, gamma, beta, epsilon=1e-12):
    mean = x.mean(-1, keepdims=True)
    variance = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def test_minilm_parity_through_google_checkpoint(minilm_google):
    folder, tensors = minilm_google
    checkpoint = load_pretrained(folder, heads=True)  # load_google_checkpoint, heads and all
    assert checkpoint.lowercase is True
    assert checkpoint.config.num_layers == 6 and checkpoint.config.activation == "gelu"
    assert checkpoint.pretrainer.encoder is checkpoint.encoder
    reference = np.load(REFERENCE)
    mask = reference["attention_mask"].astype("int32")
    inputs = {
        "token_ids": reference["input_ids"].astype("int32"),
        "segment_ids": reference["token_type_ids"].astype("int32"),
        "padding_mask": mask,
    }
    outputs = checkpoint.encoder.predict(inputs, verbose=0)
    real = mask.astype(bool)
    hidden_diff = np.abs(outputs["sequence_output"] - reference["last_hidden_state"])[real].max()
    assert hidden_diff <= HIDDEN_TOLERANCE
    pooled_diff = np.abs(outputs["pooled_output"] - reference["pooler_output"]).max()
    assert pooled_diff <= HIDDEN_TOLERANCE

    # The heads, against google-research/bert's formulas on the reference states.
    positions = np.array([[1, 2, 3], [1, 1, 0]] + [[1, 2, 0]] * 6, dtype="int32")
    predicted = checkpoint.pretrainer.predict(
        {**inputs, "masked_lm_positions": positions}, verbose=0
    )
    gathered = np.take_along_axis(reference["last_hidden_state"], positions[:, :, None], axis=1)
    x = gelu(
        gathered @ tensors["cls/predictions/transform/dense/kernel"]
        + tensors["cls/predictions/transform/dense/bias"]
    )
    x = layer_norm(
        x,
        tensors["cls/predictions/transform/LayerNorm/gamma"],
        tensors["cls/predictions/transform/LayerNorm/beta"],
    )
    mlm_logits = (
        x @ tensors["bert/embeddings/word_embeddings"].T + tensors["cls/predictions/output_bias"]
    )
    assert predicted["masked_lm"].shape == (8, 3, 30522)
    assert predicted["masked_lm"].dtype == np.float32
    # Logits are sums over 384 products, so allow ~10x the hidden-state tolerance.
    assert np.abs(predicted["masked_lm"] - mlm_logits).max() <= 1e-3
    nsp_logits = (
        reference["pooler_output"] @ tensors["cls/seq_relationship/output_weights"].T
        + tensors["cls/seq_relationship/output_bias"]
    )
    assert np.abs(predicted["next_sentence"] - nsp_logits).max() <= HIDDEN_TOLERANCE


TINY = BertConfig(
    vocab_size=30,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    intermediate_size=32,
    max_position_embeddings=32,
)
TINY_GOOGLE_CONFIG = {
    "vocab_size": 30,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 32,
    "hidden_act": "gelu",
}
TINY_VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"W{i}" for i in range(25)]


def tiny_tensors(heads=True):
    model = bert_pretrainer(TINY)
    pairs = encoder_weight_map(model.encoder, TINY.num_layers)
    if heads:
        pairs += heads_weight_map(model)
    return {
        name: np.asarray(variable.numpy().T if transpose else variable.numpy())
        for name, variable, transpose in pairs
    }


def test_missing_tensor_is_named(tmp_path):
    tensors = tiny_tensors()
    del tensors["bert/encoder/layer_1/output/dense/bias"]
    write_folder(str(tmp_path), TINY_GOOGLE_CONFIG, TINY_VOCABULARY, tensors)
    with pytest.raises(ValueError, match="bert/encoder/layer_1/output/dense/bias"):
        load_google_checkpoint(str(tmp_path))


def test_shape_mismatch_is_named(tmp_path):
    tensors = tiny_tensors()
    tensors["cls/seq_relationship/output_weights"] = np.zeros((16, 2), "float32")
    write_folder(str(tmp_path), TINY_GOOGLE_CONFIG, TINY_VOCABULARY, tensors)
    with pytest.raises(ValueError, match="cls/seq_relationship/output_weights"):
        load_google_checkpoint(str(tmp_path))


def test_encoder_only_checkpoint_and_cased_vocabulary(tmp_path):
    tensors = tiny_tensors(heads=False)
    write_folder(str(tmp_path), TINY_GOOGLE_CONFIG, TINY_VOCABULARY, tensors)
    with pytest.raises(ValueError, match="cls/predictions"):
        load_google_checkpoint(str(tmp_path))
    checkpoint = load_google_checkpoint(str(tmp_path), heads=False)
    assert checkpoint.pretrainer is None
    assert checkpoint.lowercase is False  # "W0"... are upper case
    embeddings = checkpoint.encoder.get_layer("token_embedding").embeddings.numpy()
    np.testing.assert_array_equal(embeddings, tensors["bert/embeddings/word_embeddings"])


def test_vocabulary_size_mismatch(tmp_path):
    write_folder(str(tmp_path), TINY_GOOGLE_CONFIG, TINY_VOCABULARY[:-1], tiny_tensors())
    with pytest.raises(ValueError, match="vocab_size=30"):
        load_google_checkpoint(str(tmp_path))

