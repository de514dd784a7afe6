"""`without_autotune`: the tf.data option every input pipeline kbert builds carries."""


def without_autotune(dataset):
    """`dataset` with tf.data's autotuning model turned off.

    With it on, each iterator runs a thread that re-tunes the pipeline on a
    period that doubles up to 60 s, and in TensorFlow 2.21 freeing the
    iterator can wait, idle, for that thread (seen in a debugger: the
    iterator's destructor waiting on the thread, the thread in its timed
    wait). Keras frees iterators as `fit` ends and at each validation: in
    back-to-back `fit`s of 12 and 24 steps of the Debian classifier on this
    project's 2-core machine, 16 of 44 stood idle 20 to 30 s as they ended;
    with this option, none of 24. `num_parallel_calls=AUTOTUNE` and
    `prefetch(AUTOTUNE)` then keep TensorFlow's starting values instead of
    being re-tuned: ample for pipelines that slice arrays already encoded
    or parse records, a small share of a training step.

    Args:
        dataset: a `tf.data.Dataset`.

    Returns:
        The same dataset, its options merged with `autotune.enabled = False`.
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
