"""Fine-tuning any task with `model.fit`; the task decides data, head, loss and metrics.

`finetune` reads the training and dev files with the task's reader, builds the
task's model on a pretrained (or fresh) encoder, fits it with AdamW on BERT's
schedule and writes a model folder (`kbert.modelfolder`). It never tests the
task's name: everything that differs between tasks is a call into the task.

Its steps, in the order that keeps a seed's model the same bit for bit (each
draws its random numbers after the one before): the recipe resolved and
every value checked (`_checked_recipe`); the data read, the task made
(`_task`); the encoder loaded, or adapted first (`_encoder`,
`_adapted_encoder`); the rows encoded and batched (`_datasets`); the model
built and compiled (`_compiled_model`), its head kept from a fine-tuned
transformers `--init` folder (`kbert.training.init_head`) or probed (`_probe`); `fit`
and the dev figures (`kbert.training.epochs`, which `distill` shares); the
model folder written.

A run checkpoints every epoch into a folder beside `out`
(`.kbert-resume-NAME`, `kbert.training.resume`); if it is killed, the same
call resumes from its last complete epoch, with the shuffles and dropout an
uninterrupted run would have used (an adaptation killed on its way, from its
last 100 steps). The folder is removed once `out` is written; a run with
other settings starts afresh.
"""

import dataclasses
import os
import shutil

import keras

from kbert.checkpoints.huggingface import init_encoder, read_init
from kbert.config import check_init
from kbert.hardware import log_dtype
from kbert.logs import Waiting, to_stderr
from kbert.modelcard import data_files
from kbert.modelfolder import check_model_out, write_model_folder
from kbert.pretraining.adapt import adapt, adaptation_text
from kbert.recipes import Recipe, check_adaptation, check_probe
from kbert.tasks import DEFAULT_TASK, get_task
from kbert.tasks.inference import NonFiniteOutputs
from kbert.training.batching import eval_dataset, train_dataset, training_bucket_width
from kbert.text import WordPieceTokenizer, load_vocab
from kbert.fitting.distribute import (
    STRATEGIES,
    chief_folder,
    compile_for_strategy,
    get_strategy,
    log_batch_sizes,
)
from kbert.fitting.optimizers import layerwise_multipliers, make_optimizer
from kbert.training.epochs import TrainingDiverged, dev_figures, fit_epochs
from kbert.training.init_head import check_init_head, keep_head, plan_head
from kbert.training.probe import probe_head as fit_probe
from kbert.training.resume import ADAPT_FOLDER, file_identity, resume_folder, resume_point

# Where callers have found them: `kbert.training.epochs` and `kbert.training.resume` hold them now.
__all__ = ["finetune", "Training", "TrainingDiverged", "dev_figures", "file_identity", "fit_epochs", "resume_folder",
           "resume_point", "check_training_numbers", "check_callbacks", "set_seeds"]

# What kbert.json records of how the model was trained, besides its
# sequence length and dtype.
TRAINING_SETTINGS = (
    "epochs", "batch_size", "learning_rate", "warmup_fraction", "weight_decay", "layer_decay",
    "ema_momentum", "reinit_pooler", "attention_dropout", "jit_compile", "seed", "adapt_steps",
    "probe_head", "init_head",
)


@dataclasses.dataclass(frozen=True)
class Training:
    """How one `finetune` call trains, resolved and checked: what its steps share.

    `recipe` is the task's with the caller's values in place; the other fields
    are `finetune`'s arguments of those names, `dtype` a policy name (`auto`
    resolved) and `strategy` a `tf.distribute.Strategy`.
    """

    recipe: Recipe
    strategy: object
    dtype: str
    seed: int = 0
    layer_decay: float = 1.0
    ema_momentum: float | None = None
    reinit_pooler: bool = False
    attention_dropout: float | None = None
    jit_compile: bool = False


def finetune(
    train, dev, init, out, task=DEFAULT_TASK, options=None,
    sequence_length=None, batch_size=None, epochs=None, learning_rate=None, warmup_fraction=None,
    weight_decay=None, adapt_steps=None, probe_head=None, init_head=None,
    layer_decay=1.0, ema_momentum=None, reinit_pooler=False, attention_dropout=None, jit_compile=False,
    dtype=None, seed=0, vocab=None, lowercase=None, strategy="auto", overwrite=False, deterministic=False,
    verbose="auto", callbacks=(), log=None,
):
    """Fine-tunes `task` and writes the model folder `out`; returns the dev figures.

    Args:
        train, dev: str. Data files in the task's format.
        init: str. A Hugging Face checkpoint folder (of a fine-tuned task
            class, its head too: `init_head`), a packaged checkpoint name
            (e.g. "all-minilm-l6-v2") or a `BertConfig` preset (random init;
            then `vocab` is required).
        out: str. Output folder, written aside and renamed into place; an
            existing kbert model folder is replaced only with `overwrite`, and
            anything else there is refused before training starts.
        task: str. A name in `kbert.tasks.TASKS`.
        options: dict. The task's data options (`Task.options`), e.g.
            `{"text_column": "review"}`.
        sequence_length, batch_size, epochs, learning_rate, warmup_fraction,
            weight_decay: the packed length (longer inputs are truncated, or
            windowed by tasks that window), the global batch, the passes
            over `train`, the peak rate, the share of the steps warming it
            up and AdamW's decoupled weight decay (not on LayerNorm and
            biases); each None (the default) takes the task's recipe
            (`Task.recipe`, a `kbert.recipes.Recipe`).
        adapt_steps: int or None. Masked-LM steps on the training texts
            before fine-tuning (task-adaptive pretraining,
            `kbert.pretraining.adapt`), with the recipe's batch and length;
            0: none; None: the task's recipe (1,200 for
            text-pair-classification, else 0).
        probe_head: bool or None. Start the head as a logistic regression on
            the frozen encoder's vectors of the training texts
            (`kbert.training.probe`); None: the task's recipe (True for
            text-classification).
        init_head: bool or None. Whether to start from the head of a fine-tuned
            transformers `init` folder (`kbert.training.init_head`): None keeps
            it where its labels are the training data's (in any order) and
            else trains a new one, saying so; True refuses a head it cannot
            keep; False takes the encoder alone. A kept head is not probed.
        layer_decay: float in (0, 1]. Layer-wise learning-rate decay
            (`kbert.training.layerwise_multipliers`); 1 is off.
        ema_momentum: float or None. End on an exponential moving average of
            the weights.
        reinit_pooler: bool. Re-initialise the pooler's dense layer instead of
            keeping the checkpoint's (Zhang et al., 2021, "Revisiting
            few-sample BERT fine-tuning").
        attention_dropout: float in [0, 1) or None. Dropout on the attention
            probabilities while fine-tuning, in place of the checkpoint's
            (BERT's 0.1); 0 also skips drawing its random mask, the largest
            tensor a step draws one for.
        jit_compile: bool. Compile the train step with XLA.
        dtype: str. A dtype policy such as "mixed_bfloat16", or "auto":
            mixed_bfloat16 where the device multiplies bfloat16 natively,
            float32 elsewhere (`kbert.hardware`).
        strategy: str. A `tf.distribute` strategy name (see
            `kbert.fitting.distribute.STRATEGIES`); `batch_size` is global.
        overwrite: bool. Replace `out` if it is a kbert model folder.
        deterministic: bool. TensorFlow op determinism: the same weights,
            bit for bit, from the same command, also across a resume (see
            the module's docstring).
        verbose: `fit`'s verbosity: "auto" (1 on a terminal, else 2), 0
            (no progress bar or lines, `log` aside), 1 or 2.
        callbacks: list of Keras callbacks, given to `fit` after kbert's own (which
            stop a diverged run, keep the training curve and checkpoint
            every epoch).
        log: callable taking a str, for progress lines (default: stderr;
            `kbert.logs.quiet` drops them).

    Returns:
        dict. The task's dev figures, the training time and curve.

    Raises:
        ValueError: bad input (named file and line), or `TrainingDiverged`.
    """
    log = log or to_stderr
    task_class, recipe = _checked_recipe(
        task, callbacks, strategy, init, vocab, sequence_length=sequence_length, batch_size=batch_size,
        epochs=epochs, learning_rate=learning_rate, warmup_fraction=warmup_fraction, weight_decay=weight_decay,
        adapt_steps=adapt_steps, probe_head=probe_head,
    )
    check_model_out(out, overwrite, {"--train": train, "--dev": dev, "--init": init, "--vocab": vocab})
    stated = check_init_head(init, task_class, init_head, log)
    options, train_examples, dev_examples, learned = task_class.read_training(train, dev, options)
    set_seeds(seed, deterministic)
    training = _training(
        recipe, strategy, dtype, log, seed=seed, layer_decay=layer_decay, ema_momentum=ema_momentum,
        reinit_pooler=reinit_pooler, attention_dropout=attention_dropout, jit_compile=jit_compile,
    )
    vocabulary, lowercase = _vocabulary_and_casing(init, vocab, lowercase, recipe.sequence_length)
    # Loaded before anything is written: a bad checkpoint is refused.
    config, encoder = (None, None) if recipe.adapt_steps else _encoder(init, training)
    task = _task(task_class, vocabulary, lowercase, recipe.sequence_length, learned, options, dev_examples, dev)
    log(f"{task.name}: {len(train_examples)} training examples from {train}, "
        f"{len(dev_examples)} dev examples from {dev}")
    head = plan_head(init, stated, task, init_head, train, log)
    if head and recipe.probe_head:
        log(f"linear probe skipped: the head is {init}'s, kept")
        training = dataclasses.replace(training, recipe=dataclasses.replace(recipe, probe_head=False))
        recipe = training.recipe
    run = {**_run_identity(task, options, train, dev, init, vocab, lowercase, training), "init_head": bool(head)}
    texts = _adaptation_text(task, train_examples, vocabulary, lowercase, recipe)  # refused before anything is written
    resume_dir, first_epoch, curve = resume_point(out, run, log)
    adaptation = None
    if recipe.adapt_steps:
        (config, encoder), adaptation = _adapted_encoder(
            texts, resume_dir, init, vocabulary, lowercase, training, verbose, log
        )
    train_ds, steps_per_epoch, dev_encoded, dev_ds = _datasets(task, train_examples, dev_examples, training,
                                                               first_epoch, log)
    model = _compiled_model(task, config, encoder, training, steps_per_epoch * recipe.epochs)
    if head and not first_epoch:  # a resumed run restores its head
        keep_head(model, head)
    if recipe.probe_head and not first_epoch:  # a resumed run restores its head
        _probe(task, model, train_examples, resume_dir, keep=bool(adaptation), log=log)
    figures = fit_epochs(
        model, train_ds, steps_per_epoch, recipe.epochs, resume_dir, first_epoch, curve, len(train_examples),
        strategy=training.strategy, validation_data=dev_ds, verbose=verbose, callbacks=callbacks,
        batch_size=recipe.batch_size, log=log,
    )
    metrics = {**dev_figures(task, model, dev_examples, dev_encoded, log), **figures,
               "steps_per_epoch": steps_per_epoch}
    if adaptation:
        metrics["adaptation"] = adaptation
    settings = _settings(config, recipe.sequence_length, lowercase, init, training.dtype, run)
    settings["data"] = data_files(train=train, dev=dev)  # named on the model card
    # Under MultiWorkerMirroredStrategy only the chief writes `out`.
    with chief_folder(out, training.strategy) as folder:
        write_model_folder(folder, model, vocabulary, task, settings, metrics, overwrite=overwrite)
    shutil.rmtree(resume_dir, ignore_errors=True)
    return metrics


def _checked_recipe(task, callbacks, strategy, init, vocab, **overrides):
    """`(task class, recipe)`: the task named `task` and its recipe with each of
    `overrides` given (not None) in place; `ValueError` naming the first value
    out of range, before any data is read or folder written."""
    task_class = _trainable(task)
    recipe = task_class.recipe.override(**overrides)
    check_training_numbers(recipe.batch_size, recipe.epochs, recipe.learning_rate)
    check_adaptation(recipe.adapt_steps)
    check_probe(task_class, recipe.probe_head)
    task_class.check_sequence_length(recipe.sequence_length)
    check_callbacks(callbacks)
    if isinstance(strategy, str) and strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {STRATEGIES}")
    check_init(init, vocab)
    return task_class, recipe


def _training(recipe, strategy, dtype, log, **choices):
    """The `Training` of `recipe` and `choices`, with the strategy made and the
    dtype policy resolved; logs the batch on each device and the policy."""
    strategy = get_strategy(strategy)
    log_batch_sizes(strategy, recipe.batch_size, log)
    return Training(recipe, strategy, log_dtype(dtype, log), **choices)


def _task(task_class, vocabulary, lowercase, sequence_length, learned, options, dev_examples, dev):
    """The task that reads text with `vocabulary`, of what the training data taught
    (`learned`) and the `options` given; `ValueError` if the `dev` examples do not suit it."""
    tokenizer = WordPieceTokenizer(vocabulary, lowercase=lowercase)
    task = task_class(tokenizer, sequence_length, **learned)
    task.use_options(options)
    task.check(dev_examples, dev)
    return task


def _run_identity(task, options, train, dev, init, vocab, lowercase, training):
    """What identifies a run in its resume folder (`resume_point`): everything its
    weights depend on, the files by path, size and modification time."""
    return {
        "task": task.name, "task_settings": task.settings(), "options": options,
        "train": file_identity(train), "dev": file_identity(dev), "init": init,
        "vocab": file_identity(vocab) if vocab else None, "lowercase": lowercase,
        **dataclasses.asdict(training.recipe), "layer_decay": training.layer_decay,
        "ema_momentum": training.ema_momentum, "reinit_pooler": training.reinit_pooler,
        "attention_dropout": training.attention_dropout, "jit_compile": training.jit_compile,
        "dtype": training.dtype, "seed": training.seed,
    }


def _adaptation_text(task, examples, vocabulary, lowercase, recipe):
    """What adaptation reads (`kbert.pretraining.adapt.adaptation_text`), or None
    without it; `ValueError` if the texts fill no sequence."""
    if not recipe.adapt_steps:
        return None
    return adaptation_text(task.texts(examples), vocabulary, recipe.sequence_length, lowercase)


def _adapted_encoder(texts, resume_dir, init, vocabulary, lowercase, training, verbose, log):
    """`((config, encoder), figures)`: `init` after adaptation's masked-LM steps on
    `texts` (what `adaptation_text` returned), kept in the resume folder."""
    recipe = training.recipe
    adapted, figures = adapt(
        *texts, os.path.join(resume_dir, ADAPT_FOLDER), init, vocabulary, lowercase,
        recipe.adapt_steps, recipe.batch_size, recipe.sequence_length, seed=training.seed, dtype=training.dtype,
        jit_compile=training.jit_compile, strategy=training.strategy, verbose=verbose, log=log,
    )
    # Fine-tuning then draws what it would from the adapted encoder alone.
    set_seeds(training.seed)
    return _encoder(adapted, training), figures


def _datasets(task, train_examples, dev_examples, training, first_epoch, log):
    """`(training batches, steps an epoch, dev rows, dev batches)`: the examples
    encoded by the task (`kbert.training.batching`), the training batches from
    epoch `first_epoch` on."""
    recipe, replicas = training.recipe, training.strategy.num_replicas_in_sync
    with Waiting(f"encoding {len(train_examples):,} training examples", log):
        train_ds, steps_per_epoch = train_dataset(
            task, train_examples, recipe.batch_size, seed=training.seed, epochs=recipe.epochs,
            first_epoch=first_epoch, bucket_width=training_bucket_width(training.jit_compile), replicas=replicas,
        )
    with Waiting(f"encoding {len(dev_examples):,} dev examples", log):
        dev_encoded = task.encode(dev_examples)
    dev_ds = eval_dataset(task, dev_encoded, recipe.batch_size, replicas)
    return train_ds, steps_per_epoch, dev_encoded, dev_ds


def _compiled_model(task, config, encoder, training, total_steps):
    """The task's model on `encoder`, compiled with AdamW on BERT's schedule over
    `total_steps`, under the training's strategy."""
    recipe = training.recipe
    with training.strategy.scope():
        model = task.build_model(encoder, dtype=training.dtype)
        if training.reinit_pooler:
            _reinitialise(encoder.get_layer("pooler"), config.initializer_range)
        multipliers = layerwise_multipliers(config.num_layers, training.layer_decay) if training.layer_decay < 1 else None
        optimizer = make_optimizer(
            "adamw",
            recipe.learning_rate,
            total_steps,
            warmup_steps=int(recipe.warmup_fraction * total_steps),
            weight_decay=recipe.weight_decay,
            dtype=training.dtype,
            lr_multipliers=multipliers,
            ema_momentum=training.ema_momentum,
        )
        compile_for_strategy(
            model, training.strategy, jit_compile=training.jit_compile, optimizer=optimizer, **task.compile_args()
        )
    return model


def _probe(task, model, examples, resume_dir, keep, log):
    """`kbert.training.probe.probe_head`; if the encoder gives NaN or infinity, the
    resume folder is removed unless it holds what to `keep` (an adaptation)."""
    try:
        fit_probe(task, model, examples, log)
    except NonFiniteOutputs:
        if not keep:
            shutil.rmtree(resume_dir, ignore_errors=True)
        raise


def _settings(config, sequence_length, lowercase, init, dtype, run):
    """What `kbert.json` stores of how the model was made (`write_model_folder`)."""
    return {
        "bert_config": config.to_dict(),
        "sequence_length": sequence_length,
        "lowercase": lowercase,
        "init": init,
        "dtype": dtype,
        # The recipe as resolved (the task's, or what the caller gave).
        "training": {key: run[key] for key in TRAINING_SETTINGS},
    }


def _trainable(task):
    """The task class named `task`; `ValueError` if it needs no training."""
    task_class = get_task(task)
    if not task_class.trainable:
        raise ValueError(
            f"task {task!r} needs no training: give kbert evaluate, search or export "
            f"--task {task} --model CHECKPOINT"
        )
    return task_class


def _encoder(init, training):
    """`(config, encoder)` of a checkpoint or preset, built under the training's strategy,
    with its attention dropout."""
    dropout = training.attention_dropout
    with training.strategy.scope():
        config, encoder, _, _ = init_encoder(
            init, dtype=training.dtype, overrides=None if dropout is None else {"attention_dropout": dropout},
        )
    return config, encoder


def _vocabulary_and_casing(init, vocab, lowercase, sequence_length):
    """`(vocabulary, lowercase)` to read text with for fine-tuning from `init`:
    the checkpoint's unless `vocab` or `lowercase` is given, read without its
    weights; `ValueError` if the vocabulary or `sequence_length` does not fit the model."""
    config, vocabulary, init_lowercase = read_init(init)
    if vocab is not None:
        vocabulary = load_vocab(vocab)
    if len(vocabulary) > config.vocab_size:
        raise ValueError(
            f"vocabulary has {len(vocabulary)} tokens but vocab_size={config.vocab_size}"
        )
    config.check_sequence_length(sequence_length)
    return vocabulary, init_lowercase if lowercase is None else lowercase


def check_training_numbers(batch_size, epochs, learning_rate):
    """Raises `ValueError` naming a batch size, epoch count or learning rate out of range."""
    for name, value in (("batch_size", batch_size), ("epochs", epochs)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}; expected a positive integer")
    if not (isinstance(learning_rate, (int, float)) and 0 < learning_rate <= 1):
        raise ValueError(f"learning_rate={learning_rate!r}; expected a number in (0, 1]")


def check_callbacks(callbacks):
    """Raises `ValueError` naming `callbacks` if it is not a list or tuple, or an
    item of it that is not a Keras callback, before any data is read or folder written."""
    if not isinstance(callbacks, (list, tuple)):
        raise ValueError(f"callbacks={callbacks!r}; expected a list of keras.callbacks.Callback instances")
    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.Callback):
            raise ValueError(f"callbacks holds {callback!r}; expected keras.callbacks.Callback instances")


def set_seeds(seed, deterministic=False):
    """Seeds Python, NumPy and the backend; with `deterministic`, TensorFlow op determinism."""
    if deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(seed)


def _reinitialise(dense, stddev):
    """Fresh weights for a Dense layer: truncated normal kernel, zero bias (BERT's init)."""
    dense.kernel.assign(keras.initializers.TruncatedNormal(stddev=stddev)(dense.kernel.shape))
    if dense.use_bias:
        dense.bias.assign(keras.ops.zeros(dense.bias.shape))


