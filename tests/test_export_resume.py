"""The export's default plan, and its work folder: artefacts verified one at a
time, kept across an interrupt, reused by the same command and redone when
their inputs change (`kbert.export.resume`)."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from kbert.cli import main
from kbert.export import options, resume
from kbert.export.serving import serving_for
from kbert.tasks import TASKS
from tests.task_harness import task_instance
from tests.test_export_units import DEV_CSV, TRAIN_CSV, make_model_folder
from tests.test_tasks import SETTINGS

# Enough rows for each artefact to be judged; few enough to run in seconds.
EXAMPLES = 12
FAST = {"data": DEV_CSV, "calibration": TRAIN_CSV, "max_examples": EXAMPLES, "calibration_examples": 8,
        "latency_runs": 1, "formats": "tflite"}  # the default plan's TFLite files
TFLITE_FILES = [f"tflite/model_{q}.tflite" for q in ("none", "dynamic", "int8")]


# === The default plan ===


@pytest.mark.parametrize("name", sorted(TASKS))
def test_default_plan_is_what_the_docs_recommend(name):
    """SavedModel, float32 and dynamic int8 in TFLite and ONNX, full int8 where the
    task has a budget for it, the on-device file where the task has one; nothing else."""
    from kbert.export.exporter import _plan

    task = task_instance(name, SETTINGS[name])
    quantizations, text_variant = options.parse_quantizations(None)
    plan = _plan(task, None, quantizations, lambda line: None, text_variant)
    int8 = "int8" in task.budgets and "int8" not in serving_for(task).tflite_unsupported()
    expected = [("savedmodel", "none"), ("onnx", "none"), ("onnx", "dynamic"), ("tflite", "none"),
                ("tflite", "dynamic"), *([("tflite", "int8")] if int8 else [])]
    if serving_for(task).on_device:
        expected.append(("mediapipe", "none"))
    assert plan == expected


def test_quantize_all_is_the_full_matrix():
    from kbert.export.exporter import TEXT_VARIANT, _plan

    task = task_instance("text-classification", SETTINGS["text-classification"])
    quantizations, text_variant = options.parse_quantizations("all")
    plan = _plan(task, "tflite", quantizations, lambda line: None, text_variant)
    assert plan == [("tflite", q) for q in options.QUANTIZATIONS] + [("tflite", TEXT_VARIANT)]
    assert options.parse_quantizations("fp16,none") == (("none", "fp16"), True)
    assert options.parse_quantizations(" recommended ") == (options.RECOMMENDED_QUANTIZATIONS, False)
    with pytest.raises(ValueError, match="'all' and 'recommended' stand alone"):
        options.parse_quantizations("all,fp16")


def test_command_line_defaults():
    import argparse

    from kbert.cli.export import add_export_parser

    parser = argparse.ArgumentParser(prog="kbert")
    add_export_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["export", "--model", "m", "--out", "o", "--data", "d"])
    assert (args.quantize, args.max_examples, args.latency_runs) == ("recommended", 500, 20)
    given = ["export", "--model", "m", "--out", "o", "--data", "d", "--max-examples", "all"]
    assert parser.parse_args(given).max_examples is None
    for bad in ("0", "many"):
        with pytest.raises(SystemExit):
            parser.parse_args(["export", "--model", "m", "--out", "o", "--data", "d", "--max-examples", bad])


# === Kept, reused, redone ===


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_folder(tmp_path_factory.mktemp("model") / "tiny")


def _export(model, out, log=None, **kwargs):
    from kbert.export import export_model

    return export_model(model, str(out), log=log or (lambda line: None), **{**FAST, **kwargs})


def _interrupt_at(prefix):
    """A `log` that raises KeyboardInterrupt (as Ctrl-C would) at the first line starting with `prefix`."""

    def log(line):
        if line.startswith(prefix):
            raise KeyboardInterrupt

    return log


def _records(folder):
    with open(os.path.join(folder, resume.STEPS_FILE)) as f:
        return json.load(f)["steps"]


def test_an_interrupt_keeps_the_verified_artefacts_and_the_rerun_reuses_them(model_dir, tmp_path):
    out = tmp_path / "export"
    work = resume.work_path(str(out))
    with pytest.raises(KeyboardInterrupt):
        _export(model_dir, out, log=_interrupt_at("tflite/model_dynamic.tflite: converting"))
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(work)]  # no export, no staging
    assert resume.kept_artefacts(str(out)) == ["tflite/model_none.tflite"]
    assert sorted(_records(work)) == [resume.REFERENCE, "tflite/none"]
    assert not os.path.exists(os.path.join(work, "tflite", "model_dynamic.tflite"))
    kept = os.stat(os.path.join(work, "tflite", "model_none.tflite"))

    lines = []
    report = _export(model_dir, out, log=lines.append)
    assert report["reused"] == ["tflite/model_none.tflite"]
    assert [e["path"] for e in report["artefacts"]] == TFLITE_FILES
    assert [e["reused"] for e in report["artefacts"]] == [True, False, False]
    assert "tflite/model_none.tflite: reused from an earlier run of the same model, data and options" in lines
    assert "Keras reference: reused from an earlier run of the same model, data and options" in lines
    assert "TFLite: converting to float32" not in lines  # int8 quantizes the kept float32 file
    assert os.stat(out / "tflite" / "model_none.tflite").st_ino == kept.st_ino  # the very file
    assert report["artefacts"][0]["passed"] and report["artefacts"][1]["max_abs_diff"] > 0
    assert sorted(os.listdir(tmp_path)) == ["export"]
    assert json.load(open(out / "report.json"))["reused"] == ["tflite/model_none.tflite"]
    assert "Reused, as an earlier run of the same model, data and options verified them: " \
           "`tflite/model_none.tflite`." in (out / "report.md").read_text()


def test_a_step_whose_inputs_changed_is_redone(model_dir, tmp_path):
    """--overwrite reuses the replaced export's unchanged artefacts; other
    calibration redoes int8 alone; other data redoes all."""
    out = tmp_path / "export"
    first = _export(model_dir, out)
    assert first["reused"] == []
    assert _export(model_dir, out, overwrite=True)["reused"] == TFLITE_FILES
    recalibrated = _export(model_dir, out, overwrite=True, calibration_examples=6)
    assert recalibrated["reused"] == TFLITE_FILES[:2]
    assert recalibrated["artefacts"][2]["max_abs_diff"] != first["artefacts"][2]["max_abs_diff"]
    assert _export(model_dir, out, overwrite=True, max_examples=EXAMPLES - 1)["reused"] == []
    assert sorted(_records(out)) == ["tflite/dynamic", "tflite/int8", "tflite/none"]


@pytest.mark.slow
def test_another_model_redoes_every_step(model_dir, tmp_path):
    out = tmp_path / "export"
    _export(model_dir, out)
    other = make_model_folder(tmp_path / "other", seed=1)
    assert _export(other, out, overwrite=True)["reused"] == []


def test_a_changed_file_is_never_reused(model_dir, tmp_path):
    out = tmp_path / "export"
    work = resume.work_path(str(out))
    with pytest.raises(KeyboardInterrupt):
        _export(model_dir, out, log=_interrupt_at("tflite/model_int8.tflite: "))
    with open(os.path.join(work, "tflite", "model_dynamic.tflite"), "ab") as f:
        f.write(b"\0")
    os.remove(os.path.join(work, "tflite", "model_none.tflite"))
    report = _export(model_dir, out)
    assert report["reused"] == []
    assert all(e["max_abs_diff"] <= 1e-4 for e in report["artefacts"] if e["quantization"] == "none")


def test_a_plan_that_asks_less_drops_the_rest(model_dir, tmp_path):
    out = tmp_path / "export"
    with pytest.raises(KeyboardInterrupt):
        _export(model_dir, out, log=_interrupt_at("tflite/model_int8.tflite: "))
    report = _export(model_dir, out, quantizations="dynamic")
    assert report["reused"] == ["tflite/model_dynamic.tflite"]
    assert sorted(os.listdir(out / "tflite")) == ["model_dynamic.tflite"]


def test_nothing_of_the_users_is_removed(model_dir, tmp_path):
    out = tmp_path / "export"
    work = resume.work_path(str(out))
    with pytest.raises(KeyboardInterrupt):
        _export(model_dir, out, log=_interrupt_at("tflite/model_dynamic.tflite: converting"))
    with open(os.path.join(work, "notes.txt"), "w") as f:
        f.write("mine")
    refusal = f"^{re.escape(work)} holds notes.txt, which kbert did not write; move it aside$"
    with pytest.raises(ValueError, match=refusal):
        _export(model_dir, out)
    assert sorted(os.listdir(work)) == sorted(
        [".kbert-lock", ".kbert-reference.npz", resume.STEPS_FILE, "notes.txt", "tflite"]
    )
    # A folder of the user's where the export goes is refused before any work.
    os.remove(os.path.join(work, "notes.txt"))
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty and is not a kbert export folder"):
        _export(model_dir, out)
    assert os.listdir(out) == ["mine.txt"] and resume.kept_artefacts(str(out)) == ["tflite/model_none.tflite"]


def test_the_command_says_what_it_kept(model_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C on the second artefact: status 130, one line naming the kept one and
    the folder; the same command then finishes, reusing it."""
    from kbert.export import steps

    convert = steps.tflite_step

    def interrupted_on_dynamic(reference, sources, quantization, *args):
        if quantization == "dynamic":
            raise KeyboardInterrupt
        return convert(reference, sources, quantization, *args)

    monkeypatch.setattr(steps, "tflite_step", interrupted_on_dynamic)
    out = tmp_path / "export"
    argv = ["export", "--model", model_dir, "--out", str(out), "--data", DEV_CSV, "--formats", "tflite",
            "--max-examples", str(EXAMPLES), "--calibration-examples", "8", "--latency-runs", "1"]
    assert main(argv) == 130
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.endswith(
        f"kbert: interrupted; 1 verified artefact kept in {resume.work_path(str(out))}; "
        "run the same command again to reuse them\n"
    )
    monkeypatch.setattr(steps, "tflite_step", convert)
    status = main(argv)
    summary = json.loads(capsys.readouterr().out)
    assert status == (0 if summary["passed"] else 1)
    assert [(a["path"], a["reused"]) for a in summary["artefacts"]] == list(zip(TFLITE_FILES, [True, False, False]))


@pytest.mark.slow
def test_sigint_to_the_command_keeps_what_it_verified(model_dir, tmp_path):
    """A real Ctrl-C (SIGINT to `kbert export`) once the first artefact is judged."""
    out = tmp_path / "export"
    argv = [sys.executable, "-m", "kbert.cli", "export", "--model", model_dir, "--out", str(out), "--data", DEV_CSV,
            "--calibration", TRAIN_CSV, "--formats", "tflite",
            "--max-examples", str(EXAMPLES), "--calibration-examples", "8", "--latency-runs", "1"]
    # SIGINT at its default, as in a shell: a suite run in the background inherits it ignored.
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in process.stderr:
        if line.startswith("tflite/model_dynamic.tflite: converting"):
            process.send_signal(signal.SIGINT)
            break
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130 and stdout == "", stderr
    assert f"kbert: interrupted; 1 verified artefact kept in {resume.work_path(str(out))}" in stderr
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    summary = json.loads(rerun.stdout)
    assert rerun.returncode == (0 if summary["passed"] else 1), rerun.stderr
    assert [a["reused"] for a in summary["artefacts"]] == [True, False, False]
    assert sorted(os.listdir(tmp_path)) == ["export"]


@pytest.mark.slow
def test_a_kept_file_of_another_model_is_no_source(model_dir, tmp_path):
    """int8 quantizes the float32 file only where this run made or reused it: an
    interrupted run's float32 file of another model is not used."""
    other = make_model_folder(tmp_path / "other", seed=1)
    with pytest.raises(KeyboardInterrupt):
        _export(other, tmp_path / "export", log=_interrupt_at("tflite/model_dynamic.tflite: "))
    _export(model_dir, tmp_path / "export", quantizations="int8")
    _export(model_dir, tmp_path / "fresh", quantizations="int8")
    int8 = [(tmp_path / name / "tflite" / "model_int8.tflite").read_bytes() for name in ("export", "fresh")]
    assert int8[0] == int8[1]
