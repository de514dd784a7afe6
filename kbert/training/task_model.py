"""A kbert task as one Keras model: raw inputs into `fit`, `evaluate` and `predict`, saved whole.

`TaskModel` holds the task's network (encoder and head, `Task.build_model`)
and its `BertPreprocessor` (tokenizer and vocabulary), with the task's name
and settings (label names, tags, score range, truncation). The task turns
Python values into its examples (`Task.examples_from_inputs`); `fit`
batches them the way `kbert finetune` does (`kbert.training.batching`: its
packing, windows, shuffles and length buckets), and `compile()` with no
optimizer gives the task's recipe: AdamW on BERT's schedule, sized from the
data when `fit` knows it; `adapt` runs the recipe's masked-LM steps on the
training texts first (task-adaptive pretraining, as `kbert finetune` does
for pair classification). As keras-hub's tasks, a model not compiled yet is
compiled so by `fit` and `evaluate`. `save("x.keras")` keeps everything, and
`keras.saving.load_model` gives back a model that reads raw inputs;
`save_folder` writes a kbert model folder for `kbert evaluate`, `predict`
and `export`.

Every task (`kbert.tasks.TASKS`), each with its own inputs:

| task | x | y |
| --- | --- | --- |
| text-classification | texts | label names (an integer `1` is the label "1") |
| multi-label-classification | texts | a list of label names per text (none: `[]`) |
| text-pair-classification, text-pair-regression | `(first_texts, second_texts)` | labels, or scores |
| token-classification | raw texts, or lists of words | a list of tags per list of words |
| question-answering | `{"question", "context"}` dicts, or `(questions, contexts)` | `{"text", "answer_start"}`, or None for no answer (v2.0) |
| sentence-embedding | texts | none: it needs no training, `fit` refuses it |
| fill-mask | texts with `[MASK]`s | for `figures`: each text's hidden words; it needs no training |

`x` may also be a `tf.data.Dataset` of batches, as Keras's `fit` takes
them (`inputs_from_dataset`). `predict` gives the network's outputs (per
packed row: a long NER text or QA context is several windows),
`predict_labels` the task's answers (labels, entities with character
offsets, answer spans, vectors, masked words). Keras's callbacks work; with
`kbert.AtomicBackup`, a `fit` killed and run again resumes at the epoch its
backup holds, with the batches, optimizer state and dropout seeds an
uninterrupted run has. The network is backend-agnostic Keras (TensorFlow,
JAX, PyTorch); preprocessing and `fit`'s batching are TensorFlow (tf-text,
tf.data).

Example:
>>> model = TaskModel.from_checkpoint("all-minilm-l6-v2", labels=["neg", "pos"])  # doctest: +SKIP
>>> model.fit(["a dull film", "a fine film"], ["neg", "pos"], epochs=1)  # doctest: +SKIP
>>> model.predict_labels(["a fine play"])  # doctest: +SKIP

The README's Python section has an example for each task.
"""

import os

import keras

from kbert.logs import to_stderr
from kbert.models import train_on_real_tokens
from kbert.tasks import DEFAULT_TASK, get_task
from kbert.tasks.base import INFERENCE_BATCH_SIZE, Task
from kbert.tasks.inference import replicas
from kbert.training.batching import eval_dataset, train_dataset, training_bucket_width
from kbert.training.probe import probe_head
from kbert.fitting.optimizers import make_optimizer


@keras.saving.register_keras_serializable(package="kbert")
class TaskModel(keras.Model):
    """A task's network with its preprocessor; takes raw inputs.

    Args:
        network: keras.Model from `Task.build_model` (on `ENCODER_INPUTS`).
        preprocessor: `kbert.text.BertPreprocessor`, the task's packing.
        task: str. A task name (`kbert.tasks.TASKS`).
        task_settings: dict. `Task.settings()`: label names, tags, score range...
        bert_config: dict. The encoder's `BertConfig.to_dict()`.
    """

    def __init__(self, network, preprocessor, task, task_settings, bert_config, **kwargs):
        super().__init__(**kwargs)
        task_class = get_task(task)
        self.network = network
        self.preprocessor = preprocessor
        self.task_name = task
        self.bert_config = dict(bert_config)
        self.task = task_class.stored(preprocessor.tokenizer, preprocessor.sequence_length, task_settings)
        self.task.preprocessor = preprocessor
        self._recipe_compile = None
        # The network is a functional model, built; so is this one, which only calls it
        # (else saving a model that never went through Keras's `__call__` warns).
        self.built = True

    @classmethod
    def from_checkpoint(cls, init, task=DEFAULT_TASK, labels=None, sequence_length=None, dtype=None,
                        **options):
        """The task's model on a checkpoint, its head new.

        Args:
            init: str. What `kbert finetune --init` takes: "all-minilm-l6-v2",
                a Hugging Face or google-research/bert folder; for a task that
                needs no training, what `--model` takes with `--task`
                (`kbert.modelfolder.ModelFolder.from_pretrained`).
            task: str. A task name (`kbert.tasks.TASKS`).
            labels: list of str, or int (that many classes, named "0", "1"...);
                classification only.
            sequence_length: int. Packed length; default the task's recipe's
                (a task that needs no training: the checkpoint's).
            dtype: a dtype policy, "auto" (mixed bfloat16 where the device
                multiplies it natively) or None (the global policy).
            **options: fields of the task's `Config` (`kbert.tasks.task_config`):
                what training data would teach and its options, e.g. `score_range=(0, 5)` (finite, low below high),
                `truncate="longest_first"`; for token classification
                `tags=["O", "B-LOC", ...]` (required) and `scheme` (IOB1, IOB2,
                BIOES; default "auto": from the tags); for question answering
                `version_2_with_negative=True`, `doc_stride=`...; for sentence
                embeddings `pooling=`, `normalize=`.
        """
        from kbert.checkpoints.huggingface import init_encoder
        from kbert.hardware import resolve_dtype
        from kbert.text import WordPieceTokenizer

        task_class = get_task(task)
        if labels is not None:
            options["labels"] = (
                [str(i) for i in range(labels)] if isinstance(labels, int)
                else list(labels) if isinstance(labels, (list, tuple)) else labels
            )
        dtype = resolve_dtype(dtype) if dtype is not None else None
        if not task_class.trainable:
            return cls._pretrained(init, task_class, sequence_length, dtype, options)
        task_class.Config.create(options, f"task {task_class.name!r}")  # before the checkpoint loads
        config, encoder, vocabulary, lowercase = init_encoder(init, dtype=dtype)
        if vocabulary is None:
            raise ValueError(f"init={init!r} has no vocabulary; give a checkpoint folder or name")
        length = sequence_length or task_class.recipe.sequence_length
        config.check_sequence_length(length)
        built = task_class(WordPieceTokenizer(vocabulary, lowercase=lowercase), length, **options)
        return cls(built.build_model(encoder, dtype=dtype), built.preprocessor, task,
                   built.settings(), config.to_dict())

    @classmethod
    def _pretrained(cls, init, task_class, sequence_length, dtype, options):
        """A task that needs no training on `init`, as the CLI builds it (`ModelFolder.from_pretrained`)."""
        from kbert.modelfolder import ModelFolder

        known = {option.name for option in task_class.options}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"task {task_class.name!r} takes no {unknown[0]}=; it takes {', '.join(sorted(known))}"
            )
        folder = ModelFolder.from_pretrained(init, task_class.name, options, sequence_length)
        network = folder.model
        if dtype is not None:
            network = folder.task.build_model(folder.config, dtype=dtype)
            network.set_weights(folder.model.get_weights())
        return cls(network, folder.task.preprocessor, task_class.name, folder.task.settings(),
                   folder.config.to_dict())

    @classmethod
    def from_folder(cls, folder):
        """The model of a kbert model folder (`kbert finetune --out`, `save_folder`)."""
        from kbert.modelfolder import ModelFolder

        loaded = ModelFolder.load(folder)
        return cls(loaded.model, loaded.task.preprocessor, loaded.task.name, loaded.task.settings(),
                   loaded.settings["bert_config"])

    # === Keras ===

    def call(self, inputs, training=None):
        return self.network(inputs, training=training)

    def __call__(self, inputs, training=None, **kwargs):
        """The network called as the top-level model. Nested in this model's own
        `Layer.__call__`, TensorFlow's backward pass sums the lower blocks'
        bfloat16 gradients in another order (forward and loss equal to the bit,
        gradients a bfloat16 rounding apart), and `fit` under mixed precision
        would drift from `kbert finetune`'s (0.002 in MiniLM's logits within 20
        steps); called as it is, Keras's own `train_step` matches it to the bit."""
        return self.network(inputs, training=training, **kwargs)

    def compile(self, optimizer=None, loss=None, metrics=None, **kwargs):
        """Keras's `compile`; what is not given is the task's: its loss, its metrics and,
        with no optimizer, its recipe's AdamW on BERT's schedule, built by `fit`."""
        defaults = self.task.compile_args()
        task_loss, task_metrics = defaults.pop("loss"), defaults.pop("metrics", None)
        loss = task_loss if loss is None else loss
        metrics = task_metrics if metrics is None else metrics
        for key, value in defaults.items():  # e.g. question answering's loss_weights
            kwargs.setdefault(key, value)
        # As kbert finetune trains: without XLA, which is slower on CPUs, and on
        # TensorFlow the encoder blocks over each batch's real tokens alone.
        kwargs.setdefault("jit_compile", False)
        real_tokens = keras.backend.backend() == "tensorflow" and kwargs["jit_compile"] is False
        train_on_real_tokens(self.network, enabled=real_tokens)
        if optimizer is None:
            self._recipe_compile = dict(loss=loss, metrics=metrics, **kwargs)
            optimizer = "adamw"  # a placeholder until fit knows the steps
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def fit(self, x=None, y=None, batch_size=None, epochs=None, validation_data=None, seed=0,
            **kwargs):
        """Trains on raw inputs, batched as `kbert finetune` batches them.

        Args:
            x: the task's inputs (the module's table; `Task.examples_from_inputs`),
                or a `tf.data.Dataset` of batches of `(x, y)` (`inputs_from_dataset`).
            y: targets, one per example: label names, scores, tag lists or
                answers. An integer label is the label of that name, never a
                position: with `labels=2` (named "0" and "1") `[0, 1]` work;
                with `labels=["1", "0"]` they are refused (give the names as
                strings), and so are they with `labels=["neg", "pos"]`.
                Every text must be non-blank (as `kbert finetune` requires).
            batch_size, epochs: default the task's recipe's.
            validation_data: `(x, y)` in the same form, or a dataset. A task
                that chooses a setting on dev predictions, as `kbert finetune`
                does, chooses it here after training (question answering v2.0:
                its null-score threshold; pair classification: whether pairs
                are read both ways; unless one was given).
            seed: the shuffles' seed (dropout and new weights follow
                `keras.utils.set_random_seed`).
            **kwargs: `keras.Model.fit`'s (callbacks, verbose...).

        A model not compiled yet is compiled with the task's recipe (`compile()`).
        The recipe's adaptation (pair classification's) is `adapt`, called first;
        its linear probe (text classification's head starts as a logistic
        regression on the frozen encoder, `kbert.training.probe`) is fitted
        here, when `fit` compiles the recipe and restores no backup.
        """
        self._check_trainable("fit")
        if not self.compiled:
            self.compile()
        recipe = self.task.recipe.override(batch_size=batch_size, epochs=epochs)
        examples = self.examples(x, y)
        dataset, steps = train_dataset(
            self.task, examples, recipe.batch_size, seed=seed, epochs=recipe.epochs,
            bucket_width=training_bucket_width(bool(self.jit_compile)), replicas=replicas(self),
        )
        probe = self._recipe_compile is not None and recipe.probe_head
        if self._recipe_compile is not None:
            total = steps * recipe.epochs
            super().compile(
                optimizer=make_optimizer("adamw", recipe.learning_rate, total,
                                         warmup_steps=int(recipe.warmup_fraction * total),
                                         weight_decay=recipe.weight_decay),
                **self._recipe_compile,
            )
            self._recipe_compile = None
        # Each epoch's shuffle is its own (seeded by its number): a run resumed
        # at epoch k skips to epoch k's batches, as an uninterrupted run sees them.
        restored = self._restored_epoch(kwargs.get("callbacks"))
        if probe and not restored:
            quiet = kwargs.get("verbose", "auto") == 0
            probe_head(self.task, self.network, examples, log=None if quiet else to_stderr)
        dataset = dataset.skip(steps * restored)
        validation = None
        if validation_data is not None:
            pair = (validation_data,) if _is_dataset(validation_data) else validation_data
            validation = self.examples(*pair)
            encoded = self.task.encode(validation)
            validation_data = eval_dataset(self.task, encoded, recipe.batch_size, replicas(self))
        history = super().fit(dataset, epochs=recipe.epochs, steps_per_epoch=steps,
                              validation_data=validation_data, shuffle=False, **kwargs)
        if validation is not None and type(self.task).tune is not Task.tune:
            # As `kbert finetune` does on dev: a task's choice made on the
            # validation predictions (question answering's null threshold).
            def predict():
                outputs = self.task.run(self.network, encoded.features, recipe.batch_size)
                return self.task.decode(validation, encoded, outputs)

            self.task.tune(validation, predict(), predict)
        return history

    def adapt(self, x, steps=None, batch_size=None, folder=None, seed=0, verbose="auto"):
        """Task-adaptive pretraining, before `fit`: masked-LM steps on the texts of
        `x`, as `kbert finetune` runs them first (`kbert.pretraining.adapt`).

        Args:
            x: the task's inputs, as `fit` takes them (no targets).
            steps, batch_size: default the task's recipe's (1,200 steps for
                text-pair-classification).
            folder: str or None. Where the run is kept (`kbert pretrain`'s
                folder; the adapted encoder in `encoder/`): new, or one an
                earlier call left, killed (resumed from its last 100 steps)
                or complete (read back). None: a temporary folder.
            seed: the masks' and the new masked-LM head's; Keras's global
                seed is set to it (`keras.utils.set_random_seed`).
            verbose: `fit`'s verbosity.

        The encoder's weights are replaced by the adapted ones; the task's
        head is left as it is. The masked-LM head starts anew, as it does
        from a checkpoint without one (all-MiniLM-L6-v2).

        Returns:
            dict. Steps, the last masked-LM loss and accuracy, the training time.
        """
        import tempfile

        from kbert.checkpoints.huggingface import load_hf_weights, save_hf_checkpoint
        from kbert.config import BertConfig
        from kbert.pretraining.adapt import adapt, adaptation_text
        from kbert.pretraining.run_folder import HISTORY_FILE, check_run_folder

        self._check_trainable("adapt")
        if folder is not None and not os.path.isfile(os.path.join(folder, HISTORY_FILE)):
            check_run_folder(folder, resumable=True, name=f"folder={folder!r}")
        recipe = self.task.recipe.override(batch_size=batch_size, adapt_steps=steps)
        if not isinstance(recipe.adapt_steps, int) or recipe.adapt_steps < 1:
            raise ValueError(
                f"steps={recipe.adapt_steps!r}" + (" (the recipe's)" if steps is None else "")
                + "; expected a positive number of masked-LM steps"
            )
        tokenizer, length = self.preprocessor.tokenizer, self.task.sequence_length
        texts, sequences = adaptation_text(
            self.task.texts(self.examples(x)), tokenizer.vocabulary, length, tokenizer.lowercase
        )
        config = BertConfig.from_dict(self.bert_config)
        encoder = self.network.get_layer("bert_encoder")
        # Adaptation goes on from a checkpoint folder: the encoder, as it is now, written as one.
        with tempfile.TemporaryDirectory(prefix="kbert-adapt-") as scratch:
            start = os.path.join(scratch, "encoder")
            save_hf_checkpoint(encoder, config, tokenizer.vocabulary, start, lowercase=tokenizer.lowercase)
            adapted, figures = adapt(
                texts, sequences, folder or os.path.join(scratch, "run"), start, tokenizer.vocabulary,
                tokenizer.lowercase, recipe.adapt_steps, recipe.batch_size, length, seed=seed,
                dtype=self.network.dtype_policy.name, verbose=verbose, init_name="the TaskModel's encoder",
            )
            load_hf_weights(encoder, config, os.path.join(adapted, "model.safetensors"))
        return figures

    def _check_trainable(self, method):
        if not self.task.trainable:
            raise ValueError(
                f"task {self.task_name!r} needs no training; TaskModel.{method} refuses it "
                "(predict gives its outputs as the checkpoint computes them)"
            )

    def _restored_epoch(self, callbacks):
        """The epoch a `keras.callbacks.BackupAndRestore` among `callbacks` resumes at
        (0 if none has a backup). Its restore runs here, before Keras's `fit` runs it
        again, so that the batches can start where the backup stopped."""
        self._initial_epoch = None  # Keras keeps a past fit's restore
        for callback in callbacks or ():
            if isinstance(callback, keras.callbacks.BackupAndRestore):
                callback.set_model(self)
                callback.on_train_begin()
        return self._initial_epoch or 0

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        """Keras's loss and compiled metrics on raw inputs (`figures` gives the task's own)."""
        if kwargs.get("_use_cached_eval_dataset"):  # Keras's fit, on `fit`'s validation batches
            return super().evaluate(x, y, batch_size=batch_size, **kwargs)
        if not self.compiled:
            self.compile()
        encoded = self.task.encode(self.examples(x, y))
        dataset = eval_dataset(self.task, encoded, batch_size or self.task.recipe.batch_size, replicas(self))
        return super().evaluate(dataset, **kwargs)

    def predict(self, x, batch_size=INFERENCE_BATCH_SIZE, **kwargs):
        """The network's outputs for raw inputs (a dict if several): a row per packed
        row, in the inputs' order; a long text or context may be several windows."""
        _, _, outputs = self._run(self.examples(x), batch_size)
        if len(self.task.outputs) == 1:
            return outputs[self.task.outputs[0]]
        return {name: outputs[name] for name in self.task.outputs}

    # === The task's answers ===

    def predict_labels(self, x, batch_size=INFERENCE_BATCH_SIZE):
        """What `kbert predict` prints for each input: a label and its scores, a score,
        entities with character offsets, an answer span, a vector, or masked words."""
        examples, encoded, outputs = self._run(self.examples(x), batch_size)
        return self.task.predict_json(examples, self.task.decode(examples, encoded, outputs))

    def figures(self, x, y, batch_size=INFERENCE_BATCH_SIZE):
        """The task's figures (`kbert evaluate`'s): accuracy and F1s, Spearman and Pearson,
        entity F1s, or SQuAD's exact match and F1."""
        examples, encoded, outputs = self._run(self.examples(x, y), batch_size, targets=True)
        return self.task.evaluate(examples, self.task.decode(examples, encoded, outputs))

    def _run(self, examples, batch_size, targets=False):
        """`(examples, encoded, outputs)`: the network run on `examples`, in their order;
        with `targets`, a label the model does not know is refused naming its line."""
        encoded = self.task.encode(examples, targets=targets)
        return examples, encoded, self.task.run(self.network, encoded.features, batch_size)

    def save(self, filepath, overwrite=False, zipped=None, **kwargs):
        """Writes the model, preprocessing included, as one `.keras` file; `keras.saving.load_model` reads it back.

        The file is written beside `filepath`, then renamed: an older file
        stays whole until the new one is complete. An existing file is
        replaced only with `overwrite=True`, and only if kbert wrote it: a
        `.keras` zip archive whose `config.json` holds a kbert `TaskModel`
        (registered name "kbert>TaskModel"). Anything else there is the
        user's and is never replaced (Keras's own default replaces it).

        Args:
            filepath: str or path-like. A name ending in `.keras`.
            overwrite: bool. Replace a `TaskModel` file saved there before.
            zipped, **kwargs: as Keras's `Model.save` (the file is zipped).

        Raises:
            ValueError: one line naming `filepath`: not a `.keras` name, a
                folder, a file kbert did not write, or one without `overwrite`.
        """
        from kbert.fileio import keras_archive_class, written_aside

        path = os.fspath(filepath)
        if zipped is False or not path.endswith(".keras"):
            raise ValueError(f"{path}: TaskModel.save writes one .keras file; expected a name ending in .keras "
                             "(a kbert model folder: save_folder)")
        if os.path.isdir(path):
            raise ValueError(f"{path} is a folder; expected a .keras file name")
        if os.path.lexists(path):
            if keras_archive_class(path) != keras.saving.get_registered_name(TaskModel):
                raise ValueError(f"{path} exists and is not a TaskModel .keras file kbert wrote; kbert replaces "
                                 "only its own files: choose another name")
            if not overwrite:
                raise ValueError(f"{path} exists; pass overwrite=True to replace it")
        with written_aside(path, suffix=".keras") as staging:
            super().save(staging, overwrite=True, zipped=zipped, **kwargs)

    def save_folder(self, out, metrics=None, overwrite=False):
        """Writes a kbert model folder (`kbert evaluate`, `predict`, `export` take it).

        An existing `out` is replaced only with `overwrite=True`, and only if
        it is a kbert model folder holding nothing kbert did not write (a
        file or folder of the user's, even an empty one, is refused:
        `kbert.fileio.foreign_entries`).
        """
        from kbert.modelfolder import write_model_folder

        if not self.task.trainable:
            raise ValueError(
                f"task {self.task_name!r} has no model folder; kbert's commands take its "
                f"checkpoint with --task {self.task_name}"
            )
        settings = {
            "bert_config": self.bert_config,
            "sequence_length": self.task.sequence_length,
            "lowercase": self.preprocessor.tokenizer.lowercase,
            "init": None, "dtype": self.network.dtype_policy.name,
        }
        write_model_folder(out, self.network, self.preprocessor.tokenizer.vocabulary, self.task,
                           settings, metrics or {}, overwrite=overwrite)

    # === Inputs ===

    def examples(self, x, y=None):
        """The task's examples for raw inputs `x` and targets `y` (or None); `x` may be
        a `tf.data.Dataset` of batches that holds both (`inputs_from_dataset`)."""
        if _is_dataset(x):
            if y is not None:
                raise ValueError("y is given with a tf.data.Dataset x; the dataset holds the targets")
            x, y = inputs_from_dataset(x)
        examples = self.task.examples_from_inputs(x, y)
        if not examples:
            raise ValueError("x holds no examples; expected one or more")
        return examples

    # === Saving ===

    def get_compile_config(self):
        return super().get_compile_config()

    def compile_from_config(self, config):
        """As Keras's, which skips models whose `compile` is their own."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def get_config(self):
        return {
            **super().get_config(),
            "network": keras.saving.serialize_keras_object(self.network),
            "preprocessor": keras.saving.serialize_keras_object(self.preprocessor),
            "task": self.task_name,
            "task_settings": self.task.settings(),
            "bert_config": self.bert_config,
        }

    @classmethod
    def from_config(cls, config):
        import kbert.layers  # noqa: F401  (registers the layers the network names)

        config = dict(config)
        config["network"] = keras.saving.deserialize_keras_object(config["network"])
        config["preprocessor"] = keras.saving.deserialize_keras_object(config["preprocessor"])
        return cls(**config)


def inputs_from_dataset(dataset):
    """`(x, y)`: a `tf.data.Dataset` of batches, as Keras's `fit` takes them, gathered
    into the Python inputs of the module's table.

    Each element is `(x, y)`, `(x,)` or `x`; `x` is a batch of texts, a tuple of
    such batches (text pairs, or questions and contexts), a ragged batch of word
    lists, or a dict of batches (`{"question", "context"}`), which becomes one
    dict per example; so does a dict `y` (answers, as TFDS's SQuAD gives them:
    `{"text": [...], "answer_start": [...]}`, empty for no answer). Strings are
    decoded as UTF-8. y is None if no element has one.
    """
    xs, ys = [], []
    for element in dataset:
        if isinstance(element, tuple) and len(element) in (1, 2):
            x, y = element if len(element) == 2 else (element[0], None)
        else:
            x, y = element, None
        xs.append(_batch_rows(x))
        ys.append(None if y is None else _batch_rows(y))
    if not xs:
        raise ValueError("the tf.data.Dataset x holds no elements")
    # Every element of a dataset has one structure: all hold targets or none.
    return _concatenate(xs), None if ys[0] is None else _concatenate(ys)


def _is_dataset(value):
    import tensorflow as tf

    return isinstance(value, tf.data.Dataset)


def _batch_rows(value):
    """One batch as Python values: a list with a row per example, a tuple of such
    lists, or a list of dicts."""
    if isinstance(value, (tuple, list)):
        return tuple(_batch_rows(column) for column in value)
    if isinstance(value, dict):
        columns = {key: _batch_rows(column) for key, column in value.items()}
        rows = len(next(iter(columns.values())))
        return [_records({key: column[i] for key, column in columns.items()}) for i in range(rows)]
    if value.shape.rank == 0:
        raise ValueError("a tf.data.Dataset element holds a scalar; expected batches (dataset.batch(n))")
    return _decoded(value.to_list() if hasattr(value, "to_list") else value.numpy().tolist())


def _records(row):
    """A dict of equal lists (TFDS's answers) as a list of dicts; another dict as it is."""
    if row and all(isinstance(value, list) for value in row.values()):
        return [dict(zip(row, values)) for values in zip(*row.values())]
    return row


def _decoded(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [_decoded(item) for item in value]
    return value


def _concatenate(batches):
    """The batches of `_batch_rows` joined: lists end to end, tuples column by column."""
    if isinstance(batches[0], tuple):
        return tuple(_concatenate([batch[i] for batch in batches]) for i in range(len(batches[0])))
    return [row for batch in batches for row in batch]
