"""tools/benchmarks/recipe_data.py and gpu_recipes.py: the group split, the renumbered
vocabulary, adaptation's sequences and masks, and the seed-vmapped trainers (kbert's
optimizer and schedule, on JAX)."""

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


ADAPTER_CHECK = r"""
import json, math, os, sys
os.environ["KERAS_BACKEND"] = "jax"
sys.modules["tensorflow"] = None  # the GPU image has none
sys.path.insert(0, os.path.join(sys.argv[1], "tools", "benchmarks"))
import jax, jax.numpy as jnp, keras, numpy as np
import gpu_recipes as g
from kbert.config import BertConfig

# The masks: 2,000 rows of 128 pieces, ids 5..39 in the body.
rng = np.random.default_rng(0)
ids = rng.integers(5, 40, (2000, 128)).astype("int32")
ids[:, 0], ids[:, -1] = 2, 3
masked, positions, labels = (np.asarray(a) for a in g.mask_batch(jax.random.PRNGKey(0), jnp.asarray(ids), 40, 4))
rows = np.arange(len(ids))[:, None]
outside = np.ones_like(ids, bool)
outside[rows, positions] = False
chosen_ids = masked[rows, positions]
masks = {
    "predictions": list(positions.shape),
    "distinct": all(len(set(row)) == len(row) for row in positions.tolist()),
    "in_body": bool(positions.min() >= 1 and positions.max() <= 126),
    "labels_are_the_ids": bool((labels == ids[rows, positions]).all()),
    "rest_unchanged": bool((masked[outside] == ids[outside]).all()),
    "mask_share": float((chosen_ids == 4).mean()),
    "kept_share": float((chosen_ids == labels).mean()),
    "positions_spread": float(np.bincount(positions.reshape(-1), minlength=128)[1:127].std()
                              / np.bincount(positions.reshape(-1), minlength=128)[1:127].mean()),
}

# A tiny BERT adapts: every row repeats one 6-piece phrase, so a masked piece is known from its neighbours.
config = BertConfig.from_preset("bert_tiny", vocab_size=40)
weights = {"weight." + v.path: v.numpy() for v in g.bert_encoder(config).weights}
phrases = rng.integers(5, 40, (8, 6))
sequences = np.stack([np.concatenate([[2], np.tile(phrases[i % 8], 3)[:16], [3]]) for i in range(64)]).astype("int32")
seeds = (0, 1)
adapter = g.Adapter(config, weights, "float32", seeds, 40, 4)
_, early = adapter.run(jnp.asarray(sequences), 20, seeds, chunk=20)
encoders, late = adapter.run(jnp.asarray(sequences), 300, seeds, chunk=100)
info = {"task": "text-classification", "settings": {"labels": ["a", "b"]}}
model, state = g.initial_state("kbert", info, config, weights, "float32", seeds, encoders)
paths = [v.path for v in model.trainable_variables]
embedding = next(p for p in encoders if p.endswith("token_embedding/embeddings"))
plain = g.initial_state("kbert", info, config, weights, "float32", seeds)[1]
head = [i for i, p in enumerate(paths) if p not in encoders]
index = g.adaptation_rows(64, 10, seeds)
print(json.dumps({
    "masks": masks, "early": early, "late": late,
    "encoder_weights": len(encoders), "encoder_variables": len(g.bert_encoder(config).trainable_variables),
    "placed": bool(np.array_equal(np.asarray(state[0][paths.index(embedding)]), np.asarray(encoders[embedding]))),
    "moved": float(np.abs(np.asarray(encoders[embedding][0]) - weights["weight." + embedding]).max()),
    "seeds_differ": float(np.abs(np.asarray(encoders[embedding][0]) - np.asarray(encoders[embedding][1])).max()),
    "heads_as_without": all(np.array_equal(np.asarray(state[0][i]), np.asarray(plain[0][i])) for i in head),
    "rows_each_pass": all(sorted(index[:2, s].reshape(-1).tolist()) == list(range(64)) for s in range(2)),
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


def test_adaptation_masks_as_tf_text_and_adapts_per_seed():
    """gpu_recipes's adaptation: BERT's masks, as many a row as kbert's pipeline draws,
    and a masked LM per seed that learns, its encoder then fine-tuned with the usual head."""
    result = subprocess.run([sys.executable, "-c", ADAPTER_CHECK, ROOT], capture_output=True, text=True,
                            timeout=900, env={**os.environ, "KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    masks = report["masks"]
    # ceil(0.15 x 126) = 19 distinct body positions a row, as RandomItemSelector takes them.
    assert masks["predictions"] == [2000, 19] and masks["distinct"] and masks["in_body"]
    assert masks["labels_are_the_ids"] and masks["rest_unchanged"]
    # 38,000 positions: 80% [MASK]; 10% kept, plus the random tenth's 1 in 40 draws of the same id.
    assert abs(masks["mask_share"] - 0.8) < 0.01, masks
    assert abs(masks["kept_share"] - (0.1 + 0.1 / 40)) < 0.01, masks
    assert masks["positions_spread"] < 0.1, masks
    early, late = report["early"], report["late"]
    assert all(b < a - 1.0 for a, b in zip(early["masked_lm_loss"], late["masked_lm_loss"])), (early, late)
    # Chance is 1 in 35 body ids; 300 steps at adaptation's 1e-4 reach 35-38%.
    assert all(accuracy > 0.2 for accuracy in late["masked_lm_accuracy"]), late
    assert report["encoder_weights"] == report["encoder_variables"]
    assert report["placed"] and report["moved"] > 1e-3 and report["seeds_differ"] > 1e-4
    assert report["heads_as_without"] and report["rows_each_pass"]


def test_adaptation_sequences_are_the_pipelines_packing(tmp_path):
    """recipe_data's adaptation rows: the distinct training texts' pieces in order, cut
    into [CLS] + 126 + [SEP], the remainder dropped, as `kbert finetune` adapts on them."""
    from kbert.tasks import get_task
    from kbert.text import WordPieceTokenizer
    from tests.task_harness import minilm_vocabulary

    data = load_tool("recipe_data")
    words = "the quick brown fox jumps over lazy dogs near riverbanks while accordions play".split()
    rng = np.random.default_rng(0)
    pairs = [(" ".join(rng.choice(words, 12)), " ".join(rng.choice(words, 9))) for _ in range(40)]
    pairs.append(pairs[0])  # a repeated pair is read once
    train = tmp_path / "train.tsv"
    train.write_text("sentence1\tsentence2\tlabel\n" + "".join(f"{a}\t{b}\t{i % 2}\n" for i, (a, b) in enumerate(pairs)))
    tokenizer = WordPieceTokenizer(list(minilm_vocabulary()), lowercase=True)
    rows = data.adaptation_sequences(get_task("text-pair-classification"), tokenizer, str(train), str(train))
    texts = list(dict.fromkeys(text for pair in pairs for text in pair))
    pieces = [int(i) for text in texts for i in tokenizer(text).numpy()]
    body = data.SEQUENCE_LENGTH - 2
    expected = [[tokenizer.cls_id, *pieces[i:i + body], tokenizer.sep_id]
                for i in range(0, len(pieces) // body * body, body)]
    assert len(expected) >= 3
    assert rows.tolist() == expected


SWAPPED_CHECK = r"""
import json, os, sys
os.environ["KERAS_BACKEND"] = "jax"
sys.modules["tensorflow"] = None  # the GPU image has none
sys.path.insert(0, os.path.join(sys.argv[1], "tools", "benchmarks"))
import jax.numpy as jnp, numpy as np
import gpu_recipes as g

# [CLS] 5 6 [SEP] 7 [SEP] and [CLS] 8 [SEP] 9 9 9 [SEP], then padding.
ids = np.array([[2, 5, 6, 3, 7, 3, 0, 0], [2, 8, 3, 9, 9, 9, 3, 0]], "int32")
segments = np.array([[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 0]], "int32")
dev = {"token_ids": jnp.asarray(ids), "segment_ids": jnp.asarray(segments),
       "padding_mask": jnp.asarray(ids != 0), "targets": jnp.asarray([1, 0])}
swapped = g.swapped_dev(dev)
rng = np.random.default_rng(0)
given, other = rng.normal(0, 3, (2, 5, 2)), rng.normal(0, 3, (2, 5, 2))
softmax = lambda z: np.exp(z) / np.exp(z).sum(-1, keepdims=True)
print(json.dumps({
    "token_ids": np.asarray(swapped["token_ids"]).tolist(),
    "segment_ids": np.asarray(swapped["segment_ids"]).tolist(),
    "padding_mask": np.asarray(swapped["padding_mask"]).tolist(),
    "targets": np.asarray(swapped["targets"]).tolist(),
    "merged_error": float(np.abs(softmax(g.both_ways(given, other)) - (softmax(given) + softmax(other)) / 2).max()),
}))
"""


def test_sweep_reads_dev_pairs_the_other_way_on_jax():
    """gpu_recipes' other order of the dev pairs is `[CLS] b [SEP] a [SEP]` with its segments and
    mask, and its merged outputs' softmax the mean of the two orders' (without TensorFlow)."""
    result = subprocess.run([sys.executable, "-c", SWAPPED_CHECK, ROOT], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["token_ids"] == [[2, 7, 3, 5, 6, 3, 0, 0], [2, 9, 9, 9, 3, 8, 3, 0]]
    assert report["segment_ids"] == [[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1, 1, 0]]
    assert report["padding_mask"] == [[True] * 6 + [False] * 2, [True] * 7 + [False]]
    assert report["targets"] == [1, 0]
    assert report["merged_error"] < 1e-6


def test_report_scores_pairs_in_the_order_finetune_keeps(tmp_path):
    """Where a sweep read the dev pairs both ways, each seed's figures are those `kbert
    finetune` keeps: both ways only when their accuracy is higher, else as given."""
    from kbert.tasks import get_task
    from tests.task_harness import task_instance

    report = load_tool("recipe_report")
    labels = np.arange(40) % 2
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence1\tsentence2\tlabel\n" + "".join(f"a{i}\tb{i}\t{y}\n" for i, y in enumerate(labels)))
    task_class = get_task("text-pair-classification")
    examples = task_class.read(str(dev), task_class.resolve_options({}))
    task = task_instance("text-pair-classification", {"labels": ["0", "1"]})  # one for both seeds, as the report's

    def logits(right, margin):
        """Logits right on the rows `right` by `margin`, wrong on the others by 1."""
        signs = np.where(right, margin, -1.0)
        return np.stack([-signs * (labels * 2 - 1), signs * (labels * 2 - 1)], axis=-1) / 2

    given = logits(np.arange(40) < 30, 1.0)  # 30 of 40 right
    mended = logits(np.arange(40) < 36, 4.0)  # the other order: 36, and surer, so the mean is right there too
    spoiled = logits(np.arange(40) < 20, 4.0)  # 20, and surer: the mean follows it
    softmax = lambda z: np.exp(z) / np.exp(z).sum(-1, keepdims=True)  # noqa: E731

    figures, as_given, order = report.tuned_score(task, examples, given, mended)
    mean = (softmax(given) + softmax(mended)) / 2
    assert order == "both"
    assert as_given["accuracy"] == 0.75
    assert figures["accuracy"] == float((mean.argmax(-1) == labels).mean()) > 0.75

    figures, as_given, order = report.tuned_score(task, examples, given, spoiled)
    assert order == "given"
    assert figures == as_given and figures["accuracy"] == 0.75


def test_report_table_says_which_seeds_read_pairs_both_ways():
    report = load_tool("recipe_report")
    common = {"data": "mrpc", "task": "text-pair-classification", "epochs": 5, "learning_rate": 1e-4,
              "adapt_steps": None, "figures": {"accuracy": [0.8, 0.01], "f1": [0.86, 0.01]}}
    table = report.markdown({"candidates": [
        {**common, "impl": "kbert", "pair_orders": ["both", "given", "both"],
         "figures_as_given": {"accuracy": [0.79, 0.01], "f1": [0.85, 0.01]}},
        {**common, "impl": "keras-hub"},
    ]})
    assert "| seeds read both ways | as given |" in table
    assert "| kbert | 5 | 0.0001 | 0.8000 ± 0.0100 | 0.8600 ± 0.0100 | 2 of 3 | 0.7900 / 0.8500 |" in table
    assert "| keras-hub | 5 | 0.0001 | 0.8000 ± 0.0100 | 0.8600 ± 0.0100 | — | — |" in table
