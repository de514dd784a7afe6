"""Task-adaptive pretraining: masked LM on a task's own training texts before fine-tuning.

Gururangan et al. (2020), "Don't Stop Pretraining": an encoder that goes on
with its masked-LM objective on the unlabelled text of a small task, then
fine-tunes, does better on it. `finetune(adapt_steps=N)` runs `adapt` first;
it is `kbert pretrain --corpus` on the training texts, with the fine-tuning's
batch and sequence length (docs/pretraining.md).
"""

import json
import math
import os
import sys

import keras

from kbert.fitting.backup import AtomicBackup
from kbert.pretraining.dynamic_masking import count_sequences, make_dynamic_masking_dataset
from kbert.pretraining.instances import DEFAULT_MASKED_LM_PROB
from kbert.pretraining.run_folder import BACKUP_FOLDER, ENCODER_FOLDER, HISTORY_FILE
from kbert.pretraining.train import pretrain
from kbert.training.progress import TrainingProgress

# AdamW at google-research/bert's peak rate for it, warming up over a tenth of
# the steps: what the text-pair recipe's 600 and 1,200 steps were measured with on MRPC.
LEARNING_RATE = 1e-4
# Steps between the checkpoints a killed adaptation resumes from.
CHECKPOINT_EVERY = 100


def adapt(texts, sequences, folder, init, vocabulary, lowercase, steps, batch_size, sequence_length, seed=0,
          dtype=None, jit_compile=False, strategy="auto", verbose="auto", log=print, init_name=None):
    """Pretrains `init` with masked LM on `texts` for `steps` steps into `folder`.

    Args:
        texts, sequences: what `adaptation_text` returns: the distinct
            training texts, read in order, packed into sequences of
            `sequence_length` and masked anew on every pass
            (`make_dynamic_masking_dataset`), and how many sequences they fill.
        folder: str. `pretrain`'s `out`: new, or what an earlier call with the
            same arguments left: complete (its history.json is read back) or
            killed (resumed from its last checkpoint).
        init, vocabulary, lowercase: the checkpoint (or preset) fine-tuning
            starts from, and the vocabulary and casing it reads text with.
        steps, batch_size, sequence_length, seed, dtype, jit_compile, strategy,
            verbose, init_name: as for `pretrain`.
        log: callable taking a str, for progress lines.

    Returns:
        `(encoder folder, figures)`: the adapted encoder, a Hugging Face folder
        to fine-tune from, and a dict for metrics.json (steps, the last
        window's masked-LM loss and accuracy, the training time).
    """
    encoder = os.path.join(folder, ENCODER_FOLDER)
    history_file = os.path.join(folder, HISTORY_FILE)
    if os.path.isfile(history_file):
        log(f"adaptation: done in an earlier run, kept in {folder}")
        with open(history_file) as f:
            return encoder, _figures(json.load(f))
    log(f"adaptation: {steps} masked-LM steps of {batch_size} on {len(texts)} training texts "
        f"({sequences} sequences of {sequence_length}, about {steps * batch_size / sequences:.1f} passes; "
        "adapt_steps=0, --adapt-steps 0, skips it)")
    # Seeded before the pipeline is built, whose masking ops take their seeds
    # then: a call gives the same masks wherever it is made.
    keras.utils.set_random_seed(seed)
    data = make_dynamic_masking_dataset(
        texts, vocabulary, batch_size, sequence_length, math.ceil(DEFAULT_MASKED_LM_PROB * sequence_length),
        lowercase=lowercase, seed=seed,
    )
    history = pretrain(
        data, folder, vocabulary, init=init, batch_size=batch_size, num_train_steps=steps,
        learning_rate=LEARNING_RATE, optimizer="adamw", lowercase=lowercase, jit_compile=jit_compile,
        dtype=dtype, seed=seed, checkpoint_every=min(CHECKPOINT_EVERY, steps), strategy=strategy, verbose=verbose,
        init_name=init_name, next_sentence=False, callbacks=[_progress(folder, steps, verbose, log)],
    )
    return encoder, _figures(history)


def _progress(folder, steps, verbose, log):
    """What adaptation says as it runs (`TrainingProgress`): the time the other
    steps will take, and where Keras prints a line a window of
    `CHECKPOINT_EVERY` steps, a line every `LINE_SECONDS`; counted from the
    last checkpoint of a run killed on its way, where `pretrain` resumes."""
    if verbose == "auto":  # as `pretrain` decides it
        verbose = 1 if sys.stdout.isatty() else 2
    windows = AtomicBackup.restore_point(os.path.join(folder, BACKUP_FOLDER))[1] or 0
    return TrainingProgress("adaptation", steps, windows * min(CHECKPOINT_EVERY, steps), lines=verbose == 2, log=log)


def adaptation_text(texts, vocabulary, sequence_length, lowercase):
    """`(distinct texts in order, sequences they pack into)`; `ValueError` if
    they fill no sequence of `sequence_length` pieces."""
    texts = list(dict.fromkeys(texts))
    sequences = count_sequences(texts, vocabulary, sequence_length, lowercase)
    if not sequences:
        raise ValueError(
            f"the {len(texts)} training texts fill no sequence of {sequence_length} pieces; "
            "adaptation needs more text (pass adapt_steps=0, --adapt-steps 0, to skip it)"
        )
    return texts, sequences


def _figures(history):
    final = history["final"]
    return {
        "steps": final["step"],
        "masked_lm_loss": final["masked_lm_loss"],
        "masked_lm_accuracy": final["masked_lm_accuracy"],
        "train_seconds": history["throughput"]["train_seconds"],
    }
