"""The `kbert` command line: its parser, the task commands and `main`.

Every subcommand imports TensorFlow only when it runs, so `--help` is instant.
Bad input ends with one line `kbert: error: ...` on stderr and exit status 2.
"""

import argparse
import json
import os
import re
import signal
import sys
import tempfile

from kbert.cliargs import (
    HelpFormatter,
    add_command,
    add_model_arguments,
    add_task_options,
    examples_epilog,
    dropout_rate,
    fraction,
    learning_rate,
    positive_float,
    positive_fraction,
    positive_int,
    rate,
)
from kbert.cliio import (
    EXIT_INTERRUPTED,
    CliError,
    check_output_file,
    in_main_thread,
    input_paths,
    interrupted_line,
    is_npy,
    is_tensorflow_data_error,
    read_texts,
    tensorflow_reason,
)
from kbert.fileio import write_file
from kbert.interrupts import Interrupted, handle_signals, restore
from kbert.recipes import DISTILLATION

# TensorFlow's start-up lines that `_quiet_tensorflow` drops.
_TENSORFLOW_STARTUP = re.compile(
    r"absl::InitializeLog\(\) is called|port\.cc:\d+\] oneDNN custom operations|cudart_stub\.cc"
    r"|cuda_platform\.cc:\d+\] failed call to cuInit|cpu_feature_guard\.cc"
    r"|^To enable the following instructions|rebuild TensorFlow with the appropriate compiler flags"
)


def _quiet_tensorflow():
    """Starts TensorFlow without its start-up log lines, unless TF_CPP_MIN_LOG_LEVEL is set.

    TensorFlow 2.21 writes them (the oneDNN notice, CUDA probes on a machine
    without a GPU, CPU instruction sets) through absl before absl's logging is
    set up, where TF_CPP_MIN_LOG_LEVEL does not reach; so stderr is held while
    TensorFlow loads and lists its devices, and every other line is passed on.
    oneDNN itself stays as it is (TF_ENABLE_ONEDNN_OPTS changes numerics).
    """
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    with tempfile.TemporaryFile() as held:
        sys.stderr.flush()
        stderr = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()
        finally:
            sys.stderr.flush()
            os.dup2(stderr, 2)
            os.close(stderr)
            held.seek(0)
            for line in held.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not _TENSORFLOW_STARTUP.search(line):
                    sys.stderr.write(line)


def _task_options(args, names=None):
    """The task data options given on the command line (None where not given).

    `names`: the options to take; default every task's.
    """
    if names is None:
        from kbert.tasks import TASKS

        names = {o.name for task in TASKS.values() for o in task.options}
    return {name: getattr(args, name, None) for name in names}


def cmd_finetune(args):
    from kbert.tasks import get_task
    from kbert.training.finetune import finetune

    task = get_task(args.task)
    metrics = finetune(
        args.train,
        args.dev,
        args.init,
        args.out,
        task=args.task,
        options=_task_options(args, [o.name for o in task.options]),
        sequence_length=args.seq_len,
        batch_size=args.batch_size,
        epochs=args.epochs,
        learning_rate=args.lr,
        warmup_fraction=args.warmup,
        weight_decay=args.weight_decay,
        layer_decay=args.layer_decay,
        ema_momentum=args.ema,
        reinit_pooler=args.reinit_pooler,
        attention_dropout=args.attention_dropout,
        jit_compile=args.xla,
        dtype=args.dtype,
        seed=args.seed,
        vocab=args.vocab,
        strategy=args.strategy,
        overwrite=args.overwrite,
        deterministic=args.deterministic,
    )
    summary = {**task.summary(metrics), "train_seconds": metrics["train_seconds"]}
    _print_json({"model": args.out, "task": args.task, "dev": summary})


def cmd_distill(args):
    from kbert.tasks import TASKS
    from kbert.training.distill import distill

    metrics = distill(
        args.teacher,
        args.train,
        args.dev,
        args.out,
        student=args.student,
        unlabelled=args.unlabelled,
        unlabelled_limit=args.unlabelled_limit,
        temperature=args.temperature,
        alpha=args.alpha,
        options=_task_options(args),
        sequence_length=args.seq_len,
        batch_size=args.batch_size,
        epochs=args.epochs,
        learning_rate=args.lr,
        warmup_fraction=args.warmup,
        weight_decay=args.weight_decay,
        jit_compile=args.xla,
        dtype=args.dtype,
        seed=args.seed,
        overwrite=args.overwrite,
        deterministic=args.deterministic,
    )
    task = TASKS[metrics["distillation"]["task"]]
    _print_json({
        "model": args.out,
        "task": task.name,
        "dev": {**task.summary(metrics), "train_seconds": metrics["train_seconds"]},
        "teacher_dev": task.summary(metrics["teacher"]),
    })


def _load_model_folder(args):
    """The model of `--model` (and `--task`) and its data options (stored, then given)."""
    from kbert.modelfolder import open_model

    given = _task_options(args)
    folder = open_model(args.model, args.task, given, args.seq_len)
    return folder, folder.use_options(given)


def cmd_evaluate(args):
    folder, options = _load_model_folder(args)
    examples = folder.task.read(args.data, options)
    metrics = folder.evaluate(examples, source=args.data, batch_size=args.batch_size)
    _print_json(metrics)


# `predict --input` files read by the task's data reader (without targets);
# any other is texts: a .json list, or one text a line.
PREDICT_DATA_FILES = (".csv", ".tsv", ".jsonl", ".conll")


def cmd_predict(args):
    if bool(args.texts) == bool(args.input):
        raise CliError("give either TEXT arguments or --input FILE")
    folder, options = _load_model_folder(args)
    task = folder.task
    if args.input and os.path.splitext(args.input)[1].lower() in PREDICT_DATA_FILES:
        examples = task.read(args.input, options, targets=False)
    else:
        examples = task.examples_from_texts(args.texts or read_texts(args.input))
    rows = task.predict_json(examples, folder.predict(examples, batch_size=args.batch_size))
    for row in rows:
        _print_json(row)


def _print_json(value):
    """One JSON line on stdout; NaN and infinity are refused, never printed."""
    try:
        line = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise CliError("the result holds NaN or infinity; the model is broken") from None
    print(line)


def cmd_embed(args):
    import numpy as np

    if not args.output.endswith(".npy"):
        raise CliError(f"--output {args.output}: expected a .npy file name")
    check_output_file(
        "--output", args.output, args.overwrite, is_npy, "a .npy array file",
        {"--input": args.input, "--model": args.model},
    )
    texts = read_texts(args.input)
    folder, _ = _load_model_folder(args)
    embeddings = folder.embed(texts, batch_size=args.batch_size)
    write_file(args.output, lambda f: np.save(f, embeddings))
    print(json.dumps({"output": args.output, "shape": list(embeddings.shape)}))


def cmd_search(args):
    from kbert import search

    queries = list(args.queries) + (read_texts(args.queries_file, "--queries") if args.queries_file else [])
    if args.corpus:
        if not args.model:
            raise CliError("--corpus needs --model: the model that embeds it")
        check_output_file(
            "--index", args.index, args.overwrite, search.is_index, "a kbert index",
            {"--corpus": args.corpus, "--queries": args.queries_file, "--model": args.model},
        )
        folder, _ = _load_model_folder(args)
        texts, lines = search.read_corpus(args.corpus, args.text_column)
        _print_json(search.build_index(folder, texts, lines, args.index, args.corpus, args.batch_size))
        if not queries:
            return
        index = search.load_index(args.index)
    else:
        if not queries:
            raise CliError("give QUERY arguments or --queries FILE, or --corpus to build the index")
        index = search.load_index(args.index)
        folder = search.index_model(index, args.index, args.model)
    rows, scores = search.search(index, folder.embed(queries, batch_size=args.batch_size), args.top_k)
    for query, found, score in zip(queries, rows, scores):
        _print_json({
            "query": query,
            "results": [
                {"score": float(s), "line": int(index.lines[i]), "text": index.text(i)}
                for i, s in zip(found, score)
            ],
        })


# What `kbert --help` says: every command, by what it is for.
DESCRIPTION = """\
BERT for Keras 3, from raw text to served models.

  train:     finetune (a task on a pretrained checkpoint), distill (into a smaller student)
  use:       evaluate, predict, embed, search
  serve:     export (TF Serving, TFLite, ONNX, MediaPipe; each verified)
  pretrain:  tokenize, vocab, pretraining-data, pretrain
"""
DEBIAN = "data/debian-packages"


def _add_training_data(p):
    p.add_argument("--train", required=True, metavar="FILE", help="training data, in the task's format")
    p.add_argument("--dev", required=True, metavar="FILE", help="dev data, evaluated after training")


def _recipe_default(tasks, field, show=str):
    """`--help`'s default of a recipe flag: each task's value."""
    values = "; ".join(f"{task.name}: {show(getattr(task.recipe, field))}" for task in tasks)
    return f"default: the task's recipe ({values})"


def _add_training_arguments(p, tasks=None):
    """What `finetune` and `distill` both take: the recipe, how the run goes, the output.

    `tasks`: finetune's tasks, whose recipes give the defaults; None: distillation's recipe.
    """
    p.add_argument("--out", required=True, metavar="DIR", help="model folder to write (a new or empty folder)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace --out if it is a kbert model folder"
    )
    recipe = p.add_argument_group("recipe")
    if tasks:
        recipe.add_argument("--seq-len", type=positive_int, help="packed length; " + _recipe_default(tasks, "sequence_length"))
        recipe.add_argument("--batch-size", type=positive_int, help="global batch; " + _recipe_default(tasks, "batch_size"))
        recipe.add_argument("--epochs", type=positive_int, help="passes over --train; " + _recipe_default(tasks, "epochs"))
        recipe.add_argument(
            "--lr", type=learning_rate,
            help="peak learning rate, in (0, 1]; " + _recipe_default(tasks, "learning_rate", rate),
        )
        recipe.add_argument(
            "--warmup", type=fraction,
            help="share of the steps warming up; " + _recipe_default(tasks, "warmup_fraction"),
        )
        recipe.add_argument(
            "--weight-decay", type=fraction,
            help="AdamW's decoupled weight decay; " + _recipe_default(tasks, "weight_decay"),
        )
    else:
        recipe.add_argument(
            "--seq-len", type=positive_int, default=DISTILLATION.sequence_length,
            help="packed length (default: the teacher's)",
        )
        recipe.add_argument("--batch-size", type=positive_int, default=DISTILLATION.batch_size, help="global batch")
        recipe.add_argument("--epochs", type=positive_int, default=DISTILLATION.epochs, help="passes over --train")
        recipe.add_argument(
            "--lr", type=learning_rate, default=DISTILLATION.learning_rate,
            help=f"peak learning rate, in (0, 1] (default: {rate(DISTILLATION.learning_rate)})",
        )
        recipe.add_argument(
            "--warmup", type=fraction, default=DISTILLATION.warmup_fraction, help="share of the steps warming up"
        )
        recipe.add_argument(
            "--weight-decay", type=fraction, default=DISTILLATION.weight_decay, help="AdamW's decoupled weight decay"
        )
    run = p.add_argument_group("how it runs")
    run.add_argument(
        "--dtype", default="auto",
        help="dtype policy, e.g. float32 or mixed_bfloat16; auto: mixed_bfloat16 where the device "
        "multiplies bfloat16 natively (Ampere GPUs, TPUs, CPUs with AVX512_BF16 or AMX), else float32",
    )
    run.add_argument("--xla", action="store_true", help="compile the train step with XLA")
    run.add_argument("--seed", type=int, default=0, help="weights of new layers, dropout and shuffles")
    run.add_argument(
        "--deterministic", action="store_true",
        help="TensorFlow op determinism: bitwise reproducible, also across a resume",
    )
    return recipe, run


def _add_finetune(sub, tasks):
    from kbert.tasks import DEFAULT_TASK

    p = add_command(
        sub, "finetune", "fine-tune a task on a pretrained checkpoint; writes a model folder",
        (
            f"kbert finetune --train {DEBIAN}/train.csv --dev {DEBIAN}/dev.csv \\\n"
            "      --init all-minilm-l6-v2 --out runs/debian-minilm",
            "kbert finetune --task token-classification --train train.conll --dev dev.conll \\\n"
            "      --init all-minilm-l6-v2 --out runs/ner",
            "kbert finetune --task question-answering --train train-v2.0.json --dev dev-v2.0.json \\\n"
            "      --init all-minilm-l6-v2 --epochs 2 --lr 5e-5 --out runs/squad",
        ),
        description="Fine-tunes a task on a pretrained checkpoint with the task's recipe (the "
        "recipe flags override it), evaluates it on --dev and writes a model folder (model.keras, "
        "vocab.txt, kbert.json with the recipe it ran, metrics.json).\n\ntasks:\n"
        + "\n".join(f"  {task.name:26} {task.description}" for task in tasks),
        usage="kbert finetune [--task TASK] --train FILE --dev FILE --init CHECKPOINT --out DIR [options]",
    )
    p.add_argument(
        "--task", default=DEFAULT_TASK, choices=[task.name for task in tasks], metavar="TASK",
        help="the task, one of " + ", ".join(task.name for task in tasks),
    )
    _add_training_data(p)
    p.add_argument(
        "--init", required=True, metavar="CHECKPOINT",
        help="Hugging Face checkpoint folder, 'all-minilm-l6-v2', or a BertConfig preset",
    )
    p.add_argument("--vocab", help="vocab.txt (default: the checkpoint's; required with a preset)")
    recipe, run = _add_training_arguments(p, tasks)
    recipe.add_argument(
        "--layer-decay", type=positive_fraction, default=1.0,
        help="layer-wise learning-rate decay in (0, 1]; 1 is off",
    )
    recipe.add_argument(
        "--ema", type=fraction, default=None, metavar="MOMENTUM",
        help="end on a moving average of the weights with this momentum, e.g. 0.99 (default: off)",
    )
    recipe.add_argument("--reinit-pooler", action="store_true", help="re-initialise the pooler")
    recipe.add_argument(
        "--attention-dropout", type=dropout_rate, default=None, metavar="RATE",
        help="dropout on the attention probabilities while fine-tuning, in [0, 1); "
        "default: the checkpoint's (0.1)",
    )
    run.add_argument(
        "--strategy", default="auto",
        help="tf.distribute strategy: auto, default, mirrored, multiworker or tpu; "
        "--batch-size is the global batch",
    )
    add_task_options(p, tasks)
    p.set_defaults(run=cmd_finetune)


def _add_distill(sub, tasks):
    p = add_command(
        sub, "distill", "distill a fine-tuned model folder into a smaller student",
        (
            f"kbert distill --teacher runs/debian-minilm --train {DEBIAN}/train.csv \\\n"
            f"      --dev {DEBIAN}/dev.csv --out runs/debian-minilm-l1",
            f"kbert distill --teacher runs/debian-minilm --student layers:2 --train {DEBIAN}/train.csv \\\n"
            f"      --dev {DEBIAN}/dev.csv --unlabelled corpus.txt.gz --out runs/debian-minilm-l2",
        ),
        description="Trains a student on the teacher's task from the gold labels and the "
        "teacher's outputs (softened by --temperature for classifiers), and writes it as a "
        "model folder of the teacher's task, labels, vocabulary and sequence length.",
        usage="kbert distill --teacher DIR --train FILE --dev FILE --out DIR [options]",
    )
    p.add_argument("--teacher", required=True, help="the teacher's model folder (kbert finetune --out)")
    _add_training_data(p)
    p.add_argument(
        "--student", default="layers:1",
        help="layers:K (K of the teacher's blocks evenly spaced, the last kept, with its weights; "
        "default layers:1, its last block), every-other (blocks 1, 3, 5, ... counting from 0), a "
        "BertConfig preset (random init) or a checkpoint as for finetune --init",
    )
    p.add_argument(
        "--unlabelled",
        help="extra texts without labels (one-text tasks): one sentence a line, a blank line "
        "between documents, a document one text; .gz read too (default: none)",
    )
    p.add_argument("--unlabelled-limit", type=positive_int, default=None, metavar="N",
                   help="take at most N unlabelled texts (default: all)")
    p.add_argument("--temperature", type=positive_float, default=2.0,
                   help="softens the teacher's and the student's distributions")
    p.add_argument("--alpha", type=fraction, default=0.5,
                   help="weight of the gold labels' loss in [0, 1]; the teacher's takes 1 - alpha")
    _add_training_arguments(p)
    add_task_options(p, tasks, stored=True)
    p.set_defaults(run=cmd_distill)


def _add_use_commands(sub, tasks, embedding_tasks):
    """evaluate, predict, embed, search: a model folder (or a checkpoint and a task) at work."""
    from kbert.tasks import EMBEDDING_TASK

    p = add_command(
        sub, "evaluate", "the task's metrics of a model on a labelled file, as JSON",
        (
            f"kbert evaluate --model runs/debian-minilm --data {DEBIAN}/dev.csv",
            f"kbert evaluate --model runs/debian-minilm --data {DEBIAN}/dev.csv --truncate longest_first",
            "kbert evaluate --model all-minilm-l6-v2 --task sentence-embedding --data sts-dev.tsv",
        ),
    )
    add_model_arguments(p)
    p.add_argument("--data", required=True, help="labelled data in the task's format")
    p.add_argument("--batch-size", type=positive_int, default=64, help="texts per inference batch")
    add_task_options(p, tasks, stored=True)
    p.set_defaults(run=cmd_evaluate)

    p = add_command(
        sub, "predict", "the task's predictions as JSON lines",
        (
            'kbert predict --model runs/debian-minilm "an IMAP mail client for the terminal"',
            "kbert predict --model runs/debian-minilm --input texts.txt",
            'kbert predict --model runs/squad "Who led the Normans?" "Rollo led the Normans to Normandy."',
        ),
    )
    add_model_arguments(p)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to predict (or --input)")
    p.add_argument(
        "--input",
        help="a .txt file (one text per line), a .json list, or a data file in the task's "
        "format (.csv, .tsv, .jsonl)",
    )
    p.add_argument("--batch-size", type=positive_int, default=64, help="texts per inference batch")
    add_task_options(p, tasks, stored=True)
    p.set_defaults(run=cmd_predict)

    p = add_command(
        sub, "embed", "sentence embeddings (float32, one row per text) to a .npy file",
        (
            "kbert embed --model all-minilm-l6-v2 --input texts.txt --output embeddings.npy",
            "kbert embed --model all-minilm-l6-v2 --input texts.json --output embeddings.npy --pooling cls",
        ),
    )
    add_model_arguments(p, task=EMBEDDING_TASK)
    p.add_argument("--input", required=True, help="a .txt file (one text per line) or a .json list")
    p.add_argument("--output", required=True, help="the .npy file to write")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    p.add_argument("--batch-size", type=positive_int, default=64, help="texts per inference batch")
    add_task_options(p, embedding_tasks)
    p.set_defaults(run=cmd_embed)

    p = add_command(
        sub, "search", "exact semantic search: embed a corpus once into an index file, then query it",
        (
            "kbert search --model all-minilm-l6-v2 --corpus corpus.txt.gz --index corpus.kbert-index",
            'kbert search --index corpus.kbert-index "a mail client for the terminal"',
            f"kbert search --model all-minilm-l6-v2 --corpus {DEBIAN}/train.csv --index debian.kbert-index \\\n"
            '      --top-k 3 "chess engine"',
        ),
        description="With --corpus, embeds every text of the corpus with --model and writes "
        "--index; with QUERY arguments or --queries, prints the --top-k closest texts of the "
        "index to each query by cosine similarity, one JSON line per query. The query "
        "model is the one the index was built with (checked on its first text).",
    )
    add_model_arguments(p, task=EMBEDDING_TASK, required=False)
    p.add_argument("--index", required=True, help="the index file to write (with --corpus) or read")
    p.add_argument(
        "--corpus",
        help="texts to index: a text file, one text a line (.gz read too), or a .csv/.tsv "
        "file (the texts in --text-column)",
    )
    p.add_argument("--text-column", help="the column of a .csv/.tsv --corpus holding the texts (default: text)")
    p.add_argument("queries", nargs="*", metavar="QUERY", help="queries (or --queries)")
    p.add_argument("--queries", dest="queries_file", help="a .txt file of queries, one a line")
    p.add_argument("-k", "--top-k", type=positive_int, default=10, help="texts per query")
    p.add_argument("--overwrite", action="store_true", help="with --corpus: replace --index if it exists")
    p.add_argument("--batch-size", type=positive_int, default=64, help="texts per inference batch")
    add_task_options(p, embedding_tasks)
    p.set_defaults(run=cmd_search)


def build_parser():
    """The `kbert` command's parser, every subcommand included; imports no TensorFlow."""
    from kbert.cli.pretraining import add_pretraining_commands
    from kbert.export.cli import add_export_parser
    from kbert.tasks import EMBEDDING_TASK, TASKS

    parser = argparse.ArgumentParser(
        prog="kbert", description=DESCRIPTION, formatter_class=HelpFormatter,
        epilog=examples_epilog(
            f"kbert finetune --train {DEBIAN}/train.csv --dev {DEBIAN}/dev.csv \\\n"
            "      --init all-minilm-l6-v2 --out runs/debian-minilm",
            'kbert predict --model runs/debian-minilm "an IMAP mail client for the terminal"',
            f"kbert export --model runs/debian-minilm --data {DEBIAN}/dev.csv --out saved_models/debian",
        ) + "\n\nkbert COMMAND --help: the command's options, their defaults and examples.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    trainable = [task for task in TASKS.values() if task.trainable]
    _add_finetune(sub, trainable)
    _add_distill(sub, trainable)
    _add_use_commands(sub, list(TASKS.values()), [TASKS[EMBEDDING_TASK]])
    add_export_parser(sub)
    add_pretraining_commands(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    # SIGTERM (a killed job, `timeout`) unwinds like Ctrl-C: half-written
    # outputs are removed, and one line says what was kept.
    previous = handle_signals() if in_main_thread() else None
    try:
        _quiet_tensorflow()
        status = args.run(args)
    except (CliError, ValueError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"kbert: error: {message}", file=sys.stderr)
        return 2
    except Exception as error:
        if not is_tensorflow_data_error(error):
            raise
        reason = tensorflow_reason(error)
        read = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in input_paths(args))
        print(f"kbert: error: an input is damaged or unreadable ({reason}); this command reads {read or 'no file'}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        if previous is not None:
            for signum in previous:  # a second one while reporting
                signal.signal(signum, signal.SIG_IGN)
        try:
            line = interrupted_line(args)
        except Exception:  # noqa: BLE001  (the one line matters more than its detail)
            line = "interrupted"
        print(f"kbert: {line}", file=sys.stderr)
        return 128 + stop.signum if isinstance(stop, Interrupted) else EXIT_INTERRUPTED
    finally:
        if previous is not None:
            restore(previous)
    return status or 0




if __name__ == "__main__":
    sys.exit(main())
