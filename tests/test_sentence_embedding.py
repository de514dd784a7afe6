"""The sentence-embedding task: parity with sentence-transformers, STS figures, search, export.

References: sentence-transformers' embeddings and PyTorch's hidden states of
all-MiniLM-L6-v2 (`tests/data/minilm_reference`), scipy's correlations,
numpy's brute force, and the runtimes themselves (LiteRT, onnxruntime,
TF's SavedModel loader, MediaPipe's `TextEmbedder` in its own environment).
STS-B pairs come from `../shared/data/glue-stsb/dev.tsv`. MediaPipe on the
real MiniLM against sentence-transformers is a figure of
`tools/benchmarks/benchmark_embedding.py --parts mediapipe` (half a minute more here).
"""

import contextlib
import io
import json
import os

import numpy as np
import pytest
import scipy.stats

from kbert import BertConfig
from kbert.checkpoints import load_pretrained, save_hf_checkpoint
from kbert.cli import main
from kbert.export.serving import serving_for
from kbert.modelfolder import ModelFolder, open_model
from kbert.search import build_index, index_model, load_index, read_corpus, search
from kbert.tasks import TASKS, TextExample
from kbert.tasks.sentence_embedding import (
    MIN_COSINE,
    SentenceEmbedding,
    row_cosines,
    sentence_transformers_modules,
)
from kbert.tasks.text_pair_regression import regression_metrics
from tests.task_harness import minilm_vocabulary, task_instance, write_task_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(REPO, "tests", "data", "minilm_reference")
STSB_DEV = os.path.join(REPO, "..", "shared", "data", "glue-stsb", "dev.tsv")
DEBIAN_DEV = os.path.join(REPO, "data", "debian-packages", "dev.csv")
# sentence-transformers' embeddings against kbert's on the same weights
# (README of tests/data/minilm_reference: PyTorch float32 noise ~3e-6).
REFERENCE_MIN_COSINE = 0.99999
# Hidden states agree to 1e-4 at most (tests/test_hf_checkpoint.py); pooled
# vectors of them do too.
HIDDEN_STATE_ATOL = 1e-4
# Rows cut to their length and full-length rows differ by float rounding only.
RUN_TOLERANCE = 1e-5
TINY = BertConfig(
    vocab_size=30522, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
    max_position_embeddings=64,
)
TINY_LENGTH = 32


def write_checkpoint(path, seed=0, modules=("Transformer", "Pooling", "Normalize"), pooling="mean"):
    """A tiny Hugging Face checkpoint with sentence-transformers' files, as ST saves them."""
    import keras

    from kbert.models import bert_encoder

    keras.utils.set_random_seed(seed)
    encoder = bert_encoder(TINY)
    rng = np.random.default_rng(seed)
    for variable in encoder.weights:
        variable.assign(variable.numpy() + rng.normal(0, 0.05, variable.shape))
    save_hf_checkpoint(encoder, TINY, list(minilm_vocabulary()), str(path))
    write_sentence_transformers_files(path, modules, pooling)
    return str(path)


def write_sentence_transformers_files(path, modules=("Transformer", "Pooling", "Normalize"), pooling="mean"):
    folders = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "2_Dense"}
    entries = [
        {"idx": i, "name": str(i), "path": folders[kind], "type": f"sentence_transformers.models.{kind}"}
        for i, kind in enumerate(modules)
    ]
    (path / "modules.json").write_text(json.dumps(entries))
    os.makedirs(path / "1_Pooling", exist_ok=True)
    modes = pooling if isinstance(pooling, tuple) else (pooling,)
    config = {"word_embedding_dimension": TINY.hidden_size}
    for key, mode in (("cls_token", "cls"), ("mean_tokens", "mean"), ("max_tokens", "max"),
                      ("mean_sqrt_len_tokens", "mean_sqrt_len")):
        config[f"pooling_mode_{key}"] = mode in modes
    (path / "1_Pooling" / "config.json").write_text(json.dumps(config))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": TINY_LENGTH}))


def stsb_subset(path, pairs):
    with open(STSB_DEV, encoding="utf-8") as f:
        lines = f.readlines()[: pairs + 1]
    path.write_text("".join(lines), encoding="utf-8")
    return str(path)


def run_cli(argv):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(argv)
    return status, [json.loads(line) for line in printed.getvalue().splitlines()]


def error_of(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kbert: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="module")
def minilm():
    return load_pretrained("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def reference():
    with open(os.path.join(REFERENCE, "sentences.json"), encoding="utf-8") as f:
        sentences = json.load(f)
    return sentences, dict(np.load(os.path.join(REFERENCE, "minilm_reference.npz")))


# === Parity with sentence-transformers ===


def test_minilm_matches_sentence_transformers(reference):
    sentences, arrays = reference
    folder = ModelFolder.from_pretrained("all-minilm-l6-v2", "sentence-embedding")
    # Read from the package's modules.json, 1_Pooling/config.json and sentence_bert_config.json.
    assert (folder.task.pooling, folder.task.normalize) == ("mean", True)
    assert folder.sequence_length == 256
    # The reference embeds an empty sentence too, which kbert refuses, as every text it is given.
    kept = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    cosines = row_cosines(folder.embed([sentences[i] for i in kept]), arrays["sentence_embeddings"][kept])
    assert len(kept) == len(sentences) - 1 and cosines.min() >= REFERENCE_MIN_COSINE, cosines
    with pytest.raises(ValueError, match=r"^text \d+: empty text$"):
        folder.embed(sentences)


def sentence_transformers_pooling(hidden, mask, pooling):
    """sentence_transformers.models.Pooling's definitions, on PyTorch's hidden states."""
    mask = mask[:, :, None].astype(np.float64)
    hidden = hidden.astype(np.float64)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "max":
        return np.where(mask == 0, -1e9, hidden).max(axis=1)
    return (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_pooling_matches_sentence_transformers_definition(minilm, reference, pooling):
    sentences, arrays = reference
    length = arrays["input_ids"].shape[1]
    task = task_instance("sentence-embedding", {"pooling": pooling, "normalize": False}, length)
    # Built as records: the reference's empty sentence ([CLS] [SEP]) is one no entry point takes.
    encoded = task.encode([TextExample(texts=(sentence,)) for sentence in sentences], targets=False)
    np.testing.assert_array_equal(encoded.features["token_ids"], arrays["input_ids"])
    vectors = task.run(task.build_model(minilm.encoder), encoded.features)["embedding"]
    expected = sentence_transformers_pooling(arrays["last_hidden_state"], arrays["attention_mask"], pooling)
    assert np.abs(vectors - expected).max() <= HIDDEN_STATE_ATOL


def test_rows_cut_to_their_length_equal_full_length_rows(tiny):
    folder = ModelFolder.from_pretrained(tiny, "sentence-embedding")
    texts = ["a", "a text editor for the console", "word " * 40, "."]
    features = folder.task.encode(folder.task.examples_from_texts(texts)).features
    full = folder.model.predict(features, verbose=0)
    np.testing.assert_allclose(folder.task.run(folder.model, features)["embedding"], full, atol=RUN_TOLERANCE)


# === Settings from the checkpoint ===


@pytest.mark.parametrize(
    "modules, pooling, expected",
    [
        (("Transformer", "Pooling", "Normalize"), "mean", {"pooling": "mean", "normalize": True}),
        (("Transformer", "Pooling"), "cls", {"pooling": "cls", "normalize": False}),
        (("Transformer", "Pooling", "Normalize"), "max", {"pooling": "max", "normalize": True}),
    ],
)
def test_settings_come_from_sentence_transformers_files(tmp_path, modules, pooling, expected):
    write_sentence_transformers_files(tmp_path, modules, pooling)
    assert sentence_transformers_modules(str(tmp_path)) == expected
    assert SentenceEmbedding.pretrained_settings(str(tmp_path), {}) == expected
    assert SentenceEmbedding.pretrained_sequence_length(str(tmp_path)) == TINY_LENGTH
    given = SentenceEmbedding.pretrained_settings(str(tmp_path), {"pooling": "max", "normalize": "no"})
    assert given == {"pooling": "max", "normalize": False}


def test_a_checkpoint_without_sentence_transformers_files_gets_the_defaults(tmp_path):
    assert sentence_transformers_modules(str(tmp_path)) == {}
    assert SentenceEmbedding.pretrained_settings(str(tmp_path), None) == {"pooling": "mean", "normalize": True}
    assert SentenceEmbedding.pretrained_sequence_length(str(tmp_path)) is None


@pytest.mark.parametrize(
    "modules, pooling, options, message",
    [
        (("Transformer", "Pooling", "Dense"), "mean", {}, "names the module 'Dense'"),
        (("Transformer", "Pooling"), ("mean", "max"), {}, "turns on ['pooling_mode_max_tokens', 'pooling_mode_mean_tokens']"),
        (("Transformer", "Pooling"), "mean_sqrt_len", {}, "pooling_mode_mean_sqrt_len_tokens"),
        (("Transformer", "Pooling"), "mean", {"normalize": "maybe"}, "--normalize 'maybe'"),
    ],
)
def test_settings_kbert_cannot_compute_are_refused(tmp_path, modules, pooling, options, message):
    write_sentence_transformers_files(tmp_path, modules, pooling)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SentenceEmbedding.pretrained_settings(str(tmp_path), options)


# === STS evaluation ===


def test_correlations_match_scipy():
    rng = np.random.default_rng(0)
    # STS scores repeat (ties), as cosines of equal texts do.
    gold = rng.integers(0, 11, 300) / 2.0
    predicted = np.round(gold + rng.normal(0, 1.5, 300), 1)
    metrics = regression_metrics(gold, predicted)
    assert metrics["pearson"] == pytest.approx(scipy.stats.pearsonr(gold, predicted)[0], abs=1e-12)
    assert metrics["spearman"] == pytest.approx(scipy.stats.spearmanr(gold, predicted)[0], abs=1e-12)


def test_evaluate_on_stsb_is_scipy_on_the_cosines_of_kbert_embed(tiny, tmp_path):
    data = stsb_subset(tmp_path / "stsb.tsv", 40)
    status, (metrics,) = run_cli(["evaluate", "--model", tiny, "--task", "sentence-embedding", "--data", data])
    assert status == 0 and metrics["n"] == 40 and set(metrics) == {"pearson", "spearman", "n"}
    pairs = SentenceEmbedding.read(data)
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps([text for pair in pairs for text in pair.texts]))
    assert run_cli(["embed", "--model", tiny, "--input", str(texts), "--output", str(tmp_path / "e.npy")])[0] == 0
    vectors = np.load(tmp_path / "e.npy").astype(np.float64)
    cosines = np.sum(vectors[0::2] * vectors[1::2], axis=1)
    gold = [pair.target for pair in pairs]
    # evaluate and embed batch the texts apart, and float32 kernels of other
    # batch shapes differ in the last bits (1.1e-6 on an AMX Xeon's oneDNN).
    assert metrics["spearman"] == pytest.approx(scipy.stats.spearmanr(gold, cosines)[0], abs=1e-5)
    assert metrics["pearson"] == pytest.approx(scipy.stats.pearsonr(gold, cosines)[0], abs=1e-5)


def test_predict_gives_pair_cosines_and_text_vectors(tiny, tmp_path):
    data = stsb_subset(tmp_path / "stsb.tsv", 3)
    status, rows = run_cli(["predict", "--model", tiny, "--task", "sentence-embedding", "--input", data])
    assert status == 0 and [set(r) for r in rows] == [{"sentence1", "sentence2", "score"}] * 3
    status, rows = run_cli(["predict", "--model", tiny, "--task", "sentence-embedding", "one", "two"])
    vectors = np.array([row["embedding"] for row in rows])
    assert [row["text"] for row in rows] == ["one", "two"] and vectors.shape == (2, TINY.hidden_size)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)


def test_a_model_folder_of_another_task_gives_its_encoder(tmp_path):
    trained = write_task_folder(tmp_path / "clf", "text-classification", {"labels": ["a", "b"]}, TINY)
    folder = open_model(trained, "sentence-embedding")
    assert folder.sequence_length == 16 and (folder.task.pooling, folder.task.normalize) == ("mean", True)
    texts = ["A chess game.", "An IMAP server for mail."]
    features = folder.task.encode(folder.task.examples_from_texts(texts)).features
    hidden = ModelFolder.load(trained).encoder.predict(features, verbose=0)["sequence_output"]
    mask = features["padding_mask"][:, :, None]
    mean = (hidden * mask).sum(1) / mask.sum(1)
    expected = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    np.testing.assert_allclose(folder.embed(texts), expected, atol=RUN_TOLERANCE)


def test_a_google_checkpoint_gives_the_same_vectors(tiny, tmp_path):
    from safetensors.numpy import load_file

    from tests.test_google_checkpoint import google_name, write_folder

    tensors = {}
    for hf_name, value in load_file(os.path.join(tiny, "model.safetensors")).items():
        name, transpose = google_name(hf_name)
        tensors[name] = np.ascontiguousarray(value.T if transpose else value)
    with open(os.path.join(tiny, "config.json")) as f:
        hf_config = json.load(f)
    keys = ("hidden_act", "hidden_size", "intermediate_size", "max_position_embeddings",
            "num_attention_heads", "num_hidden_layers", "type_vocab_size", "vocab_size")
    google = str(tmp_path / "google")
    write_folder(google, {key: hf_config[key] for key in keys}, list(minilm_vocabulary()), tensors)
    texts = ["A chess game.", "An IMAP server for mail."]
    expected = open_model(tiny, "sentence-embedding").embed(texts)
    folder = open_model(google, "sentence-embedding", sequence_length=TINY_LENGTH)
    assert (folder.task.pooling, folder.task.normalize) == ("mean", True)  # no sentence-transformers files
    np.testing.assert_allclose(folder.embed(texts), expected, atol=RUN_TOLERANCE)


def test_tasks_that_need_training_are_kept_apart(tiny, tmp_path, capsys):
    assert not TASKS["sentence-embedding"].trainable
    with pytest.raises(SystemExit):
        main(["finetune", "--task", "sentence-embedding", "--train", "x", "--dev", "y", "--init", tiny,
              "--out", str(tmp_path / "m")])
    capsys.readouterr()
    data = stsb_subset(tmp_path / "stsb.tsv", 3)
    err = error_of(["evaluate", "--model", tiny, "--task", "text-pair-regression", "--data", data], capsys)
    assert "task 'text-pair-regression' needs training" in err
    err = error_of(["evaluate", "--model", tiny, "--data", data], capsys)
    assert "needs --task, one that needs no training (sentence-embedding, fill-mask)" in err
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--model", tiny, "--task", "sentence-embedding", "--pooling", "sum", "--data", data])
    assert exit_.value.code == 2 and "--pooling: invalid choice: 'sum'" in capsys.readouterr().err
    err = error_of(["evaluate", "--model", tiny, "--task", "sentence-embedding", "--seq-len", "65",
                    "--data", data], capsys)
    assert "sequence_length=65 exceeds max_position_embeddings=64" in err


# === Search ===


@pytest.fixture(scope="module")
def index(tiny, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("index") / "debian.kbert-index")
    folder = open_model(tiny, "sentence-embedding")
    texts, lines = read_corpus(DEBIAN_DEV)
    texts, lines = texts[:60], lines[:60]
    summary = build_index(folder, texts, lines, path, DEBIAN_DEV)
    assert summary["texts"] == 60 and summary["dimension"] == TINY.hidden_size
    return {"path": path, "texts": texts, "lines": lines, "folder": folder}


def test_search_is_exact_brute_force(index, monkeypatch):
    import kbert.search

    loaded = load_index(index["path"])
    assert [loaded.text(i) for i in range(len(loaded))] == index["texts"]
    assert loaded.lines.tolist() == index["lines"] == list(range(2, 62))
    queries = index["folder"].embed(["a mail server", index["texts"][7]])
    rows, scores = search(loaded, queries, 5)
    unit = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    expected = unit @ loaded.embeddings.T
    np.testing.assert_array_equal(rows, np.argsort(-expected, axis=1, kind="stable")[:, :5])
    np.testing.assert_allclose(scores, np.take_along_axis(expected, rows, 1), atol=1e-6)
    assert rows[1, 0] == 7 and scores[1, 0] == pytest.approx(1.0, abs=1e-6)
    monkeypatch.setattr(kbert.search, "SCORE_CHUNK", 7)  # many chunks, merged
    chunked = search(loaded, queries, 5)
    np.testing.assert_array_equal(chunked[0], rows)
    assert search(loaded, queries, 100)[0].shape == (2, 60)


def test_search_cli_builds_and_queries(tiny, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a text editor\n\nan IMAP mail server\na chess game\n", encoding="utf-8")
    path = str(tmp_path / "small.kbert-index")
    status, (summary, result) = run_cli(["search", "--model", tiny, "--corpus", str(corpus), "--index", path,
                                         "an IMAP mail server", "-k", "2"])
    assert status == 0 and summary["texts"] == 3
    assert result["query"] == "an IMAP mail server" and len(result["results"]) == 2
    assert result["results"][0] == {"score": pytest.approx(1.0, abs=1e-6), "line": 3, "text": "an IMAP mail server"}
    status, (again,) = run_cli(["search", "--index", path, "an IMAP mail server", "-k", "2"])
    assert status == 0 and [r["line"] for r in again["results"]] == [3, 1]
    for found, first in zip(again["results"], result["results"]):
        assert found["score"] == pytest.approx(first["score"], abs=1e-6)


def test_search_refuses_another_model_and_bad_files(index, tmp_path, capsys):
    other = write_checkpoint(tmp_path / "other", seed=1)
    loaded = load_index(index["path"])
    with pytest.raises(ValueError, match="was built by another model"):
        index_model(loaded, index["path"], other)
    missing = str(tmp_path / "no" / "such.kbert-index")
    err = error_of(["search", "--model", other, "--corpus", DEBIAN_DEV, "--index", missing], capsys)
    assert "no such folder" in err and not os.path.exists(missing)
    before = open(index["path"], "rb").read()
    err = error_of(["search", "--model", other, "--corpus", DEBIAN_DEV, "--index", index["path"]], capsys)
    assert "exists; pass --overwrite" in err
    err = error_of(["search", "--model", other, "--corpus", str(tmp_path / "none.txt"), "--index", index["path"],
                    "--overwrite"], capsys)
    assert "none.txt: no such file" in err and open(index["path"], "rb").read() == before
    truncated = tmp_path / "truncated.kbert-index"
    truncated.write_bytes(before[: len(before) // 2])
    assert "is a damaged kbert index" in error_of(["search", "--index", str(truncated), "q"], capsys)
    assert "QUERY arguments or --queries" in error_of(["search", "--index", index["path"]], capsys)


# === Export ===


def test_quantized_artefacts_keep_spearman_and_the_vectors_direction():
    task = task_instance("sentence-embedding", {})
    keras = {"spearman": 0.80}
    ok = serving_for(task).judge({"quantization": "dynamic", "spearman": 0.797, "mean_cosine": 0.99}, keras)
    assert ok["passed"] and ok["metric_drop"] == pytest.approx(0.003)
    lost = serving_for(task).judge({"quantization": "dynamic", "spearman": 0.79, "mean_cosine": 0.99}, keras)
    assert not lost["passed"]
    # Every vector's sign flipped: cosines between pairs, hence Spearman, unchanged.
    flipped = serving_for(task).judge({"quantization": "16x8", "spearman": 0.80, "mean_cosine": -0.99}, keras)
    assert not flipped["passed"] and "mean_cosine >= 0.95" in flipped["budget"]
    vectors = np.random.default_rng(0).normal(size=(4, 8))
    agreement = serving_for(task).agreement({"embedding": -vectors}, {"embedding": vectors})
    assert agreement["mean_cosine"] == pytest.approx(-1.0) and agreement["min_cosine"] == pytest.approx(-1.0)
    assert not serving_for(task).judge({"quantization": "none", **agreement}, keras)["passed"]


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    from kbert.export import export_model

    root = tmp_path_factory.mktemp("export")
    data = stsb_subset(root / "stsb.tsv", 8)
    out = str(root / "embedder")
    report = export_model(
        tiny, out, data=data, task="sentence-embedding", quantizations="none",
        latency_runs=1, log=lambda line: None,
    )
    return {"out": out, "report": report, "data": data}


def test_export_writes_and_verifies_every_artefact(exported):
    report = exported["report"]
    assert report["passed"] and report["task"] == "sentence-embedding" and report["metric"] == "spearman"
    paths = {entry["path"]: entry for entry in report["artefacts"]}
    assert sorted(paths) == [
        "1", "mediapipe/text_embedder.tflite", "onnx/model.onnx", "tflite/model_none.tflite",
        "tflite/model_text.tflite",
    ]
    for entry in report["artefacts"]:
        assert entry["min_cosine"] >= MIN_COSINE and entry["budget"] == "min_cosine >= 0.9999", entry["path"]
    mediapipe_entry = paths["mediapipe/text_embedder.tflite"]
    assert mediapipe_entry["contract"]["output"] == {"metadata_name": "embedding", "dtype": "float32", "shape": [1, 32]}
    assert sorted(i["metadata_name"] for i in mediapipe_entry["contract"]["inputs"]) == ["ids", "mask", "segment_ids"]
    assert mediapipe_entry["tokenization"]["texts"] == 16


def test_exported_savedmodel_and_tflite_give_keras_unit_vectors(exported, tiny):
    import tensorflow as tf

    from kbert.export.savedmodel import load_savedmodel
    from kbert.export.tflite import TfliteRunner

    folder = open_model(tiny, "sentence-embedding")
    texts = ["A man is playing a guitar.", "Résumé of a naïve approach."]
    expected = folder.embed(texts)
    served = load_savedmodel(os.path.join(exported["out"], "1")).signatures["serving_default"]
    vectors = served(text=tf.constant(texts))["embedding"].numpy()
    assert row_cosines(vectors, expected).min() >= MIN_COSINE
    runner = TfliteRunner(os.path.join(exported["out"], "tflite", "model_none.tflite"), 2)
    (output,) = runner.runner.get_output_details().values()
    assert output["shape"].tolist() == [1, TINY.hidden_size]
    features = folder.task.encode(folder.task.examples_from_texts(texts)).features
    assert row_cosines(runner.run(features)["embedding"], expected).min() >= MIN_COSINE
