"""tools/benchmarks/recipe_data.py and gpu_recipes.py: the group split, the renumbered
vocabulary, and the seed-vmapped trainer (kbert's optimizer and schedule, on JAX)."""

import json
import os
import subprocess
import sys

import numpy as np

from tests.task_harness import ROOT, load_tool

TRAINER_CHECK = r"""
import json, os, sys
os.environ["KERAS_BACKEND"] = "jax"
sys.modules["tensorflow"] = None  # the GPU image has none
sys.path.insert(0, os.path.join(sys.argv[1], "tools", "benchmarks"))
import jax.numpy as jnp, keras, numpy as np
import gpu_recipes as g
from kbert.config import BertConfig
from kbert.fitting.optimizers import WarmupPolynomialDecay

config = BertConfig.from_preset("bert_tiny", vocab_size=40)
info = {"task": "text-classification", "settings": {"labels": ["a", "b"]}}
weights = {"weight." + v.path: v.numpy() for v in g.bert_encoder(config).weights}
seeds, rows = (0, 1), 48
rng = np.random.default_rng(0)
ids = rng.integers(7, 40, (rows, 16)).astype("int32")
labels = np.arange(rows) % 2
ids[:, 1:9] = 5 + labels[:, None]  # the class is in the first eight pieces
ids[:, 0], ids[:, -1] = 2, 3
data = {"token_ids": jnp.asarray(ids), "segment_ids": jnp.zeros_like(ids),
        "padding_mask": jnp.asarray(ids != 0), "targets": jnp.asarray(labels)}
model, state = g.initial_state("kbert", info, config, weights, "float32", seeds)
trainer = g.Trainer(model, regression=False)
steps = -(-rows // g.BATCH_SIZE)
epochs = 20
rates = g.schedule(3e-3, steps, epochs)
reference = WarmupPolynomialDecay(3e-3, steps * epochs, int(0.1 * steps * epochs))
index, weight = g.epoch_rows(rows, steps, seeds, 0)
losses = []
for epoch in range(epochs):
    index, weight = g.epoch_rows(rows, steps, seeds, epoch)
    state, loss = trainer.epoch(state, data, jnp.asarray(index), jnp.asarray(weight),
                                jnp.asarray(rates[epoch * steps:(epoch + 1) * steps]))
    losses.append(np.asarray(loss).mean(axis=0).tolist())
outputs = g.dev_outputs(trainer, state, data)
print(json.dumps({
    "losses": losses,
    "rates_match": float(np.abs(rates - [float(reference(s)) for s in range(len(rates))]).max()),
    "rows_once": all(sorted(index[:, s].reshape(-1)[weight[:, s].reshape(-1) > 0].tolist())
                     == list(range(rows)) for s in range(len(seeds))),
    "padding_weight": float(weight.sum()) / len(seeds),
    "outputs_shape": list(outputs.shape),
    "seeds_differ": float(np.abs(outputs[0] - outputs[1]).max()),
    "accuracy": g.gpu_figures(outputs, labels, info),
}))
"""


def test_groups_join_rows_that_share_a_run_of_words():
    data = load_tool("recipe_data")
    shared = " ".join(f"w{i}" for i in range(data.SHINGLE_WORDS))
    texts = [f"foo. {shared} tail", f"foo-data. {shared} other", "bar. nothing alike here", "baz."]
    groups = data.text_groups(texts)
    assert groups[0] == groups[1]
    assert len({groups[0], groups[2], groups[3]}) == 3


def test_group_split_holds_out_whole_groups(tmp_path):
    data = load_tool("recipe_data")
    words = [" ".join(f"g{g}w{i}" for i in range(data.SHINGLE_WORDS)) for g in range(40)]
    train = tmp_path / "train.csv"
    with open(train, "w", encoding="utf-8") as f:
        f.write("text,label\n")
        for g, run in enumerate(words):
            for copy in range(3):  # three binaries of one source package
                f.write(f"\"pkg{g}-{copy}. {run}\",l{g % 2}\n")
    counts = data.group_split(str(train), str(tmp_path / "split"))
    assert counts["groups"] == 40 and counts["dev_rows"] % 3 == 0
    assert counts["dev_rows"] + counts["train_rows"] == 120
    read = {name: (tmp_path / "split" / f"{name}.csv").read_text(encoding="utf-8") for name in ("train", "dev")}
    for run in words:
        assert (run in read["train"]) != (run in read["dev"])


def test_compact_vocabulary_renumbers_every_id_array():
    data = load_tool("recipe_data")
    arrays = {"a.token_ids": np.array([[101, 7, 102, 0]]), "b.token_ids": np.array([[101, 30000, 102, 0]]),
              "a.segment_ids": np.array([[0, 0, 1, 1]])}
    kept = data.compact_vocabulary(arrays, specials=[0, 101, 102])
    assert kept.tolist() == [0, 7, 101, 102, 30000]
    assert arrays["a.token_ids"].tolist() == [[2, 1, 3, 0]]
    assert arrays["b.token_ids"].tolist() == [[2, 4, 3, 0]]
    assert arrays["a.segment_ids"].dtype == np.uint8


def test_trainer_learns_per_seed_on_kbert_schedule():
    """A tiny classifier, two seeds vmapped: each row once an epoch, BERT's schedule, loss falls."""
    result = subprocess.run([sys.executable, "-c", TRAINER_CHECK, ROOT], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["rates_match"] < 1e-9
    assert report["rows_once"] and report["padding_weight"] == 48
    assert report["outputs_shape"] == [2, 48, 2]
    assert report["seeds_differ"] > 1e-3
    first, last = report["losses"][0], report["losses"][-1]
    assert all(b < a for a, b in zip(first, last)), report["losses"]
    assert all(figures["accuracy"] == 1.0 for figures in report["accuracy"]), report["accuracy"]


def test_group_split_is_the_same_in_every_process(tmp_path):
    """Python hashes strings differently in each process; the split must not follow it."""
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import recipe_data; "
              "recipe_data.group_split(sys.argv[2], sys.argv[3])")
    train = os.path.join(ROOT, "data", "debian-packages", "train.csv")
    held = []
    for hash_seed in ("1", "2"):
        out = tmp_path / hash_seed
        subprocess.run([sys.executable, "-c", script, os.path.join(ROOT, "tools", "benchmarks"), train, str(out)],
                       check=True, env={**os.environ, "PYTHONHASHSEED": hash_seed})
        held.append((out / "dev.csv").read_bytes())
    assert held[0] == held[1]
