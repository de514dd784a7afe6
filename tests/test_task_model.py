"""kbert.training.task_model.TaskModel: raw texts into fit and predict, saved whole, the
same training as `kbert finetune`, and a model folder the CLI takes."""

import csv

import keras
import numpy as np
import pytest

from kbert.cli import main
from kbert.modelfolder import ModelFolder
from kbert.training.finetune import finetune
from kbert.training.task_model import TaskModel
from tests.task_harness import TINY_LABELS, TINY_TEXTS, minilm_vocabulary

LABELS = list(TINY_LABELS)
TEXTS = [*TINY_TEXTS, "An editor for LaTeX documents.", "A card game for two players."]
TARGETS = [LABELS[i % 3] for i in range(len(TEXTS))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A one-block, 16-wide BERT on MiniLM's vocabulary, as a Hugging Face folder, and data."""
    from kbert.checkpoints import save_hf_checkpoint
    from kbert.config import BertConfig
    from kbert.models import bert_encoder

    folder = tmp_path_factory.mktemp("tiny")
    config = BertConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                        max_position_embeddings=128)
    save_hf_checkpoint(bert_encoder(config), config, list(minilm_vocabulary()), str(folder / "bert"))
    with open(folder / "data.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(zip(TEXTS, TARGETS))
    return folder


def trained(tiny, seed=0):
    keras.utils.set_random_seed(seed)
    model = TaskModel.from_checkpoint(str(tiny / "bert"), labels=LABELS, dtype="float32")
    model.compile()
    model.fit(TEXTS, TARGETS, epochs=2, batch_size=4, seed=seed, verbose=0)
    return model


def test_fit_on_raw_texts_trains_as_kbert_finetune(tiny, tmp_path):
    """The same seed gives the same dev outputs as `finetune` (same batches, steps, schedule)."""
    model = trained(tiny)
    finetune(str(tiny / "data.csv"), str(tiny / "data.csv"), str(tiny / "bert"), str(tmp_path / "m"),
             epochs=2, batch_size=4, dtype="float32", seed=0, verbose=0)
    folder = ModelFolder.load(str(tmp_path / "m"))
    assert folder.task.labels == LABELS
    examples = folder.task.examples_from_texts(TEXTS)
    reference = folder.task.run(folder.model, folder.task.encode(examples, targets=False).features)
    np.testing.assert_allclose(model.predict(TEXTS), reference["logits"], atol=1e-5)


def test_save_and_load_keep_the_tokenizer_and_labels(tiny, tmp_path):
    model = trained(tiny)
    logits = model.predict(TEXTS)
    assert logits.shape == (len(TEXTS), 3)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert isinstance(loaded, TaskModel) and loaded.task.labels == LABELS
    assert np.abs(loaded.predict(TEXTS) - logits).max() <= 1e-6
    answers = loaded.predict_labels(TEXTS[:2])
    assert [a["label"] in LABELS for a in answers] == [True, True]
    loaded.fit(TEXTS, [LABELS.index(t) for t in TARGETS], epochs=1, batch_size=4, verbose=0)


def test_folder_serves_the_cli(tiny, tmp_path, capsys):
    model = trained(tiny)
    model.save_folder(str(tmp_path / "folder"))
    folder = ModelFolder.load(str(tmp_path / "folder"))
    examples = folder.task.examples_from_texts(TEXTS)
    outputs = folder.task.run(folder.model, folder.task.encode(examples, targets=False).features)
    assert np.abs(outputs["logits"] - model.predict(TEXTS)).max() <= 1e-6
    assert main(["evaluate", "--model", str(tmp_path / "folder"), "--data", str(tiny / "data.csv")]) == 0
    assert '"accuracy"' in capsys.readouterr().out
    again = TaskModel.from_folder(str(tmp_path / "folder"))
    assert np.abs(again.predict(TEXTS) - model.predict(TEXTS)).max() <= 1e-6
    assert set(model.figures(TEXTS, TARGETS)) >= {"accuracy", "macro_f1"}


def test_pairs_and_bad_inputs(tiny):
    keras.utils.set_random_seed(0)
    pairs = TaskModel.from_checkpoint(str(tiny / "bert"), task="text-pair-classification", labels=2,
                                      dtype="float32")
    pairs.compile()
    pairs.fit((TEXTS[:4], TEXTS[4:]), [0, 1, 0, 1], epochs=1, batch_size=2, verbose=0)
    assert pairs.predict((TEXTS[:3], TEXTS[3:6])).shape == (3, 2)
    with pytest.raises(ValueError, match="takes 2 texts an example"):
        pairs.predict(TEXTS)
    with pytest.raises(ValueError, match="label index 5 is out of range"):
        pairs.fit((TEXTS[:2], TEXTS[2:4]), [0, 5], epochs=1)
    with pytest.raises(ValueError, match="does not take texts"):
        TaskModel.from_checkpoint(str(tiny / "bert"), task="token-classification", labels=["O"])
