"""Fine-tuning a BERT classifier on labelled text with `model.fit`, and the model folder.

A fine-tuned model folder holds:

| file | content |
| --- | --- |
| `model.keras` | the classifier (token ids -> logits) |
| `vocab.txt` | the WordPiece vocabulary |
| `labels.json` | class names in output order |
| `kbert.json` | `bert_config`, `sequence_length`, `lowercase` |
| `metrics.json` | dev figures and the training curve |
"""

import csv
import json
import os
import shutil
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from kbert.checkpoints.huggingface import init_encoder
from kbert.config import BertConfig
from kbert.fileio import replace_folder
from kbert.models import bert_classifier, rewire_encoder
from kbert.text import BertPreprocessor, WordPieceTokenizer, load_vocab, save_vocab
from kbert.training.distribute import (
    chief_folder,
    compile_for_strategy,
    get_strategy,
    log_batch_sizes,
)
from kbert.training.optimizers import make_optimizer

# BERT paper, section 4/A.3: warm up over the first 10% of steps.
DEFAULT_WARMUP_FRACTION = 0.1
MODEL_FILE = "model.keras"
VOCAB_FILE = "vocab.txt"
LABELS_FILE = "labels.json"
SETTINGS_FILE = "kbert.json"
METRICS_FILE = "metrics.json"


def read_labelled_csv(path, text_column="text", label_column="label", require_labels=True):
    """Reads `(texts, labels)` from a CSV file with a header row.

    Raises `ValueError` naming the file for a missing file, an empty file, a
    missing column or a row without a label.
    """
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            raise ValueError(f"{path} is empty; expected a CSV with a header row")
        wanted = [text_column] + ([label_column] if require_labels else [])
        missing = [column for column in wanted if column not in reader.fieldnames]
        if missing:
            raise ValueError(
                f"{path} has no column {missing[0]!r}; its columns are {reader.fieldnames}"
            )
        rows = list(reader)
    if not rows:
        raise ValueError(f"{path} has a header but no rows")
    texts = [row[text_column] or "" for row in rows]
    if not require_labels:
        return texts, None
    labels = [row[label_column] for row in rows]
    for line, label in enumerate(labels, start=2):
        if not label:
            raise ValueError(f"{path}, line {line}: empty {label_column!r}")
    return texts, labels


def encode_labels(labels, label_names, source="data"):
    """Maps label strings to ids; unknown labels raise `ValueError` naming them."""
    index = {name: i for i, name in enumerate(label_names)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
        raise ValueError(
            f"{source} has labels {unknown[:5]} that the model does not know; "
            f"expected one of {list(label_names)}"
        )
    return np.array([index[label] for label in labels], dtype="int32")


# Training batches are padded to a multiple of this many tokens (see
# `bucketed_dataset`): few enough shapes for XLA, little padding wasted.
BUCKET_WIDTH = 32


def bucketed_dataset(texts, labels, preprocessor, batch_size, seed=0):
    """Shuffled training batches of similar length, padded to a multiple of 32.

    Padding every batch to `sequence_length` wastes most of the compute on
    short texts; grouping texts by length keeps the batches dense while the
    number of distinct shapes (what XLA compiles for) stays small.

    Returns `(dataset, batches_per_epoch)`; the count is exact, since each
    bucket yields ceil(size / batch_size) batches whatever the shuffle.
    """
    sequence_length = preprocessor.sequence_length
    boundaries = list(range(BUCKET_WIDTH + 1, sequence_length + 1, BUCKET_WIDTH))
    boundaries.append(sequence_length + 1)
    lengths = np.sum(preprocessor(tf.constant(texts))["padding_mask"].numpy(), axis=1)
    bucket_sizes = np.bincount(np.searchsorted(boundaries, lengths, side="right"))
    batches = int(sum(-(-int(size) // batch_size) for size in bucket_sizes))

    def trim(features, label):
        length = tf.reduce_sum(features["padding_mask"])
        return {key: value[:length] for key, value in features.items()}, label

    ds = tf.data.Dataset.from_tensor_slices(
        (tf.constant(texts, dtype=tf.string), np.asarray(labels, "int32"))
    )
    ds = ds.shuffle(len(texts), seed=seed, reshuffle_each_iteration=True)
    ds = ds.map(lambda x, y: trim(preprocessor(x), y), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.bucket_by_sequence_length(
        lambda features, label: tf.shape(features["token_ids"])[0],
        bucket_boundaries=boundaries,
        bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
        pad_to_bucket_boundary=True,
    )
    ds = ds.apply(tf.data.experimental.assert_cardinality(batches))
    return ds.prefetch(tf.data.AUTOTUNE), batches


def text_dataset(texts, preprocessor, batch_size, labels=None, shuffle=False, seed=0):
    """A `tf.data.Dataset` of packed features (and labels) from raw strings."""
    inputs = tf.constant(texts, dtype=tf.string)
    if labels is None:
        ds = tf.data.Dataset.from_tensor_slices(inputs)
    else:
        ds = tf.data.Dataset.from_tensor_slices((inputs, np.asarray(labels, "int32")))
    if shuffle:
        ds = ds.shuffle(len(texts), seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size)
    if labels is None:
        ds = ds.map(preprocessor, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        ds = ds.map(lambda x, y: (preprocessor(x), y), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def classification_metrics(label_ids, predicted_ids, label_names):
    """Accuracy, macro-F1 and per-class F1 (Keras's F1Score on one-hot labels)."""
    num_classes = len(label_names)
    f1 = keras.metrics.F1Score(average=None)
    f1.update_state(
        keras.ops.one_hot(label_ids, num_classes), keras.ops.one_hot(predicted_ids, num_classes)
    )
    per_class = [float(v) for v in keras.ops.convert_to_numpy(f1.result())]
    return {
        "accuracy": float(np.mean(np.asarray(label_ids) == np.asarray(predicted_ids))),
        "macro_f1": float(np.mean(per_class)),
        "per_class_f1": dict(zip(label_names, per_class)),
        "n": int(len(label_ids)),
    }


class _StepLossLogger(keras.callbacks.Callback):
    """Keeps the training loss every `every` steps, for the curve in metrics.json."""

    def __init__(self, every):
        super().__init__()
        self.every = every
        self.curve = []
        self._step = 0

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self._step % self.every == 0 and logs and "loss" in logs:
            self.curve.append({"step": self._step, "loss": float(logs["loss"])})


def finetune(
    train_csv,
    dev_csv,
    init,
    out,
    text_column="text",
    label_column="label",
    sequence_length=128,
    batch_size=32,
    epochs=3,
    learning_rate=5e-5,
    warmup_fraction=DEFAULT_WARMUP_FRACTION,
    weight_decay=0.01,
    jit_compile=False,
    dtype=None,
    seed=0,
    vocab=None,
    lowercase=None,
    strategy="auto",
    verbose="auto",
):
    """Fine-tunes a classifier and writes the model folder `out`; returns metrics.

    Args:
        train_csv, dev_csv: str. CSV files with `text_column` and `label_column`.
        init: str. A Hugging Face checkpoint folder, a packaged checkpoint name
            (e.g. "all-minilm-l6-v2") or a `BertConfig` preset (random init;
            then `vocab` is required).
        out: str. Output folder, written aside and renamed into place.
        sequence_length: int. Packed length; longer texts are truncated.
        jit_compile: bool. Compile the train step with XLA.
        dtype: str. A dtype policy such as "mixed_bfloat16".
        strategy: str. A `tf.distribute` strategy name (see
            `kbert.training.distribute.STRATEGIES`); `batch_size` is global.
    """
    if batch_size < 1 or epochs < 1 or learning_rate <= 0:
        raise ValueError(
            f"batch_size={batch_size}, epochs={epochs}, lr={learning_rate}: expected "
            "positive values"
        )
    train_texts, train_labels = read_labelled_csv(train_csv, text_column, label_column)
    dev_texts, dev_labels = read_labelled_csv(dev_csv, text_column, label_column)
    label_names = sorted(set(train_labels))
    if len(label_names) < 2:
        raise ValueError(f"{train_csv} has {len(label_names)} distinct label(s); need at least 2")
    train_ids = encode_labels(train_labels, label_names, train_csv)
    dev_ids = encode_labels(dev_labels, label_names, dev_csv)

    keras.utils.set_random_seed(seed)
    strategy = get_strategy(strategy)
    log_batch_sizes(strategy, batch_size)
    with strategy.scope():
        config, encoder, vocabulary, init_lowercase = init_encoder(init, dtype=dtype)
    if vocab is not None:
        vocabulary = load_vocab(vocab)
    if vocabulary is None:
        raise ValueError(f"init={init!r} is a preset with no vocabulary; pass vocab=")
    if len(vocabulary) > config.vocab_size:
        raise ValueError(
            f"vocabulary has {len(vocabulary)} tokens but vocab_size={config.vocab_size}"
        )
    lowercase = init_lowercase if lowercase is None else lowercase
    config.check_sequence_length(sequence_length)

    tokenizer = WordPieceTokenizer(vocabulary, lowercase=lowercase)
    preprocessor = BertPreprocessor(tokenizer, sequence_length=sequence_length)
    train_ds, steps_per_epoch = bucketed_dataset(
        train_texts, train_ids, preprocessor, batch_size, seed=seed
    )
    dev_ds = text_dataset(dev_texts, preprocessor, batch_size, dev_ids)

    total_steps = steps_per_epoch * epochs
    with strategy.scope():
        model = bert_classifier(encoder, len(label_names), dtype=dtype)
        compile_for_strategy(
            model,
            strategy,
            jit_compile=jit_compile,
            optimizer=make_optimizer(
                "adamw",
                learning_rate,
                total_steps,
                warmup_steps=int(warmup_fraction * total_steps),
                weight_decay=weight_decay,
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
    if verbose == "auto":
        verbose = 1 if sys.stdout.isatty() else 2
    step_logger = _StepLossLogger(every=max(1, steps_per_epoch // 20))
    start = time.perf_counter()
    history = model.fit(
        train_ds,
        validation_data=dev_ds,
        epochs=epochs,
        callbacks=[step_logger],
        shuffle=False,  # the dataset shuffles itself
        verbose=verbose,
    )
    train_seconds = time.perf_counter() - start

    logits = model.predict(dev_ds, verbose=0)
    metrics = classification_metrics(dev_ids, np.argmax(logits, axis=-1), label_names)
    metrics.update(
        train_examples=len(train_texts),
        epochs=epochs,
        train_seconds=round(train_seconds, 1),
        train_sequences_per_second=round(len(train_texts) * epochs / train_seconds, 2),
        history={k: [float(v) for v in values] for k, values in history.history.items()},
        training_curve=step_logger.curve,
    )
    settings = {
        "bert_config": config.to_dict(),
        "sequence_length": sequence_length,
        "lowercase": lowercase,
        "init": init,
        "dtype": dtype,
    }
    # Under MultiWorkerMirroredStrategy only the chief writes `out`.
    with chief_folder(out, strategy) as folder:
        _write_model_folder(folder, model, vocabulary, label_names, settings, metrics)
    return metrics


def _write_model_folder(out, model, vocabulary, label_names, settings, metrics):
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".kbert-", dir=parent)
    try:
        model.save(os.path.join(staging, MODEL_FILE))
        save_vocab(vocabulary, os.path.join(staging, VOCAB_FILE))
        for name, value in ((LABELS_FILE, label_names), (SETTINGS_FILE, settings), (METRICS_FILE, metrics)):
            with open(os.path.join(staging, name), "w") as f:
                json.dump(value, f, indent=2)
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def encoder_dtype_policy(model):
    """The dtype policy a classifier's encoder computes under.

    The outer functional Model reports float32 whatever its layers do.
    """
    return model.get_layer("bert_encoder").get_layer("token_embedding").dtype_policy


class FinetunedModel:
    """A fine-tuned model folder loaded for inference.

    Attributes: `model` (keras.Model), `labels` (list of str), `config`
    (BertConfig), `sequence_length`, `tokenizer`, `preprocessor`.

    Example:
    >>> model = FinetunedModel.load("runs/debian-minilm")  # doctest: +SKIP
    >>> model.predict(["A text editor for the terminal."])  # doctest: +SKIP
    """

    def __init__(self, model, vocabulary, labels, settings):
        self.model = model
        self.vocabulary = vocabulary
        self.labels = labels
        self.config = BertConfig.from_dict(settings["bert_config"])
        self.sequence_length = settings["sequence_length"]
        self.lowercase = settings["lowercase"]
        self.tokenizer = WordPieceTokenizer(vocabulary, lowercase=self.lowercase)
        self.preprocessor = BertPreprocessor(self.tokenizer, sequence_length=self.sequence_length)

    @classmethod
    def load(cls, folder):
        if not os.path.isdir(folder):
            raise ValueError(f"{folder}: no such model folder")
        paths = {
            name: os.path.join(folder, name)
            for name in (MODEL_FILE, VOCAB_FILE, LABELS_FILE, SETTINGS_FILE)
        }
        missing = [name for name, path in paths.items() if not os.path.isfile(path)]
        if missing:
            raise ValueError(
                f"{folder} is not a kbert model folder: {', '.join(missing)} missing"
            )
        try:
            with open(paths[LABELS_FILE]) as f:
                labels = json.load(f)
            with open(paths[SETTINGS_FILE]) as f:
                settings = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{folder}: corrupt JSON ({error})") from None
        try:
            model = keras.saving.load_model(paths[MODEL_FILE])
        except Exception as error:  # Keras raises many types for a broken archive.
            raise ValueError(f"{paths[MODEL_FILE]} could not be loaded: {error}") from None
        return cls(model, load_vocab(paths[VOCAB_FILE]), labels, settings)

    @property
    def compute_dtype(self):
        """The dtype the encoder computes in: "bfloat16" for a mixed_bfloat16 model."""
        return encoder_dtype_policy(self.model).compute_dtype

    def float32_model(self):
        """The classifier computing in float32, on a copy of the same weights.

        A model trained under mixed precision keeps float32 variables but
        computes in bfloat16 or float16; exported artefacts compute in float32,
        and this is the Keras model they are held to. Returns `self.model` when
        it already computes in float32.
        """
        if self.compute_dtype == "float32":
            return self.model
        model = bert_classifier(self.config, len(self.labels), dtype="float32")
        model.set_weights(self.model.get_weights())
        return model

    @property
    def encoder(self):
        """The full encoder (every position), sharing the classifier's weights."""
        return rewire_encoder(self.model.get_layer("bert_encoder"), first_token_only=False)

    def scores(self, texts, batch_size=64):
        """Class probabilities, `(len(texts), num_classes)` float32."""
        if not texts:
            return np.zeros((0, len(self.labels)), "float32")
        logits = self.model.predict(
            text_dataset(list(texts), self.preprocessor, batch_size), verbose=0
        )
        return keras.ops.convert_to_numpy(keras.ops.softmax(logits, axis=-1))

    def predict(self, texts, batch_size=64):
        """`[{"text", "label", "scores"}]`, scores keyed by label."""
        scores = self.scores(texts, batch_size)
        return [
            {
                "text": text,
                "label": self.labels[int(np.argmax(row))],
                "scores": {label: float(s) for label, s in zip(self.labels, row)},
            }
            for text, row in zip(texts, scores)
        ]

    def evaluate(self, texts, labels, source="data", batch_size=64):
        label_ids = encode_labels(labels, self.labels, source)
        predicted = np.argmax(self.scores(texts, batch_size), axis=-1)
        return classification_metrics(label_ids, predicted, self.labels)
