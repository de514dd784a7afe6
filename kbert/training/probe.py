"""A head that starts as a linear probe on the frozen encoder (LP-FT).

Kumar et al. (2022, "Fine-tuning can distort pretrained features and
underperform out-of-distribution") fit the head first, as a logistic
regression on the pretrained encoder's vectors, then fine-tune everything:
the encoder's first steps then follow a head that already reads it, not a
random one. On the Debian task it gained dev accuracy on each of six seeds
(docs/benchmarks.md); text classification's recipe does it
(`Recipe.probe_head`).

The regression is scikit-learn's `LogisticRegression` (L-BFGS, its default L2
penalty C=1) on the vector the head reads (the pooled [CLS]) of each training
row, computed as `kbert evaluate` runs the model: no dropout, rows in
batches of similar length.
"""

import time

import numpy as np

from kbert.models.heads import HEAD_LAYER
from kbert.tasks.base import INFERENCE_BATCH_SIZE
from kbert.tasks.inference import NonFiniteOutputs, run_by_length

# scikit-learn's default L2 penalty: the sum of the rows' losses plus half
# the squared weights over C.
PROBE_C = 1.0
PROBE_MAX_ITER = 5000


def probe_head(task, model, examples, log=None):
    """Sets the weights of `model`'s head to a logistic regression fitted on the
    frozen encoder's vectors of `examples`' training rows, and logs its
    training accuracy (`log`: a callable taking a str, or None); if the rows
    lack one of the head's classes, logs that and leaves the head as it is.
    `NonFiniteOutputs` if the encoder gives NaN or infinity."""
    import keras
    from sklearn.linear_model import LogisticRegression

    log = log or (lambda line: None)
    start = time.perf_counter()
    head = model.get_layer(HEAD_LAYER)
    rows = task.training_rows(examples, packed=True)
    targets = np.asarray(rows.targets)
    missing = head.units - len(np.unique(targets))
    if missing:
        log(f"linear probe skipped: {missing} of the head's {head.units} classes have no training row")
        return
    reader = keras.Model(model.input, model.get_layer("bert_encoder")(model.input)[head.reads])
    try:
        vectors = run_by_length(reader, rows.features, ("vector",), task.sequence_length, INFERENCE_BATCH_SIZE)
    except NonFiniteOutputs:
        raise NonFiniteOutputs(
            "the encoder gives non-finite vectors (NaN or infinity) before any training: "
            "the weights it starts from are broken"
        ) from None
    vectors = vectors["vector"].astype(np.float64)
    regression = LogisticRegression(C=PROBE_C, max_iter=PROBE_MAX_ITER).fit(vectors, targets)
    kernel, bias = regression.coef_.T, regression.intercept_
    if head.units == 2:
        # One logit for class 1 against class 0: the softmax of two halves gives the same odds.
        kernel, bias = np.concatenate([-kernel, kernel], axis=1) / 2, np.concatenate([-bias, bias]) / 2
    head.dense.kernel.assign(kernel.astype(np.float32))
    head.dense.bias.assign(bias.astype(np.float32))
    log(f"linear probe: the head starts as a logistic regression on the frozen encoder "
        f"({100 * regression.score(vectors, targets):.2f}% training accuracy, "
        f"{time.perf_counter() - start:.1f} s)")
