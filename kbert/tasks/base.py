"""`Task`: everything that differs between BERT's tasks, behind one interface.

A task owns its data format, preprocessing, what its model predicts (its
`objective`: head, loss, metrics), what it stores in the model folder and
what `predict` prints. The trainers batch its rows (`kbert.training.batching`),
the exporter serves it through its adapter (`kbert.export.serving`), and
neither, nor the model folder or the command line, tests its name. A task
rests on `kbert.models` and `kbert.text` only.

The life of a task instance:

    examples = Task.read(path, options)            # records (`TextExample`...), each with its `line`
    learned = Task.learn(examples, path)           # what training data teaches (labels)
    task = Task(tokenizer, sequence_length, **learned, **options)   # its `Config`
    encoded = task.encode(examples)                # `Encoded`: features, targets, rows -> examples
    model = task.build_model(encoder, dtype)       # the encoder and a head layer named "head"
    outputs = task.run(model, encoded.features)    # {name: array} keyed by task.outputs
    predictions = task.decode(examples, encoded, outputs)
    task.evaluate(examples, predictions)           # {"n": ..., metric: ...}
"""

from kbert.tasks import running
from kbert.tasks.objectives import Objective
from kbert.tasks.running import INFERENCE_BATCH_SIZE  # noqa: F401 (where callers import it from)
from kbert.tasks.task_settings import TaskSettings

# Examples tokenized per call of the preprocessor in `encode`.
ENCODE_CHUNK = 1024
# A quantized artefact may lose this much of the task's metric (a fraction:
# accuracy, Spearman) against the Keras model: 0.1 point for float16, half a
# point for the int8 schemes.
METRIC_BUDGETS = {"fp16": 0.001, "dynamic": 0.005, "int8": 0.005, "16x8": 0.005}


class Task(TaskSettings):
    """One BERT task; subclasses set the class attributes and the hooks below.

    Args:
        tokenizer: `kbert.text.WordPieceTokenizer`.
        sequence_length: int. Packed length of every input row.
        **values: fields of the task's `Config` (what `learn` returned, the
            flags given); the others take their defaults.

    A task's settings are its `config`, whose fields read and write as the
    task's attributes (`task.labels`). What every task does alike lives
    beside this class: with its settings, `kbert.tasks.task_settings`;
    running its model, `kbert.tasks.running`.
    """

    # The registry name, used by `--task`.
    name = None
    # One line for `kbert finetune --help`.
    description = ""
    # What the model predicts and how it learns (`kbert.tasks.objectives`):
    # its outputs, head, loss and metrics.
    objective = Objective()
    # The string inputs of the SavedModel's `serving_default`.
    text_inputs = ("text",)
    # The figure artefacts are judged by (`evaluate`'s key; higher is better),
    # its display scale (100: points) and how much each quantization may lose.
    metric = None
    metric_scale = 1.0
    budgets = {}
    # The figures of `evaluate` a log line shows (None: every scalar).
    summary_keys = None
    # False for a task that needs no training (sentence embeddings): `kbert
    # finetune` refuses it, and the other commands build it on a pretrained
    # checkpoint with `--task` (`pretrained_settings`,
    # `kbert.modelfolder.ModelFolder.from_pretrained`).
    trainable = True
    # What `kbert finetune` trains with unless flags say otherwise
    # (`kbert.recipes.Recipe`): each trainable task names its own.
    recipe = None
    # The task in Hugging Face's terms: its Hub pipeline tag (model cards);
    # the transformers `pipeline` that runs its exported folder (None: none);
    # the transformers class whose fine-tuned folders kbert reads as this task
    # (`kbert.checkpoints.hf_tasks`; None: none), and the `problem_type`s such
    # a folder may state (empty: any).
    hub_pipeline_tag = None
    hf_pipeline = None
    hf_architecture = None
    hf_problem_types = ()

    @classmethod
    def settings_from_hf_labels(cls, labels, where):
        """The task's settings from a transformers folder's `id2label` names
        (`where`: the folder, for errors): its labels."""
        return {"labels": labels}

    def __init__(self, tokenizer, sequence_length, **values):
        from kbert.text import BertPreprocessor

        self.check_sequence_length(sequence_length)
        self.tokenizer = tokenizer
        self.sequence_length = sequence_length
        self.config = self.Config.create(values, f"task {self.name!r}")
        # A model folder's task: its `built` flags are fixed (`TaskConfig.merged`).
        self.trained = False
        self.preprocessor = BertPreprocessor(tokenizer, sequence_length=sequence_length)
        self.configure()

    def configure(self):
        """Sets what follows from `config` (a preprocessor that cuts otherwise);
        called whenever the config changes. Default: nothing."""

    # === Data ===

    @classmethod
    def read(cls, path, options=None, targets=True):
        """Reads a data file into a list of examples, records such as `TextExample`
        (`kbert.tasks.records`); `targets=False` for files without labels (predict)."""
        raise NotImplementedError

    @classmethod
    def learn(cls, examples, source):
        """What the training data teaches (label names): `Config` fields, a JSON dict."""
        return {}

    @classmethod
    def check_learned(cls, learned, examples, source):
        """Raises `ValueError` naming `source` if `examples` hold targets that
        `learned` (what the training data taught) lacks, as `check` does for a
        model's: a dev label no training example has. Default: nothing."""

    def tune(self, examples, predictions, predict):
        """Settings chosen on the dev predictions after training (a threshold, the
        order a pair is read in), before the dev figures are computed and
        `settings()` stored. `predict()` gives the dev predictions again, under
        the settings as they then are. Returns what it chose and what training
        counted, a JSON dict merged over the dev figures into metrics.json."""
        return {}

    @classmethod
    def pretrained_settings(cls, checkpoint, options):
        """The settings of a task that needs no training on a pretrained encoder: from
        the `options` given (name -> value or None) and what the `checkpoint` folder
        says of the task (None: a kbert model folder's encoder)."""
        raise ValueError(f"task {cls.name!r} needs training; it has no pretrained settings")

    @classmethod
    def pretrained_sequence_length(cls, checkpoint):
        """The packed length a pretrained `checkpoint` folder asks for, or None."""
        return None

    def check(self, examples, source):
        """Raises `ValueError` naming `source` if `examples` do not suit this model."""

    def examples_from_texts(self, texts):
        """Examples from raw strings on the command line (`kbert predict TEXT ...`)."""
        raise ValueError(f"task {self.name!r} takes a file (--input), not TEXT arguments")

    def examples_from_inputs(self, x, y=None):
        """Examples from Python values, as `kbert.TaskModel`'s `fit`, `evaluate` and
        `predict` take them: inputs `x` and targets `y` (None: none), one per example."""
        raise ValueError(f"task {self.name!r} takes no Python inputs; read its data with {type(self).__name__}.read")

    def texts(self, examples):
        """The texts of `examples`, in order: what adaptation reads (masked LM on
        the training text before fine-tuning, `kbert.pretraining.adapt`).
        Default: each example's inputs, as `serving_request` gives them."""
        return [text for example in examples for text in self.serving_request(example).values()]

    # === Preprocessing ===

    def encode(self, examples, targets=True):
        """`Encoded` rows for `examples`."""
        raise NotImplementedError

    def training_rows(self, examples, packed=False):
        """The rows a model trains on: `Encoded` (default: `encode`'s), or `Rows`
        made one at a time for sets too big to hold packed
        (`kbert.training.batching` batches either). `packed`: `Encoded` always,
        for a teacher to label at once (`kbert distill`)."""
        return self.encode(examples)

    # === Model: the `objective`'s (`kbert.tasks.objectives`) ===

    outputs = property(lambda self: self.objective.outputs, doc="Names of the model's outputs.")
    reads_sequence = property(lambda self: self.objective.reads_sequence, doc="The head reads every position.")
    target_padding = property(lambda self: self.objective.target_padding, doc="What pads per-token targets.")

    def build_model(self, encoder_or_config, dtype=None):
        """The task's model on `ENCODER_INPUTS`: the encoder and a float32 head layer named "head"."""
        return self.objective.build_model(self, encoder_or_config, dtype)

    def compile_args(self):
        """`loss` and `metrics` for `model.compile`."""
        return self.objective.compile_args(self)

    def check_model(self, model, source):
        """Raises `ValueError` naming `source` if `model` does not fit these settings."""
        self.objective.check_model(self, model, source)

    def distillation_loss(self, temperature, alpha):
        """The Keras loss a student trains on (`kbert distill`): `alpha` weighs the
        gold targets' loss, `1 - alpha` the teacher's, softened by `temperature`."""
        return self.objective.distillation_loss(self, temperature, alpha)

    # Whether `kbert distill --unlabelled` may add raw texts (`examples_from_texts`),
    # trained on the teacher's outputs alone.
    distills_unlabelled_text = False

    # === Inference ===

    def run(self, model, features, batch_size=INFERENCE_BATCH_SIZE):
        """`model`'s outputs on int32 `features`, a dict keyed by `outputs`
        (default: `kbert.tasks.running.run`, in batches of similar length)."""
        return running.run(self, model, features, batch_size)

    def input_views(self, features):
        """The inputs the model reads each row as, a list of feature dicts of the
        rows' shape (default: the rows alone); `run` and every exported graph
        (`kbert.export.graph.model_outputs`) run the model on each and join
        the outputs with `merge_views`. `keras.ops` only: it runs in graphs."""
        return [features]

    def merge_views(self, outputs):
        """One output dict from the model's outputs on each of two or more `input_views`."""
        raise NotImplementedError(f"task {self.name!r} reads several input_views; it must join them")

    def over_views(self, features, run):
        """`run(view)`'s outputs on each of the rows' `input_views`, joined (`kbert.tasks.running.over_views`)."""
        return running.over_views(self, features, run)

    def decode(self, examples, encoded, outputs):
        """One prediction per example from the outputs of `encoded`'s rows
        (default: the `objective`'s, one per row)."""
        return self.objective.decode(self, outputs)

    def evaluate(self, examples, predictions):
        """The task's figures: a JSON dict with `n` and `metric`."""
        raise NotImplementedError

    def predict_json(self, examples, predictions):
        """What `kbert predict` prints, one JSON-able dict per example."""
        raise NotImplementedError

    def embeddings(self, predictions):
        """float32 `(n, dimension)`: one vector per single-text example's prediction
        (`kbert embed`, `kbert search`); tasks that give no text vectors raise."""
        raise ValueError(
            f"task {self.name!r} gives no text embeddings; use a task that does "
            "(--task sentence-embedding)"
        )

    @classmethod
    def summary(cls, metrics):
        """The figures of `evaluate` worth a line in a log: `summary_keys`, in
        their order, or every scalar."""
        if cls.summary_keys is not None:
            return {k: metrics[k] for k in cls.summary_keys if k in metrics}
        return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}

    # === Serving ===

    def serving_request(self, example):
        """One instance of `serving_default` and of `kbert predict`'s JSON: input name -> str."""
        raise NotImplementedError
