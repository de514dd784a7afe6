"""`export_model` end to end on a tiny model: every artefact written, reloaded and checked.

One export (all formats and quantizations, 24 dev texts) is shared by the
tests of this module; it takes about a minute on two cores.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from kbert.export import savedmodel
from kbert.export.graph import GRAPH_TOLERANCE
from kbert.export.onnx import ONNX_OPSET
from kbert.export.options import QUANTIZATIONS
from kbert.export.serving_base import FLOAT_TOLERANCE
from kbert.modelfolder import ModelFolder
from tests.test_export_units import DEV_CSV, TRAIN_CSV, make_model_folder

pytestmark = pytest.mark.slow

EXAMPLES = 24
NAME = "tiny"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVING_EXAMPLE = os.path.join(REPO, "tests", "data", "serving_example.json")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from kbert.export import export_model

    root = tmp_path_factory.mktemp("export")
    model_dir = make_model_folder(root / "model")
    out = str(root / "saved_models" / NAME)
    lines = []
    report = export_model(
        model_dir,
        out,
        data=DEV_CSV,
        formats="savedmodel,tflite,onnx",  # MediaPipe: tests/test_mediapipe.py
        quantizations="all",
        calibration=TRAIN_CSV,
        max_examples=EXAMPLES,
        calibration_examples=16,
        latency_runs=5,
        log=lines.append,
    )
    return {"model_dir": model_dir, "out": out, "report": report, "log": lines}


@pytest.fixture(scope="module")
def reference(exported):
    finetuned = ModelFolder.load(exported["model_dir"])
    examples = finetuned.task.read(DEV_CSV)[:EXAMPLES]
    texts = [e.texts[0] for e in examples]
    return finetuned, texts, finetuned.predict(examples)


def logits_of(finetuned, texts):
    features = finetuned.task.encode(finetuned.task.examples_from_texts(texts), targets=False).features
    return finetuned.model.predict(features, verbose=0)


def _entry(report, path):
    return next(e for e in report["artefacts"] if e["path"] == path)


def test_report_lists_every_artefact(exported):
    report = exported["report"]
    paths = [e["path"] for e in report["artefacts"]]
    assert paths == [
        "1",
        "onnx/model.onnx",
        "onnx/model_int8.onnx",
        *[f"tflite/model_{q}.tflite" for q in QUANTIZATIONS],
        "tflite/model_text.tflite",
    ]
    for entry in report["artefacts"]:
        assert os.path.exists(os.path.join(exported["out"], entry["path"]))
        assert entry["size_bytes"] > 0 and entry["latency"]["runs"] == 5
        assert entry["latency"]["threads"] >= 1 and 0 <= entry["top1_agreement"] <= 1
        if entry["quantization"] == "none":
            assert entry["max_abs_diff"] <= FLOAT_TOLERANCE and entry["passed"], entry
    assert report["examples"] == EXAMPLES and report["calibration_examples"] == 16
    on_disk = json.load(open(os.path.join(exported["out"], "report.json")))
    assert on_disk["passed"] == report["passed"] == all(e["passed"] for e in report["artefacts"])
    markdown = open(os.path.join(exported["out"], "report.md")).read()
    assert markdown in exported["log"] and markdown.count("\n| `") == len(paths)
    leftovers = [n for n in os.listdir(os.path.dirname(exported["out"])) if n.startswith(".")]
    assert leftovers == []


def test_savedmodel_reloads_with_keras_scores(exported, reference):
    finetuned, texts, scores = reference
    version_dir = os.path.join(exported["out"], "1")
    loaded = savedmodel.load_savedmodel(version_dir)
    outputs = loaded.signatures["serving_default"](text=tf.constant(texts))
    np.testing.assert_allclose(outputs["scores"].numpy(), scores, atol=GRAPH_TOLERANCE)
    labels = [finetuned.task.labels[i] for i in scores.argmax(-1)]
    assert [label.decode() for label in outputs["label"].numpy()] == labels
    features = finetuned.task.preprocessor(tf.constant(texts))
    tokens = loaded.signatures["serve_tokens"](**features)
    np.testing.assert_allclose(tokens["logits"].numpy(), outputs["logits"].numpy(), atol=GRAPH_TOLERANCE)
    assert sorted(os.listdir(os.path.join(version_dir, "assets"))) == ["labels.txt", "vocab.txt"]
    assert _entry(exported["report"], "1")["max_abs_diff"] <= GRAPH_TOLERANCE


def test_saved_model_cli_and_serving_files(exported):
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    version_dir = os.path.join(exported["out"], "1")
    shown = savedmodel.saved_model_cli_show(version_dir, ["text"], ["label", "logits", "scores"])
    assert "inputs['text'] tensor_info:\n        dtype: DT_STRING" in shown
    config = text_format.Parse(
        open(os.path.join(exported["out"], "models.config")).read(),
        model_server_config_pb2.ModelServerConfig(),
    )
    (model,) = config.model_config_list.config
    assert (model.name, model.base_path, model.model_platform) == (NAME, f"/models/{NAME}", "tensorflow")
    requests = savedmodel.read_warmup_requests(version_dir)
    assert 1 <= len(requests) <= savedmodel.MAX_WARMUP_REQUESTS
    assert requests[0].model_spec.name == NAME
    assert requests[0].model_spec.signature_name == "serving_default"
    assert tf.make_ndarray(requests[0].inputs["text"]).shape == (1,)


def test_rest_example(exported, reference):
    """The REST body TF Serving returns, and the committed README example in the same form."""
    finetuned, texts, _ = reference
    example = json.load(open(os.path.join(exported["out"], "rest_example.json"), encoding="utf-8"))
    instances = [text.split(". ")[0].rstrip(".") + "." for text in texts[:2]]
    assert example["request"] == {"signature_name": "serving_default", "instances": instances}
    predictions = example["response"]["predictions"]
    assert [sorted(p) for p in predictions] == [["label", "logits", "scores"]] * 2
    scores = finetuned.predict(finetuned.task.examples_from_texts(instances))
    for prediction, row in zip(predictions, scores):
        assert prediction["label"] == finetuned.task.labels[int(row.argmax())]
        np.testing.assert_allclose(prediction["scores"], row, atol=1e-5)
    committed = json.load(open(SERVING_EXAMPLE, encoding="utf-8"))
    assert set(committed) == {"request", "response"}
    assert committed["request"]["signature_name"] == "serving_default"
    rows = committed["response"]["predictions"]
    assert len(rows) == len(committed["request"]["instances"])
    assert all(sorted(r) == ["label", "logits", "scores"] and len(r["scores"]) == 12 for r in rows)


def test_tflite_ops_and_runner(exported, reference):
    from kbert.export import tflite

    finetuned, texts, scores = reference
    for entry in exported["report"]["artefacts"]:
        if entry["format"] != "tflite":
            continue
        path = os.path.join(exported["out"], entry["path"])
        ops = tflite.tflite_ops(open(path, "rb").read())
        assert ops == entry["ops"]
        assert not [op for op in ops if op.startswith("Flex")]
        if entry["input"] == "text":
            assert set(tflite.TEXT_CUSTOM_OPS) <= set(ops)
            runner = tflite.TfliteRunner(path, threads=2, text=True)
            got = runner.run_text({"text": texts[:3]})["logits"]
            np.testing.assert_allclose(got, logits_of(finetuned, texts[:3]), atol=1e-4)
        else:
            assert tflite.check_ops(open(path, "rb").read()) == ops


def test_onnx_fused_with_dynamic_axes(exported, reference):
    import onnx

    from kbert.export.onnx import OnnxRunner
    from kbert.text import BertPreprocessor

    finetuned, texts, _ = reference
    report = exported["report"]
    assert report["onnx_fusions"]["Attention"] == 2 and report["onnx_fusions"]["BiasGelu"] == 2
    assert report["onnx_fusions"]["SkipLayerNormalization"] >= 4 and report["onnx_all_blocks_fused"]
    path = os.path.join(exported["out"], "onnx", "model.onnx")
    model = onnx.load(path)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= ONNX_OPSET
    dims = [[d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input]
    assert dims == [["batch", "sequence"]] * 3
    runner = OnnxRunner(path, threads=2)
    for length in (8, 24):
        packed = BertPreprocessor(finetuned.tokenizer, length)(tf.constant(texts[:3]))
        features = {k: v.numpy() for k, v in packed.items()}
        expected = finetuned.model.predict(features, verbose=0)
        np.testing.assert_allclose(runner.run(features, ["logits"])["logits"], expected, atol=GRAPH_TOLERANCE)
