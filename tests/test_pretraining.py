"""The pretraining model, its losses, and its optimizer, on tiny configurations."""

import logging
import math
import os
import re

import keras
import numpy as np
import pytest
from absl import logging as absl_logging

from kbert import BertConfig, bert_encoder
from kbert.checkpoints import load_hf_checkpoint
from kbert.pretraining import (
    BertPretrainer,
    WarmupPolynomialDecay,
    bert_pretrainer,
    make_optimizer,
    pretrain,
    write_pretraining_data,
)
from kbert.pretraining.train import _WindowProgbar

CONFIG = BertConfig(
    vocab_size=40,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
)


def random_batch(batch=4, length=12, predictions=3, seed=0):
    rng = np.random.default_rng(seed)
    positions = np.sort(rng.choice(np.arange(1, length - 1), (batch, predictions)), axis=1)
    features = {
        "token_ids": rng.integers(5, CONFIG.vocab_size, (batch, length)).astype("int32"),
        "segment_ids": np.zeros((batch, length), "int32"),
        "padding_mask": np.ones((batch, length), "int32"),
        "masked_lm_positions": positions.astype("int32"),
    }
    labels = {
        "masked_lm": rng.integers(5, CONFIG.vocab_size, (batch, predictions)).astype("int32"),
        "next_sentence": rng.integers(0, 2, (batch,)).astype("int32"),
    }
    weights = {
        "masked_lm": np.ones((batch, predictions), "float32"),
        "next_sentence": np.ones((batch,), "float32"),
    }
    return features, labels, weights


def test_outputs_names_and_tied_projection():
    model = bert_pretrainer(CONFIG)
    features, _, _ = random_batch()
    outputs = model(features)
    assert tuple(outputs["masked_lm"].shape) == (4, 3, CONFIG.vocab_size)
    assert tuple(outputs["next_sentence"].shape) == (4, 2)
    assert all(keras.backend.standardize_dtype(o.dtype) == "float32" for o in outputs.values())
    assert sorted(layer.name for layer in model.layers) == sorted(
        [
            "token_ids",
            "segment_ids",
            "padding_mask",
            "masked_lm_positions",
            "bert_encoder",
            "masked_lm",
            "next_sentence",
        ]
    )
    head = model.get_layer("masked_lm")
    embedding = model.encoder.get_layer("token_embedding")
    assert head.token_embedding is embedding
    # The projection is the embedding matrix, counted once among the weights.
    paths = [w.path for w in model.trainable_weights]
    assert len(paths) == len(set(paths))
    assert sum(w.path.endswith("embeddings") and w.shape == (40, 32) for w in model.weights) == 1
    assert sorted(w.path for w in head.weights if w is not embedding.embeddings) == [
        "masked_lm/output_bias",
        "masked_lm/transform_dense/bias",
        "masked_lm/transform_dense/kernel",
        "masked_lm/transform_layer_norm/beta",
        "masked_lm/transform_layer_norm/gamma",
    ]


def test_head_computes_google_formula():
    model = bert_pretrainer(CONFIG)
    features, _, _ = random_batch()
    encoder_outputs = model.encoder(
        {k: features[k] for k in ("token_ids", "segment_ids", "padding_mask")}
    )
    head = model.get_layer("masked_lm")
    for variable in (head.output_bias, head.transform_layer_norm.beta):
        variable.assign(np.random.default_rng(1).normal(size=variable.shape))
    hidden = np.take_along_axis(
        np.asarray(encoder_outputs["sequence_output"]),
        features["masked_lm_positions"][:, :, None],
        axis=1,
    )
    x = hidden @ head.transform_dense.kernel.numpy() + head.transform_dense.bias.numpy()
    x = 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
    x = x * head.transform_layer_norm.gamma.numpy() + head.transform_layer_norm.beta.numpy()
    expected = x @ model.encoder.get_layer("token_embedding").embeddings.numpy().T
    expected += head.output_bias.numpy()
    np.testing.assert_allclose(model(features)["masked_lm"], expected, atol=1e-4)


def test_loss_ignores_padded_prediction_slots():
    model = bert_pretrainer(CONFIG)
    model.compile(optimizer="adam")
    features, labels, weights = random_batch(predictions=4)
    weights["masked_lm"][:, 2:] = 0.0
    loss = model.evaluate(features, labels, sample_weight=weights, verbose=0, return_dict=True)
    # Other labels in the padded slots change nothing.
    labels_changed = {**labels, "masked_lm": labels["masked_lm"].copy()}
    labels_changed["masked_lm"][:, 2:] = 0
    changed = model.evaluate(
        features, labels_changed, sample_weight=weights, verbose=0, return_dict=True
    )
    for name in ("loss", "masked_lm_loss", "masked_lm_accuracy"):
        assert abs(loss[name] - changed[name]) < 1e-6, name
    # And the masked-LM loss is the mean over the real slots only.
    logits = np.asarray(model.predict(features, verbose=0)["masked_lm"])[:, :2]
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -np.take_along_axis(log_probs, labels["masked_lm"][:, :2, None], -1).mean()
    assert abs(loss["masked_lm_loss"] - expected) < 1e-4


def test_save_and_load_keeps_outputs_and_tie(tmp_path):
    model = bert_pretrainer(CONFIG)
    features, _, _ = random_batch()
    path = os.path.join(tmp_path, "pretrainer.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, BertPretrainer)
    for name, value in model(features).items():
        np.testing.assert_allclose(loaded(features)[name], value, atol=1e-6)
    assert loaded.get_layer("masked_lm").token_embedding is loaded.encoder.get_layer(
        "token_embedding"
    )


def test_pretrainer_from_an_existing_encoder():
    encoder = bert_encoder(CONFIG.replace(activation="relu", layer_norm_epsilon=1e-6))
    model = bert_pretrainer(encoder)
    assert model.encoder is encoder
    assert model.get_layer("masked_lm").activation == "relu"
    assert model.get_layer("masked_lm").layer_norm_epsilon == 1e-6
    with pytest.raises(ValueError, match="BertConfig or an encoder"):
        bert_pretrainer("bert_tiny")


def test_mixed_precision_logits_are_float32():
    model = bert_pretrainer(CONFIG, dtype="mixed_bfloat16")
    outputs = model(random_batch()[0])
    assert all(keras.backend.standardize_dtype(o.dtype) == "float32" for o in outputs.values())


# A tiny corpus of repeated sentences: the model can learn it in a few steps.
SENTENCES = [
    "the cat sat on the mat",
    "a dog ran to the park",
    "the bird sang in the tree",
    "my fish swam in the bowl",
]
TINY_VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(
    {word for sentence in SENTENCES for word in sentence.split()}
)


def test_window_headings_follow_keras_logging_setting(capsys, caplog):
    progbar = _WindowProgbar(log_every=10, num_train_steps=35)
    progbar.set_params({"verbose": 2, "epochs": 4, "steps": 10})
    progbar.on_epoch_begin(3)
    assert capsys.readouterr().out == "steps 31-35 of 35\n"
    # With interactive logging off, Keras sends its progress lines to absl logging: so do the headings.
    # The absl logger is read directly, at INFO: earlier tests in the process may have changed its level.
    absl_logger = absl_logging.get_absl_logger()
    absl_logger.addHandler(caplog.handler)
    keras.config.disable_interactive_logging()
    try:
        with caplog.at_level("INFO", logger=absl_logger.name):
            progbar.on_epoch_begin(1)
    finally:
        keras.config.enable_interactive_logging()
        absl_logger.removeHandler(caplog.handler)
    assert capsys.readouterr().out == ""
    assert "steps 11-20 of 35" in caplog.messages, (absl_logger.disabled, logging.root.manager.disable)


def test_pretrain_fits_with_jit_compile_and_saves_an_encoder(tmp_path, capsys):
    corpus = os.path.join(tmp_path, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("\n\n".join("\n".join(SENTENCES[i:] + SENTENCES[:i]) for i in range(4)) + "\n")
    records = os.path.join(tmp_path, "records")
    write_pretraining_data(
        corpus,
        TINY_VOCABULARY,
        records,
        max_seq_length=16,
        max_predictions_per_seq=3,
        dupe_factor=20,
        num_shards=1,
        progress=False,
    )
    config = CONFIG.replace(hidden_dropout=0.0, attention_dropout=0.0)
    out = os.path.join(tmp_path, "run")
    # model.fit with jit_compile=True, in windows of 10 steps (+ 5 left over).
    history = pretrain(
        records,
        out,
        TINY_VOCABULARY,
        init=config,
        eval_data=records,
        batch_size=8,
        num_train_steps=35,
        num_warmup_steps=2,
        learning_rate=5e-2,
        log_every=10,
        eval_steps=2,
        verbose=2,
    )
    # Each window's progress line is headed by its steps, not by a Keras epoch.
    headings = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("steps ", "Epoch "))]
    assert headings == ["steps 1-10 of 35", "steps 11-20 of 35", "steps 21-30 of 35", "steps 31-35 of 35"]
    windows = history["windows"]
    assert [w["step"] for w in windows] == [10, 20, 30, 35]
    assert windows[-1]["loss"] < 0.9 * windows[0]["loss"]
    assert windows[-1]["masked_lm_accuracy"] > windows[0]["masked_lm_accuracy"]
    assert {"val_masked_lm_accuracy", "next_sentence_accuracy", "learning_rate"} <= set(windows[0])
    assert windows[-1]["learning_rate"] == pytest.approx(0.0, abs=1e-9)
    assert history["throughput"]["sequences_per_second"] > 0
    assert history["settings"]["bert_config"]["vocab_size"] == len(TINY_VOCABULARY)

    # The encoder folder loads as a Hugging Face checkpoint, with the trained weights.
    checkpoint = load_hf_checkpoint(os.path.join(out, "encoder"))
    assert checkpoint.vocabulary == TINY_VOCABULARY
    model = bert_pretrainer(checkpoint.config)
    model.load_weights(os.path.join(out, "pretrainer.weights.h5"))
    features = random_batch()[0]
    del features["masked_lm_positions"]
    features["token_ids"] = features["token_ids"] % len(TINY_VOCABULARY)
    np.testing.assert_allclose(
        checkpoint.encoder(features)["sequence_output"],
        model.encoder(features)["sequence_output"],
        atol=1e-6,
    )
    # It keeps the trained heads too (a BertForPreTraining folder): fill-mask reads them.
    features["masked_lm_positions"] = random_batch()[0]["masked_lm_positions"]
    heads = load_hf_checkpoint(os.path.join(out, "encoder"), heads=True).pretrainer(features)
    for name, value in model(features).items():
        np.testing.assert_allclose(heads[name], value, atol=1e-5)
    # From Python the message names the argument, as the command names --out.
    encoder = os.path.join(out, "encoder")
    with pytest.raises(ValueError, match=rf"^out={re.escape(repr(out))} holds a finished run \(35 steps\), with "
                                         rf"nothing to resume; to pretrain it further, run again with "
                                         rf"init={re.escape(repr(encoder))} and a new folder$"):
        pretrain(records, out, TINY_VOCABULARY, init=config, num_train_steps=1)


@pytest.mark.parametrize("name", ["lamb", "adamw"])
def test_optimizer_decays_kernels_but_not_layer_norm_or_biases(name):
    model = bert_pretrainer(CONFIG)
    optimizer = make_optimizer(name, 1e-2, total_steps=10, warmup_steps=0, weight_decay=0.1)
    variables = model.trainable_variables
    before = {v.path: v.numpy().copy() for v in variables}
    # Zero gradients: the only change left is the weight decay.
    optimizer.apply_gradients([(np.zeros(v.shape, "float32"), v) for v in variables])
    decayed = {v.path for v in variables if not np.allclose(v.numpy(), before[v.path])}
    for path in before:
        no_decay = path.endswith(("/gamma", "/beta", "/bias"))
        if no_decay or not before[path].any():
            assert path not in decayed, path
        else:
            assert path in decayed, path
    assert "masked_lm/output_bias" not in decayed
    assert "token_embedding/embeddings" in decayed


FUSED_ONLY = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="the fused update is TensorFlow's"
)


def _optimizer(fused):
    return make_optimizer("adamw", 1e-2, total_steps=6, warmup_steps=2, weight_decay=0.1,
                          global_clipnorm=0.5, fused=fused)


@FUSED_ONLY
def test_fused_adamw_applies_keras_adamw_update():
    """The same gradients (a dense one, a gather's IndexedSlices, a bias) through kbert's
    AdamW (one ResourceApplyAdam a variable) and Keras's: the same weights to float32
    rounding, with the schedule, decay and its exclusions, and clipping."""
    import tensorflow as tf

    from kbert.training import FusedAdamW

    rng = np.random.default_rng(0)
    initial = [rng.normal(size=shape).astype("float32") for shape in ((50, 8), (30, 4), (8,))]
    names = ("kernel", "embeddings", "bias")
    steps = []
    for _ in range(6):
        rows = rng.choice(30, 5)
        steps.append([
            tf.constant(rng.normal(size=(50, 8)).astype("float32")),
            tf.IndexedSlices(tf.constant(rng.normal(size=(5, 4)).astype("float32")),
                             tf.constant(rows), tf.constant([30, 4])),
            tf.constant(rng.normal(size=(8,)).astype("float32")),
        ])
    weights = {}
    for fused in (False, True):
        variables = [keras.Variable(w, name=n) for w, n in zip(initial, names)]
        optimizer = _optimizer(fused)
        assert isinstance(optimizer, FusedAdamW) == fused
        for gradients in steps:
            optimizer.apply_gradients(zip(gradients, variables))
        weights[fused] = [v.numpy() for v in variables]
    assert min(float(np.max(np.abs(a - b))) for a, b in zip(initial, weights[True])) > 1e-2
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(weights[False], weights[True]))
    assert diff < 1e-6, diff
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(restored, FusedAdamW) and restored.weight_decay == 0.1


@FUSED_ONLY
@pytest.mark.parametrize("jit_compile", [False, True])
def test_fused_adamw_fits_as_keras_adamw(jit_compile):
    """Through model.fit, also compiled by XLA. Rounding differences of ~1e-7 a step
    grow through the gradients over the steps (measured ~1e-5 after 6 steps of 1e-2)."""
    from kbert import bert_classifier

    config = CONFIG.replace(hidden_dropout=0.0, attention_dropout=0.0)
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(1, CONFIG.vocab_size, (24, 10)).astype("int32"),
        "segment_ids": np.zeros((24, 10), "int32"),
        "padding_mask": np.ones((24, 10), "int32"),
    }
    y = rng.integers(0, 3, (24,)).astype("int32")
    keras.utils.set_random_seed(0)
    initial = bert_classifier(config, 3, dropout=0.0).get_weights()
    weights = {}
    for fused in (False, True):
        model = bert_classifier(config, 3, dropout=0.0)
        model.set_weights(initial)
        model.compile(optimizer=_optimizer(fused), jit_compile=jit_compile,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        weights[fused] = model.get_weights()
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(initial, weights[False])) > 1e-2
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(weights[False], weights[True]))
    assert diff < 1e-4, diff


def test_schedule_warmup_then_linear_decay_to_zero():
    schedule = WarmupPolynomialDecay(1e-3, total_steps=100, warmup_steps=10)
    values = {step: float(schedule(step)) for step in (0, 5, 10, 55, 100, 150)}
    assert values[0] == 0.0
    assert values[5] == pytest.approx(5e-4)
    assert values[10] == pytest.approx(1e-3)
    assert values[55] == pytest.approx(5e-4)
    assert values[100] == pytest.approx(0.0, abs=1e-12)
    assert values[150] == pytest.approx(0.0, abs=1e-12)
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule)
    )
    assert float(restored(55)) == pytest.approx(values[55])


def test_pretrain_in_float16_scales_the_loss_and_stays_finite(tmp_path):
    import tensorflow as tf

    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
        f"w{i}" for i in range(CONFIG.vocab_size - 5)
    ]
    batches = tf.data.Dataset.from_tensors(random_batch(batch=8)).repeat()
    try:
        history = pretrain(
            batches,
            os.path.join(tmp_path, "run"),
            vocabulary,
            init=CONFIG,
            num_train_steps=6,
            log_every=3,
            jit_compile=False,
            dtype="mixed_float16",
            verbose=0,
        )
    finally:
        keras.config.set_dtype_policy("float32")
    # Keras's compile() adds loss scaling only for a float16 *model* policy,
    # and the pretrainer's own policy stays float32 (checked: compile() then
    # keeps a plain optimizer); pretrain() wraps it for float16 layers.
    assert history["settings"]["loss_scaling"] is True
    assert all(math.isfinite(w["loss"]) for w in history["windows"])
    assert history["windows"][-1]["loss"] < history["windows"][0]["loss"] * 1.5


def test_layerwise_rates_scale_each_blocks_first_step():
    """Adam's first step moves every weight by the learning rate (|g| >> epsilon); with
    layer-wise decay each block moves by its factor of it."""
    from kbert import bert_classifier
    from kbert.training import layerwise_multipliers

    model = bert_classifier(CONFIG, 3)
    factors = layerwise_multipliers(CONFIG.num_layers, 0.5)
    assert factors["transformer_layer_0"] == 0.5 ** CONFIG.num_layers
    assert factors["token_embedding"] == 0.5 ** (CONFIG.num_layers + 1)
    optimizer = make_optimizer(
        "adamw", 1e-2, total_steps=10, weight_decay=0.0, global_clipnorm=None, lr_multipliers=factors
    )
    variables = model.trainable_variables
    before = {v.path: v.numpy().copy() for v in variables}
    rng = np.random.default_rng(0)
    optimizer.apply_gradients([(rng.normal(size=v.shape).astype("float32"), v) for v in variables])
    for variable in variables:
        step = np.abs(variable.numpy() - before[variable.path])
        prefix = variable.path.split("/")[0]
        # The median: a gradient within a few epsilons of 0 moves its weight less.
        assert np.median(step) == pytest.approx(1e-2 * factors.get(prefix, 1.0), rel=1e-3), variable.path
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert restored.lr_multipliers == factors
