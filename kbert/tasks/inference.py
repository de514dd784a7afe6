"""Running a task's model: examples a chunk at a time, rows in batches of similar length.

`predict_chunks` encodes, runs and decodes examples a chunk at a time, so
that memory does not grow with their number: the model folder, `kbert
predict`, `embed`, `evaluate` and finetune's dev figures go through it, so
all run the same batches. `Task.run` calls the rest; the exporter asks the
task, never this module.
"""

import sys

import numpy as np

from kbert.config import ENCODER_INPUTS

# Batches of rows of similar length are padded to a multiple of this many
# tokens (`batches_by_length`, and training under XLA or JAX): few shapes to
# compile, little padding wasted.
BUCKET_WIDTH = 32
# Examples encoded, run and decoded at a time (`predict_chunks`): their rows
# are batched by length among themselves. Thousands keep padding as low as
# sorting the whole set does (64-row batches) and the encoded rows a few MB;
# at MiniLM's ~100 texts/s on 2 cores a chunk is ~20 s, `kbert predict`'s
# pace of output and of its progress lines.
CHUNK_EXAMPLES = 2048


def predict_chunks(task, examples, run, size=CHUNK_EXAMPLES):
    """`(chunk, predictions)` for each chunk of `examples` (`example_chunks`), in order.

    Args:
        task: the `Task`.
        examples: an iterable of the task's examples, read as it is used.
        run: callable(features) -> the model's outputs (`Task.run`).
        size: int. Examples a chunk.
    """
    for chunk in example_chunks(task, examples, size):
        encoded = task.encode(chunk, targets=False)
        yield chunk, task.decode(chunk, encoded, run(encoded.features))


def example_chunks(task, examples, size=CHUNK_EXAMPLES):
    """Lists of about `size` consecutive `examples` (any iterable), cut only
    between the groups the task reads as one (its `read_together`, if it has
    one: a document whose sentences share windows), so that each example is
    read as a run on all of them would read it; a group is never cut."""
    together = getattr(task, "read_together", None)
    chunk, wanted = [], size
    for example in examples:
        chunk.append(example)
        if len(chunk) < wanted:
            continue
        cut = len(chunk) if together is None else together(chunk)[-1].start  # the last group may go on
        if cut == 0:
            wanted = 2 * len(chunk)  # one group so far: read on (doubling keeps the cost linear)
            continue
        yield chunk[:cut]
        chunk, wanted = chunk[cut:], size
    if chunk:
        yield chunk


def joined(parts):
    """The predictions of consecutive chunks as those of one run: arrays
    concatenated, lists (one item per example) put end to end."""
    parts = list(parts)
    if not parts:
        raise ValueError("no examples to run the model on")
    if all(isinstance(part, np.ndarray) for part in parts):
        return np.concatenate(parts)
    return [item for part in parts for item in part]


def batches_by_length(features, batch_size, sequence_length, block=None):
    """Row indices in batches of similar length, each with its width: its longest
    row rounded up to `BUCKET_WIDTH` (at most `sequence_length`).

    Padding every batch to `sequence_length` would make short inputs
    (CoNLL's sentences: median 16 pieces; Debian's descriptions at 256:
    median 88) cost as much as the longest. `block`: rows are sorted within
    consecutive blocks of this many (None: all together).
    """
    lengths = np.maximum(np.asarray(features["padding_mask"]).sum(axis=1), 1)
    block = block or max(1, len(lengths))
    for first in range(0, len(lengths), block):
        order = first + np.argsort(lengths[first : first + block], kind="stable")
        for begin in range(0, len(order), batch_size):
            index = order[begin : begin + batch_size]
            width = -(-int(lengths[index].max()) // BUCKET_WIDTH) * BUCKET_WIDTH
            yield index, min(sequence_length, width)


def run_full_length(model, features, names, batch_size):
    """`model`'s outputs on every row at its full length, in order: a dict keyed by `names`."""
    check_rows(features)
    _expect_retracing()
    result = model.predict(
        {name: features[name] for name in ENCODER_INPUTS}, batch_size=batch_size, verbose=0
    )
    return check_finite(output_dict(result, names))


def run_by_length(model, features, names, sequence_length, batch_size):
    """`model`'s outputs of one row each (no sequence axis), a dict keyed by
    `names`: rows in batches of similar length, each cut to its width
    (`batches_by_length`), put back in the rows' order.

    `predict_on_batch` rather than `predict`, whose ~0.1 s of set-up per
    call is most of a single query's time. Rows are sorted by length within
    blocks of `CHUNK_EXAMPLES`, so that a run on all rows at once makes the
    batches that a run a chunk at a time (`predict_chunks`) makes where each
    example is one row: both give the same outputs to the last bit (batches
    of other widths round bfloat16 otherwise).
    """
    check_rows(features)
    _expect_retracing()
    chunks, order = [], []
    for index, width in batches_by_length(features, batch_size, sequence_length, CHUNK_EXAMPLES):
        batch = {name: np.asarray(features[name])[index, :width] for name in ENCODER_INPUTS}
        chunks.append(output_dict(_predict_batch(model, batch, len(index)), names))
        order.append(index)
    order = np.concatenate(order)
    outputs = {}
    for name in names:
        values = np.concatenate([np.asarray(chunk[name]) for chunk in chunks])
        outputs[name] = np.empty_like(values)
        outputs[name][order] = values
    return check_finite(outputs)


def _expect_retracing():
    """Keras's predict step traces once per batch width here: TensorFlow's warning of it is dropped."""
    if "tensorflow" in sys.modules:
        from kbert.quiet import drop_predict_retracing_warnings

        drop_predict_retracing_warnings()


def replicas(model):
    """The replicas a batch of `model`'s is split among: its TensorFlow
    strategy's `num_replicas_in_sync`; 1 on other backends."""
    strategy = getattr(model, "distribute_strategy", None)
    return strategy.num_replicas_in_sync if strategy is not None else 1


def _predict_batch(model, batch, rows):
    """`model`'s outputs on one batch. Under a strategy of several replicas,
    Keras's `predict_on_batch` runs the whole batch on each replica and gives
    their outputs end to end; `predict` splits the batch among them."""
    if replicas(model) > 1:
        return model.predict(batch, batch_size=rows, verbose=0)
    return model.predict_on_batch(batch)


def output_dict(result, names):
    """A model's outputs (a dict, a list or one array) as a dict keyed by `names`."""
    if isinstance(result, dict):
        return result
    return dict(zip(names, result if isinstance(result, (list, tuple)) else [result]))


def check_rows(features):
    """`ValueError` if `features` hold no row."""
    if not len(features[ENCODER_INPUTS[0]]):
        raise ValueError("no examples to run the model on")


class NonFiniteOutputs(ValueError):
    """A model gave NaN or infinity: its weights are broken."""


def check_finite(outputs):
    """`outputs` (a dict of arrays), or `NonFiniteOutputs` if one holds NaN or infinity."""
    bad = [name for name, value in outputs.items() if not np.all(np.isfinite(value))]
    if bad:
        raise NonFiniteOutputs(
            f"the model gives non-finite {bad[0]} (NaN or infinity): its weights are "
            "broken (diverged training?)"
        )
    return outputs


def softmax(logits, dtype=np.float32):
    """Softmax over the last axis, computed in float64, returned as `dtype`."""
    logits = np.asarray(logits, np.float64)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(dtype)
