"""kbert.training.probe: the head starts as scikit-learn's logistic regression on the
frozen encoder's pooled [CLS] vectors; the recipe's switch and its refusals."""

import json

import keras
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from kbert.cli import main
from kbert.config import BertConfig
from kbert.models.heads import HEAD_LAYER
from kbert.recipes import check_probe
from kbert.tasks import get_task
from kbert.training.probe import probe_head
from tests.task_harness import TINY_LABELS, TINY_TEXTS, task_instance

TEXTS = [*TINY_TEXTS, "An editor for LaTeX documents.", "A card game for two players.", "A mail and news proxy."]
CONFIG = BertConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=64)


def probed(labels, targets, logs=None):
    """`(task, model, examples, head weights before)` after `probe_head` on `TEXTS`."""
    keras.utils.set_random_seed(0)
    task = task_instance("text-classification", {"labels": list(labels)})
    model = task.build_model(CONFIG)
    # A fresh encoder's [CLS] vectors hardly differ between texts: spread its weights.
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(variable.numpy() + rng.normal(0, 0.3, variable.shape))
    examples = task.examples_from_inputs(TEXTS, targets)
    before = [w.numpy() for w in model.get_layer(HEAD_LAYER).weights]
    probe_head(task, model, examples, log=None if logs is None else logs.append)
    return task, model, examples, before


@pytest.mark.parametrize("labels", [TINY_LABELS, TINY_LABELS[:2]], ids=["3 classes", "2 classes"])
def test_the_head_gives_scikit_learns_probabilities(labels):
    """The pooled vectors are computed here at full length in one batch (the probe
    runs rows in length buckets), and the regression fitted on them anew."""
    targets = [labels[i % len(labels)] for i in range(len(TEXTS))]
    logs = []
    task, model, examples, before = probed(labels, targets, logs)
    features = task.encode(examples).features
    (encoder,) = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    vectors = keras.ops.convert_to_numpy(encoder(features, training=False)["pooled_output"]).astype(np.float64)
    regression = LogisticRegression(C=1.0, max_iter=5000).fit(vectors, task.targets(examples))
    logits = keras.ops.convert_to_numpy(model(features, training=False))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert np.abs(probabilities - regression.predict_proba(vectors)).max() <= 1e-4
    assert np.abs(model.get_layer(HEAD_LAYER).weights[0].numpy() - before[0]).max() > 0.1
    assert len(logs) == 1 and logs[0].startswith("linear probe: the head starts as a logistic regression"), logs


def test_a_class_without_rows_leaves_the_head_as_it_is():
    targets = [TINY_LABELS[i % 2] for i in range(len(TEXTS))]
    logs = []
    _, model, _, before = probed(TINY_LABELS, targets, logs)
    for weight, start in zip(model.get_layer(HEAD_LAYER).weights, before):
        np.testing.assert_array_equal(weight.numpy(), start)
    assert logs == ["linear probe skipped: 1 of the head's 3 classes have no training row"]


def test_only_classifier_heads_take_a_probe():
    check_probe(get_task("text-classification"), True)
    check_probe(get_task("text-pair-classification"), True)
    check_probe(get_task("token-classification"), False)
    with pytest.raises(ValueError, match="task 'token-classification' has no classifier head"):
        check_probe(get_task("token-classification"), True)
    with pytest.raises(ValueError, match=r"probe_head='yes'; expected True or False"):
        check_probe(get_task("text-classification"), "yes")
    assert get_task("text-classification").recipe.probe_head
    assert not get_task("text-pair-classification").recipe.probe_head


def test_the_cli_refuses_a_probe_for_a_tagger_before_loading(tmp_path, capsys):
    data = tmp_path / "train.txt"
    data.write_text("EU B-ORG\nrejects O\n\n")
    code = main(["finetune", "--task", "token-classification", "--train", str(data), "--dev", str(data),
                 "--init", "all-minilm-l6-v2", "--out", str(tmp_path / "m"), "--probe-head"])
    err = capsys.readouterr().err
    assert code == 2 and "has no classifier head" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m").exists()


def test_kbert_json_records_the_switch(tmp_path, capsys):
    """`--no-probe-head` trains from a random head; kbert.json says which it ran."""
    import csv

    from kbert.checkpoints import save_hf_checkpoint
    from kbert.models import bert_encoder
    from tests.task_harness import minilm_vocabulary

    keras.utils.set_random_seed(0)
    save_hf_checkpoint(bert_encoder(CONFIG), CONFIG, list(minilm_vocabulary()), str(tmp_path / "bert"))
    with open(tmp_path / "data.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "label"), *((t, TINY_LABELS[i % 3]) for i, t in enumerate(TEXTS))])
    settings = {}
    for flag in ("--probe-head", "--no-probe-head"):
        out = tmp_path / flag.strip("-")
        code = main(["finetune", "--train", str(tmp_path / "data.csv"), "--dev", str(tmp_path / "data.csv"),
                     "--init", str(tmp_path / "bert"), "--out", str(out), "--epochs", "1", "--batch-size", "4",
                     "--seq-len", "32", flag])
        assert code == 0
        settings[flag] = json.loads((out / "kbert.json").read_text())["training"]["probe_head"]
        assert ("linear probe: the head starts" in capsys.readouterr().err) == (flag == "--probe-head")
    assert settings == {"--probe-head": True, "--no-probe-head": False}
