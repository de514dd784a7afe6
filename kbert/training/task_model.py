"""A kbert task as one Keras model: raw texts into `fit`, `evaluate` and `predict`, saved whole.

`TaskModel` holds the task's network (encoder and head, `Task.build_model`)
and its `BertPreprocessor` (tokenizer and vocabulary), with the task's name
and settings (label names, score range, truncation). `fit` batches raw
inputs the way `kbert finetune` does (`kbert.training.batching`: its packing,
shuffles and length buckets), and `compile()` with no optimizer gives the
task's recipe: AdamW on BERT's schedule, sized from the data when `fit`
knows it. `save("x.keras")` keeps everything, and `keras.saving.load_model`
gives back a model that reads text; `save_folder` writes a kbert model
folder for `kbert evaluate`, `predict` and `export`.

Single texts and text pairs (`TextTask`s): text classification, text-pair
classification and text-pair regression. The network is backend-agnostic
Keras; preprocessing and `fit`'s batching are TensorFlow (tf-text, tf.data).

Example:
>>> model = TaskModel.from_checkpoint("all-minilm-l6-v2", labels=["neg", "pos"])  # doctest: +SKIP
>>> model.compile()  # doctest: +SKIP
>>> model.fit(["a dull film", "a fine film"], ["neg", "pos"], epochs=1)  # doctest: +SKIP
>>> model.predict_labels(["a fine play"])  # doctest: +SKIP
"""

import keras

from kbert.tasks import DEFAULT_TASK, get_task
from kbert.tasks.text_task import TextTask
from kbert.training.batching import eval_dataset, train_dataset, training_bucket_width
from kbert.training.finetune import DEFAULT_WARMUP_FRACTION
from kbert.training.optimizers import make_optimizer


@keras.saving.register_keras_serializable(package="kbert")
class TaskModel(keras.Model):
    """A task's network with its preprocessor; takes raw texts.

    Args:
        network: keras.Model from `Task.build_model` (on `ENCODER_INPUTS`).
        preprocessor: `kbert.text.BertPreprocessor`, the task's packing.
        task: str. A task name (`kbert.tasks.TASKS`) whose examples are texts.
        task_settings: dict. `Task.settings()`: label names, score range...
        bert_config: dict. The encoder's `BertConfig.to_dict()`.
    """

    def __init__(self, network, preprocessor, task, task_settings, bert_config, **kwargs):
        super().__init__(**kwargs)
        task_class = text_task(task)
        self.network = network
        self.preprocessor = preprocessor
        self.task_name = task
        self.task_settings = dict(task_settings)
        self.bert_config = dict(bert_config)
        self.task = task_class(preprocessor.tokenizer, preprocessor.sequence_length, **task_settings)
        self.task.preprocessor = preprocessor
        self._recipe_compile = None

    @classmethod
    def from_checkpoint(cls, init, task=DEFAULT_TASK, labels=None, sequence_length=None, dtype=None,
                        **options):
        """The task's model on a checkpoint, its head new.

        Args:
            init: str. What `kbert finetune --init` takes: "all-minilm-l6-v2",
                a Hugging Face or google-research/bert folder.
            task: str. A task whose examples are texts (`kbert.tasks.TASKS`):
                text classification, text-pair classification or regression.
            labels: list of str, or int (that many classes, named "0", "1"...);
                classification only.
            sequence_length: int. Packed length; default the task's recipe's.
            dtype: a dtype policy, "auto" (mixed bfloat16 where the device
                multiplies it natively) or None (the global policy).
            **options: the task's options (`Task.options`), e.g.
                `truncate="longest_first"`, `head="cross"`, `score_range=(0, 5)`.
        """
        from kbert.checkpoints.huggingface import init_encoder
        from kbert.hardware import resolve_dtype
        from kbert.text import WordPieceTokenizer

        task_class = text_task(task)
        settings = {}
        if labels is not None:
            settings["labels"] = [str(i) for i in range(labels)] if isinstance(labels, int) else list(labels)
        if "score_range" in options:
            settings["score_range"] = list(options.pop("score_range"))
        dtype = resolve_dtype(dtype) if dtype is not None else None
        config, encoder, vocabulary, lowercase = init_encoder(init, dtype=dtype)
        if vocabulary is None:
            raise ValueError(f"init={init!r} has no vocabulary; give a checkpoint folder or name")
        length = sequence_length or task_class.recipe.sequence_length
        config.check_sequence_length(length)
        built = task_class(WordPieceTokenizer(vocabulary, lowercase=lowercase), length, **settings)
        built.use_options(task_class.resolve_options(options))
        return cls(built.build_model(encoder, dtype=dtype), built.preprocessor, task,
                   built.settings(), config.to_dict())

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

    def compile(self, optimizer=None, loss=None, metrics=None, **kwargs):
        """Keras's `compile`; what is not given is the task's: its loss, its metrics and,
        with no optimizer, its recipe's AdamW on BERT's schedule, built by `fit`."""
        defaults = self.task.compile_args()
        loss = defaults["loss"] if loss is None else loss
        metrics = defaults.get("metrics") if metrics is None else metrics
        # As kbert finetune trains: without XLA, which is slower on CPUs.
        kwargs.setdefault("jit_compile", False)
        if optimizer is None:
            self._recipe_compile = dict(loss=loss, metrics=metrics, **kwargs)
            optimizer = "adamw"  # a placeholder until fit knows the steps
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def fit(self, x=None, y=None, batch_size=None, epochs=None, validation_data=None, seed=0,
            **kwargs):
        """Trains on raw inputs, batched as `kbert finetune` batches them.

        Args:
            x: texts: a list or array of strings, or a pair `(first_texts, second_texts)`.
            y: targets, one per example: label names or indices, or scores.
            batch_size, epochs: default the task's recipe's.
            validation_data: `(x, y)` in the same form.
            seed: the shuffles' seed (dropout and new weights follow
                `keras.utils.set_random_seed`).
            **kwargs: `keras.Model.fit`'s (callbacks, verbose...).
        """
        recipe = self.task.recipe.override(batch_size=batch_size, epochs=epochs)
        dataset, steps = train_dataset(
            self.task, self.examples(x, y), recipe.batch_size, seed=seed, epochs=recipe.epochs,
            bucket_width=training_bucket_width(bool(self.jit_compile)),
        )
        if self._recipe_compile is not None:
            total = steps * recipe.epochs
            super().compile(
                optimizer=make_optimizer("adamw", recipe.learning_rate, total,
                                         warmup_steps=int(DEFAULT_WARMUP_FRACTION * total)),
                **self._recipe_compile,
            )
            self._recipe_compile = None
        if validation_data is not None:
            encoded = self.task.encode(self.examples(*validation_data))
            validation_data = eval_dataset(self.task, encoded, recipe.batch_size)
        return super().fit(dataset, epochs=recipe.epochs, steps_per_epoch=steps,
                           validation_data=validation_data, shuffle=False, **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        """Keras's loss and compiled metrics on raw inputs (`figures` gives the task's own)."""
        encoded = self.task.encode(self.examples(x, y))
        dataset = eval_dataset(self.task, encoded, batch_size or self.task.recipe.batch_size)
        return super().evaluate(dataset, **kwargs)

    def predict(self, x, batch_size=64, **kwargs):
        """The network's outputs for raw inputs, in their order (a dict if several)."""
        _, _, outputs = self._run(self.examples(x), batch_size)
        return outputs[self.task.outputs[0]] if len(self.task.outputs) == 1 else outputs

    # === The task's answers ===

    def predict_labels(self, x, batch_size=64):
        """What `kbert predict` prints for each input: a label and its scores, or a score."""
        examples, encoded, outputs = self._run(self.examples(x), batch_size)
        return self.task.predict_json(examples, self.task.decode(examples, encoded, outputs))

    def figures(self, x, y, batch_size=64):
        """The task's figures (`kbert evaluate`'s): accuracy and F1s, or Spearman and Pearson."""
        examples, encoded, outputs = self._run(self.examples(x, y), batch_size, targets=True)
        return self.task.evaluate(examples, self.task.decode(examples, encoded, outputs))

    def _run(self, examples, batch_size, targets=False):
        """`(examples, encoded, outputs)`: the network run on `examples`, in their order;
        with `targets`, a label the model does not know is refused naming its line."""
        encoded = self.task.encode(examples, targets=targets)
        return examples, encoded, self.task.run(self.network, encoded.features, batch_size)

    def save_folder(self, out, metrics=None, overwrite=False):
        """Writes a kbert model folder (`kbert evaluate`, `predict`, `export` take it)."""
        from kbert.modelfolder import write_model_folder

        settings = {
            "bert_config": self.bert_config,
            "sequence_length": self.task.sequence_length,
            "lowercase": self.preprocessor.tokenizer.lowercase,
            "init": None, "dtype": self.network.dtype_policy.name, "options": {},
        }
        write_model_folder(out, self.network, self.preprocessor.tokenizer.vocabulary, self.task,
                           settings, metrics or {}, overwrite=overwrite)

    # === Inputs ===

    def examples(self, x, y=None):
        """The task's examples for raw inputs `x` and targets `y` (or None)."""
        width = len(self.task.text_inputs)
        if width == 1:
            columns = (_strings(x, "x"),)
        elif isinstance(x, (tuple, list)) and len(x) == width and not isinstance(x[0], str):
            columns = tuple(_strings(column, f"x[{i}]") for i, column in enumerate(x))
        else:
            raise ValueError(
                f"task {self.task_name!r} takes {width} texts an example; give x as a tuple of "
                f"{width} lists ({', '.join(self.task.text_inputs)})"
            )
        rows = len(columns[0])
        if any(len(column) != rows for column in columns):
            raise ValueError(f"x's columns hold {[len(c) for c in columns]} texts; expected equal counts")
        targets = [None] * rows if y is None else self._targets(y, rows)
        return [{"texts": tuple(column[i] for column in columns), "target": targets[i], "line": i + 1}
                for i in range(rows)]

    def _targets(self, y, rows):
        import numpy as np

        values = np.asarray(y).reshape(-1).tolist()
        if len(values) != rows:
            raise ValueError(f"y holds {len(values)} targets for {rows} examples")
        labels = self.task_settings.get("labels")
        if labels is None:
            return [float(value) for value in values]
        if all(isinstance(value, int) for value in values):
            bad = [value for value in values if not 0 <= value < len(labels)]
            if bad:
                raise ValueError(f"label index {bad[0]} is out of range; {len(labels)} labels: {labels}")
            return [labels[value] for value in values]
        return [str(value) for value in values]

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
            "task_settings": self.task_settings,
            "bert_config": self.bert_config,
        }

    @classmethod
    def from_config(cls, config):
        import kbert.layers  # noqa: F401  (registers the layers the network names)

        config = dict(config)
        config["network"] = keras.saving.deserialize_keras_object(config["network"])
        config["preprocessor"] = keras.saving.deserialize_keras_object(config["preprocessor"])
        return cls(**config)


def text_task(name):
    """The task class `name`, if its examples are texts; else `ValueError` naming those that are."""
    from kbert.tasks import TASKS

    task_class = get_task(name)
    if not (issubclass(task_class, TextTask) and task_class.trainable):
        served = sorted(n for n, t in TASKS.items() if issubclass(t, TextTask) and t.trainable)
        raise ValueError(
            f"task {name!r} does not take texts; TaskModel serves {', '.join(served)}; "
            "train it with kbert.training.finetune"
        )
    return task_class


def _strings(values, name):
    import numpy as np

    values = np.asarray(values, dtype=object).reshape(-1).tolist()
    wrong = [value for value in values if not isinstance(value, str)]
    if wrong:
        raise ValueError(f"{name} holds {type(wrong[0]).__name__} {wrong[0]!r}; expected strings")
    return values
