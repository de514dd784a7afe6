"""Running a task's model on encoded rows: in batches of similar length, in order.

`Task.run` calls these; the model folder, `kbert predict`, `evaluate` and
the exporter ask the task, never this module.
"""

import sys

import numpy as np

from kbert.config import ENCODER_INPUTS

# Batches of rows of similar length are padded to a multiple of this many
# tokens (`batches_by_length`, and training under XLA or JAX): few shapes to
# compile, little padding wasted.
BUCKET_WIDTH = 32


def batches_by_length(features, batch_size, sequence_length):
    """Row indices in batches of similar length, each with its width: its longest
    row rounded up to `BUCKET_WIDTH` (at most `sequence_length`).

    Padding every batch to `sequence_length` would make short inputs
    (CoNLL's sentences: median 16 pieces; Debian's descriptions at 256:
    median 88) cost as much as the longest.
    """
    lengths = np.maximum(np.asarray(features["padding_mask"]).sum(axis=1), 1)
    order = np.argsort(lengths, kind="stable")
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
    call is most of a single query's time.
    """
    check_rows(features)
    _expect_retracing()
    chunks, order = [], []
    for index, width in batches_by_length(features, batch_size, sequence_length):
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
