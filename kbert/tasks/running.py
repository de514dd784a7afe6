"""What every task's model run shares: the batch size, the input views, the default `Task.run`.

A task says how its model reads a row (`Task.reads_sequence`, its
`input_views` and `merge_views`); running it is the same for every task
and lives here, beside the task rather than in its base class. A task whose
rows need another run (named entities' logits over every position)
overrides `Task.run`; the rest call `run`.
"""

import numpy as np

from kbert.tasks import inference

# Rows per model call at inference (`Task.run`): `kbert evaluate`, `predict`,
# the exporter's checks and finetune's dev figures alike, so that finetune's
# figures are the ones `kbert evaluate` gives on its model folder (batches of
# other widths round bfloat16 otherwise).
INFERENCE_BATCH_SIZE = 64


def run(task, model, features, batch_size=INFERENCE_BATCH_SIZE):
    """`model`'s outputs on int32 `features`, a dict of arrays keyed by `task.outputs`
    (`kbert.tasks.inference`): rows in batches of similar length, or at their
    full length if the task `reads_sequence`; on each of the rows' `input_views`,
    joined by `merge_views`. `ValueError` if the model gives NaN or infinity (a
    diverged or corrupt model)."""
    outputs = over_views(task, features, lambda view: _run_view(task, model, view, batch_size))
    return {name: np.asarray(value) for name, value in outputs.items()}


def _run_view(task, model, features, batch_size):
    features = {name: np.asarray(value) for name, value in features.items()}
    if task.reads_sequence:
        return inference.run_full_length(model, features, task.outputs, batch_size)
    return inference.run_by_length(model, features, task.outputs, task.sequence_length, batch_size)


def over_views(task, features, run_view):
    """`run_view(view)`'s outputs on each of the rows' `task.input_views`: those of
    the one view, or the views' joined by `task.merge_views`."""
    outputs = [run_view(view) for view in task.input_views(features)]
    return outputs[0] if len(outputs) == 1 else task.merge_views(outputs)
