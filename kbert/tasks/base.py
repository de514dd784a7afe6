"""`Task`: everything that differs between BERT's tasks, behind one interface.

A task owns its data format, preprocessing, head, loss and metrics, what it
stores in the model folder, what `predict` prints, its serving signature and
the figure an exported artefact is judged by. The trainers
(`kbert.training.finetune`, `kbert.training.distill`), the model folder
(`kbert.modelfolder`), the exporter (`kbert.export`) and the command line
ask the task and never test its name. A task rests on `kbert.models` and `kbert.text` only.

The life of a task instance:

    examples = Task.read(path, options)            # list of dicts, each with "line"
    settings = Task.learn(examples, path)          # what training data teaches (labels)
    task = Task(tokenizer, sequence_length, **settings)
    encoded = task.encode(examples)                # int32 features, targets, rows -> examples
    model = task.build_model(encoder, dtype)       # inputs: ENCODER_INPUTS
    outputs = {name: array}                        # the model's outputs on encoded.features
    predictions = task.decode(examples, encoded, outputs)
    task.evaluate(examples, predictions)           # {"n": ..., metric: ...}

A model's outputs are always handled as a dict keyed by `task.outputs`. The
export path recomputes the encoder with converter-friendly ops and calls
`task.head` on it, so a task's head must be made of Keras layers that `head`
can call on TensorFlow tensors.
"""

import dataclasses

import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.tabular import read_table

# Batches of rows of similar length are padded to a multiple of this many
# tokens (`Task.batches_by_length`, and training under XLA or JAX): few
# shapes to compile, little padding wasted.
BUCKET_WIDTH = 32
# Training batches on TensorFlow without XLA, where a new width costs no
# compile, hold rows of similar length padded to a multiple of this: the
# encoder blocks skip the padding but in attention's scores, whose cost
# grows with the square of the width.
FINE_BUCKET_WIDTH = 16
# Epoch e of a run with seed s is shuffled with the seed STRIDE * s + e, so
# epochs and seeds never share a shuffle.
EPOCH_SEED_STRIDE = 1_000_003
# Examples tokenized per call of the preprocessor in `encode`.
ENCODE_CHUNK = 1024
# A float32 artefact computes what Keras computes in another order: outputs
# agree to ~1e-6, so 1e-4 flags a wrong op, not rounding.
FLOAT_TOLERANCE = 1e-4
# A quantized artefact may lose this much of the task's metric (a fraction:
# accuracy, Spearman) against the Keras model: 0.1 point for float16, half a
# point for the int8 schemes.
METRIC_BUDGETS = {"fp16": 0.001, "dynamic": 0.005, "int8": 0.005, "16x8": 0.005}


@dataclasses.dataclass(frozen=True)
class Option:
    """A data option a task takes (a `--flag` of finetune, evaluate and predict).

    Options of the same `name` in several tasks mean the same thing.
    """

    name: str
    help: str
    default: object = None
    # The values it may take (checked when the command line is parsed), or None.
    choices: tuple = None


@dataclasses.dataclass
class Encoded:
    """Examples as model inputs.

    Attributes:
        features: dict of int32 `(rows, sequence_length)` arrays named `ENCODER_INPUTS`.
        targets: array or dict of arrays, one per row, or None without targets.
        example_of_row: int `(rows,)`: the example each row comes from (tasks
            that window long inputs have several rows per example).
        extra: what the task's `decode` needs besides (offsets, windows).
    """

    features: dict
    targets: object = None
    example_of_row: np.ndarray = None
    extra: object = None

    def __post_init__(self):
        if self.example_of_row is None:
            self.example_of_row = np.arange(len(self.features[ENCODER_INPUTS[0]]))

    def __len__(self):
        return len(self.example_of_row)


class Task:
    """One BERT task; subclasses set the class attributes and the hooks below.

    Args:
        tokenizer: `kbert.text.WordPieceTokenizer`.
        sequence_length: int. Packed length of every input row.
        **settings: what `learn` returned when the model was trained.
    """

    # The registry name, used by `--task`.
    name = None
    # One line for `kbert finetune --help`.
    description = ""
    # Options of `read`, in CLI order.
    options = ()
    # Names of the model's outputs.
    outputs = ("logits",)
    # True if the head reads `sequence_output` (every position); else the
    # export graph computes only [CLS] in the last block.
    reads_sequence = False
    # The string inputs of the SavedModel's `serving_default`.
    text_inputs = ("text",)
    # The figure artefacts are judged by (`evaluate`'s key; higher is better),
    # its display scale (100: points) and how much each quantization may lose.
    metric = None
    metric_scale = 1.0
    budgets = {}
    # The MediaPipe task that runs this model (`kbert.export.mediapipe`), if any.
    mediapipe = None
    # Whether the export has a string-in TFLite variant (`tflite_text_features`):
    # one row per example, packed with builtin ops.
    tflite_text_variant = True
    # False for a task that needs no training (sentence embeddings): `kbert
    # finetune` refuses it, and the other commands build it on a pretrained
    # checkpoint with `--task` (`pretrained_settings`,
    # `kbert.modelfolder.ModelFolder.from_pretrained`).
    trainable = True
    # What `kbert finetune` trains with unless flags say otherwise
    # (`kbert.recipes.Recipe`): each trainable task names its own.
    recipe = None

    def __init__(self, tokenizer, sequence_length, **settings):
        from kbert.text import BertPreprocessor

        if settings:
            raise ValueError(f"task {self.name!r} takes no settings; got {sorted(settings)}")
        self.tokenizer = tokenizer
        self.sequence_length = sequence_length
        self.preprocessor = BertPreprocessor(tokenizer, sequence_length=sequence_length)

    # === Data ===

    @classmethod
    def read(cls, path, options=None, targets=True):
        """Reads a data file; `targets=False` for files without labels (predict)."""
        raise NotImplementedError

    @classmethod
    def learn(cls, examples, source):
        """What the training data teaches beyond weights (label names): a JSON dict."""
        return {}

    @classmethod
    def resolve_options(cls, options):
        """`options` (name -> value or None) completed with this task's defaults."""
        options = options or {}
        return {o.name: options.get(o.name) if options.get(o.name) is not None else o.default
                for o in cls.options}

    def settings(self):
        """The JSON dict stored in the model folder; `Task(..., **settings)` rebuilds."""
        return {}

    def use_options(self, options):
        """Takes the data options that act beyond `read` (a window stride, a threshold).

        Called with the options (name -> value or None; command-line values
        are strings) wherever this instance's examples are read: by the
        trainer, `evaluate`, `predict` and the exporter. Default: none.
        """

    def tune(self, examples, predictions):
        """Settings chosen on the dev predictions after training (a threshold).

        The trainer calls it before the dev figures are computed and stores
        `settings()` after it. Returns what it chose and what training
        counted (questions skipped), a JSON dict merged into metrics.json;
        default: nothing.
        """
        return {}
    @classmethod
    def pretrained_settings(cls, checkpoint, options):
        """The settings of this task on a pretrained encoder, for a task that needs no training.

        Args:
            checkpoint: str or None. The checkpoint's folder, for what it says
                of the task (None: a kbert model folder's encoder).
            options: dict. Option name -> value given, or None.
        """
        raise ValueError(f"task {cls.name!r} needs training; it has no pretrained settings")

    @classmethod
    def pretrained_sequence_length(cls, checkpoint):
        """The packed length a pretrained `checkpoint` folder asks for, or None."""
        return None

    def check(self, examples, source):
        """Raises `ValueError` naming `source` if `examples` do not suit this model."""

    def check_model(self, model, source):
        """Raises `ValueError` naming `source` if `model` does not fit these settings."""

    def examples_from_texts(self, texts):
        """Examples from raw strings on the command line (`kbert predict TEXT ...`)."""
        raise ValueError(f"task {self.name!r} takes a file (--input), not TEXT arguments")

    # === Preprocessing ===

    def encode(self, examples, targets=True):
        """`Encoded` rows for `examples`."""
        raise NotImplementedError

    def train_dataset(self, examples, batch_size, seed=0, epochs=1, first_epoch=0,
                      bucket_width=None):
        """Shuffled training batches for epochs `first_epoch` .. `epochs - 1`.

        Each epoch is shuffled by a seed of its own, derived from `seed` and
        the epoch's number, so a run resumed at epoch k sees the batches an
        uninterrupted run sees from epoch k on. Each batch is padded to its
        longest row; with a `bucket_width` (`training_bucket_width`), rows of
        similar length are batched together and padded to a multiple of it.

        Returns:
            `(dataset, batches_per_epoch)`. The count is exact (with buckets,
            each gives ceil(size / batch_size) batches whatever the shuffle);
            fit with `steps_per_epoch=batches_per_epoch`.
        """
        return self.batched_dataset(
            self.encode(examples), batch_size, seed, epochs, first_epoch, bucket_width
        )

    def batched_dataset(self, encoded, batch_size, seed=0, epochs=1, first_epoch=0,
                        bucket_width=None):
        """`train_dataset`'s batches of rows already encoded, with any targets.

        Args:
            encoded: `Encoded`. Its `targets` may be any structure of arrays
                with one row each (`kbert distill` adds the teacher's
                outputs); if the task `reads_sequence`, each row's targets
                with an axis of their own are cut and padded along it as
                the row's tokens are.
            batch_size, seed, epochs, first_epoch, bucket_width: as for
                `train_dataset`.
        """
        import tensorflow as tf

        lengths = encoded.features["padding_mask"].sum(axis=1)
        padding = tf.nest.map_structure(
            lambda target: tf.constant(self.target_padding, tf.as_dtype(target.dtype)),
            encoded.targets,
        )

        def trim(features, target):
            used = tf.reduce_sum(features["padding_mask"])
            cut = {key: value[:used] for key, value in features.items()}
            if self.reads_sequence:
                target = tf.nest.map_structure(lambda t: t[:used] if t.shape.rank else t, target)
            return cut, target

        rows = tf.data.Dataset.from_tensor_slices((encoded.features, encoded.targets))

        def epoch(index):
            ds = rows.shuffle(len(encoded), seed=EPOCH_SEED_STRIDE * seed + index)
            return ds.map(trim, num_parallel_calls=tf.data.AUTOTUNE)

        return epoch_batches(
            epoch, lengths, batch_size, self.sequence_length, padding, epochs, first_epoch, bucket_width
        )

    # What pads per-token targets in padded batches (ignored by the loss).
    target_padding = 0

    def batches_by_length(self, features, batch_size):
        """Row indices in batches of similar length, each with its width: its longest
        row rounded up to `BUCKET_WIDTH`.

        Padding every batch to `sequence_length` would make short inputs
        (CoNLL's sentences: median 16 pieces; Debian's descriptions at 256:
        median 88) cost as much as the longest.
        """
        lengths = np.maximum(np.asarray(features["padding_mask"]).sum(axis=1), 1)
        order = np.argsort(lengths, kind="stable")
        for begin in range(0, len(order), batch_size):
            index = order[begin : begin + batch_size]
            width = -(-int(lengths[index].max()) // BUCKET_WIDTH) * BUCKET_WIDTH
            yield index, min(self.sequence_length, width)

    def eval_dataset(self, encoded, batch_size):
        """`encoded` with its targets as `(features, targets)` batches of similar
        length, each cut to its width (`batches_by_length`), targets with a
        sequence axis too if the task `reads_sequence`: for metrics that add up
        over batches (`fit`'s validation), not in the rows' order.
        """
        import tensorflow as tf

        from kbert.text.datasets import without_autotune

        batches = list(self.batches_by_length(encoded.features, batch_size))

        def cut(index, width):
            features = {name: encoded.features[name][index, :width] for name in ENCODER_INPUTS}
            targets = tf.nest.map_structure(
                lambda t: t[index, :width] if self.reads_sequence and t.ndim > 1 else t[index],
                encoded.targets,
            )
            return features, targets

        row_spec = tf.TensorSpec([None, None], tf.int32)
        target_spec = tf.nest.map_structure(
            lambda t: tf.TensorSpec((None,) * t.ndim, tf.as_dtype(t.dtype)), cut(*batches[0])[1]
        )
        ds = tf.data.Dataset.from_generator(
            lambda: (cut(index, width) for index, width in batches),
            output_signature=({name: row_spec for name in ENCODER_INPUTS}, target_spec),
        )
        # A known count: Keras warns of data running out on a dataset of unknown size.
        ds = ds.apply(tf.data.experimental.assert_cardinality(len(batches)))
        return without_autotune(ds.prefetch(tf.data.AUTOTUNE))

    # === Model ===

    def build_model(self, encoder_or_config, dtype=None):
        """The task's model on `ENCODER_INPUTS`; its head computes in float32."""
        raise NotImplementedError

    def compile_args(self):
        """`loss` and `metrics` for `model.compile`."""
        raise NotImplementedError

    def head(self, model, encoder_outputs, features, encode=None):
        """The head of `model` on encoder outputs computed elsewhere.

        Args:
            model: keras.Model from `build_model`.
            encoder_outputs: dict with `sequence_output` and `pooled_output`
                (float32 TensorFlow tensors).
            features: the encoder inputs.
            encode: callable(features) -> encoder outputs, the same pass on
                other rows (full sequences), for a head that reads more
                rows than the model's input (`text-pair-regression`'s texts
                apart).

        Returns:
            dict of `outputs`, float32.
        """
        raise NotImplementedError

    # === Distillation (`kbert distill`) ===

    # Whether `kbert distill --unlabelled` may add raw texts (`examples_from_texts`),
    # trained on the teacher's outputs alone.
    distills_unlabelled_text = False

    def distillation_loss(self, temperature, alpha):
        """The Keras loss a student of this task trains on (`kbert.tasks.distillation`).

        Args:
            temperature: float > 0. Softens the teacher's and the student's
                distributions, for tasks that output them.
            alpha: float in [0, 1]. The weight of the gold targets' loss; the
                teacher's takes `1 - alpha`.
        """
        raise ValueError(f"task {self.name!r} cannot be distilled yet (kbert distill)")

    def hard_weights(self, encoded):
        """float32 `(rows,)`: 1 for a row whose gold target the student learns, 0 for a row
        it learns from the teacher's outputs alone (every encoded row has a target here)."""
        return np.ones(len(encoded), np.float32)

    def distillation_targets(self, targets, teacher_outputs, hard_weight):
        """What `distillation_loss` compares the student's outputs with.

        Args:
            targets: the task's targets of the rows (`encode`'s).
            teacher_outputs: dict. The teacher's outputs on the rows (`run`'s).
            hard_weight: float32 `(rows,)`. 1 for a labelled row, 0 for an
                unlabelled one.
        """
        from kbert.tasks.distillation import distillation_targets

        return distillation_targets(targets, teacher_outputs[self.outputs[0]], hard_weight)

    # === Inference ===

    def run(self, model, features, batch_size=64):
        """`model`'s outputs on int32 `features`, a dict keyed by `outputs`.

        Raises `ValueError` if the model gives NaN or infinity (a diverged or
        corrupt model), rather than passing them on to be printed.
        """
        rows = len(features[ENCODER_INPUTS[0]])
        if not rows:
            raise ValueError("no examples to run the model on")
        if not self.reads_sequence:
            return check_finite(self.run_by_length(model, features, batch_size))
        # Outputs along the sequence: every row at the full length, in order.
        result = model.predict(
            {name: features[name] for name in ENCODER_INPUTS}, batch_size=batch_size, verbose=0
        )
        return check_finite(self._output_dict(result))

    def run_by_length(self, model, features, batch_size=64):
        """`model`'s outputs of one row each (no sequence axis), dict keyed by
        `outputs`: rows in batches of similar length, each cut to its width
        (`batches_by_length`), put back in the rows' order.

        `predict_on_batch` rather than `predict`, whose ~0.1 s of set-up per
        call is most of a single query's time.
        """
        chunks, order = [], []
        for index, width in self.batches_by_length(features, batch_size):
            batch = {name: np.asarray(features[name])[index, :width] for name in ENCODER_INPUTS}
            chunks.append(self._output_dict(model.predict_on_batch(batch)))
            order.append(index)
        order = np.concatenate(order)
        outputs = {}
        for name in self.outputs:
            values = np.concatenate([np.asarray(chunk[name]) for chunk in chunks])
            outputs[name] = np.empty_like(values)
            outputs[name][order] = values
        return outputs

    def _output_dict(self, result):
        """A model's outputs (a dict, a list or one array) as a dict keyed by `outputs`."""
        if isinstance(result, dict):
            return result
        return dict(zip(self.outputs, result if isinstance(result, (list, tuple)) else [result]))

    def decode(self, examples, encoded, outputs):
        """One prediction per example from the outputs of `encoded`'s rows."""
        raise NotImplementedError

    def evaluate(self, examples, predictions):
        """The task's figures: a JSON dict with `n` and `metric`."""
        raise NotImplementedError

    def predict_json(self, examples, predictions):
        """What `kbert predict` prints, one JSON-able dict per example."""
        raise NotImplementedError

    def embeddings(self, predictions):
        """float32 `(n, dimension)`: one vector per single-text example's prediction.

        For `kbert embed` and `kbert search`; tasks that give no text vectors raise.
        """
        raise ValueError(
            f"task {self.name!r} gives no text embeddings; use a task that does "
            "(--task sentence-embedding)"
        )

    @classmethod
    def summary(cls, metrics):
        """The scalar figures of `evaluate` worth a line in a log."""
        return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}

    # === Export ===

    def serving_features(self, strings):
        """Encoder inputs from the `text_inputs` string tensors (TensorFlow ops)."""
        return self.preprocessor(tuple(strings[name] for name in self.text_inputs))

    def serving_outputs(self, features, outputs):
        """The SavedModel signatures' outputs from the head's outputs.

        They must include each of `outputs` (rows first, any trailing shape):
        ONNX and the verification read them back by those names.
        """
        return dict(outputs)

    def serving_assets(self):
        """Files shipped in the SavedModel's `assets/` for clients: name -> text."""
        return {}

    def serving_request(self, example):
        """One instance of `serving_default`: input name -> str."""
        raise NotImplementedError

    def serving_strings(self, examples):
        """The string inputs of `examples` for a text signature: name -> list of str."""
        requests = [self.serving_request(example) for example in examples]
        return {name: [request[name] for request in requests] for name in self.text_inputs}

    def serving_text_outputs(self, call, examples, batch_size):
        """Runs a string-input artefact on `examples`; outputs aligned with `encode`'s rows.

        Args:
            call: callable(dict name -> list of str) -> dict of outputs.
            examples: the task's examples.
            batch_size: int. Strings (of each input) per call.

        Returns:
            dict keyed by `outputs`, one row per string of `serving_strings`.
            Tasks whose rows are not their examples either override this or
            give one string per row in `serving_strings`.
        """
        strings = self.serving_strings(examples)
        rows = len(next(iter(strings.values())))
        chunks = []
        for start in range(0, rows, batch_size):
            result = call({name: values[start : start + batch_size] for name, values in strings.items()})
            chunks.append({name: np.asarray(result[name]) for name in self.outputs})
        return {name: np.concatenate([chunk[name] for chunk in chunks]) for name in self.outputs}

    def tflite_text_features(self, ids):
        """Encoder inputs `(1, sequence_length)` of the TFLite text variant.

        Args:
            ids: list of int32 1-D tensors, the WordPiece ids of each of
                `text_inputs` (tf-text's tokenizer), for one example.

        Only TFLite builtin ops (see `kbert.text.packer.pack_one`).
        """
        raise NotImplementedError

    def tflite_unsupported(self):
        """TFLite quantizations this model's graph cannot take: name -> why (the
        exporter skips them). Default: none."""
        return {}

    def scores(self, outputs):
        """The numbers a float32 artefact must reproduce within `FLOAT_TOLERANCE`."""
        return np.concatenate([np.asarray(outputs[n], np.float32).reshape(len(outputs[n]), -1)
                               for n in self.outputs], axis=1)

    def agreement(self, outputs, reference):
        """How an artefact's outputs agree with the Keras model's: a JSON dict."""
        return {"max_abs_diff": float(np.abs(self.scores(outputs) - self.scores(reference)).max())}

    def prediction_agreement(self, predictions, reference):
        """How an artefact's predictions (`decode`'s) agree with the Keras model's.

        For tasks whose answer is more than their outputs (spans chosen
        across windows); a JSON dict, default empty.
        """
        return {}

    def judge(self, entry, reference_figures):
        """Sets `entry["budget"]` and `entry["passed"]`.

        A float32 artefact must agree within `FLOAT_TOLERANCE`; a quantized one
        may lose at most `budgets[quantization]` of `metric`.
        """
        quantization = entry["quantization"]
        if quantization == "none":
            entry["budget"] = f"max_abs_diff <= {FLOAT_TOLERANCE:g}"
            entry["passed"] = entry["max_abs_diff"] <= FLOAT_TOLERANCE
            return entry
        budget = self.budgets[quantization]
        drop = reference_figures[self.metric] - entry[self.metric]
        entry["metric_drop"] = round(self.metric_scale * drop, 6)
        unit = " points" if self.metric_scale == 100 else ""
        entry["budget"] = f"{self.metric} drop <= {self.metric_scale * budget:g}{unit}"
        entry["passed"] = drop <= budget + 1e-9
        return entry


def training_bucket_width(jit_compile=False):
    """The length buckets of training batches: `FINE_BUCKET_WIDTH` where a
    new width is free (TensorFlow without XLA), `BUCKET_WIDTH` where each
    compiles a step of its own (XLA, and JAX, which always compiles).

    Without XLA the encoder blocks train over the real tokens alone
    (`kbert.models.train_on_real_tokens`), so only attention's scores pay
    for padding, and they pay for its square: batches drawn at random pad
    Debian's descriptions (89 pieces on average, a quarter cut at 128) to
    128 almost always; buckets of 16 pad them to 95 (a step: 0.76 s against
    0.87 s, `tools/benchmarks/profile_finetune.py`) for 221 batches an epoch instead
    of 219.
    """
    import keras

    if jit_compile or keras.backend.backend() != "tensorflow":
        return BUCKET_WIDTH
    return FINE_BUCKET_WIDTH


def epoch_batches(
    epoch, lengths, batch_size, sequence_length, target_padding, epochs=1, first_epoch=0,
    bucket_width=None,
):
    """Training batches, epoch after epoch: `(dataset, batches_per_epoch)`.

    Args:
        epoch: callable(int) -> tf.data.Dataset of `(features, targets)` rows
            in that epoch's order, each cut to its used length.
        lengths: int array. Every row's used length, in any order.
        batch_size: int.
        sequence_length: int. The longest row.
        target_padding: the targets' structure of scalar tensors that pad them.
        epochs, first_epoch: ints. The dataset holds epochs `first_epoch` ..
            `epochs - 1`, each batched on its own.
        bucket_width: int or None. None: batches in the epoch's order, each
            padded to its longest row. An int: rows of similar length batched
            together, each batch padded to a multiple of it (or to
            `sequence_length`).

    The count is exact, since each bucket gives ceil(size / batch_size)
    batches whatever the order.
    """
    import tensorflow as tf

    from kbert.text.datasets import without_autotune

    padding_values = ({name: 0 for name in ENCODER_INPUTS}, target_padding)
    if bucket_width is None:
        batches = -(-len(lengths) // batch_size)

        def batched(index):
            return epoch(index).padded_batch(batch_size, padding_values=padding_values)
    else:
        boundaries = list(range(bucket_width + 1, sequence_length + 1, bucket_width)) + [sequence_length + 1]
        bucket_sizes = np.bincount(np.searchsorted(boundaries, lengths, side="right"))
        batches = int(sum(-(-int(size) // batch_size) for size in bucket_sizes))

        def batched(index):
            return epoch(index).bucket_by_sequence_length(
                lambda features, target: tf.shape(features["token_ids"])[0],
                bucket_boundaries=boundaries,
                bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
                pad_to_bucket_boundary=True,
                padding_values=padding_values,
            )

    ds = batched(first_epoch)
    for index in range(first_epoch + 1, epochs):
        ds = ds.concatenate(batched(index))
    ds = ds.apply(tf.data.experimental.assert_cardinality(batches * (epochs - first_epoch)))
    return without_autotune(ds.prefetch(tf.data.AUTOTUNE)), batches


def check_finite(outputs):
    """`outputs` (a dict of arrays), or `ValueError` if one holds NaN or infinity."""
    bad = [name for name, value in outputs.items() if not np.all(np.isfinite(value))]
    if bad:
        raise ValueError(
            f"the model gives non-finite {bad[0]} (NaN or infinity): its weights are "
            "broken (diverged training?)"
        )
    return outputs


class TextTask(Task):
    """A task whose examples are one or two texts, packed as BERT's segments.

    Examples are dicts `{"texts": (str,) or (str, str), "target": ..., "line": int}`
    read from a CSV or TSV file: the texts from the columns the options
    `text_options` name, the target from the column `target_option` names.
    """

    # Names of the options that give the text columns, and the target column.
    text_options = ()
    target_option = None

    @classmethod
    def parse_target(cls, value, path, line):
        """The target of one record from its column's string."""
        return value

    @classmethod
    def read(cls, path, options=None, targets=True):
        options = cls.resolve_options(options)
        columns = [options[name] for name in cls.text_options]
        target = options[cls.target_option]
        rows = read_table(path, columns + ([target] if targets else []))
        return [
            {
                "texts": tuple(row[column] for column in columns),
                "target": cls.parse_target(row[target], path, row.line) if targets else None,
                "line": row.line,
            }
            for row in rows
        ]

    def examples_from_texts(self, texts):
        width = len(self.text_inputs)
        if len(texts) % width:
            raise ValueError(
                f"task {self.name!r} takes texts in groups of {width} "
                f"({', '.join(self.text_inputs)}); got {len(texts)}"
            )
        return [
            {"texts": tuple(texts[i : i + width]), "target": None, "line": None}
            for i in range(0, len(texts), width)
        ]

    def targets(self, examples):
        """The training targets of `examples`, an array with one row each."""
        raise NotImplementedError

    def encode(self, examples, targets=True):
        import tensorflow as tf

        chunks = []
        for start in range(0, len(examples), ENCODE_CHUNK):
            batch = examples[start : start + ENCODE_CHUNK]
            segments = tuple(
                tf.constant([example["texts"][i] for example in batch])
                for i in range(len(self.text_inputs))
            )
            chunks.append(self.preprocessor(segments))
        features = {
            name: np.concatenate([chunk[name].numpy() for chunk in chunks]).astype(np.int32)
            for name in ENCODER_INPUTS
        }
        return Encoded(features, self.targets(examples) if targets else None)

    def serving_request(self, example):
        """The inputs of `example` by name, as `serving_default` and `predict` take them."""
        return dict(zip(self.text_inputs, example["texts"]))

    def tflite_text_features(self, ids):
        from kbert.text.packer import pack_one

        tokenizer = self.tokenizer
        return pack_one(
            ids, self.sequence_length, tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id,
            truncate=self.preprocessor.packer.truncate,
        )


def softmax(logits):
    """Row-wise softmax over the last axis, in float64, returned as float32."""
    logits = np.asarray(logits, np.float64)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)
