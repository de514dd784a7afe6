"""Pretraining TFRecords in google-research/bert's format: writing them and reading them back.

`write_pretraining_data` is `create_pretraining_data.py` made parallel: the
documents are dealt round-robin to shards, and each shard is tokenized, cut
into instances (`kbert.pretraining.instances`) and written by its own process
with its own seed, so a shard's bytes depend only on the corpus, the options,
the number of shards and the seed. `make_pretraining_dataset` reads these
records, or google's, as `(features, labels, sample_weights)` for `model.fit`.
"""

import functools
import json
import multiprocessing
import os
import random

from kbert.corpus import read_documents
from kbert.fileio import staged_folder
from kbert.models.pretrainer import MASKED_LM, NEXT_SENTENCE
from kbert.pretraining.instances import (
    DEFAULT_RANDOM_SEED,
    InstanceOptions,
    SpecialIds,
    create_training_instances,
)
from kbert.pretraining.records_folder import (
    METADATA_FILE,
    RECORDS_FORMAT,
    SHARD_PATTERN,
    VOCAB_FILE,
    WHAT,
    check_records_out,
    is_records_folder,
    read_records_metadata,
    records_names,
)

# Shards are a property of the data, not of the machine, so that a seed gives
# the same files everywhere; the process pool only decides how fast.
DEFAULT_NUM_SHARDS = 16
# Lines tokenized per call of the tokenizer inside a shard's process.
_TOKENIZE_BATCH = 4096
# google-research/bert's run_pretraining.py input_fn: records shuffled in a
# buffer of 100 after interleaving the (shuffled) files.
RECORD_SHUFFLE_BUFFER = 100


def feature_spec(max_seq_length, max_predictions_per_seq):
    """google-research/bert's `name_to_features` for its pretraining records."""
    import tensorflow as tf

    return {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def serialize_instance(instance, max_seq_length, max_predictions_per_seq):
    """A `TrainingInstance` as a serialized `tf.train.Example`, padded with zeros.

    Byte for byte deterministic (map keys sorted), so equal instances give
    equal files.
    """
    import tensorflow as tf

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    length = len(instance.tokens)
    num_predictions = len(instance.masked_lm_positions)
    pad = [0] * (max_seq_length - length)
    pad_predictions = [0] * (max_predictions_per_seq - num_predictions)
    features = {
        "input_ids": ints(list(instance.tokens) + pad),
        "input_mask": ints([1] * length + pad),
        "segment_ids": ints(list(instance.segment_ids) + pad),
        "masked_lm_positions": ints(list(instance.masked_lm_positions) + pad_predictions),
        "masked_lm_ids": ints(list(instance.masked_lm_labels) + pad_predictions),
        "masked_lm_weights": tf.train.Feature(
            float_list=tf.train.FloatList(
                value=[1.0] * num_predictions + [0.0] * len(pad_predictions)
            )
        ),
        "next_sentence_labels": ints([1 if instance.is_random_next else 0]),
    }
    example = tf.train.Example(features=tf.train.Features(feature=features))
    return example.SerializeToString(deterministic=True)


@functools.lru_cache(maxsize=2)
def _line_tokenizer(vocabulary, lowercase):
    """A traced function from a 1-D string tensor to ragged ids, kept per vocabulary."""
    import tensorflow as tf

    from kbert.text import WordPieceTokenizer

    # Text that spells "[MASK]" is plain text here, as in google-research/bert.
    tokenizer = WordPieceTokenizer(list(vocabulary), lowercase=lowercase, split_special_tokens=True)
    # One graph for all batches: about twice as fast as running op by op.
    return tf.function(tokenizer, input_signature=[tf.TensorSpec([None], tf.string)])


def _tokenize_documents(documents, vocabulary, lowercase):
    """Documents of text lines → documents of id lists, empty sentences dropped."""
    import tensorflow as tf

    tokenize = _line_tokenizer(tuple(vocabulary), lowercase)
    lines = [line for document in documents for line in document]
    ids = []
    for start in range(0, len(lines), _TOKENIZE_BATCH):
        ragged = tokenize(tf.constant(lines[start : start + _TOKENIZE_BATCH]))
        values, splits = ragged.flat_values.numpy(), ragged.row_splits.numpy()
        ids.extend(values[a:b].tolist() for a, b in zip(splits[:-1], splits[1:]))
    tokenized, offset = [], 0
    for document in documents:
        sentences = [sentence for sentence in ids[offset : offset + len(document)] if sentence]
        offset += len(document)
        tokenized.append(sentences)
    return tokenized


def _write_shard(task):
    """Tokenizes, cuts and writes one shard (runs in a worker process)."""
    import tensorflow as tf

    documents, vocabulary, lowercase, options, seed, path = task
    tokenized = _tokenize_documents(documents, vocabulary, lowercase)
    instances = create_training_instances(
        tokenized, options, SpecialIds.from_vocabulary(vocabulary), random.Random(seed)
    )
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with tf.io.TFRecordWriter(temporary) as writer:
            for instance in instances:
                writer.write(
                    serialize_instance(
                        instance, options.max_seq_length, options.max_predictions_per_seq
                    )
                )
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return path, len(instances), sum(len(i.masked_lm_positions) for i in instances)


def write_pretraining_data(
    corpus,
    vocabulary,
    output_dir,
    lowercase=True,
    max_seq_length=InstanceOptions.max_seq_length,
    max_predictions_per_seq=InstanceOptions.max_predictions_per_seq,
    masked_lm_prob=InstanceOptions.masked_lm_prob,
    dupe_factor=InstanceOptions.dupe_factor,
    short_seq_prob=InstanceOptions.short_seq_prob,
    whole_word_masking=False,
    random_seed=DEFAULT_RANDOM_SEED,
    num_shards=DEFAULT_NUM_SHARDS,
    num_workers=None,
    overwrite=False,
    progress=True,
):
    """Writes masked-LM / next-sentence TFRecords from raw text, like google-research/bert.

    Args:
        corpus: path, glob pattern or list of paths; one sentence per line, a
            blank line between documents; `.gz` files are decompressed.
        vocabulary: list of str or path of a `vocab.txt`. Must hold `[CLS]`,
            `[SEP]`, `[MASK]`; `[PAD]` should be id 0, since records pad with 0.
        output_dir: str. A new or empty folder, or one this function wrote
            (with `overwrite`): receives the shards
            `pretraining-0000i-of-0000n.tfrecord`, `vocab.txt` and
            `pretraining_data.json` (options and counts). It is written
            beside, then renamed (`kbert.fileio.staged_folder`).
        lowercase: bool. Tokenize uncased (as the vocabulary was learned).
        max_seq_length, max_predictions_per_seq, masked_lm_prob, dupe_factor,
        short_seq_prob: as google-research/bert's flags (defaults 128, 20,
            0.15, 10, 0.1).
        whole_word_masking: bool. Mask all pieces of a word together.
        random_seed: int. Shard i draws from `random.Random(random_seed + i)`;
            with one shard the draws are those of the original script.
        num_shards: int. Documents are dealt round-robin to this many shards
            (fewer if there are fewer documents); next-sentence negatives are
            drawn within a shard.
        num_workers: int or None. Processes (default: CPU count). Does not
            change the output.
        overwrite: bool. Replace the records of an earlier call in
            `output_dir`; a folder holding anything else is refused, as one
            that is not such records is, overwrite or not.
        progress: bool. Show a tqdm bar over shards.

    Returns:
        The sorted list of shard paths.

    The records parse with `feature_spec` (google's `name_to_features`).

    Example:
    >>> paths = write_pretraining_data("corpus.txt.gz", vocab, "records")  # doctest: +SKIP
    """
    from kbert.text import load_vocab

    options = InstanceOptions(
        max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq,
        masked_lm_prob=masked_lm_prob,
        dupe_factor=dupe_factor,
        short_seq_prob=short_seq_prob,
        whole_word_masking=whole_word_masking,
    )
    if isinstance(vocabulary, (str, os.PathLike)):
        vocabulary = load_vocab(vocabulary)
    vocabulary = list(vocabulary)
    SpecialIds.from_vocabulary(vocabulary)  # raises early if a special token is missing
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards={num_shards!r} must be a positive integer")
    if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
        raise ValueError(f"num_workers={num_workers!r} must be a positive integer or None")
    check_records_out(output_dir, overwrite)
    with staged_folder(output_dir, is_records_folder, overwrite, WHAT, records_names(output_dir)) as staging:
        counts = _write_records(corpus, vocabulary, staging, lowercase, options, random_seed, num_shards,
                                num_workers, progress)
    return [os.path.join(output_dir, name) for name in sorted(counts)]


def _write_records(corpus, vocabulary, output_dir, lowercase, options, random_seed, num_shards, num_workers,
                   progress):
    """Writes the shards, `vocab.txt` and the metadata into `output_dir`;
    returns {shard name: (sequences, predictions)}."""
    from kbert.text import save_vocab

    documents = read_documents(corpus)
    if not documents:
        raise ValueError(f"{corpus} holds no text (only blank lines, or nothing); expected one sentence a line, "
                         "a blank line between documents")
    num_shards = min(num_shards, len(documents))
    paths = [
        os.path.join(output_dir, SHARD_PATTERN.format(index=index, count=num_shards))
        for index in range(num_shards)
    ]
    tasks = [
        (documents[index::num_shards], vocabulary, lowercase, options, random_seed + index, path)
        for index, path in enumerate(paths)
    ]
    del documents
    results = _run(tasks, num_workers or os.cpu_count() or 1, progress)

    counts = {os.path.basename(path): (n, predictions) for path, n, predictions in results}
    save_vocab(vocabulary, os.path.join(output_dir, VOCAB_FILE))
    metadata = {
        "format": RECORDS_FORMAT,
        "max_seq_length": options.max_seq_length,
        "max_predictions_per_seq": options.max_predictions_per_seq,
        "masked_lm_prob": options.masked_lm_prob,
        "dupe_factor": options.dupe_factor,
        "short_seq_prob": options.short_seq_prob,
        "whole_word_masking": options.whole_word_masking,
        "random_seed": random_seed,
        "lowercase": lowercase,
        "vocab_size": len(vocabulary),
        "num_instances": sum(count[0] for count in counts.values()),
        "num_predictions": sum(count[1] for count in counts.values()),
        "shards": {name: counts[name][0] for name in sorted(counts)},
    }
    with open(os.path.join(output_dir, METADATA_FILE), "w") as f:
        json.dump(metadata, f, indent=2)
    return counts


def _run(tasks, num_workers, progress):
    from tqdm.auto import tqdm

    bar = tqdm(total=len(tasks), unit="shard", desc="pretraining data", disable=not progress)
    results = []
    try:
        if num_workers == 1 or len(tasks) == 1:
            for task in tasks:
                results.append(_write_shard(task))
                bar.update()
        else:
            # "spawn": forking a process that already runs TensorFlow can hang.
            context = multiprocessing.get_context("spawn")
            # Workers ignore Ctrl-C (a terminal sends it to them too): the
            # parent alone reports it, and the pool's exit stops them.
            with context.Pool(min(num_workers, len(tasks)), initializer=_ignore_interrupts) as pool:
                for result in pool.imap_unordered(_write_shard, tasks):
                    results.append(result)
                    bar.update()
    finally:
        bar.close()
    return results


def _ignore_interrupts():
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def read_metadata(output_dir):
    """The `pretraining_data.json` that `write_pretraining_data` left in `output_dir`."""
    return read_records_metadata(output_dir)


def _record_files(record_glob):
    import tensorflow as tf

    patterns = [record_glob] if isinstance(record_glob, (str, os.PathLike)) else record_glob
    files = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        if os.path.isdir(pattern):
            pattern = os.path.join(pattern, "*.tfrecord")
        files.extend(sorted(tf.io.gfile.glob(pattern)))
    if not files:
        raise ValueError(f"no TFRecord files match {record_glob!r}")
    return files


def _record_lengths(files):
    """(max_seq_length, max_predictions_per_seq) of the first record in `files`."""
    import tensorflow as tf

    for raw in tf.data.TFRecordDataset(files).take(1):
        example = tf.train.Example.FromString(raw.numpy())
        features = example.features.feature
        missing = [name for name in feature_spec(1, 1) if name not in features]
        if missing:
            raise ValueError(f"records in {files} lack the features {missing}")
        return (
            len(features["input_ids"].int64_list.value),
            len(features["masked_lm_positions"].int64_list.value),
        )
    return None


def make_pretraining_dataset(
    record_glob,
    batch_size,
    seq_len=None,
    max_predictions=None,
    shuffle=True,
    repeat=True,
    seed=None,
):
    """Batches of pretraining records for `BertPretrainer.fit`.

    Args:
        record_glob: a glob pattern, folder or list of them; records from
            `write_pretraining_data` or from google-research/bert's script.
        batch_size: int. Batches are full (the remainder is dropped), so
            shapes stay static for `jit_compile`.
        seq_len: int or None. The records' `max_seq_length` (None: read from
            the first record; a mismatch raises `ValueError`).
        max_predictions: int or None. The records' `max_predictions_per_seq`.
        shuffle: bool. Shuffle the files and, in a buffer of 100, the records
            (google's `input_fn`).
        repeat: bool. Repeat forever (then pass `steps_per_epoch` to `fit`).
        seed: int or None. Seed of the shuffles.

    Returns:
        A `tf.data.Dataset` of `(features, labels, sample_weights)`:
        features `token_ids`, `segment_ids`, `padding_mask` `(batch, seq_len)`
        and `masked_lm_positions` `(batch, max_predictions)`, int32; labels
        `masked_lm` `(batch, max_predictions)` and `next_sentence` `(batch,)`;
        sample weights `masked_lm` (google's `masked_lm_weights`: 0 on padded
        prediction slots) and `next_sentence` (ones).

    Example:
    >>> dataset = make_pretraining_dataset("records/*.tfrecord", 32)  # doctest: +SKIP
    >>> model.fit(dataset, steps_per_epoch=1000)  # doctest: +SKIP
    """
    import tensorflow as tf

    from kbert.text.datasets import without_autotune

    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    files = _record_files(record_glob)
    found = _record_lengths(files)
    if found is None:
        raise ValueError(f"the records of {record_glob!r} are empty")
    for name, given, actual in (
        ("seq_len", seq_len, found[0]),
        ("max_predictions", max_predictions, found[1]),
    ):
        if given is not None and given != actual:
            raise ValueError(f"{name}={given}, but the records of {record_glob!r} have {actual}")
    seq_len, max_predictions = found
    spec = feature_spec(seq_len, max_predictions)

    dataset = tf.data.Dataset.from_tensor_slices(files)
    if repeat:
        dataset = dataset.repeat()
    if shuffle:
        dataset = dataset.shuffle(len(files), seed=seed)
    dataset = dataset.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(len(files), 8),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=seed is not None or not shuffle,
    )
    if shuffle:
        dataset = dataset.shuffle(RECORD_SHUFFLE_BUFFER, seed=seed)
    dataset = dataset.batch(batch_size, drop_remainder=True)

    def parse(serialized):
        example = tf.io.parse_example(serialized, spec)
        ints = {
            name: tf.cast(value, tf.int32)
            for name, value in example.items()
            if value.dtype == tf.int64
        }
        features = {
            "token_ids": ints["input_ids"],
            "segment_ids": ints["segment_ids"],
            "padding_mask": ints["input_mask"],
            "masked_lm_positions": ints["masked_lm_positions"],
        }
        labels = {
            MASKED_LM: ints["masked_lm_ids"],
            NEXT_SENTENCE: ints["next_sentence_labels"][:, 0],
        }
        weights = {
            MASKED_LM: example["masked_lm_weights"],
            NEXT_SENTENCE: tf.ones([tf.shape(serialized)[0]], tf.float32),
        }
        return features, labels, weights

    return without_autotune(
        dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    )
