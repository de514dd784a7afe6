"""A head that starts as a linear probe on the frozen encoder (LP-FT).

Kumar et al. (2022, "Fine-tuning can distort pretrained features and
underperform out-of-distribution") fit the head first, as a logistic
regression on the pretrained encoder's vectors, then fine-tune everything:
the encoder's first steps then follow a head that already reads it, not a
random one. On the Debian task it gained dev accuracy on each of six seeds
(docs/benchmarks.md); text classification's recipe does it
(`Recipe.probe_head`).

The regression is the objective's (`Objective.fit_probe`): scikit-learn's
`LogisticRegression` (L-BFGS, its default L2 penalty C=1), multinomial over
the classes or one per label, on the vector the head reads (the pooled [CLS])
of each training row, computed as `kbert evaluate` runs the model: no
dropout, rows in batches of similar length.
"""

import time

import numpy as np

from kbert.logs import Waiting
from kbert.models.heads import HEAD_LAYER
from kbert.tasks.base import INFERENCE_BATCH_SIZE
from kbert.tasks.inference import NonFiniteOutputs, run_by_length


def probe_head(task, model, examples, log=None):
    """Sets the weights of `model`'s head to a logistic regression fitted on the
    frozen encoder's vectors of `examples`' training rows, and logs its
    training accuracy (`log`: a callable taking a str, or None); if the rows
    lack one of the head's classes, logs that and leaves the head as it is.
    `NonFiniteOutputs` if the encoder gives NaN or infinity."""
    import keras

    log = log or (lambda line: None)
    start = time.perf_counter()
    head = model.get_layer(HEAD_LAYER)
    rows = task.training_rows(examples, packed=True)
    targets = np.asarray(rows.targets)
    missing = task.objective.probe_gap(targets, head.units)
    if missing:
        log(f"linear probe skipped: {missing}")
        return
    reader = keras.Model(model.input, model.get_layer("bert_encoder")(model.input)[head.reads])
    try:
        with Waiting(f"linear probe: the frozen encoder on {len(targets):,} training rows", log):
            vectors = run_by_length(reader, rows.features, ("vector",), task.sequence_length, INFERENCE_BATCH_SIZE)
    except NonFiniteOutputs:
        raise NonFiniteOutputs(
            "the encoder gives non-finite vectors (NaN or infinity) before any training: "
            "the weights it starts from are broken"
        ) from None
    vectors = vectors["vector"].astype(np.float64)
    with Waiting(f"linear probe: a logistic regression on {len(vectors):,} vectors of {vectors.shape[1]}", log):
        kernel, bias, accuracy = task.objective.fit_probe(vectors, targets, head.units)
    head.dense.kernel.assign(kernel.astype(np.float32))
    head.dense.bias.assign(bias.astype(np.float32))
    log(f"linear probe: the head starts as a logistic regression on the frozen encoder "
        f"({100 * accuracy:.2f}% training accuracy, {time.perf_counter() - start:.1f} s)")
