"""The model folder: what `kbert finetune` writes and every other command reads.

| file | content |
| --- | --- |
| `model.keras` | the task's model (token ids -> the task's outputs) |
| `vocab.txt` | the WordPiece vocabulary |
| `kbert.json` | `task`, `task_settings` (the task's config: label names, data columns, options), `bert_config`, `sequence_length`, `lowercase`, `vocabulary_size` (the lines of `vocab.txt`), how it was trained |
| `metrics.json` | dev figures and the training curve |
| `README.md` | the model card (`kbert.modelcard`) |
| `training.png` | the training loss and dev figures, where it was trained with `fit_epochs` (`kbert.plots`) |
| `.kbert-manifest.json` | the files kbert wrote: what `--overwrite` may replace (`kbert.fileio`) |

Folders written before tasks existed have no `task` in `kbert.json` and keep
their label names in `labels.json`; they load as `text-classification`.

A task that needs no training (`Task.trainable` False) has no folder of its
own: `ModelFolder.from_pretrained` builds it in memory on a pretrained
checkpoint, or on the encoder of a model folder of another task, and
`open_model` picks the one of the two ways that `--model` and `--task` name.

Example:
>>> folder = ModelFolder.load("runs/debian-minilm")  # doctest: +SKIP
>>> folder.predict(folder.task.examples_from_texts(["A text editor."]))  # doctest: +SKIP
"""

import contextlib
import json
import os
import zipfile

from kbert.config import ENCODER_INPUTS, PACKAGED_CHECKPOINTS, BertConfig
from kbert.fileio import check_distinct, check_output_folder, read_json, staged_folder
from kbert.tasks import DEFAULT_TASK, TASKS, get_task, inference
from kbert.tasks.base import INFERENCE_BATCH_SIZE as BATCH_SIZE

MODEL_FILE = "model.keras"
VOCAB_FILE = "vocab.txt"
SETTINGS_FILE = "kbert.json"
METRICS_FILE = "metrics.json"
# Where folders of the first format kept their label names.
LEGACY_LABELS_FILE = "labels.json"
FORMAT = "kbert-model"
# What a model folder written before manifests holds: kbert's own names
# (`kbert.fileio.foreign_entries`); anything else in it is the user's.
MODEL_FOLDER_NAMES = (MODEL_FILE, VOCAB_FILE, SETTINGS_FILE, METRICS_FILE, LEGACY_LABELS_FILE)
# The longest input of a pretrained checkpoint that does not say its own
# (`Task.pretrained_sequence_length`): BERT tokenizers' `model_max_length`,
# what sentence-transformers then uses.
PRETRAINED_SEQUENCE_LENGTH = 512


def is_model_folder(path):
    """Whether `path` is a kbert model folder (one that `ModelFolder.load` reads)."""
    settings = os.path.join(path, SETTINGS_FILE)
    if not os.path.isfile(settings):
        return False
    try:
        return "bert_config" in read_json(settings)
    except (OSError, ValueError):
        return False


def check_model_out(out, overwrite, inputs):
    """Refuses, before any work, a model folder `out` that kbert may not write.

    Args:
        out: str. The model folder to write.
        overwrite: bool. Whether an earlier kbert model folder may be replaced
            (only when it holds nothing but kbert's files).
        inputs: dict. Option -> path the command reads: `out` may be none of
            them, inside none, and hold none.
    """
    check_distinct({"--out": out}, inputs)
    check_output_folder(out, "model", is_model_folder, overwrite, MODEL_FOLDER_NAMES)


def check_student_out(teacher, out, overwrite, train, dev, unlabelled=None, student=None):
    """Refuses, before any work, a `teacher` that is no model folder, or a
    student folder `out` kbert may not write (`check_model_out`) given what
    `kbert distill` reads."""
    if os.path.abspath(out) == os.path.abspath(teacher):
        raise ValueError(f"--out {out} is the teacher's folder; write the student to another")
    if not is_model_folder(teacher):
        raise ValueError(f"--teacher {teacher} is not a kbert model folder (what kbert finetune --out writes)")
    inputs = {"--teacher": teacher, "--train": train, "--dev": dev, "--unlabelled": unlabelled, "--student": student}
    check_model_out(out, overwrite, inputs)


def write_model_folder(out, model, vocabulary, task, settings, metrics, overwrite=False):
    """Writes a model folder: staged beside `out`, then renamed into place.

    Args:
        out: str. The folder; an existing kbert model folder is replaced only
            with `overwrite` (`kbert.fileio.staged_folder`).
        model: keras.Model from `task.build_model`.
        vocabulary: list of str.
        task: the `Task` instance.
        settings: dict. `bert_config`, `sequence_length`, `lowercase` and how
            the model was trained.
        metrics: dict. Dev figures, for `metrics.json`.
    """
    from kbert.text import save_vocab

    content = {"format": FORMAT, "task": task.name, "task_settings": task.settings(),
               "vocabulary_size": len(vocabulary), **settings}
    with staged_folder(out, is_model_folder, overwrite, what="model", known_names=MODEL_FOLDER_NAMES) as staging:
        with _without_training_state(model):
            model.save(os.path.join(staging, MODEL_FILE))
        save_vocab(vocabulary, os.path.join(staging, VOCAB_FILE))
        for name, value in ((SETTINGS_FILE, content), (METRICS_FILE, metrics)):
            with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
                json.dump(value, f, indent=2, ensure_ascii=False, allow_nan=False)
        _describe(staging, os.path.basename(os.path.normpath(out)), task, content, metrics)


def _describe(folder, name, task, content, metrics):
    """The model card (`README.md`) and the training picture (`training.png`,
    where `metrics` hold a training curve) of the model folder being written."""
    from kbert import modelcard, plots

    plot = plots.training_plot(metrics, os.path.join(folder, plots.TRAINING_PLOT), name)
    modelcard.write_model_card(folder, task, content, metrics, name=name, plot=plot and plots.TRAINING_PLOT)


@contextlib.contextmanager
def _without_training_state(model):
    """`model` as an uncompiled model while it is saved: `model.keras` then holds the
    weights alone, not the optimizer's two moments of each (three times the size);
    a run resumes from its own checkpoints (`kbert.fitting.backup`)."""
    optimizer, compiled = getattr(model, "optimizer", None), getattr(model, "compiled", False)
    model.optimizer, model.compiled = None, False
    try:
        yield
    finally:
        model.optimizer, model.compiled = optimizer, compiled


class ModelFolder:
    """A model folder loaded for inference and export.

    Attributes: `path`, `model` (keras.Model), `vocabulary`, `config`
    (BertConfig), `sequence_length`, `lowercase`, `tokenizer`, `task` (the
    `Task` instance, which owns the preprocessing), `settings` (kbert.json).
    """

    def __init__(self, path, model, vocabulary, settings):
        from kbert.text import WordPieceTokenizer

        self.path = path
        self.model = model
        self.vocabulary = vocabulary
        self.settings = settings
        self.config = BertConfig.from_dict(settings["bert_config"])
        self.sequence_length = settings["sequence_length"]
        self.lowercase = settings["lowercase"]
        self.tokenizer = WordPieceTokenizer(vocabulary, lowercase=self.lowercase)
        self.task = get_task(settings["task"]).stored(self.tokenizer, self.sequence_length, _task_values(settings))

    @classmethod
    def load(cls, folder):
        """Reads `folder`, its parts checked against each other (`_check_parts`,
        `Task.check_model`); `ValueError` naming the file and what is wrong with it."""
        import kbert.models  # noqa: F401  (registers the layers and heads model.keras names)
        from kbert.text import load_vocab

        if not os.path.isdir(folder):
            raise ValueError(f"{folder}: no such model folder")
        paths = {name: os.path.join(folder, name) for name in (MODEL_FILE, VOCAB_FILE, SETTINGS_FILE)}
        missing = [name for name, path in paths.items() if not os.path.isfile(path)]
        if missing:
            raise ValueError(f"{folder} is not a kbert model folder: {', '.join(missing)} missing")
        settings = _read_settings(folder, paths[SETTINGS_FILE])
        model = load_keras_file(paths[MODEL_FILE])
        source = _settings_source(folder, settings)
        vocabulary = load_vocab(paths[VOCAB_FILE])  # its errors name vocab.txt
        try:
            loaded = cls(folder, model, vocabulary, settings)
        except (KeyError, TypeError) as error:
            raise ValueError(
                f"{paths[SETTINGS_FILE]} is not what kbert finetune writes ({type(error).__name__}: {error})"
            ) from None
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None
        missing_inputs = sorted(set(ENCODER_INPUTS) - set(getattr(model, "input", {}) or {}))
        if missing_inputs:
            raise ValueError(f"{paths[MODEL_FILE]} lacks the inputs {missing_inputs}")
        _check_parts(loaded, paths)
        # Checked before a legacy head moves into its layer: a model that does
        # not fit the settings is named as such, not as a weight with no place.
        loaded.task.check_model(model, source)
        try:
            loaded.model = with_head_layer(model, loaded.task)
        except ValueError as error:
            raise ValueError(f"{paths[MODEL_FILE]}: {error}") from None
        return loaded

    @classmethod
    def from_pretrained(cls, model, task, options=None, sequence_length=None):
        """A task that needs no training, on a pretrained encoder (nothing is written).

        Args:
            model: str. A checkpoint `kbert.checkpoints.load_pretrained` reads
                (a Hugging Face or google-research/bert folder, a packaged name
                such as "all-minilm-l6-v2"), or a kbert model folder, whose
                encoder is used as trained.
            task: str. A task whose `trainable` is False.
            options: dict. Option name -> value given (or None), for
                `Task.pretrained_settings`.
            sequence_length: int or None. Packed length; default the model
                folder's, or what the checkpoint asks for
                (`Task.pretrained_sequence_length`), else up to
                `PRETRAINED_SEQUENCE_LENGTH`.

        Returns:
            ModelFolder whose `path` is `model`.

        Example:
        >>> from kbert.tasks import EMBEDDING_TASK
        >>> folder = ModelFolder.from_pretrained("all-minilm-l6-v2", EMBEDDING_TASK)  # doctest: +SKIP
        """
        task_class = get_task(task)
        if task_class.trainable:
            raise ValueError(
                f"task {task!r} needs training: fine-tune it with kbert finetune and pass "
                "the model folder as --model"
            )
        # A head that comes from the checkpoint (fill-mask's masked LM) is built on its pretrainer.
        heads = task_class.objective.pretrained_heads
        if is_model_folder(model) and heads:
            raise ValueError(
                f"{model} is a kbert model folder, which keeps no masked-LM head; task {task!r} needs a "
                "checkpoint that has one (Hugging Face BertForMaskedLM or BertForPreTraining, google-research/bert)"
            )
        if is_model_folder(model):
            trained = cls.load(model)
            config, source = trained.config, trained.encoder
            vocabulary, lowercase = trained.vocabulary, trained.lowercase
            checkpoint, default_length = None, trained.sequence_length
        else:
            from kbert.checkpoints import load_pretrained

            pretrained = load_pretrained(model, heads=heads)
            config, source = pretrained.config, pretrained.pretrainer or pretrained.encoder
            vocabulary, lowercase = pretrained.vocabulary, pretrained.lowercase
            checkpoint = pretrained.folder
            default_length = task_class.pretrained_sequence_length(checkpoint) or min(
                PRETRAINED_SEQUENCE_LENGTH, config.max_position_embeddings
            )
        sequence_length = sequence_length or default_length
        config.check_sequence_length(sequence_length)
        settings = {
            "task": task_class.name,
            "task_settings": task_class.pretrained_settings(checkpoint, options),
            "bert_config": config.to_dict(),
            "sequence_length": sequence_length,
            "lowercase": lowercase,
        }
        folder = cls(model, None, vocabulary, settings)
        folder.model = folder.task.build_model(source)
        return folder

    def set_sequence_length(self, sequence_length):
        """Packs inputs to `sequence_length` from now on (e.g. to time another length)."""
        self.config.check_sequence_length(sequence_length)
        self.sequence_length = sequence_length
        self.task = type(self.task).stored(self.tokenizer, sequence_length, self.task.settings())

    def use_options(self, given=None):
        """The task's options: those stored with the model, with those `given` merged in.

        Args:
            given: dict. Option name -> value given (on the command line), or None.

        Returns:
            dict. Every option of the task, by name, as the task now uses them
            (`Task.use_options`); read data with it.
        """
        self.task.use_options(given)
        return self.task.option_values(self.task.config)

    # === The model ===

    @property
    def encoder_layer(self):
        return self.model.get_layer("bert_encoder")

    @property
    def compute_dtype(self):
        """The dtype the encoder computes in: "bfloat16" for a mixed_bfloat16 model.

        The outer functional Model reports float32 whatever its layers do.
        """
        return self.encoder_layer.get_layer("token_embedding").dtype_policy.compute_dtype

    def float32_model(self):
        """The model computing in float32, on a copy of the same weights.

        A model trained under mixed precision keeps float32 variables but
        computes in bfloat16 or float16; exported artefacts compute in float32,
        and this is the Keras model they are held to. Returns `self.model` when
        it already computes in float32.
        """
        if self.compute_dtype == "float32":
            return self.model
        model = self.task.build_model(self.config, dtype="float32")
        model.set_weights(self.model.get_weights())
        return model

    @property
    def encoder(self):
        """The full encoder (every position), sharing the model's weights."""
        from kbert.models import rewire_encoder

        return rewire_encoder(self.encoder_layer, first_token_only=False)

    # === Inference ===

    def outputs(self, features, model=None, batch_size=BATCH_SIZE):
        """The model's outputs on int32 features, a dict keyed by `task.outputs`."""
        try:
            return self.task.run(model or self.model, features, batch_size)
        except ValueError as error:
            raise ValueError(f"{self.path}: {error}") from None

    def predict_chunks(self, examples, batch_size=BATCH_SIZE):
        """`(chunk, predictions)` for each chunk of `examples` (any iterable, read as it
        is used), in order: memory holds one chunk's rows (`kbert.tasks.inference.predict_chunks`)."""
        return inference.predict_chunks(self.task, examples, lambda features: self.outputs(features, None, batch_size))

    def predict(self, examples, batch_size=BATCH_SIZE):
        """The task's predictions for `examples`."""
        return inference.joined(predictions for _, predictions in self.predict_chunks(examples, batch_size))

    def evaluate(self, examples, source="data", batch_size=BATCH_SIZE, on_chunk=None):
        """The task's figures on labelled `examples`.

        The rows are made a chunk at a time; the predictions, which the
        figures need together, are kept. `on_chunk(n)`: called as each chunk
        of `n` examples is done (progress).
        """
        return self.evaluated(examples, source, batch_size, on_chunk)[0]

    def evaluated(self, examples, source="data", batch_size=BATCH_SIZE, on_chunk=None):
        """`(figures, predictions)`: `evaluate`'s figures and the predictions they
        come from (for pictures of them, `kbert.plots.evaluation_plots`)."""
        self.task.check(examples, source)
        predictions = []
        for chunk, chunk_predictions in self.predict_chunks(examples, batch_size):
            predictions.append(chunk_predictions)
            if on_chunk is not None:
                on_chunk(len(chunk))
        predictions = inference.joined(predictions)
        return self.task.evaluate(examples, predictions), predictions

    def embed(self, texts, batch_size=BATCH_SIZE):
        """float32 `(len(texts), dimension)`: the task's vector of each text (`Task.embeddings`)."""
        examples = self.task.examples_from_texts(list(texts))
        return self.task.embeddings(self.predict(examples, batch_size))


def load_keras_file(path):
    """The Keras model in the `.keras` file `path`, its archive checked whole first.

    Keras says "File not found" of a truncated `.keras` file (its zip
    directory, at the end, is gone) and reads flipped bytes in the weights as
    weights; here both are one line naming `path` as damaged.
    """
    import keras

    damaged = f"{path} is damaged: "
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # every member's CRC-32
    except (zipfile.BadZipFile, EOFError):
        raise ValueError(damaged + "not a complete .keras zip archive (truncated?); write it again") from None
    if bad is not None:
        raise ValueError(damaged + f"its member {bad} fails its CRC check; write it again")
    try:
        return keras.saving.load_model(path, compile=False)
    except Exception as error:  # Keras raises many types for an archive it cannot read.
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path} is not a readable Keras model: {reason}") from None


def _check_parts(loaded, paths):
    """`ValueError` naming the files of the first fact the folder's parts disagree on:
    `kbert.json`'s `bert_config`, `sequence_length` and `vocabulary_size`
    against the encoder in `model.keras` and the lines of `vocab.txt` (the
    head against the task's settings is `Task.check_model`'s). The first file
    named is named by its path, the second, in the same folder, by its name,
    so that the line holds both whole."""
    settings_file, model_file, vocab_file = paths[SETTINGS_FILE], paths[MODEL_FILE], paths[VOCAB_FILE]
    try:
        facts = _encoder_facts(loaded)
    except ValueError as error:  # Keras's "No such layer"
        raise ValueError(f"{model_file} holds no kbert BERT encoder ({error})") from None
    for key, stored, actual, what in facts:
        if stored != actual:
            raise ValueError(f"{settings_file} says {key}={stored} but {MODEL_FILE} has {actual} {what}")
    try:
        loaded.config.check_sequence_length(loaded.sequence_length)
    except ValueError as error:
        raise ValueError(f"{settings_file}: {error} (the position embeddings of {MODEL_FILE})") from None
    tokens, rows = len(loaded.vocabulary), loaded.config.vocab_size
    # Folders written before `vocabulary_size` was stored are held to the embedding's rows alone.
    written = loaded.settings.get("vocabulary_size")
    if written is not None and tokens != written:
        raise ValueError(
            f"{vocab_file} has {tokens} tokens; {SETTINGS_FILE} says the model was written with {written} "
            "(the file is cut or replaced): restore the folder's vocab.txt"
        )
    if tokens > rows:
        raise ValueError(f"{vocab_file} has {tokens} tokens; {MODEL_FILE} embeds {rows} token ids")


def _encoder_facts(loaded):
    """`(bert_config key, stored value, the encoder's, unit)` for the encoder's shapes."""
    encoder, config = loaded.encoder_layer, loaded.config
    tokens = encoder.get_layer("token_embedding")
    blocks = [layer for layer in encoder.layers if layer.name.startswith("transformer_layer_")]
    return (
        ("vocab_size", config.vocab_size, tokens.input_dim, "token embedding rows"),
        ("hidden_size", config.hidden_size, tokens.output_dim, "embedding columns"),
        ("max_position_embeddings", config.max_position_embeddings,
         encoder.get_layer("position_embedding").max_length, "position embedding rows"),
        ("type_vocab_size", config.type_vocab_size, encoder.get_layer("segment_embedding").input_dim,
         "segment embedding rows"),
        ("num_layers", config.num_layers, len(blocks), "encoder blocks"),
    )


def _needs_task():
    """What a `--model` that is no model folder needs, said after what it is (from
    `TASKS` as it is now: a task may be added after import)."""
    untrained = [name for name, task_class in TASKS.items() if not task_class.trainable]
    return f"a pretrained checkpoint needs --task, one that needs no training ({', '.join(untrained)})"


def check_model_name(model, task=None):
    """Refuses a `model` (and `task`) that `open_model` cannot open whatever it holds; cheap (loads nothing).

    With no `task` it must be a folder (a model folder); with one, a folder
    or a name in `PACKAGED_CHECKPOINTS`, and a model folder must be of that
    task, or the task one that needs no training (it runs on the encoder).
    """
    if task is not None and is_model_folder(model):
        stored = _stored_task(model)
        if stored != task and get_task(task).trainable:
            raise ValueError(
                f"--task {task} does not match --model {model}, a {stored} model folder: "
                f"omit --task, or pass a {task} model folder"
            )
    if os.path.isdir(model) or (task is not None and model in PACKAGED_CHECKPOINTS):
        return
    if task is None:
        raise ValueError(f"--model {model}: no such model folder; {_needs_task()}")
    raise ValueError(
        f"--model {model}: no such model folder, checkpoint folder or packaged checkpoint "
        f"({', '.join(sorted(PACKAGED_CHECKPOINTS))})"
    )


def open_model(model, task=None, options=None, sequence_length=None):
    """The model that `--model` and `--task` name.

    Args:
        model: str. A kbert model folder, or a pretrained checkpoint.
        task: str or None. None, or the folder's own task: the model folder as
            trained. Another task, which must need no training: that task on
            `model`'s encoder (`ModelFolder.from_pretrained`). A task of a
            fine-tuned transformers folder (`kbert.checkpoints.hf_tasks`): that
            folder with its head.
        options: dict. Option name -> value given (or None).
        sequence_length: int or None. Packed length; default: the model's own.

    Raises:
        ValueError: one line naming `model` and what is wrong.
    """
    check_model_name(model, task)
    if task is not None and get_task(task).trainable and not is_model_folder(model):
        from kbert.checkpoints.hf_tasks import load_hf_task_folder, task_class_of

        if task_class_of(model):  # a fine-tuned transformers task folder, its head kept
            return load_hf_task_folder(model, task, options, sequence_length)
    if task is not None and not (is_model_folder(model) and _stored_task(model) == task):
        return ModelFolder.from_pretrained(model, task, options, sequence_length)
    try:
        folder = ModelFolder.load(model)
    except ValueError as error:
        if task is not None or is_model_folder(model):
            raise
        raise ValueError(f"{str(error).splitlines()[0]}; {_needs_task()}") from None
    if sequence_length is not None and sequence_length != folder.sequence_length:
        folder.set_sequence_length(sequence_length)
    return folder


def _stored_task(folder):
    return _read_settings(folder, os.path.join(folder, SETTINGS_FILE))["task"]


def _task_values(settings):
    """The task's config values in `kbert.json`'s `settings`."""
    # Folders written before one config per task kept the data options apart.
    former = {k: v for k, v in (settings.get("options") or {}).items() if v is not None}
    return {**former, **settings["task_settings"]}


def stored_data_options(folder, given=None):
    """A model folder's task and the data options it reads with: `(task class,
    options)` as `ModelFolder.load(folder).use_options(given)` gives them, from
    `kbert.json` alone, so the command line can read data before TensorFlow loads.

    None if `kbert.json` is not what kbert writes (`ModelFolder.load` says what is
    wrong); a `given` option that the model cannot take is refused as `use_options` does.
    """
    try:
        settings = _read_settings(folder, os.path.join(folder, SETTINGS_FILE))
        task_class = get_task(settings["task"])
        config = task_class.Config.create(task_class.Config.with_formers(_task_values(settings)))
    except (KeyError, TypeError, ValueError):
        return None
    config = config.merged(given, trained=True)
    return task_class, task_class.option_values(config)


def stored_settings(folder):
    """A model folder's `kbert.json` as `ModelFolder` reads it, `task_settings` holding
    every task value (a first-format folder's labels too), read without
    TensorFlow so that data is checked against the model before it loads;
    `ValueError` naming the file, `KeyError` if it lacks `task_settings`."""
    settings = _read_settings(folder, os.path.join(folder, SETTINGS_FILE))
    return {**settings, "task_settings": _task_values(settings)}


def _read_settings(folder, path):
    settings = read_json(path)
    if not isinstance(settings, dict):
        raise ValueError(f"{path} holds {type(settings).__name__}; expected a JSON object")
    if "task" not in settings:  # the first format: a text classifier
        labels_path = os.path.join(folder, LEGACY_LABELS_FILE)
        if not os.path.isfile(labels_path):
            raise ValueError(f"{folder} is not a kbert model folder: {LEGACY_LABELS_FILE} missing")
        try:
            with open(labels_path, encoding="utf-8") as f:
                labels = json.load(f)
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"{labels_path} is not valid JSON ({error})") from None
        settings = {**settings, "task": DEFAULT_TASK, "task_settings": {"labels": labels}}
    return settings


def _settings_source(folder, settings):
    """The file that holds the task settings, for messages."""
    if "format" in settings:
        return os.path.join(folder, SETTINGS_FILE)
    return os.path.join(folder, LEGACY_LABELS_FILE)


def with_head_layer(model, task):
    """`model`, or if it was written before heads were one layer, the task's model
    rebuilt around its encoder with its head's weights.

    Models saved before `kbert.models.heads` keep their head as loose layers
    ("logits", "qa_outputs", "cross_score", "cosine_score"); the task's head
    layer holds sublayers of the same names, so each weight moves to the one
    of the same path under "head/". A weight with no place raises.
    """
    from kbert.models.heads import HEAD_LAYER

    if any(layer.name == HEAD_LAYER for layer in model.layers):
        return model
    rebuilt = task.build_model(model.get_layer("bert_encoder"), dtype=model.dtype_policy.name)
    places = {variable.path.split("/", 1)[1]: variable for variable in rebuilt.get_layer(HEAD_LAYER).weights}
    encoder_weights = {id(variable) for variable in model.get_layer("bert_encoder").weights}
    for variable in model.weights:
        if id(variable) in encoder_weights:
            continue
        if variable.path not in places:
            raise ValueError(f"model {model.name!r}: weight {variable.path!r} has no place in the task's head")
        places.pop(variable.path).assign(variable.value)
    if places:
        raise ValueError(f"model {model.name!r}: no weight for the head's {sorted(places)}")
    return rebuilt
