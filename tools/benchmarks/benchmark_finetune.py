"""Fine-tuning, kbert and its peer side by side: dev figures over seeds, and `fit`'s wall-clock.

Both fine-tune the same checkpoint (keras-hub's `BertBackbone` gets its
weights through `kbert.checkpoints.to_keras_hub`) with the same recipe: AdamW
on BERT's schedule (`kbert.training.make_optimizer`; keras-hub gets Keras's
own `AdamW`, the same update without kbert's fused kernel), batch, epochs,
sequence length, dtype policy, seeds. kbert runs its product path
(`kbert.training.finetune.finetune`, as `kbert finetune` does); keras-hub
runs its own `BertTextClassifier` with its `BertTextClassifierPreprocessor`
(which takes a tuple of two string tensors for sentence pairs; a score is
its one output unit trained with mean squared error, as keras-nlp's GLUE
script fits STS-B). Both are scored by the task's own metrics
(`Task.evaluate`). Baselines: the majority class (classification), TF-IDF +
logistic regression (single texts), the zero-shot cosine of the
checkpoint's sentence embeddings (pair regression) and answering nothing
(SQuAD 2.0). Prints one JSON object; `--out FILE` writes it too.

    python tools/benchmarks/benchmark_finetune.py --task text-pair-classification \\
        --train ../shared/data/glue-mrpc/train.tsv --dev ../shared/data/glue-mrpc/dev.tsv \\
        --impls kbert,keras-hub --seeds 0,1,2
    python tools/benchmarks/benchmark_finetune.py --task text-pair-regression \\
        --train ../shared/data/glue-stsb/train.tsv --dev ../shared/data/glue-stsb/dev.tsv \\
        --impls kbert,kbert:head=cross,keras-hub --seeds 0,1,2

Both run the task's recipe (`kbert finetune`'s defaults) unless `--epochs`,
`--lr`, `--batch-size`, `--seq-len`, `--warmup` or `--weight-decay` say otherwise.

Named entities, question answering and multi-label classification have
another peer, `transformers`: Hugging Face's `BertForTokenClassification`
with run_ner.py's own recipe (`transformers_ner.py`),
`BertForQuestionAnswering` with run_qa.py's (`transformers_qa.py`), or
`BertForSequenceClassification` with its multi-label tutorial's
(`transformers_multilabel.py`), on PyTorch in a process of its own, against
kbert's default:

    python tools/benchmarks/benchmark_finetune.py --task token-classification \\
        --train ../shared/data/conll2003/train.txt --dev ../shared/data/conll2003/dev.txt \\
        --impls kbert,transformers --seeds 0,1,2 --baselines ""
    python tools/benchmarks/benchmark_finetune.py --task question-answering \\
        --train ../shared/data/squad-sample/normans-dev-v2.0.json \\
        --dev ../shared/data/squad-sample/normans-dev-v2.0.json --impls kbert,transformers --seeds 0,1,2
    python tools/benchmarks/benchmark_finetune.py --task multi-label-classification \\
        --train ../shared/data/debian-tags/train.csv --dev ../shared/data/debian-tags/dev.csv \\
        --impls kbert,transformers --seeds 0,1,2 --baselines ""

Each run also reports `train_loss`, the mean training loss of its last
epoch, `mean_step_seconds`, its mean step after the first (and
`mean_step_seconds_by_epoch`, the same epoch by epoch), and
`fit_phases`: where `fit`'s wall-clock went (`FitPhases`). With keras-hub
in the run, the report gives kbert's mean `fit` and mean step as fractions
of keras-hub's.
`--max-steps N` fits keras-hub's classifier and kbert's fed by
keras-hub's input pipeline (`kbert-model-hub-input`) on the same first N
batches of the recipe's schedule, dropout on, without validation: whether
the two models learn alike, with one seed's batches in one order for both:

    python tools/benchmarks/benchmark_finetune.py --train data/debian-packages/train.csv \
        --dev data/debian-packages/dev.csv --epochs 2 --lr 1e-4 --max-steps 110 \
        --impls kbert-model-hub-input,keras-hub --seeds 0,1 --baselines ""

`--also-evaluate truncate=longest_first` evaluates each kbert model on dev
again with those task options too (`kbert evaluate --truncate
longest_first`), reported under `also_evaluated`: how a model trained with
one rule serves inputs packed by another (MediaPipe keeps a text's start).

`kbert:NAME=VALUE[:NAME=VALUE]` runs kbert with task options or the recipe
options of `RECIPE_OPTIONS` (`kbert finetune --NAME VALUE`), so that variants
run side by side in one run:

    python tools/benchmarks/benchmark_finetune.py --train data/debian-packages/train.csv \
        --dev data/debian-packages/dev.csv --epochs 2 --lr 1e-4 \
        --impls kbert,kbert:attention-dropout=0,keras-hub
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

IMPLS = ("kbert", "keras-hub", "transformers")
# The tasks each peer but keras-hub runs: its script for each.
PEER_TASKS = {"transformers": {"token-classification": "transformers_ner.py",
                               "question-answering": "transformers_qa.py",
                               "multi-label-classification": "transformers_multilabel.py"}}
# Diagnostics: kbert's model fed by keras-hub's input pipeline (its tokenizer
# and packer, unbucketed batches padded to the sequence length, one shuffle of
# the whole set per epoch), to tell the model's part in a gap from the input's.
HYBRIDS = ("kbert-model-hub-input",)
BASELINES = ("majority", "tfidf", "zero-shot-cosine", "no-answer")
# kbert-only recipe options a variant may set: `kbert finetune` flag -> (its
# `finetune` argument, the flag's type). They replace the command-line values.
RECIPE_OPTIONS = {
    "attention-dropout": ("attention_dropout", "dropout_rate"),
    "layer-decay": ("layer_decay", "positive_fraction"),
    "ema": ("ema_momentum", "fraction"),
}


def parse_args(argv=None):
    from kbert.cliargs import dropout_rate, fraction, learning_rate, positive_fraction, positive_int
    from kbert.hardware import resolve_dtype
    from kbert.tasks import TASKS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="text-classification",
                        choices=[name for name, task in TASKS.items() if task.trainable])
    parser.add_argument("--train", required=True)
    parser.add_argument("--dev", required=True)
    parser.add_argument("--init", default="all-minilm-l6-v2")
    parser.add_argument("--impls", default="kbert,keras-hub")
    parser.add_argument("--seeds", default="0,1,2")
    # Unset, each of these six is the task's recipe's (`kbert finetune`'s default), for every impl.
    parser.add_argument("--epochs", type=positive_int, help="default: the task's recipe")
    parser.add_argument("--lr", type=learning_rate, help="default: the task's recipe")
    parser.add_argument("--batch-size", type=positive_int, help="default: the task's recipe")
    parser.add_argument("--seq-len", type=positive_int, help="default: the task's recipe")
    parser.add_argument("--dtype", default="auto", help="a dtype policy for both, or auto (as kbert finetune)")
    parser.add_argument("--warmup", type=fraction, help="default: the task's recipe")
    parser.add_argument("--weight-decay", type=fraction, help="default: the task's recipe")
    parser.add_argument("--layer-decay", type=positive_fraction, default=1.0, help="kbert only")
    parser.add_argument("--ema", type=fraction, default=None, help="kbert only")
    parser.add_argument("--reinit-pooler", action="store_true", help="kbert only")
    parser.add_argument("--attention-dropout", type=dropout_rate, default=None, help="kbert only")
    parser.add_argument("--max-steps", type=positive_int, default=None,
                        help="fit only the first N batches of the recipe's schedule, without "
                             "validation (keras-hub and the hybrid only): a diagnostic of the "
                             "training loss on the same batches")
    parser.add_argument("--baselines", default=",".join(BASELINES), help="those that fit the task")
    parser.add_argument("--also-evaluate", action="append", default=[], metavar="NAME=VALUE[:NAME=VALUE]",
                        help="kbert only: evaluate each trained model on dev again with these "
                             "task options too (e.g. truncate=longest_first); repeatable")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    args.dtype = resolve_dtype(args.dtype)
    recipe = TASKS[args.task].recipe.override(
        epochs=args.epochs, learning_rate=args.lr, batch_size=args.batch_size, sequence_length=args.seq_len,
        warmup_fraction=args.warmup, weight_decay=args.weight_decay,
    )
    args.epochs, args.lr = recipe.epochs, recipe.learning_rate
    args.batch_size, args.seq_len = recipe.batch_size, recipe.sequence_length
    args.warmup, args.weight_decay = recipe.warmup_fraction, recipe.weight_decay
    args.impls = [i for i in args.impls.split(",") if i]
    # Each entry's (task options, recipe arguments), parsed once here.
    args.settings = {}
    for impl in args.impls:
        base, variant, given = impl.partition(":")
        if base not in IMPLS + HYBRIDS or variant and base != "kbert":
            parser.error(f"--impls {impl}: expected some of {', '.join(IMPLS + HYBRIDS)}, "
                         "or kbert:NAME=VALUE with options of the task or the recipe")
        try:
            args.settings[impl] = option_settings(given, args.task, RECIPE_OPTIONS) if variant else ({}, {})
        except argparse.ArgumentTypeError as error:
            parser.error(f"--impls {impl}: {error}")
    for impl in args.impls:
        if impl in PEER_TASKS and args.task not in PEER_TASKS[impl]:
            *others, last = PEER_TASKS[impl]
            parser.error(f"--impls {impl}: runs --task {' or '.join(filter(None, [', '.join(others), last]))} only")
    also_evaluate = {}
    for entry in args.also_evaluate:
        try:
            also_evaluate[entry] = option_settings(entry, args.task)[0]
        except argparse.ArgumentTypeError as error:
            parser.error(f"--also-evaluate {entry}: {error}")
    args.also_evaluate = also_evaluate
    if args.max_steps and any(impl.split(":")[0] == "kbert" for impl in args.impls):
        parser.error("--max-steps: runs keras-hub's input pipeline only; "
                     f"expected --impls among keras-hub, {', '.join(HYBRIDS)}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds {args.seeds}: expected integers separated by commas")
    args.baselines = [b for b in args.baselines.split(",") if b]
    for path in (args.train, args.dev):
        if not os.path.isfile(path):
            parser.error(f"{path}: no such file")
    return args


def log(message):
    print(message, file=sys.stderr, flush=True)


def option_settings(given, task, recipe_options=None):
    """`(task options, recipe arguments of finetune)` of `NAME=VALUE[:NAME=VALUE]`.

    A name is an option of `task` or, with `recipe_options` (`RECIPE_OPTIONS`),
    a `kbert finetune` recipe flag. Raises `argparse.ArgumentTypeError` naming
    what is wrong: an unknown name, no value, a value outside the option's
    choices, or a recipe value of the wrong type.
    """
    from kbert import cliargs
    from kbert.tasks import TASKS

    known = {o.name: o for o in TASKS[task].options}
    recipe_options = recipe_options or {}
    options, recipe = {}, {}
    for entry in given.split(":"):
        name, _, value = entry.partition("=")
        if name in recipe_options:
            argument, kind = recipe_options[name]
            recipe[argument] = getattr(cliargs, kind)(value)
            continue
        option = known.get(name.replace("-", "_"))
        if option is None or not value:
            where = f" or of the recipe ({', '.join(recipe_options)})" if recipe_options else ""
            raise argparse.ArgumentTypeError(
                f"expected NAME=VALUE[:NAME=VALUE] with options of {task} ({', '.join(sorted(known))}){where}"
            )
        if option.choices and value not in option.choices:
            raise argparse.ArgumentTypeError(f"{option.name} {value!r}; expected one of {', '.join(option.choices)}")
        options[option.name] = value
    return options, recipe


def fit_phases_callback():
    """A `FitPhases` callback (Keras is imported late, after the backend is chosen)."""
    import keras

    class FitPhases(keras.callbacks.Callback):
        """Splits `fit`'s wall-clock: the first step (which traces the step
        function), the other steps, validation, and the rest (`phases(fit_seconds)`):
        callbacks, checkpoints, and any wait between steps, before the
        validation or as `fit` frees its input iterators."""

        def __init__(self):
            super().__init__()
            self.steps, self.epoch_starts, self.validation = [], [], 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_starts.append(len(self.steps))

        def on_train_batch_begin(self, batch, logs=None):
            self._step = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.steps.append(time.perf_counter() - self._step)

        def on_test_begin(self, logs=None):
            self._test = time.perf_counter()

        def on_test_end(self, logs=None):
            self.validation += time.perf_counter() - self._test

        @staticmethod
        def _mean(steps):
            return round(sum(steps) / len(steps), 4) if steps else None

        def mean_step(self):
            """Seconds of a step after the first: what the two libraries' steps compare by."""
            return self._mean(self.steps[1:])

        def mean_step_by_epoch(self):
            """`mean_step` epoch by epoch: whether steps slow down as `fit` goes on."""
            ends = self.epoch_starts[1:] + [len(self.steps)]
            return [self._mean(self.steps[max(start, 1):end])
                    for start, end in zip(self.epoch_starts, ends)]

        def report(self, fit_seconds):
            """The step figures of a run's report, for either library."""
            return {
                "mean_step_seconds": self.mean_step(),
                "mean_step_seconds_by_epoch": self.mean_step_by_epoch(),
                "fit_phases": self.phases(fit_seconds),
            }

        def phases(self, fit_seconds):
            steps = sum(self.steps[1:])
            first = self.steps[0] if self.steps else 0.0
            return {
                "first_step": round(first, 1), "other_steps": round(steps, 1),
                "validation": round(self.validation, 1),
                "rest": round(fit_seconds - first - steps - self.validation, 1),
            }

    return FitPhases()


def run_kbert(args, seed, work, impl="kbert"):
    from kbert.tasks import get_task
    from kbert.training.finetune import finetune

    options, recipe = args.settings[impl]
    phases = fit_phases_callback()
    recipe = {
        "layer_decay": args.layer_decay, "ema_momentum": args.ema,
        "attention_dropout": args.attention_dropout, **recipe,
    }
    folder = os.path.join(work, f"{impl}-{seed}".replace(":", "_"))
    metrics = finetune(
        args.train, args.dev, args.init, folder,
        task=args.task, options=options,
        sequence_length=args.seq_len, batch_size=args.batch_size, epochs=args.epochs,
        learning_rate=args.lr, warmup_fraction=args.warmup, weight_decay=args.weight_decay,
        reinit_pooler=args.reinit_pooler, dtype=args.dtype, seed=seed, verbose=0, log=log,
        callbacks=[phases], **recipe,
    )
    return {
        **get_task(args.task).summary(metrics), "fit_seconds": metrics["train_seconds"],
        "train_loss": round(metrics["history"]["loss"][-1], 4),
        **phases.report(metrics["train_seconds"]),
        **({"also_evaluated": evaluate_with(args, folder)} if args.also_evaluate else {}),
    }


def evaluate_with(args, folder):
    """The dev figures of the model in `folder` under each `--also-evaluate` entry's options."""
    from kbert.modelfolder import ModelFolder

    trained, figures = ModelFolder.load(folder), {}
    for entry, given in args.also_evaluate.items():
        options = trained.use_options(given)
        metrics = trained.evaluate(trained.task.read(args.dev, options), source=args.dev)
        figures[entry] = trained.task.summary(metrics)
    return figures


def run_transformers(args, seed):
    """The task's transformers peer (`transformers_ner.py`, `transformers_qa.py`: the
    example scripts' recipes on PyTorch), in a process of its own: PyTorch and
    TensorFlow crash together in one process."""
    import subprocess

    script = PEER_TASKS["transformers"][args.task]
    command = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), script),
               "--train", args.train, "--dev", args.dev, "--init", args.init, "--seed", str(seed)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        raise RuntimeError(f"{script} failed: {result.stderr.strip().splitlines()[-1:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    return {**figures["dev"], "fit_seconds": figures["train_seconds"], "recipe": figures["recipe"],
            "impl_version": figures["impl"],
            # A peer that also scores under kbert's choice on dev (multi-label's threshold).
            **({"dev_tuned": figures["dev_tuned"]} if "dev_tuned" in figures else {})}


def run_keras_hub(args, seed, task_class, train, dev, model_from="keras-hub"):
    """keras-hub's `BertTextClassifier` on the same checkpoint, data and recipe.

    With `model_from="kbert"`, kbert's classifier in its place, fed by the
    same keras-hub preprocessor and batches.
    """
    import keras
    import keras_hub
    import numpy as np
    import tensorflow as tf

    from kbert.checkpoints import load_hf_checkpoint, to_keras_hub
    from kbert.tasks.inference import softmax
    from kbert.text import WordPieceTokenizer
    from kbert.training import make_optimizer

    settings = task_class.learn(train, args.train)
    # keras-hub has a classifier only; a score is its one output unit trained
    # with mean squared error, as keras-nlp's own GLUE script fits STS-B.
    regression = "labels" not in settings
    if regression and "score_range" not in settings:
        raise ValueError(f"keras-hub has a classifier only; task {args.task!r} is neither one nor a score")
    keras.utils.set_random_seed(seed)
    checkpoint = load_hf_checkpoint(args.init, dtype=args.dtype)
    task = task_class(WordPieceTokenizer(checkpoint.vocabulary), args.seq_len, **settings)
    tokenizer = keras_hub.models.BertTokenizer(
        vocabulary=checkpoint.vocabulary, lowercase=checkpoint.lowercase
    )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=args.seq_len
    )
    if model_from == "kbert":
        model = task.build_model(checkpoint.encoder, dtype=args.dtype)
    else:
        model = keras_hub.models.BertTextClassifier(
            to_keras_hub(checkpoint.encoder, dtype=args.dtype), 1 if regression else len(task.labels),
            preprocessor=preprocessor, dtype=args.dtype,
        )

    def inputs(examples):
        columns = tuple(tf.constant([e.texts[i] for e in examples]) for i in range(len(task.text_inputs)))
        return columns if len(columns) > 1 else columns[0]

    train_ds = tf.data.Dataset.from_tensor_slices((inputs(train), task.targets(train)))
    train_ds = train_ds.shuffle(len(train), seed=seed).batch(args.batch_size)
    dev_ds = tf.data.Dataset.from_tensor_slices((inputs(dev), task.targets(dev))).batch(args.batch_size)
    predict_ds = tf.data.Dataset.from_tensor_slices((inputs(dev),)).batch(64)
    if model_from == "kbert":
        # What keras-hub's `Task.fit` and `predict` do with its preprocessor.
        def preprocess(*batch):
            # By keyword: a positional tuple of texts would be read as (x, y).
            return (preprocessor(x=batch[0]),) + batch[1:]

        train_ds, dev_ds, predict_ds = (
            ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
            for ds in (train_ds, dev_ds, predict_ds)
        )
    steps = -(-len(train) // args.batch_size) * args.epochs
    if regression:
        loss, fit_metrics = keras.losses.MeanSquaredError(), [keras.metrics.RootMeanSquaredError(name="rmse")]
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        fit_metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    model.compile(
        optimizer=make_optimizer(
            "adamw", args.lr, steps, warmup_steps=int(args.warmup * steps),
            weight_decay=args.weight_decay, dtype=args.dtype,
            # Keras's own AdamW, as a keras-hub user has it: the same update,
            # without kbert's fused kernel.
            fused=False,
        ),
        loss=loss, metrics=fit_metrics,
    )
    phases = fit_phases_callback()
    start = time.perf_counter()
    if args.max_steps:
        history = model.fit(train_ds.take(args.max_steps), epochs=1, verbose=0, callbacks=[phases])
    else:
        history = model.fit(
            train_ds, validation_data=dev_ds, epochs=args.epochs, verbose=0, callbacks=[phases]
        )
    seconds = time.perf_counter() - start
    # Elements are 1-tuples: Keras reads an element (a, b) as (inputs, targets).
    outputs = np.asarray(model.predict(predict_ds, verbose=0), np.float32)
    metrics = task.evaluate(dev, outputs.reshape(-1) if regression else softmax(outputs))
    return {
        **task.summary(metrics), "fit_seconds": round(seconds, 1),
        "train_loss": round(history.history["loss"][-1], 4),
        **phases.report(seconds),
    }


def tfidf_features(train, dev):
    """TF-IDF of 1-2 grams (min_df 2, sublinear tf) of the training and dev texts."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2)
    return vectorizer.fit_transform([e.texts[0] for e in train]), vectorizer.transform([e.texts[0] for e in dev])


def multi_label_baselines(args, task, train, dev, targets):
    """TF-IDF with one-vs-rest logistic regression (C=10), its threshold tuned on dev as kbert's."""
    if "tfidf" not in args.baselines:
        return {}
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    train_features, dev_features = tfidf_features(train, dev)
    classifier = OneVsRestClassifier(LogisticRegression(max_iter=2000, C=10)).fit(train_features, targets)
    probabilities = classifier.predict_proba(dev_features)
    task.tune(dev, probabilities, None)
    return {"tfidf_logistic_regression": {**task.summary(task.evaluate(dev, probabilities)),
                                          "threshold": task.threshold}}


def baselines(args, task_class, train, dev):
    """The figures a fine-tuned model must beat, for the baselines that fit the task."""
    import numpy as np

    from kbert.text import WordPieceTokenizer

    settings = task_class.learn(train, args.train)
    results = {}
    if "labels" in settings:
        task = task_class(WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]), 8, **settings)
        ids = task.targets(train)
        if ids.ndim == 2:
            return multi_label_baselines(args, task, train, dev, ids)
        majority = np.bincount(ids).argmax()
        if "majority" in args.baselines:
            predictions = np.eye(len(task.labels), dtype=np.float32)[[majority] * len(dev)]
            results["majority"] = task.summary(task.evaluate(dev, predictions))
        if "tfidf" in args.baselines and len(task.text_inputs) == 1:
            from sklearn.linear_model import LogisticRegression

            train_features, dev_features = tfidf_features(train, dev)
            classifier = LogisticRegression(max_iter=2000, C=10).fit(train_features, ids)
            probabilities = classifier.predict_proba(dev_features)
            results["tfidf_logistic_regression"] = task.summary(task.evaluate(dev, probabilities))
    elif "zero-shot-cosine" in args.baselines and "score_range" in settings:
        from kbert.checkpoints import load_hf_checkpoint
        from kbert.models import bert_embedder
        from kbert.text import BertPreprocessor
        from kbert.tasks.text_pair_regression import regression_metrics

        checkpoint = load_hf_checkpoint(args.init)
        preprocessor = BertPreprocessor(
            WordPieceTokenizer(checkpoint.vocabulary, lowercase=checkpoint.lowercase), args.seq_len
        )
        embedder = bert_embedder(checkpoint.encoder)
        sides = [
            embedder.predict(preprocessor([e.texts[i] for e in dev]), batch_size=64, verbose=0)
            for i in (0, 1)
        ]
        cosine = np.sum(sides[0] * sides[1], axis=-1)
        figures = regression_metrics(np.array([e.target for e in dev]), cosine)
        results["zero_shot_cosine"] = {k: v for k, v in figures.items() if k != "mse"}
    elif "no-answer" in args.baselines and settings.get("version_2_with_negative"):
        from kbert.tasks import squad_eval

        figures = squad_eval.squad_v2_metrics([[a["text"] for a in e.answers] for e in dev], [""] * len(dev))
        results["no_answer"] = {k: round(v, 2) for k, v in figures.items() if not k.endswith("total")}
    return results


def spread(values):
    return {
        "mean": round(statistics.fmean(values), 4),
        "std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def main(argv=None):
    args = parse_args(argv)
    from kbert.export.verify import load_average, machine
    from kbert.tasks import get_task

    task_class = get_task(args.task)
    train = task_class.read(args.train)
    dev = task_class.read(args.dev)
    report = {
        "task": args.task,
        "train": {"path": os.path.relpath(args.train, REPO), "examples": len(train)},
        "dev": {"path": os.path.relpath(args.dev, REPO), "examples": len(dev)},
        "recipe": {
            "init": args.init, "epochs": args.epochs, "learning_rate": args.lr,
            "batch_size": args.batch_size, "sequence_length": args.seq_len, "dtype": args.dtype,
            "optimizer": "AdamW (BERT's: no decay on LayerNorm and biases), linear warmup then linear decay",
            "warmup_fraction": args.warmup, "weight_decay": args.weight_decay,
            "max_steps": args.max_steps,
            "kbert_only": {"layer_decay": args.layer_decay, "ema_momentum": args.ema,
                           "reinit_pooler": args.reinit_pooler, "attention_dropout": args.attention_dropout,
                           # The task's data options kbert runs with unless a variant sets them
                           # (text-classification's truncate: keras-hub keeps a text's start).
                           "task_options": task_class.resolve_options({})},
        },
        "machine": machine(),
        "runs": [],
    }
    report["baselines"] = baselines(args, task_class, train, dev)
    log(f"baselines: {json.dumps(report['baselines'])}")
    with tempfile.TemporaryDirectory(prefix="kbert-benchmark-") as work:
        for seed in args.seeds:
            for impl in args.impls:
                log(f"{impl}, seed {seed}")
                if impl.split(":")[0] == "kbert":
                    figures = run_kbert(args, seed, work, impl)
                elif impl == "transformers":
                    figures = run_transformers(args, seed)
                else:
                    model_from = "kbert" if impl in HYBRIDS else "keras-hub"
                    figures = run_keras_hub(args, seed, task_class, train, dev, model_from)
                report["runs"].append({"impl": impl, "seed": seed, **figures})
                log(json.dumps(report["runs"][-1]))
    report["load_average_after"] = load_average()
    summary = {}
    for impl in args.impls:
        runs = [r for r in report["runs"] if r["impl"] == impl]
        # Figures, not `fit_phases` (each run's own, in `runs`).
        keys = [
            k for k in runs[0]
            if k not in ("impl", "seed", "n") and all(isinstance(r[k], (int, float)) for r in runs)
        ]
        summary[impl] = {k: spread([r[k] for r in runs]) for k in keys}
        if "also_evaluated" in runs[0]:
            summary[impl]["also_evaluated"] = {
                entry: {k: spread([r["also_evaluated"][entry][k] for r in runs]) for k in figures if k != "n"}
                for entry, figures in runs[0]["also_evaluated"].items()
            }
    report["summary"] = summary
    if "keras-hub" in args.impls:
        # Mean fit, and mean step after the first, of each kbert variant over
        # keras-hub's, seed for seed the same runs.
        for key in ("fit_seconds", "mean_step_seconds"):
            if key not in summary["keras-hub"]:
                continue  # a fit of one step has no step after the first
            hub = summary["keras-hub"][key]["mean"]
            report[f"{key}_ratio_to_keras_hub"] = {
                impl: round(summary[impl][key]["mean"] / hub, 3)
                for impl in args.impls if impl.split(":")[0] == "kbert"
            }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
