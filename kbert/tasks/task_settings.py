"""What every task does with its settings, its packed length and `Config`, the same for all.

`Task` inherits `TaskSettings`: the packed length checked against the texts
it packs; the flags (`options`) completed with their defaults, merged into a
model's config wherever data is read, unset for a student that tunes them
again, stored in the model folder (`settings`) and read back (`stored`);
`kbert finetune`'s data read and checked with them. No task overrides these;
what differs between tasks is `kbert.tasks.base.Task`'s hooks.
"""

from kbert.tasks.task_config import ConfigFields, TaskConfig


class TaskSettings(ConfigFields):
    """A task's settings: its `sequence_length`, and its `config`, whose fields
    read and write as its attributes (`task.labels`)."""

    # Every setting, declared once (`kbert.tasks.task_config`): the flags,
    # what is learned from training data, what `kbert.json` stores.
    Config = TaskConfig
    # The flags of `Config`, in CLI order (set for each subclass).
    options = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.options = cls.Config.flags()

    @classmethod
    def check_sequence_length(cls, sequence_length, name="sequence_length"):
        """Raises `ValueError` if `sequence_length` leaves no room for text: the task packs
        [CLS], then each of its `text_inputs` and a [SEP], and each text needs a piece.

        `name`: how the caller names the length ("--seq-len" on the command line).
        """
        least = 1 + 2 * len(cls.text_inputs)
        if not isinstance(sequence_length, int) or sequence_length < least:
            given = f"{name} {sequence_length}" if name.startswith("--") else f"{name}={sequence_length!r}"
            packed = " ".join(["[CLS]", *(f"{text} [SEP]" for text in cls.text_inputs)])
            raise ValueError(
                f"{given} leaves no room for text: task {cls.name!r} packs {packed}; expected at least {least}"
            )

    @classmethod
    def stored(cls, tokenizer, sequence_length, values):
        """The task of a model folder's stored settings (`TaskConfig.with_formers`)."""
        task = cls(tokenizer, sequence_length, **cls.Config.with_formers(values))
        task.trained = True
        return task

    @classmethod
    def read_training(cls, train, dev, options=None):
        """`finetune`'s data: `(options, train examples, dev examples, learned)`, the
        options completed (`resolve_options`), `learned` what `train` teaches and
        `dev` checked against it. Needs no TensorFlow, so `kbert finetune`
        refuses bad data before it loads."""
        options = cls.resolve_options(options)
        train_examples = cls.read(train, options)
        dev_examples = cls.read(dev, options)
        learned = cls.learn(train_examples, train)
        cls.check_learned(learned, dev_examples, dev)
        return options, train_examples, dev_examples, learned

    @classmethod
    def option_values(cls, config):
        """Every option's value in `config` (this task's `Config`), by name: what data is read with."""
        return {option.name: getattr(config, option.name) for option in cls.options}

    @classmethod
    def resolve_options(cls, options):
        """`options` (name -> value or None) completed with the flags' defaults."""
        given = options or {}
        return {o.name: o.default if given.get(o.name) is None else given[o.name] for o in cls.options}

    def settings(self):
        """The JSON dict stored in the model folder: every `Config` field."""
        return self.config.to_dict()

    def use_options(self, options):
        """Merges the flags given (name -> value or None; command-line values are
        strings) into `config` (`TaskConfig.merged`). Called wherever this
        instance's examples are read: by the trainer, `evaluate`, `predict`
        and the exporter."""
        self.config = self.config.merged(options, self.trained)
        self.configure()

    def untune(self, given=None):
        """Forgets the settings `tune` chose on another model's dev predictions
        (`TaskConfig.untuned`), but those `given`: a student distilled from a
        teacher chooses its own."""
        self.config = self.config.untuned(given)
        self.configure()
