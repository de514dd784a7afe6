"""Training and validation batches of any task, as `tf.data` datasets.

A task says what its rows are and the trainer batches them here:
`Task.training_rows` gives either `Encoded` rows (packed arrays) or `Rows`
(one row made at a time, for sets too big to hold packed); `Encoded.learned`
marks the rows a model learns from (question answering leaves out the
windows of questions whose answer cannot be found), and `Encoded.group_size`
the rows that must stay together (a multiple-choice example's options):
batches then hold whole groups, each group's rows in order. A strategy of
several replicas splits each batch's rows evenly among them; for groups to
stay whole there too, a batch of groups holds a multiple of the replicas,
and the at most `replicas - 1` groups over are left out of that epoch (or
of validation). Nothing here tests a task's name.
"""

import keras
import numpy as np
import tensorflow as tf

from kbert.config import ENCODER_INPUTS
from kbert.tasks.records import Encoded
from kbert.tasks.inference import BUCKET_WIDTH, batches_by_length
from kbert.text.datasets import without_autotune

# Training batches on TensorFlow without XLA, where a new width costs no
# compile, hold rows of similar length padded to a multiple of this: the
# encoder blocks skip the padding but in attention's scores, whose cost
# grows with the square of the width.
FINE_BUCKET_WIDTH = 16
# Epoch e of a run with seed s is shuffled with the seed STRIDE * s + e, so
# epochs and seeds never share a shuffle.
EPOCH_SEED_STRIDE = 1_000_003


def training_bucket_width(jit_compile=False):
    """The length buckets of training batches: `FINE_BUCKET_WIDTH` where a
    new width is free (TensorFlow without XLA), `BUCKET_WIDTH` where each
    compiles a step of its own (XLA, and JAX, which always compiles).

    Without XLA the encoder blocks train over the real tokens alone
    (`kbert.models.train_on_real_tokens`), so only attention's scores pay
    for padding, and they pay for its square: batches drawn at random pad
    Debian's descriptions (89 pieces on average, a quarter cut at 128) to
    128 almost always; buckets of 16 pad them to 95 (a step: 0.76 s against
    0.87 s, `tools/benchmarks/profile_finetune.py`) for 221 batches an epoch instead
    of 219.
    """
    if jit_compile or keras.backend.backend() != "tensorflow":
        return BUCKET_WIDTH
    return FINE_BUCKET_WIDTH


def train_dataset(task, examples, batch_size, seed=0, epochs=1, first_epoch=0, bucket_width=None, replicas=1):
    """Shuffled training batches of `task`'s `examples`, epochs `first_epoch` .. `epochs - 1`.

    Each epoch is shuffled by a seed of its own, derived from `seed` and the
    epoch's number, so a run resumed at epoch k sees the batches an
    uninterrupted run sees from epoch k on. Each batch is padded to its
    longest row; with a `bucket_width` (`training_bucket_width`), rows of
    similar length are batched together and padded to a multiple of it.

    Returns:
        `(dataset, batches_per_epoch)`. The count is exact (with buckets,
        each gives ceil(size / batch_size) batches whatever the shuffle);
        fit with `steps_per_epoch=batches_per_epoch`. `replicas`: the
        strategy's `num_replicas_in_sync`, which grouped rows are batched for.
    """
    rows = task.training_rows(examples)
    if isinstance(rows, Encoded):
        return batched_dataset(task, rows, batch_size, seed, epochs, first_epoch, bucket_width, replicas)
    return _generated_dataset(task, rows, batch_size, seed, epochs, first_epoch, bucket_width, replicas)


def batched_dataset(task, encoded, batch_size, seed=0, epochs=1, first_epoch=0, bucket_width=None, replicas=1):
    """`train_dataset`'s batches of rows already encoded, with any targets.

    Args:
        encoded: `Encoded`. Its `targets` may be any structure of arrays
            with one row each (`kbert distill` adds the teacher's outputs);
            if the task `reads_sequence`, each row's targets with an axis of
            their own are cut and padded along it as the row's tokens are.
        batch_size, seed, epochs, first_epoch, bucket_width, replicas: as for `train_dataset`.

    With a `group_size` of K > 1, the epoch shuffles whole groups, a batch
    holds `batch_size` groups (`batch_size * K` rows, each group's rows
    together and in order), and a group goes to the bucket of its longest
    row; with several `replicas`, a multiple of them (the module's docstring).
    """
    encoded = _learned_rows(encoded)
    group = encoded.group_size
    features, targets = encoded.features, encoded.targets
    lengths = features["padding_mask"].sum(axis=1)
    if group > 1:
        # Elements are groups: every array gains an axis of K rows after the first.
        features, targets = tf.nest.map_structure(
            lambda t: np.asarray(t).reshape(-1, group, *np.shape(t)[1:]), (features, targets)
        )
        lengths = lengths.reshape(-1, group).max(axis=1)
    padding = tf.nest.map_structure(
        lambda target: tf.constant(task.target_padding, tf.as_dtype(target.dtype)), targets
    )

    def cut(value, used):
        """`value` cut to `used` along its length axis, the first of a row's."""
        return value[:, :used] if group > 1 else value[:used]

    def trim(features, target):
        used = tf.reduce_max(tf.reduce_sum(features["padding_mask"], axis=-1))
        trimmed = {key: cut(value, used) for key, value in features.items()}
        if task.reads_sequence:
            target = tf.nest.map_structure(
                lambda t: cut(t, used) if t.shape.rank > (group > 1) else t, target
            )
        return trimmed, target

    elements = tf.data.Dataset.from_tensor_slices((features, targets))

    def epoch(index):
        ds = elements.shuffle(len(lengths), seed=EPOCH_SEED_STRIDE * seed + index)
        return ds.map(trim, num_parallel_calls=tf.data.AUTOTUNE)

    return epoch_batches(
        epoch, lengths, batch_size, task.sequence_length, padding, epochs, first_epoch, bucket_width,
        group_size=group, replicas=replicas,
    )


def _generated_dataset(task, rows, batch_size, seed, epochs, first_epoch, bucket_width, replicas):
    """`train_dataset` of `Rows`: each epoch's rows (or groups) made in an order of its own."""
    group = rows.group_size
    lengths = np.asarray(rows.lengths).reshape(-1, group).max(axis=1)
    shape = [] if group == 1 else [group]
    row_spec = tf.TensorSpec([*shape, None], tf.int32)
    target_spec = {name: tf.TensorSpec(shape, tf.int32) for name in rows.targets}

    def element(index):
        if group == 1:
            return rows.row(index)
        return _stacked([rows.row(index * group + i) for i in range(group)])

    def generate(index):
        for element_index in np.random.default_rng([seed, index]).permutation(len(lengths)):
            yield element(element_index)

    def epoch(index):
        return tf.data.Dataset.from_generator(
            lambda: generate(index),
            output_signature=({name: row_spec for name in ENCODER_INPUTS}, target_spec),
        )

    padding = {name: tf.constant(task.target_padding, tf.int32) for name in rows.targets}
    return epoch_batches(
        epoch, lengths, batch_size, task.sequence_length, padding, epochs, first_epoch, bucket_width,
        group_size=group, replicas=replicas,
    )


def _stacked(group):
    """A group's `(features, targets)` rows as one element: features padded to its longest row."""
    width = max(len(features[ENCODER_INPUTS[0]]) for features, _ in group)
    features = {name: np.stack([np.pad(f[name], (0, width - len(f[name]))) for f, _ in group]).astype(np.int32)
                for name in ENCODER_INPUTS}
    targets = {name: np.array([t[name] for _, t in group], np.int32) for name in group[0][1]}
    return features, targets


def eval_dataset(task, encoded, batch_size, replicas=1):
    """`encoded`'s learned rows with their targets as `(features, targets)` batches
    of similar length, each cut to its width (`batches_by_length`), targets
    with a sequence axis too if the task `reads_sequence`: for metrics that
    add up over batches (`fit`'s validation), not in the rows' order.

    Rows of a group (`Encoded.group_size`) stay together and in order, as in
    training: a batch holds `batch_size` groups, as wide as their longest row,
    a multiple of the `replicas` (the module's docstring).
    """
    encoded = _learned_rows(encoded)
    group = encoded.group_size
    mask = encoded.features["padding_mask"]
    # A group's rows as one: the union of their padding masks is its longest row's.
    by_group = {"padding_mask": mask.reshape(-1, group, mask.shape[1]).max(axis=1)}
    keep = _groups_multiple(group, replicas)
    batches = [
        ((index[: len(index) // keep * keep, np.newaxis] * group + np.arange(group)).reshape(-1), width)
        for index, width in batches_by_length(by_group, batch_size, task.sequence_length)
        if len(index) >= keep
    ]

    def cut(index, width):
        features = {name: encoded.features[name][index, :width] for name in ENCODER_INPUTS}
        targets = tf.nest.map_structure(
            lambda t: t[index, :width] if task.reads_sequence and t.ndim > 1 else t[index],
            encoded.targets,
        )
        return features, targets

    row_spec = tf.TensorSpec([None, None], tf.int32)
    target_spec = tf.nest.map_structure(
        lambda t: tf.TensorSpec((None,) * t.ndim, tf.as_dtype(t.dtype)), cut(*batches[0])[1]
    )
    ds = tf.data.Dataset.from_generator(
        lambda: (cut(index, width) for index, width in batches),
        output_signature=({name: row_spec for name in ENCODER_INPUTS}, target_spec),
    )
    # A known count: Keras warns of data running out on a dataset of unknown size.
    ds = ds.apply(tf.data.experimental.assert_cardinality(len(batches)))
    return without_autotune(ds.prefetch(tf.data.AUTOTUNE))


def _learned_rows(encoded):
    """`encoded` without the rows its `learned` mask leaves out; a group is kept
    or left out whole."""
    if encoded.learned is None or encoded.learned.all():
        return encoded
    keep = np.asarray(encoded.learned, bool)
    by_group = keep.reshape(-1, encoded.group_size)
    split = np.flatnonzero(by_group.any(axis=1) != by_group.all(axis=1))
    if len(split):
        raise ValueError(
            f"Encoded.learned keeps part of group {split[0]} (rows {split[0] * encoded.group_size} "
            f"to {(split[0] + 1) * encoded.group_size - 1}); a group is learned whole or not at all"
        )
    return Encoded(
        {name: value[keep] for name, value in encoded.features.items()},
        tf.nest.map_structure(lambda t: np.asarray(t)[keep], encoded.targets),
        encoded.example_of_row[keep],
        group_size=encoded.group_size,
    )


def epoch_batches(
    epoch, lengths, batch_size, sequence_length, target_padding, epochs=1, first_epoch=0,
    bucket_width=None, group_size=1, replicas=1,
):
    """Training batches, epoch after epoch: `(dataset, batches_per_epoch)`.

    Args:
        epoch: callable(int) -> tf.data.Dataset of `(features, targets)` rows
            in that epoch's order, each cut to its used length; with a
            `group_size` above 1, groups of that many rows (arrays
            `(group_size, length, ...)`), each cut to its longest row.
        lengths: int array. Every row's (or group's) used length, in any order.
        batch_size: int. Rows (or groups) a batch.
        sequence_length: int. The longest row.
        target_padding: the targets' structure of scalar tensors that pad them.
        epochs, first_epoch: ints. The dataset holds epochs `first_epoch` ..
            `epochs - 1`, each batched on its own.
        bucket_width: int or None. None: batches in the epoch's order, each
            padded to its longest row. An int: rows of similar length batched
            together, each batch padded to a multiple of it (or to
            `sequence_length`).
        group_size: int. Rows an element of `epoch` holds; batches of groups
            come out as rows, each group's in order.
        replicas: int. With groups, a batch keeps a multiple of this many
            (the rest of a bucket's last batch is left out).

    The count is exact, since each bucket gives ceil(size / batch_size)
    batches whatever the order (with groups and replicas, its last batch
    only if it keeps a group for each replica).
    """
    padding_values = ({name: 0 for name in ENCODER_INPUTS}, target_padding)
    keep = _groups_multiple(group_size, replicas)

    def count(size):
        return size // batch_size + (size % batch_size >= keep)

    if bucket_width is None:
        batches = count(len(lengths))

        def batched(index):
            return epoch(index).padded_batch(batch_size, padding_values=padding_values)
    else:
        boundaries = list(range(bucket_width + 1, sequence_length + 1, bucket_width)) + [sequence_length + 1]
        bucket_sizes = np.bincount(np.searchsorted(boundaries, lengths, side="right"))
        batches = int(sum(count(int(size)) for size in bucket_sizes))

        def batched(index):
            return epoch(index).bucket_by_sequence_length(
                lambda features, target: tf.shape(features["token_ids"])[-1],
                bucket_boundaries=boundaries,
                bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
                pad_to_bucket_boundary=True,
                padding_values=padding_values,
            )

    ds = batched(first_epoch)
    for index in range(first_epoch + 1, epochs):
        ds = ds.concatenate(batched(index))
    if keep > 1:
        ds = ds.map(lambda features, targets: _first_groups(features, targets, keep))
        ds = ds.filter(lambda features, targets: tf.shape(features["token_ids"])[0] > 0)
    if group_size > 1:
        ds = ds.map(_rows_of_groups, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.apply(tf.data.experimental.assert_cardinality(batches * (epochs - first_epoch)))
    return without_autotune(ds.prefetch(tf.data.AUTOTUNE)), batches


def _groups_multiple(group_size, replicas):
    """What a batch's count of elements must be a multiple of: the replicas for
    groups (so that each replica's share is whole groups), else 1."""
    return replicas if group_size > 1 else 1


def _first_groups(features, targets, multiple):
    """A batch of groups cut to a `multiple` of groups (its first ones)."""
    kept = tf.shape(features["token_ids"])[0] // multiple * multiple
    return tf.nest.map_structure(lambda value: value[:kept], (features, targets))


def _rows_of_groups(features, targets):
    """A batch of groups `(batch, group_size, ...)` as its rows `(batch * group_size, ...)`."""

    def rows(value):
        return tf.reshape(value, tf.concat([[-1], tf.shape(value)[2:]], axis=0))

    return tf.nest.map_structure(rows, (features, targets))
