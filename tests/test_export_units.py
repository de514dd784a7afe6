"""kbert.export pieces that run in seconds: the export graph, budgets, bad input."""

import json
import os
import platform

import keras
import numpy as np
import pytest
import tensorflow as tf

from kbert import BertConfig, bert_classifier
from kbert.export import options, verify
from kbert.export.graph import GRAPH_TOLERANCE, model_outputs
from kbert.export.serving import serving_class, serving_for
from kbert.export.savedmodel import serving_float
from kbert.tasks import TASKS, TextExample
from tests.model_harness import tiny_inputs
from tests.task_harness import load_tool
from tests.task_harness import task_instance, write_task_folder

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "debian-packages")
DEV_CSV = os.path.join(DATA, "dev.csv")
TRAIN_CSV = os.path.join(DATA, "train.csv")
# Width 32, two blocks: every piece of the graph, small enough to convert in seconds.
TINY = BertConfig(
    vocab_size=30522,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
SEQUENCE_LENGTH = 16


def make_model_folder(path, config=TINY, sequence_length=SEQUENCE_LENGTH, seed=0, dtype=None):
    """A model folder as `kbert finetune` writes it: tiny random classifier, MiniLM vocab."""
    labels = sorted({e.target for e in TASKS["text-classification"].read(DEV_CSV)})
    return write_task_folder(
        path, "text-classification", {"labels": labels}, config, sequence_length, seed, dtype
    )


def classifier_task(num_classes=3):
    return task_instance("text-classification", {"labels": [f"c{i}" for i in range(num_classes)]})


@pytest.mark.parametrize("target", ["onnx", "tflite"])
@pytest.mark.parametrize("activation", ["gelu", "gelu_approximate", "relu"])
def test_graph_matches_keras(target, activation):
    config = TINY.replace(vocab_size=50, activation=activation)
    task = classifier_task()
    model = task.build_model(config)
    inputs = tiny_inputs(50, batch=3, length=9)
    expected = model(inputs, training=False).numpy()
    got = tf.function(lambda f: model_outputs(task, model, f, target=target))(inputs)["logits"].numpy()
    np.testing.assert_allclose(got, expected, atol=GRAPH_TOLERANCE)


# Queries and keys of the first block as PAD_DOMINANCE times the identity: a
# padded query then scores the (nearly equal) padded keys about 4 * 8**2 = 256
# nats above the real ones, whose exp() is 0 in float32 on every CPU.
PAD_DOMINANCE = 8.0


def _padding_dominated_model():
    """A tiny question-answering model (every position's output is read) whose
    padded queries put all their softmax mass on padded keys, as a QA model
    fine-tuned in float32 does in its first block."""
    keras.utils.set_random_seed(0)
    task = task_instance("question-answering", {}, SEQUENCE_LENGTH)
    model = task.build_model(TINY.replace(vocab_size=50))
    attention = model.get_layer("bert_encoder").get_layer("transformer_layer_0").attention
    for dense in (attention.query_dense, attention.key_dense):
        dense.kernel.assign(PAD_DOMINANCE * np.eye(TINY.hidden_size, dtype="float32"))
        dense.bias.assign(np.zeros(TINY.hidden_size, "float32"))
    return task, model


def test_tflite_graph_is_finite_where_padding_takes_all_the_attention(tmp_path, monkeypatch):
    """The masked softmax of the TFLite graph stays exact where a multiply-and-
    renormalise form divides 0 by 0, in TensorFlow and in LiteRT with XNNPACK, its
    builtin kernels and its reference kernels."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from kbert.export import graph, tflite
    from kbert.export.serving_base import FLOAT_TOLERANCE

    task, model = _padding_dominated_model()
    inputs = tiny_inputs(50, batch=3, length=SEQUENCE_LENGTH)
    expected = {k: keras.ops.convert_to_numpy(v) for k, v in model(inputs, training=False).items()}
    assert all(np.isfinite(v).all() for v in expected.values())

    def trace():
        return {k: v.numpy() for k, v in tf.function(lambda f: model_outputs(task, model, f, "tflite"))(inputs).items()}

    for name, value in trace().items():
        np.testing.assert_allclose(value, expected[name], atol=GRAPH_TOLERANCE)

    source = str(tmp_path / "source")
    tflite.write_token_source(task, model, SEQUENCE_LENGTH, source)
    content = tflite.convert_tokens(source, "none")
    for resolver in ("AUTO", "BUILTIN_WITHOUT_DEFAULT_DELEGATES", "BUILTIN_REF"):
        interpreter = Interpreter(model_content=content, experimental_op_resolver_type=getattr(OpResolverType, resolver))
        run = interpreter.get_signature_runner()
        for row in range(len(inputs["token_ids"])):
            got = run(**{k: v[row : row + 1] for k, v in inputs.items()})
            for name, value in got.items():
                assert np.isfinite(value).all(), (resolver, row, name)
                np.testing.assert_allclose(value[0], expected[name][row], atol=FLOAT_TOLERANCE, err_msg=resolver)

    # These inputs catch the multiply-and-renormalise form on any CPU: 0 / 0.
    def multiplied_only(scores, mask):
        probs = tf.nn.softmax(scores, axis=-1) * mask
        return probs / tf.reduce_sum(probs, axis=-1, keepdims=True)

    monkeypatch.setattr(graph, "_masked_softmax", multiplied_only)
    assert any(np.isnan(value).any() for value in trace().values())


def test_an_artefact_with_nan_fails_with_its_own_line(tmp_path):
    task = classifier_task()
    examples = [TextExample(("a text",), "c0", 2), TextExample(("b text",), "c1", 3), TextExample(("c",), "c2", 4)]
    encoded = task.encode(examples, targets=False)
    logits = {"logits": np.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0]], "float32")}
    lines = []
    reference = verify.KerasReference(
        task, examples, encoded, {}, logits, task.decode(examples, encoded, logits), str(tmp_path), 1, 1,
        lines.append,
    )
    reference.keras.update(reference.figures(predictions=reference.predictions), latency={"median_ms": 1.0})
    (tmp_path / "model.tflite").write_bytes(b"0")
    same = reference.artefact(str(tmp_path / "model.tflite"), "tflite", "none", "tokens", logits, {"median_ms": 1.0})
    assert same["passed"] and same["non_finite"] is None
    broken = {"logits": logits["logits"].copy()}
    broken["logits"][1:, 2] = [np.nan, np.inf]
    entry = reference.artefact(str(tmp_path / "model.tflite"), "tflite", "none", "tokens", broken, {"median_ms": 1.0})
    assert not entry["passed"] and entry["budget"].startswith("finite outputs, ")
    assert entry["non_finite"] == {"output": "logits", "rows": 2, "first_example": "example 2 (line 3)"}
    assert "model.tflite: NaN or infinity in logits on 2 rows, the first from example 2 (line 3)" in lines
    report = {
        "model": "m", "task": task.name, "data": "dev.csv", "examples": 3, "sequence_length": 16, "latency_runs": 1,
        "threads": 1, "metric": task.metric, "metric_scale": task.metric_scale, "figures": ["accuracy"],
        "keras": reference.keras, "artefacts": [same, entry], "passed": False,
    }
    assert ("`model.tflite` fails: NaN or infinity in logits on 2 rows, the first from example 2 (line 3)."
            in verify.markdown_report(report))
    # Rows of windows name their question; one row per text of a pair, its pair.
    qa = [type("Q", (), {"id": "q7", "line": None})()]
    assert verify.example_name(qa[0], 0) == "question 'q7'"
    reference.encoded.example_of_row = np.array([0, 0, 1])
    assert reference.non_finite({"x": np.array([[0.0], [0.0], [np.nan]])})["first_example"] == "example 2 (line 3)"
    assert reference.non_finite({"x": np.array([0.0, 0, 0, 0, np.nan, 0])})["first_example"] == "example 3 (line 4)"


def test_graph_rejects_other_models():
    from kbert import bert_encoder

    task = classifier_task(2)
    with pytest.raises(ValueError, match="not a kbert task model"):
        model_outputs(task, bert_encoder(TINY.replace(vocab_size=50)), tiny_inputs(50))
    with pytest.raises(ValueError, match="target="):
        model_outputs(task, bert_classifier(TINY.replace(vocab_size=50), 2), tiny_inputs(50), target="gguf")


def test_judge_budgets():
    task = classifier_task()
    keras_figures = {"accuracy": 0.9}
    float_entry = {"quantization": "none", "max_abs_diff": 2e-4, "accuracy": 0.9}
    assert not serving_for(task).judge(float_entry, keras_figures)["passed"]
    assert serving_for(task).judge({**float_entry, "max_abs_diff": 5e-5}, keras_figures)["passed"]
    # fp16 may lose 0.1 point, int8 and 16x8 half a point.
    assert serving_for(task).judge({"quantization": "fp16", "max_abs_diff": 0.01, "accuracy": 0.8995}, keras_figures)["passed"]
    assert not serving_for(task).judge({"quantization": "fp16", "max_abs_diff": 0.01, "accuracy": 0.898}, keras_figures)["passed"]
    entry = serving_for(task).judge({"quantization": "int8", "max_abs_diff": 0.3, "accuracy": 0.894}, keras_figures)
    assert not entry["passed"] and entry["metric_drop"] == pytest.approx(0.6)
    assert entry["budget"] == "accuracy drop <= 0.5 points"
    assert serving_for(task).judge({"quantization": "16x8", "max_abs_diff": 0.3, "accuracy": 0.91}, keras_figures)["passed"]
    # A regressor is judged by Spearman's rho, in its own units.
    regressor = task_instance("text-pair-regression", {})
    entry = serving_for(regressor).judge({"quantization": "dynamic", "max_abs_diff": 0.1, "spearman": 0.844}, {"spearman": 0.85})
    assert not entry["passed"] and entry["metric_drop"] == pytest.approx(0.006)
    assert serving_for(regressor).judge({"quantization": "dynamic", "max_abs_diff": 0.1, "spearman": 0.846}, {"spearman": 0.85})["passed"]


def test_quantizations_without_a_budget_are_skipped():
    from kbert.export.exporter import _plan

    task = task_instance("text-classification", {"labels": ["a", "b"]})
    task.budgets = {"fp16": 0.001}  # a task that declares one budget only
    log = []
    plan = _plan(task, "tflite,onnx", options.QUANTIZATIONS, log.append)
    assert plan == [("onnx", "none"), ("tflite", "none"), ("tflite", "fp16")]  # ONNX first: it converts the SavedModel
    assert "onnx dynamic: skipped: task 'text-classification' declares no accuracy budget for it (Task.budgets)" in log
    task.budgets = {}
    assert _plan(task, "onnx", ["dynamic", "none"], log.append) == [("onnx", "none")]
    with pytest.raises(ValueError, match="^onnx dynamic: task 'text-classification' declares no accuracy budget"):
        _plan(task, "onnx", ["dynamic"], log.append)


def test_latency_and_agreement():
    latency = verify.measure_latency(lambda: None, runs=50, warmup=2)
    assert latency["runs"] == 50 and 0 <= latency["median_ms"] <= latency["p90_ms"]
    task = classifier_task()
    logits = {"logits": np.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]])}
    # Row 0's winner moved to the last class: its probabilities e²/(e²+2) and 1/(e²+2)
    # trade places; row 1 shifted by a constant, which no probability sees. Scores are
    # float32: equal to float32 rounding.
    moved = {"logits": np.array([[0.0, 0.0, 2.0], [5.0, 8.0, 5.0]])}
    agreement = serving_for(task).agreement(moved, logits)
    e2 = float(np.exp(2.0))
    assert agreement["max_abs_diff"] == pytest.approx((e2 - 1) / (e2 + 2), abs=1e-7)
    assert agreement["top1_agreement"] == 0.5
    examples = [TextExample(("a",), "c0", 2), TextExample(("b",), "c2", 3)]
    assert task.evaluate(examples, task.decode(examples, None, logits))["accuracy"] == 0.5


def test_parse_names():
    assert options.parse_names("tflite, savedmodel", options.FORMATS, "format") == ("savedmodel", "tflite")
    with pytest.raises(ValueError, match="unknown format 'gguf'"):
        options.parse_names("tflite,gguf", options.FORMATS, "format")
    with pytest.raises(ValueError, match="no quantization"):
        options.parse_names(" , ", options.QUANTIZATIONS, "quantization")


def test_serving_float_matches_tf_serving():
    # json_tensor.cc: six digits when they round-trip, else nine; ".0" on whole numbers.
    assert serving_float(0.25) == "0.25"
    assert serving_float(1.0) == "1.0"
    assert serving_float(np.float32(0.123456789)) == "0.123456791"
    assert serving_float(1e-7) == "1e-07"
    assert serving_float(float("nan")) == "NaN"


# === Bad input: one-line ValueError, nothing written ===


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return make_model_folder(tmp_path_factory.mktemp("model") / "tiny")


def _export(model, out, **kwargs):
    from kbert.export import export_model

    kwargs.setdefault("data", DEV_CSV)
    return export_model(model, out, log=lambda line: None, **kwargs)


def _assert_nothing_written(folder):
    assert os.listdir(folder) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"formats": "savedmodel,gguf"}, "unknown format 'gguf'"),
        ({"quantizations": "int4"}, "unknown quantization 'int4'"),
        ({"formats": "savedmodel", "quantizations": "int8"}, "savedmodel supports none"),
        ({"threads": 0}, "threads=0"),
        ({"max_examples": 0}, "max_examples=0"),
        ({"data": "no/such.csv"}, "no/such.csv: no such file"),
    ],
)
def test_bad_arguments(model_folder, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        _export(model_folder, str(tmp_path / "out" / "m"), **kwargs)
    assert "\n" not in str(error.value)
    assert not os.path.exists(tmp_path / "out" / "m")


def test_missing_and_corrupt_model_folders(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="no such model folder"):
        _export(str(tmp_path / "missing"), str(out / "m"))
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for name in ("vocab.txt", "labels.json", "kbert.json"):
        (corrupt / name).write_text("[]")
    with pytest.raises(ValueError, match="model.keras missing"):
        _export(str(corrupt), str(out / "m"))
    (corrupt / "model.keras").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="kbert.json holds list; expected a JSON object") as error:
        _export(str(corrupt), str(out / "m"))
    assert "\n" not in str(error.value)
    _assert_nothing_written(out)


def test_empty_calibration_text(model_folder, tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text('text,label\nfine,games\n" ",games\n')
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="empty.csv, line 3: empty 'text'"):
        _export(model_folder, str(out / "m"), formats="tflite", quantizations="int8", calibration=str(empty))
    _assert_nothing_written(out)


def test_failure_midway_leaves_nothing(model_folder, tmp_path, monkeypatch):
    from kbert.export import savedmodel

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(savedmodel, "export_savedmodel", fail)
    out = tmp_path / "out"
    out.mkdir()
    (out / "m").mkdir()
    previous = json.dumps({"artefacts": []})
    (out / "m" / "report.json").write_text(previous)
    with pytest.raises(OSError, match="disk full"):
        _export(model_folder, str(out / "m"), formats="savedmodel", max_examples=4, overwrite=True)
    assert sorted(os.listdir(out)) == ["m"]
    assert os.listdir(out / "m") == ["report.json"]
    assert (out / "m" / "report.json").read_text() == previous


def test_refuses_a_folder_kbert_did_not_write(model_folder, tmp_path):
    users = tmp_path / "work"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty and is not a kbert export folder"):
        _export(model_folder, str(users), formats="savedmodel", max_examples=4)
    assert os.listdir(users) == ["notes.txt"] and (users / "notes.txt").read_text() == "mine"
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "report.json").write_text(json.dumps({"artefacts": []}))
    with pytest.raises(ValueError, match="pass --overwrite to replace it"):
        _export(model_folder, str(earlier), formats="savedmodel", max_examples=4)
    assert os.listdir(earlier) == ["report.json"]


def test_cli_exit_status(model_folder, tmp_path, monkeypatch):
    import argparse

    from kbert.cli import export as cli
    from kbert.export import exporter

    parser = argparse.ArgumentParser(prog="kbert")
    cli.add_export_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["export", "--model", model_folder, "--out", str(tmp_path / "m"), "--data", DEV_CSV, "--formats", "onnx"]
    )
    assert args.quantize == options.RECOMMENDED and args.max_examples == options.DEFAULT_MAX_EXAMPLES
    assert args.formats == "onnx" and args.text_column is None and not args.overwrite
    for passed, status in ((True, 0), (False, cli.EXIT_OVER_BUDGET)):
        report = {"passed": passed, "task": "text-classification", "metric": "accuracy", "keras": {}, "artefacts": []}
        monkeypatch.setattr(exporter, "export_model", lambda *a, report=report, **k: report)
        assert args.run(args) == status
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "--model", "m", "--out", "o", "--data", "d", "--threads", "0"])


def test_mixed_precision_model_is_held_to_its_float32_twin(tmp_path):
    from kbert.modelfolder import ModelFolder

    folder = make_model_folder(tmp_path / "bf16", dtype="mixed_bfloat16")
    finetuned = ModelFolder.load(folder)
    assert finetuned.compute_dtype == "bfloat16"
    inputs = tiny_inputs(TINY.vocab_size, batch=3, length=SEQUENCE_LENGTH)
    graph = tf.function(lambda f: model_outputs(finetuned.task, finetuned.model, f))(inputs)["logits"].numpy()
    # The twin has the same weights in the same places: the float32 export
    # graph, which reads the variables themselves, gives its logits.
    np.testing.assert_allclose(finetuned.float32_model()(inputs).numpy(), graph, atol=GRAPH_TOLERANCE)
    assert np.abs(finetuned.model(inputs).numpy() - graph).max() > 100 * GRAPH_TOLERANCE

    report = _export(folder, str(tmp_path / "m"), formats="savedmodel", max_examples=8)
    assert report["passed"], report["artefacts"]
    assert report["keras"]["as_trained"]["compute_dtype"] == "bfloat16"
    assert "as trained (bfloat16 compute)" in verify.markdown_report(report)


def test_every_on_device_kind_a_task_names_has_a_writer():
    """`kbert export --formats mediapipe` finds a writer for each task that names an on-device kind."""
    from kbert.export import on_device

    kinds = {serving_class(task).on_device for task in TASKS.values() if serving_class(task).on_device}
    assert kinds == set(on_device.EXPORTERS)
    for name, task in TASKS.items():
        assert ("mediapipe" in options.task_formats(task)) == bool(serving_class(task).on_device), name


def test_on_device_export_refuses_a_task_without_a_file(tmp_path):
    """A task that no on-device runtime runs gets a one-line error naming it, and nothing is written."""
    from kbert.export import on_device
    from kbert.modelfolder import ModelFolder

    folder = ModelFolder.load(write_task_folder(tmp_path / "model", "text-pair-regression", {}, TINY))
    out = tmp_path / "mediapipe"
    with pytest.raises(ValueError, match="task 'text-pair-regression' has no MediaPipe file; kinds: "):
        on_device.export_for_task(folder, str(out), examples=[], reference={})
    assert not out.exists()


def test_report_markdown():
    entry = {
        "path": "tflite/model_int8.tflite", "format": "tflite", "quantization": "int8", "input": "tokens",
        "max_abs_diff": 0.02, "top1_agreement": 0.99, "accuracy": 0.81, "macro_f1": 0.7,
        "size_bytes": 23 * 2**20, "latency": {"median_ms": 4.2}, "budget": "accuracy drop <= 0.5 points",
        "passed": True,
    }
    report = {
        "model": "runs/m", "task": "text-classification", "data": "dev.csv", "examples": 950,
        "sequence_length": 128, "latency_runs": 50, "threads": 2, "metric": "accuracy", "metric_scale": 100,
        "figures": ["accuracy", "macro_f1"],
        "keras": {"accuracy": 0.812, "macro_f1": 0.71, "latency": {"median_ms": 30.0}},
        "artefacts": [entry], "onnx_fusions": {"Attention": 6}, "passed": True,
    }
    markdown = verify.markdown_report(report)
    assert "| `tflite/model_int8.tflite` | tflite | int8 | tokens | 2.00e-02 | 99.00% | 81.00 | 70.00 |" in markdown
    assert "23.0 MiB" in markdown and "Attention 6" in markdown
    assert "runs on 2 threads. Keras model: accuracy 81.20, macro_f1 71.00, 30.00 ms." in markdown
    json.dumps(report)
    report["machine"] = verify.machine()
    assert f"runs on 2 threads of {report['machine']['cpu']}. Keras model:" in verify.markdown_report(report)


def test_machine():
    machine = verify.machine()
    assert machine["cpus"] == os.cpu_count() and machine["cpu"] and machine["python"] == platform.python_version()
    assert isinstance(machine["cpu_bfloat16"], bool)
    load = verify.load_average()
    assert load is None or (len(load) == 3 and all(value >= 0 for value in load))
    json.dumps(machine)


# The tiny random classifier's logits are small (|logit| <= 0.13) and close
# together, so its int8 file is held to the float file's by correlation and
# top-1 agreement over 32 rows (measured 0.95 and 31 of 32).
INT8_MIN_CORRELATION = 0.9
INT8_MIN_AGREEMENT = 0.9


def _op_input_types(model_bytes):
    """(op name, dtypes of its inputs, output tensor name) for each op of a .tflite model."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    return [
        (
            op["op_name"],
            [np.dtype(tensors[i]["dtype"]).name for i in op["inputs"] if i >= 0],
            tensors[op["outputs"][0]]["name"],
        )
        for op in interpreter._get_ops_details()
    ]


def test_tflite_int8_has_int8_matmuls(tmp_path):
    """int8 weights on every matmul, int8 activations on all but the feed-forward outputs."""
    from kbert.export import tflite
    from kbert.export.graph import FEED_FORWARD_OUTPUT

    # A fixed draw: over untrained draws the argmax agreement ranges 0.91-1.0
    # (8 seeds), and an unseeded one could land under the bar by chance.
    keras.utils.set_random_seed(0)
    task = classifier_task()
    model = task.build_model(TINY.replace(vocab_size=50, initializer_range=0.2))
    source = str(tmp_path / "source")
    tflite.write_token_source(task, model, SEQUENCE_LENGTH, source)
    calibration = tiny_inputs(50, batch=32, length=SEQUENCE_LENGTH, seed=1)
    models = {q: tflite.convert_tokens(source, q, calibration) for q in ("none", "int8")}

    ops = _op_input_types(models["int8"])
    matmuls = [(types, name) for op, types, name in ops if op == "FULLY_CONNECTED"]
    # Two blocks (QKV, attention output, feed-forward in and out), pooler, classifier.
    assert len(matmuls) == 2 * 4 + 2
    assert all(types[1] == "int8" for types, _ in matmuls)
    feed_forward = [types for types, name in matmuls if FEED_FORWARD_OUTPUT in name]
    assert len(feed_forward) == 2 and all(types[0] == "float32" for types in feed_forward)
    assert sum(types[:2] == ["int8", "int8"] for types, _ in matmuls) == len(matmuls) - 2
    assert all(types[0] == "int8" for op, types, _ in ops if op == "GATHER")

    inputs = tiny_inputs(50, batch=32, length=SEQUENCE_LENGTH, seed=2)
    logits = {}
    for quantization, model_bytes in models.items():
        path = str(tmp_path / f"model_{quantization}.tflite")
        tflite.write_bytes(path, model_bytes)
        logits[quantization] = tflite.TfliteRunner(path, threads=1).run(inputs)["logits"]
    assert np.corrcoef(logits["int8"].ravel(), logits["none"].ravel())[0, 1] >= INT8_MIN_CORRELATION
    assert np.mean(logits["int8"].argmax(-1) == logits["none"].argmax(-1)) >= INT8_MIN_AGREEMENT


@pytest.mark.slow
def test_benchmark_int8_tool(model_folder, tmp_path, capsys):
    """tools/benchmarks/benchmark_int8.py on the tiny model: three files, their figures and timings."""
    tool = load_tool("benchmark_int8")
    out = tmp_path / "files"
    tool.main([
        "--model", model_folder, "--data", DEV_CSV, "--calibration", TRAIN_CSV, "--out", str(out),
        "--max-examples", "8", "--calibration-examples", "8", "--runs", "3", "--warmup", "1",
    ])
    report = json.loads(capsys.readouterr().out)
    assert sorted(os.listdir(out)) == [f"model_{q}.tflite" for q in ("dynamic", "int8", "none")]
    for quantization, entry in report["artefacts"].items():
        assert entry["size_bytes"] == os.path.getsize(out / f"model_{quantization}.tflite")
        assert entry["latency"]["runs"] == 3 and 0 <= entry["accuracy"] <= 1
        assert 0 <= entry["versus_float"]["top1_agreement"] <= 1
    assert report["artefacts"]["none"]["versus_float"]["max_abs_diff"] == 0
    assert len(report["targets"]) == 4
