"""Adaptation: masked LM on the training texts before fine-tuning (`finetune(adapt_steps=...)`)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from kbert.cli import main
from kbert.pretraining.adapt import adapt, adaptation_text
from kbert.tasks import TASKS
from kbert.training.distill import distill
from kbert.training.finetune import finetune
from tests.task_harness import ROOT, minilm_vocabulary, task_instance

MRPC = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "glue-mrpc")
PAIRS = "text-pair-classification"
# A tiny recipe: one epoch of batches of 4 pairs, packed to 32 pieces.
TINY = {"task": PAIRS, "batch_size": 4, "sequence_length": 32, "epochs": 1, "dtype": "float32", "verbose": 0}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A one-block BERT on MiniLM's vocabulary (a Hugging Face folder) and 24 MRPC training pairs."""
    from kbert.checkpoints import save_hf_checkpoint
    from kbert.config import BertConfig
    from kbert.models import bert_encoder

    folder = tmp_path_factory.mktemp("adaptation")
    config = BertConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=64)
    keras.utils.set_random_seed(0)
    save_hf_checkpoint(bert_encoder(config), config, list(minilm_vocabulary()), str(folder / "bert"))
    with open(os.path.join(MRPC, "train.tsv"), encoding="utf-8") as f:
        lines = f.readlines()[:25]
    (folder / "pairs.tsv").write_text("".join(lines), encoding="utf-8")
    return folder


def _weights(model_folder):
    model = keras.saving.load_model(os.path.join(model_folder, "model.keras"), compile=False)
    return model.get_weights()


class _StartingEmbeddings(keras.callbacks.Callback):
    """Keeps the token embeddings fine-tuning starts from, and those of the adapted encoder beside them."""

    def __init__(self, adapted_folder):
        super().__init__()
        self.adapted_folder = adapted_folder

    def on_train_begin(self, logs=None):
        from kbert.checkpoints import load_hf_checkpoint

        self.start = _token_embeddings(self.model)
        if os.path.isdir(self.adapted_folder):
            self.adapted = _token_embeddings(load_hf_checkpoint(self.adapted_folder).encoder)


def _token_embeddings(model):
    vocabulary_size = len(minilm_vocabulary())
    return next(w.numpy() for w in model.weights if tuple(w.shape) == (vocabulary_size, 16))


def test_fine_tuning_starts_from_the_encoder_adapted_on_the_training_texts(tiny, tmp_path):
    from kbert.checkpoints import load_hf_checkpoint

    pairs, bert = str(tiny / "pairs.tsv"), str(tiny / "bert")
    adapted = str(tmp_path / ".kbert-resume-m" / "adaptation" / "encoder")
    spy = _StartingEmbeddings(adapted)
    lines = []
    figures = finetune(pairs, pairs, bert, str(tmp_path / "m"), adapt_steps=4, callbacks=[spy], log=lines.append,
                       **TINY)
    np.testing.assert_array_equal(spy.start, spy.adapted)
    assert np.abs(spy.start - _token_embeddings(load_hf_checkpoint(bert).encoder)).max() > 1e-4
    assert "adaptation: 4 masked-LM steps of 4 on 48 training texts" in "\n".join(lines)
    assert figures["adaptation"]["steps"] == 4 and np.isfinite(figures["adaptation"]["masked_lm_loss"])
    with open(tmp_path / "m" / "kbert.json") as f:
        assert json.load(f)["training"]["adapt_steps"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # the resume folder, the adaptation in it, is gone

    spy = _StartingEmbeddings(str(tmp_path / ".kbert-resume-not-adapted" / "adaptation" / "encoder"))
    finetune(pairs, pairs, bert, str(tmp_path / "not-adapted"), adapt_steps=0, callbacks=[spy], **TINY)
    assert not hasattr(spy, "adapted")
    np.testing.assert_array_equal(spy.start, _token_embeddings(load_hf_checkpoint(bert).encoder))


def test_finetune_chooses_the_pair_order_on_dev_and_evaluate_reads_it(tiny, tmp_path, capsys):
    """The order kept is the model folder's: `kbert evaluate` gives finetune's dev figures,
    and with the other `--pair-order`, those finetune measured for it."""
    pairs, bert, out = str(tiny / "pairs.tsv"), str(tiny / "bert"), str(tmp_path / "m")
    figures = finetune(pairs, pairs, bert, out, adapt_steps=0, **TINY)
    chosen = figures["pair_order"]
    assert f"the model reads pairs {'both ways' if chosen == 'both' else 'as given'} (--pair-order {chosen})" in (
        capsys.readouterr().err
    )
    other, other_figures = ("given", figures["given_order"]) if chosen == "both" else ("both", figures["both_orders"])
    with open(tmp_path / "m" / "kbert.json") as f:
        assert json.load(f)["task_settings"]["pair_order"] == chosen
    capsys.readouterr()
    for flags, expected in (([], figures), (["--pair-order", other], other_figures)):
        assert main(["evaluate", "--model", out, "--data", pairs, *flags]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert {key: printed[key] for key in ("accuracy", "f1")} == {key: expected[key] for key in ("accuracy", "f1")}


def test_a_student_chooses_its_own_pair_order_unless_one_is_given(tiny, tmp_path, capsys):
    """`distill` chooses the student's pair order on dev, as finetune chose the teacher's (the
    teacher's choice was made on its own outputs); a --pair-order given is kept."""
    pairs, bert, teacher = str(tiny / "pairs.tsv"), str(tiny / "bert"), str(tmp_path / "teacher")
    finetune(pairs, pairs, bert, teacher, adapt_steps=0, options={"pair_order": "both"}, **TINY)
    recipe = {key: TINY[key] for key in ("batch_size", "epochs", "dtype", "verbose")}

    def stored(folder):
        with open(tmp_path / folder / "kbert.json") as f:
            return json.load(f)["task_settings"]["pair_order"]

    capsys.readouterr()
    chosen = distill(teacher, pairs, pairs, str(tmp_path / "chosen"), student=bert, **recipe)
    assert f"the model reads pairs {'both ways' if chosen['pair_order'] == 'both' else 'as given'}" in (
        capsys.readouterr().err
    )
    assert stored("chosen") == chosen["pair_order"] and {"given_order", "both_orders"} & set(chosen)
    kept = distill(teacher, pairs, pairs, str(tmp_path / "kept"), student=bert, options={"pair_order": "both"},
                   **recipe)
    assert "pair_order" not in kept and "the model reads pairs" not in capsys.readouterr().err
    assert stored("kept") == "both"


def test_a_complete_adaptation_is_kept_for_the_run_that_resumes(tiny, tmp_path):
    texts = [f"text number {i} of forty, and the same again" for i in range(40)] * 2
    vocabulary = list(minilm_vocabulary())
    distinct, sequences = adaptation_text(texts, vocabulary, 16, True)
    args = (distinct, sequences, str(tmp_path / "a"), str(tiny / "bert"), vocabulary, True, 2, 4, 16)
    lines = []
    first = adapt(*args, dtype="float32", verbose=0, log=lines.append)
    assert adapt(*args, dtype="float32", verbose=0, log=lines.append) == first
    assert lines[-1] == f"adaptation: done in an earlier run, kept in {tmp_path / 'a'}"
    assert lines[0].startswith("adaptation: 2 masked-LM steps of 4 on 40 training texts")  # each distinct once
    assert lines[0].endswith("; adapt_steps=0, --adapt-steps 0, skips it)")


def test_adaptation_shows_and_keeps_the_masked_lm_figures_alone(tiny, tmp_path, capsys):
    """Its text has no sentence pairs: the next-sentence loss and accuracy, 0 throughout, are not shown."""
    from kbert.pretraining.run_folder import HISTORY_FILE

    texts = [f"text number {i} of forty, and the same again" for i in range(40)]
    vocabulary = list(minilm_vocabulary())
    distinct, sequences = adaptation_text(texts, vocabulary, 16, True)
    adapt(distinct, sequences, str(tmp_path / "a"), str(tiny / "bert"), vocabulary, True, 4, 4, 16,
          dtype="float32", verbose=2, log=lambda line: None)
    printed = capsys.readouterr().out
    assert "masked_lm_accuracy: " in printed and "next_sentence" not in printed
    with open(tmp_path / "a" / HISTORY_FILE) as f:
        history = json.load(f)
    assert history["settings"]["next_sentence"] is False
    assert [sorted(window) for window in history["windows"]] == [sorted([
        "loss", "masked_lm_loss", "masked_lm_accuracy", "step", "learning_rate", "seconds", "sequences_per_second",
    ])]


def test_too_little_text_is_refused_with_its_measure_before_anything_is_written(tiny, tmp_path):
    with pytest.raises(ValueError, match=r"^the 1 training texts fill no sequence of 32 pieces; .*--adapt-steps 0"):
        adaptation_text(["a short text"], list(minilm_vocabulary()), 32, True)
    (tmp_path / "two.tsv").write_text("sentence1\tsentence2\tlabel\na cat\ta dog\t0\na bird\ta fish\t1\n")
    with pytest.raises(ValueError, match=r"^the 4 training texts fill no sequence of 32 pieces; "):
        finetune(str(tmp_path / "two.tsv"), str(tmp_path / "two.tsv"), str(tiny / "bert"), str(tmp_path / "m"),
                 **TINY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two.tsv"]


def test_pair_texts_are_both_sentences_in_order():
    examples = TASKS[PAIRS].read(os.path.join(MRPC, "dev.tsv"))[:2]
    texts = task_instance(PAIRS, {"labels": ["0", "1"]}).texts(examples)
    assert texts == [examples[0].texts[0], examples[0].texts[1], examples[1].texts[0], examples[1].texts[1]]


def test_bad_adaptation_settings_are_refused_before_data_is_read(tiny, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"^adapt_steps=-1; expected an integer of 0 or more$"):
        finetune("missing.tsv", "missing.tsv", "all-minilm-l6-v2", str(tmp_path / "m"), task=PAIRS, adapt_steps=-1)
    pairs = str(tiny / "pairs.tsv")
    argv = ["finetune", "--task", PAIRS, "--train", pairs, "--dev", pairs,
            "--init", "all-minilm-l6-v2", "--out", str(tmp_path / "m")]
    with pytest.raises(SystemExit):
        main([*argv, "--adapt-steps", "-1"])
    assert "--adapt-steps: -1 is not an integer of 0 or more" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_finetune_command_adapts_and_says_so(tiny, tmp_path, capsys):
    pairs = str(tiny / "pairs.tsv")
    argv = ["finetune", "--task", PAIRS, "--train", pairs, "--dev", pairs, "--init", str(tiny / "bert"),
            "--out", str(tmp_path / "m"), "--adapt-steps", "2", "--batch-size", "4", "--seq-len", "32",
            "--epochs", "1", "--dtype", "float32"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["adaptation"]["steps"] == 2 and set(printed["dev"]) >= {"accuracy", "f1"}


def test_a_deterministic_run_adapts_to_the_same_weights_in_another_process(tiny, tmp_path):
    """`--deterministic` holds for the recipe that adapts: the same command, run in
    another process, ends with the same weights, bit for bit."""
    pairs = str(tiny / "pairs.tsv")
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    for name in ("first", "second"):
        run = subprocess.run(
            [sys.executable, "-m", "kbert.cli", "finetune", "--task", PAIRS, "--train", pairs, "--dev", pairs,
             "--init", str(tiny / "bert"), "--out", str(tmp_path / name), "--adapt-steps", "8",
             "--batch-size", "4", "--seq-len", "32", "--epochs", "1", "--dtype", "float32", "--deterministic"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        )
        assert run.returncode == 0, run.stdout[-3000:]
    first, second = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("first", "second"))
    assert first["adaptation"]["steps"] == 8
    assert first["adaptation"]["masked_lm_loss"] == second["adaptation"]["masked_lm_loss"]
    for a, b in zip(_weights(tmp_path / "first"), _weights(tmp_path / "second"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_task_model_adapts_as_finetune_does(tiny, tmp_path, capsys):
    """`TaskModel.adapt` then `fit`: the encoder `kbert finetune`'s adaptation gives for
    the same seed, the head untouched, and the run kept in `folder`, which names
    where it started as messages do: not the temporary folder it was written to."""
    import kbert

    pairs, bert = str(tiny / "pairs.tsv"), str(tiny / "bert")
    spy = _StartingEmbeddings(str(tmp_path / ".kbert-resume-m" / "adaptation" / "encoder"))
    finetune(pairs, pairs, bert, str(tmp_path / "m"), adapt_steps=4, seed=3, callbacks=[spy], **TINY)
    examples = TASKS[PAIRS].read(pairs)
    x = ([e.texts[0] for e in examples], [e.texts[1] for e in examples])
    model = kbert.TaskModel.from_checkpoint(bert, task=PAIRS, labels=["0", "1"], sequence_length=32)
    head = [w.copy() for w in model.network.get_layer("head").get_weights()]
    capsys.readouterr()
    figures = model.adapt(x, steps=4, batch_size=4, folder=str(tmp_path / "adapted"), seed=3, verbose=0)
    warning = "kbert: warning: the TaskModel's encoder has no cls.predictions, cls.seq_relationship; initialised anew"
    assert warning in capsys.readouterr().err
    with open(tmp_path / "adapted" / "history.json") as f:
        assert json.load(f)["settings"]["init"] == "the TaskModel's encoder"
    assert figures["steps"] == 4 and np.isfinite(figures["masked_lm_loss"])
    # The same values to the bit, also after the file's other tests (when masks were drawn row
    # by row in thread order, up to 1.9e-4 apart). Another seed moves every row.
    np.testing.assert_array_equal(_token_embeddings(model.network), spy.start)
    for before, after in zip(head, model.network.get_layer("head").get_weights()):
        np.testing.assert_array_equal(before, after)
    assert (tmp_path / "adapted" / "encoder" / "model.safetensors").is_file()
    model.fit(x, [e.target for e in examples], batch_size=4, epochs=1, verbose=0)


def test_task_model_adapts_only_with_steps(tiny):
    import kbert

    model = kbert.TaskModel.from_checkpoint(str(tiny / "bert"), labels=["a", "b"], sequence_length=32)
    with pytest.raises(ValueError, match=r"^steps=0 \(the recipe's\); expected a positive number of masked-LM steps$"):
        model.adapt(["a text"])
    with pytest.raises(ValueError, match=r"^steps=-2; expected a positive number"):
        model.adapt(["a text"], steps=-2)


def test_task_model_adapt_refuses_a_folder_it_did_not_write(tiny, tmp_path):
    import kbert

    pairs = TASKS[PAIRS].read(str(tiny / "pairs.tsv"))
    x = ([e.texts[0] for e in pairs], [e.texts[1] for e in pairs])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    model = kbert.TaskModel.from_checkpoint(str(tiny / "bert"), task=PAIRS, labels=["0", "1"], sequence_length=32)
    with pytest.raises(ValueError) as error:
        model.adapt(x, steps=2, batch_size=4, folder=str(tmp_path / "mine"), verbose=0)
    assert str(error.value) == f"folder={str(tmp_path / 'mine')!r} exists and is not empty; choose a new folder"
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
