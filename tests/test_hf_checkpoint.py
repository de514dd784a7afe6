import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from kbert import bert_embedder
from kbert.checkpoints import load_hf_checkpoint, resolve_checkpoint, save_hf_checkpoint
from kbert.checkpoints.huggingface import init_encoder

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


# Writes random BertForPreTraining and BertForMaskedLM folders with transformers, and
# their logits on one batch. In a process of its own: PyTorch and TensorFlow in one
# process crash here.
TRANSFORMERS_HEADS = """
import sys
import numpy as np, torch, transformers

root = sys.argv[1]
torch.manual_seed(0)
config = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=32)
batch = dict(np.load(root + "/features.npz"))
for architecture in (transformers.BertForPreTraining, transformers.BertForMaskedLM):
    folder = f"{root}/{architecture.__name__}"
    model = architecture(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    with open(folder + "/vocab.txt", "w") as f:
        f.write("".join(f"[unused{i}]\\n" for i in range(60)))
    with torch.no_grad():
        outputs = model(**{name: torch.tensor(value, dtype=torch.long) for name, value in batch.items()})
    if architecture is transformers.BertForPreTraining:
        logits = {"masked_lm": outputs.prediction_logits.numpy(),
                  "next_sentence": outputs.seq_relationship_logits.numpy()}
    else:
        logits = {"masked_lm": outputs.logits.numpy()}
    np.savez(folder + "/logits.npz", **logits)
"""


@pytest.fixture(scope="module")
def hf_heads(tmp_path_factory):
    """Folders transformers wrote, their logits (an implementation of the heads
    independent of kbert's) and the features they were computed on (transformers and
    PyTorch: the dev extra's; a missing one fails the subprocess)."""
    root = tmp_path_factory.mktemp("hf_heads")
    rng = np.random.default_rng(0)
    token_ids = rng.integers(5, 60, (3, 12))
    padding_mask = np.ones_like(token_ids)
    padding_mask[1, 9:] = 0
    batch = {"input_ids": token_ids, "token_type_ids": np.repeat([[0] * 7 + [1] * 5], 3, axis=0),
             "attention_mask": padding_mask}
    np.savez(root / "features.npz", **batch)
    run = subprocess.run([sys.executable, "-c", TRANSFORMERS_HEADS, str(root)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    features = {"token_ids": batch["input_ids"], "segment_ids": batch["token_type_ids"],
                "padding_mask": batch["attention_mask"]}
    return root, {name: value.astype("int32") for name, value in features.items()}


@pytest.mark.parametrize("architecture", ["BertForPreTraining", "BertForMaskedLM"])
def test_pretraining_heads_load_as_transformers_computes_them(hf_heads, architecture, capsys):
    """`load_pretrained(heads=True)` hands over the masked-LM head (and next sentence,
    where the file has it): masked-word logits as transformers gives them, so a
    checkpoint's fill-mask works; the highest-scoring words are the same."""
    from kbert.checkpoints import load_pretrained

    root, features = hf_heads
    folder = str(root / architecture)
    expected = dict(np.load(os.path.join(folder, "logits.npz")))
    checkpoint = load_pretrained(folder, heads=True)
    assert checkpoint.pretrainer.encoder is checkpoint.encoder
    positions = np.tile(np.arange(9, dtype="int32"), (3, 1))  # the real tokens of every row
    outputs = checkpoint.pretrainer.predict({**features, "masked_lm_positions": positions}, verbose=0)
    reference = expected["masked_lm"][:, :9]
    assert np.abs(outputs["masked_lm"] - reference).max() <= HIDDEN_STATE_ATOL
    np.testing.assert_array_equal(outputs["masked_lm"].argmax(-1), reference.argmax(-1))
    if "next_sentence" in expected:
        assert np.abs(outputs["next_sentence"] - expected["next_sentence"]).max() <= HIDDEN_STATE_ATOL
        assert load_pretrained(folder).pretrainer is None
    else:  # what run_mlm.py saves: no pooler, which starts anew for fine-tuning, as in transformers
        assert checkpoint.fresh == ("cls.seq_relationship", "pooler.dense")
        assert "initialised anew" not in capsys.readouterr().err  # masked words read neither
        _, encoder, _, _ = init_encoder(folder)
        assert "has no pooler.dense; initialised anew, as Hugging Face does (fine-tuning trains it)" in (
            capsys.readouterr().err
        )
        mine, theirs = (model.predict(features, verbose=0)["sequence_output"] for model in (encoder, checkpoint.encoder))
        assert np.abs(mine - theirs).max() <= 1e-6


# Loads a folder kbert wrote as transformers' BertForPreTraining and writes its logits.
TRANSFORMERS_LOAD = """
import sys
import numpy as np, torch, transformers

folder, features = sys.argv[1], dict(np.load(sys.argv[2]))
model, info = transformers.BertForPreTraining.from_pretrained(folder, output_loading_info=True)
assert not info["missing_keys"] and not info["unexpected_keys"], info
with torch.no_grad():
    outputs = model.eval()(**{name: torch.tensor(value, dtype=torch.long) for name, value in features.items()})
np.savez(folder + "/logits.npz", masked_lm=outputs.prediction_logits.numpy(),
         next_sentence=outputs.seq_relationship_logits.numpy())
"""


def test_a_pretrainer_saves_as_bert_for_pretraining(hf_heads, tmp_path):
    """`save_hf_checkpoint(pretrainer=...)` (what `kbert pretrain` writes) is a
    BertForPreTraining folder: transformers loads every tensor and gives the logits
    of the checkpoint it came from; kbert reads the heads back."""
    from kbert.checkpoints import load_pretrained
    from kbert.checkpoints.huggingface import has_masked_lm

    root, _ = hf_heads
    source = load_pretrained(str(root / "BertForPreTraining"), heads=True)
    folder = tmp_path / "saved"
    save_hf_checkpoint(source.encoder, source.config, source.vocabulary, str(folder), pretrainer=source.pretrainer)
    assert has_masked_lm(str(folder)) and not has_masked_lm("all-minilm-l6-v2")
    run = subprocess.run([sys.executable, "-c", TRANSFORMERS_LOAD, str(folder), str(root / "features.npz")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    expected = dict(np.load(root / "BertForPreTraining" / "logits.npz"))
    for name, logits in np.load(folder / "logits.npz").items():
        assert np.abs(logits - expected[name]).max() <= HIDDEN_STATE_ATOL, name


def test_heads_asked_of_an_encoder_are_named(minilm, tmp_path):
    from kbert.checkpoints import load_pretrained

    with pytest.raises(ValueError, match="'cls.predictions.transform.dense.weight' is missing .*BertForMaskedLM"):
        load_pretrained("all-minilm-l6-v2", heads=True)


def test_masked_words_head_fills_in_every_position(hf_heads, tmp_path):
    """`MaskedWordsHead.from_pretrainer`: a checkpoint's masked LM as a task head, one layer
    called on the encoder's outputs, gives transformers' logits at every real token, and
    saves and loads on its own (the copy of the tied embeddings included)."""
    import keras

    from kbert.checkpoints import load_pretrained
    from kbert.models.encoder import encoder_inputs
    from kbert.models.heads import MaskedWordsHead

    root, features = hf_heads
    folder = str(root / "BertForMaskedLM")
    checkpoint = load_pretrained(folder, heads=True)
    inputs = encoder_inputs()
    head = MaskedWordsHead.from_pretrainer(checkpoint.pretrainer)
    model = keras.Model(inputs, head(checkpoint.encoder(inputs), inputs))
    logits = model.predict(features, verbose=0)
    expected = np.load(os.path.join(folder, "logits.npz"))["masked_lm"]
    real = features["padding_mask"].astype(bool)
    assert np.abs(logits - expected)[real].max() <= HIDDEN_STATE_ATOL
    model.save(tmp_path / "fill.keras")
    again = keras.saving.load_model(tmp_path / "fill.keras").predict(features, verbose=0)
    assert np.abs(again - logits).max() <= 1e-6
    with pytest.raises(ValueError, match="has no masked_lm layer; expected a bert_pretrainer"):
        MaskedWordsHead.from_pretrainer(checkpoint.encoder)
