import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from kbert import bert_embedder
from kbert.checkpoints import load_hf_checkpoint, resolve_checkpoint, save_hf_checkpoint

REFERENCE = os.path.join(os.path.dirname(__file__), "data", "minilm_reference")
# Acceptance bound of the issue; PyTorch float32 itself is 3e-6 from float64.
HIDDEN_STATE_ATOL = 1e-4
EMBEDDING_MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def minilm():
    return load_hf_checkpoint("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(os.path.join(REFERENCE, "minilm_reference.npz")))


def reference_inputs(reference):
    return {
        "token_ids": reference["input_ids"].astype("int32"),
        "segment_ids": reference["token_type_ids"].astype("int32"),
        "padding_mask": reference["attention_mask"].astype("int32"),
    }


def max_abs_unpadded(encoder, reference):
    outputs = encoder.predict(reference_inputs(reference), verbose=0)
    real = reference["attention_mask"].astype(bool)
    hidden = np.abs(outputs["sequence_output"] - reference["last_hidden_state"])[real].max()
    pooled = np.abs(outputs["pooled_output"] - reference["pooler_output"]).max()
    return hidden, pooled


def test_minilm_matches_reference_hidden_states(minilm, reference):
    assert minilm.config.num_layers == 6 and minilm.config.hidden_size == 384
    assert minilm.lowercase and len(minilm.vocabulary) == 30522
    hidden, pooled = max_abs_unpadded(minilm.encoder, reference)
    assert hidden <= HIDDEN_STATE_ATOL, f"last_hidden_state max abs diff {hidden:.2e}"
    assert pooled <= HIDDEN_STATE_ATOL, f"pooler_output max abs diff {pooled:.2e}"


def test_minilm_sentence_embeddings_from_raw_text(minilm, reference):
    from kbert.text import BertPreprocessor, WordPieceTokenizer

    with open(os.path.join(REFERENCE, "sentences.json")) as f:
        sentences = json.load(f)
    tokenizer = WordPieceTokenizer(minilm.vocabulary, lowercase=True)
    # sentence-transformers truncates all-MiniLM-L6-v2 inputs at 256 tokens.
    inputs = BertPreprocessor(tokenizer, sequence_length=256)(sentences)
    embeddings = bert_embedder(minilm.encoder).predict(
        {k: np.asarray(v) for k, v in inputs.items()}, verbose=0
    )
    cosine = np.sum(embeddings * reference["sentence_embeddings"], axis=-1)
    assert cosine.min() >= EMBEDDING_MIN_COSINE, f"cosines {cosine}"


def test_dropout_overrides_keep_the_weights(minilm, reference):
    """`overrides` sets a fine-tuning dropout rate; the checkpoint's weights and inference stay."""
    import keras

    from kbert.checkpoints.huggingface import init_encoder

    checkpoint = load_hf_checkpoint("all-minilm-l6-v2", overrides={"attention_dropout": 0.0})
    assert checkpoint.config.attention_dropout == 0.0 and checkpoint.config.hidden_dropout == 0.1
    block = checkpoint.encoder.get_layer("transformer_layer_0")
    assert block.attention_dropout == 0.0 and block.attention.dropout == 0.0 and block.dropout == 0.1
    hidden, _ = max_abs_unpadded(checkpoint.encoder, reference)
    assert hidden <= HIDDEN_STATE_ATOL
    # Training with every dropout at 0 computes what inference does.
    quiet = load_hf_checkpoint("all-minilm-l6-v2", overrides={"attention_dropout": 0.0, "hidden_dropout": 0.0})
    inputs = {k: keras.ops.convert_to_tensor(v) for k, v in reference_inputs(reference).items()}
    trained = keras.ops.convert_to_numpy(quiet.encoder(inputs, training=True)["sequence_output"])
    real = reference["attention_mask"].astype(bool)
    assert np.abs(trained - reference["last_hidden_state"])[real].max() <= HIDDEN_STATE_ATOL
    with pytest.raises(ValueError, match="cannot override 'num_layers' of a checkpoint"):
        init_encoder("all-minilm-l6-v2", overrides={"num_layers": 2})
    with pytest.raises(ValueError, match=r"attention_dropout=1.0 must be in \[0, 1\)"):
        init_encoder("bert_tiny", overrides={"attention_dropout": 1.0})


def test_save_and_reload_round_trip(minilm, reference, tmp_path):
    out = tmp_path / "exported"
    save_hf_checkpoint(minilm.encoder, minilm.config, minilm.vocabulary, str(out))
    assert sorted(os.listdir(out)) == [
        "config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt",
    ]
    original = load_file(os.path.join(resolve_checkpoint("all-minilm-l6-v2"), "model.safetensors"))
    written = load_file(out / "model.safetensors")
    for name, value in written.items():
        np.testing.assert_array_equal(value, original[name], err_msg=name)
    reloaded = load_hf_checkpoint(str(out))
    assert reloaded.config == minilm.config
    hidden, _ = max_abs_unpadded(reloaded.encoder, reference)
    assert hidden <= HIDDEN_STATE_ATOL


def copy_checkpoint(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(resolve_checkpoint("all-minilm-l6-v2"), folder)
    return folder


def test_unknown_architecture(tmp_path):
    folder = copy_checkpoint(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="roberta", architectures=["RobertaModel"])
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="model_type='roberta'"):
        load_hf_checkpoint(str(folder))


def test_missing_tensor_is_named(tmp_path):
    folder = copy_checkpoint(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["encoder.layer.3.attention.self.key.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match="'encoder.layer.3.attention.self.key.weight' is missing"):
        load_hf_checkpoint(str(folder))


def test_shape_mismatch_is_named(tmp_path):
    folder = copy_checkpoint(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["pooler.dense.bias"] = np.zeros((10,), "float32")
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"'pooler.dense.bias' has shape \(10,\); the model expects \(384,\)"):
        load_hf_checkpoint(str(folder))


def test_missing_files_and_names(tmp_path):
    with pytest.raises(ValueError, match="neither a folder nor one of"):
        load_hf_checkpoint(str(tmp_path / "nope"))
    folder = copy_checkpoint(tmp_path)
    os.remove(folder / "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors not found"):
        load_hf_checkpoint(str(folder))


def test_save_refuses_non_empty_folder(minilm, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not empty"):
        save_hf_checkpoint(minilm.encoder, minilm.config, minilm.vocabulary, str(tmp_path / "taken"))
    assert os.listdir(tmp_path / "taken") == ["file"]
