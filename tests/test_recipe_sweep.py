"""tools/benchmarks/recipe_sweep.py: its rows are kbert's packer's, its train step is kbert's optimizer's."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kbert.tasks import get_task
from tests.task_harness import ROOT, load_tool, task_instance

DEBIAN = os.path.join(ROOT, "data", "debian-packages")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """`prepare` on 48 training and 24 dev rows of the Debian task, of 150-510 pieces."""
    folder = tmp_path_factory.mktemp("sweep")
    labels = None
    for name, count in (("train", 48), ("dev", 24)):
        with open(os.path.join(DEBIAN, f"{name}.csv"), encoding="utf-8") as f:
            rows = [row for row in csv.DictReader(f) if labels is None or row["label"] in labels]
        # Cut at 128 pieces, whole at the prepared 512.
        rows = [row for row in rows if 1000 <= len(row["text"]) <= 1800][:count]
        labels = labels or {row["label"] for row in rows}
        with open(folder / f"{name}.csv", "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, ["text", "label"])
            writer.writeheader()
            writer.writerows(rows)
    sweep = load_tool("recipe_sweep")
    sweep.prepare(str(folder / "train.csv"), str(folder / "dev.csv"), "all-minilm-l6-v2", str(folder / "data"))
    return sweep, folder


@pytest.mark.parametrize("truncate, tail", [("head_tail", "half"), ("longest_first", 0)])
def test_rows_are_what_kbert_packs(prepared, truncate, tail):
    sweep, folder = prepared
    meta, data, _ = sweep.load(str(folder / "data"))
    task_class = get_task("text-classification")
    examples = task_class.read(str(folder / "dev.csv"))
    task = task_instance("text-classification", {"labels": meta["labels"], "truncate": truncate}, 128)
    expected = task.encode(examples, targets=False).features
    assert (expected["padding_mask"][:, -1] == 1).all()  # every row is cut
    assert (data["dev_len"] < 512).all()
    ids, mask = sweep.view(data["dev_ids"], data["dev_len"], 128, tail, meta["cls"], meta["sep"])
    np.testing.assert_array_equal(data["vocabulary_ids"][ids] * mask, expected["token_ids"])
    np.testing.assert_array_equal(mask, expected["padding_mask"])


STEP_CHECK = r"""
import json, sys
import numpy as np, jax.numpy as jnp, keras
sys.path.insert(0, {root!r})
from tests.task_harness import load_tool
from kbert.training import make_optimizer
sweep = load_tool("recipe_sweep")
meta, data, weights = sweep.load({data!r})
config, model = sweep.build(meta, weights)
x, mask = sweep.view(data["train_ids"], data["train_len"], 64, "half", meta["cls"], meta["sep"])
y = data["train_y"].astype("int32")
start = [np.asarray(v.value) for v in model.trainable_variables]
train_step, _ = sweep.make_functions(model, len(meta["labels"]))
state = [[jnp.asarray(w)[None] for w in start], [jnp.asarray(v.value)[None] for v in model.non_trainable_variables]]
m = [jnp.zeros_like(w) for w in state[0]]
v = [jnp.zeros_like(w) for w in state[0]]
batches = [slice(0, 16), slice(16, 32), slice(32, 48)]
ours, theirs = [], []
for t, rows in enumerate(batches):
    inputs = {{"token_ids": x[rows][None], "segment_ids": np.zeros_like(x[rows])[None], "padding_mask": mask[rows][None]}}
    state[0], state[1], m, v, loss = train_step(state[0], state[1], m, v, float(t), inputs, y[rows][None], 1e-3, 0.0,
                                                tuple(1.0 for _ in start))
    ours.append(float(loss[0]))
# kbert's optimizer, warmup 0 and a decay too long to matter: a rate of 1e-3.
model.compile(optimizer=make_optimizer("adamw", 1e-3, total_steps=10**9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
for rows in batches:
    inputs = {{"token_ids": x[rows], "segment_ids": np.zeros_like(x[rows]), "padding_mask": mask[rows]}}
    theirs.append(float(model.train_on_batch(inputs, y[rows])))
moved = sum(float(np.sum((np.asarray(w.value) - w0) ** 2)) for w, w0 in zip(model.trainable_variables, start))
apart = sum(float(np.sum((np.asarray(a[0]) - np.asarray(w.value)) ** 2)) for a, w in zip(state[0], model.trainable_variables))
print(json.dumps({{"ours": ours, "theirs": theirs, "relative": (apart / moved) ** 0.5}}))
"""


def _jax(code_or_args, tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    command = [sys.executable] + (["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args)
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_train_step_is_kbert_optimizers(prepared, tmp_path):
    """Three steps, the same dropout masks: the losses agree, and the weights to bfloat16's noise."""
    _, folder = prepared
    report = json.loads(_jax(STEP_CHECK.format(root=ROOT, data=str(folder / "data")), tmp_path).splitlines()[-1])
    np.testing.assert_allclose(report["ours"], report["theirs"], atol=1e-3)
    assert report["ours"][0] != report["ours"][-1]
    assert report["relative"] < 0.05


@pytest.mark.slow
def test_run_writes_a_record_per_seed_and_variant(prepared, tmp_path):
    _, folder = prepared
    out = tmp_path / "sweep.jsonl"
    tool = os.path.join(ROOT, "tools", "benchmarks", "recipe_sweep.py")
    stdout = _jax([tool, "run", "--data", str(folder / "data"),
                   "--seeds", "0-1", "--variants", "base,head_tail", "--max-train", "32",
                   "--max-dev", "8", "--out", str(out)], tmp_path)
    summaries = [json.loads(line) for line in stdout.splitlines()]
    assert [s["variant"] for s in summaries] == ["base", "head_tail"]
    records = [json.loads(line) for line in open(out)]
    assert [(r["variant"], r["seed"]) for r in records] == [
        ("base", 0), ("base", 1), ("head_tail", 0), ("head_tail", 1)
    ]
    for record in records:
        assert 0 <= record["accuracy"] <= 1 and 0 <= record["macro_f1"] <= 1
        assert np.isfinite(record["last_epoch_loss"])
    # The two seeds draw their own head, batches and masks.
    assert records[0]["last_epoch_loss"] != records[1]["last_epoch_loss"]


def test_prepare_replaces_only_its_own_folder(prepared, capsys):
    sweep, folder = prepared
    theirs = folder / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    argv = ["prepare", "--train", str(folder / "train.csv"), "--dev", str(folder / "dev.csv")]
    for out, message in (
        (theirs, "is not empty and is not a kbert recipe-sweep data folder"),
        (folder / "data", "holds a kbert recipe-sweep data folder; pass --overwrite to replace it"),
    ):
        with pytest.raises(SystemExit) as exit_:
            sweep.main([*argv, "--out", str(out)])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert (theirs / "notes.txt").read_text() == "mine" and sweep.is_prepared(str(folder / "data"))


def test_run_refuses_an_unknown_variant_and_another_backend(prepared, capsys):
    sweep, folder = prepared
    for argv, message in (
        (["--seeds", "3-x"], "--seeds: '3-x': expected seeds such as 0-31 or 0,1,5"),
        (["--variants", "base,middle"], "--variants: 'middle' is not one of base, head_tail"),
        ([], "run needs the JAX backend: KERAS_BACKEND=jax"),
    ):
        with pytest.raises(SystemExit) as exit_:
            sweep.main(["run", "--data", str(folder / "data"), "--out", str(folder / "x.jsonl"), *argv])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
