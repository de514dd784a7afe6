"""The `kbert` command line.

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
    add_model_arguments,
    add_task_options,
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
    Interrupted,
    check_output_file,
    in_main_thread,
    input_paths,
    interrupted_line,
    is_npy,
    is_tensorflow_data_error,
    is_vocab_file,
    raise_interrupted,
    read_texts,
    tensorflow_reason,
)
from kbert.fileio import check_distinct, write_file
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


def cmd_tokenize(args):
    from kbert.text import BertPreprocessor, WordPieceTokenizer

    tokenizer = WordPieceTokenizer(args.vocab, lowercase=not args.cased)
    preprocessor = BertPreprocessor(tokenizer, sequence_length=None)
    for text in args.texts:
        packed = preprocessor([text])
        ids = packed["token_ids"][0].numpy()
        print(json.dumps([int(i) for i in ids[packed["padding_mask"][0].numpy() == 1]]))


def cmd_vocab(args):
    from kbert.pretraining import learn_vocabulary

    check_output_file(
        "--out", args.out, args.overwrite, is_vocab_file, "a WordPiece vocabulary", {"--corpus": args.corpus}
    )
    vocabulary = learn_vocabulary(
        args.corpus, args.size, lowercase=not args.cased, min_count=args.min_count
    )
    text = "".join(token + "\n" for token in vocabulary).encode("utf-8")
    write_file(args.out, lambda f: f.write(text))
    print(json.dumps({"vocab": args.out, "size": len(vocabulary)}))


def cmd_pretraining_data(args):
    from kbert.pretraining import read_metadata, write_pretraining_data

    check_distinct({"--out": args.out}, {"--corpus": args.corpus, "--vocab": args.vocab})
    write_pretraining_data(
        args.corpus,
        args.vocab,
        args.out,
        lowercase=not args.cased,
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob,
        dupe_factor=args.dupe_factor,
        short_seq_prob=args.short_seq_prob,
        whole_word_masking=args.whole_word_masking,
        random_seed=args.random_seed,
        num_shards=args.num_shards,
        num_workers=args.workers,
        overwrite=args.overwrite,
        progress=sys.stderr.isatty(),
    )
    metadata = read_metadata(args.out)
    print(json.dumps({
        "records": args.out,
        "shards": len(metadata["shards"]),
        "num_instances": metadata["num_instances"],
    }))


def _pretraining_init(config):
    """A preset name or checkpoint as is; a BertConfig .json file read."""
    from kbert.config import BertConfig

    if config.endswith(".json") and os.path.isfile(config):
        return BertConfig.from_json(config)
    return config


def cmd_pretrain(args):
    from kbert.pretraining import (
        make_dynamic_masking_dataset,
        make_pretraining_dataset,
        pretrain,
        read_metadata,
    )
    from kbert.training.distribute import get_strategy

    if bool(args.records) == bool(args.corpus):
        raise CliError("give either --records or --corpus")
    if args.corpus and args.deterministic:
        # tf-text's RandomItemSelector draws masks with unseeded random ops,
        # which TensorFlow's op determinism refuses.
        raise CliError("--deterministic needs --records: masking --corpus on the fly is not")
    if args.records and args.whole_word_masking:
        raise CliError(
            "--whole-word-masking needs --corpus: records carry their masks "
            "(see kbert pretraining-data --whole-word-masking)"
        )
    vocab = args.vocab
    lowercase = not args.cased
    if args.records and os.path.isdir(args.records):
        vocab = vocab or os.path.join(args.records, "vocab.txt")
        try:
            lowercase = read_metadata(args.records)["lowercase"]
        except ValueError:
            pass
    if not vocab or not os.path.isfile(vocab):
        raise CliError(f"--vocab {vocab}: no such file" if vocab else "--vocab is required")
    check_distinct({"--out": args.out}, {"--records": args.records, "--corpus": args.corpus, "--vocab": vocab})
    # Before any tf.data pipeline: MultiWorkerMirroredStrategy must configure
    # TensorFlow's collective ops first.
    strategy = get_strategy(args.strategy)
    if args.records:
        train = make_pretraining_dataset(
            args.records, args.batch_size, seq_len=args.seq_len, seed=args.seed
        )
    else:
        train = make_dynamic_masking_dataset(
            args.corpus,
            vocab,
            args.batch_size,
            args.seq_len,
            args.max_predictions,
            lowercase=lowercase,
            seed=args.seed,
            whole_word_masking=args.whole_word_masking,
        )
    kwargs = {} if args.lr is None else {"learning_rate": args.lr}
    history = pretrain(
        train,
        args.out,
        vocab,
        init=_pretraining_init(args.config),
        batch_size=args.batch_size,
        num_train_steps=args.steps,
        num_warmup_steps=args.warmup_steps,
        optimizer=args.optimizer,
        log_every=args.log_every,
        lowercase=lowercase,
        jit_compile=not args.no_jit,
        dtype=args.dtype,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        deterministic=args.deterministic,
        strategy=strategy,
        **kwargs,
    )
    final = {k: v for k, v in history["final"].items() if k in ("step", "loss", "masked_lm_accuracy")}
    print(json.dumps({
        "model": args.out,
        "final": final,
        "throughput": history["throughput"],
        "weights_sha256": history["weights_sha256"],
    }))


# What `kbert --help` says: every command, by what it is for.
DESCRIPTION = """\
BERT for Keras 3, from raw text to served models.

  train:     finetune (a task on a pretrained checkpoint), distill (into a smaller student)
  use:       evaluate, predict, embed, search
  serve:     export (TF Serving, TFLite, ONNX, MediaPipe; each verified)
  pretrain:  tokenize, vocab, pretraining-data, pretrain
"""
DEBIAN = "data/debian-packages"


def _examples(*commands):
    """An epilog of example commands, as `--help` prints them last."""
    return "examples:\n" + "\n".join("  " + command for command in commands)


def _add_command(sub, name, help, examples, description=None, usage=None):
    """A subcommand whose `--help` shows defaults and ends with `examples`."""
    return sub.add_parser(
        name, help=help, description=description or help[0].upper() + help[1:] + ".",
        epilog=_examples(*examples), formatter_class=HelpFormatter, usage=usage,
    )


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
    # kbert.training.finetune's DEFAULT_WARMUP_FRACTION and kbert.training.optimizers'
    # DEFAULT_WEIGHT_DECAY (not imported: --help loads no TensorFlow; tests/test_cli_help.py).
    recipe.add_argument("--warmup", type=fraction, default=0.1, help="share of the steps warming up")
    recipe.add_argument("--weight-decay", type=fraction, default=0.01, help="AdamW's decoupled weight decay")
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

    p = _add_command(
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
    p = _add_command(
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

    p = _add_command(
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

    p = _add_command(
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

    p = _add_command(
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

    p = _add_command(
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


def _add_pretraining_commands(sub):
    """tokenize, vocab, pretraining-data, pretrain: BERT from raw text."""
    p = _add_command(
        sub, "tokenize", "WordPiece ids with [CLS]/[SEP], one JSON list per text",
        (
            'kbert tokenize --vocab vocab.txt "Résumé of a package"',
            'kbert tokenize --vocab vocab.txt --cased "Résumé of a package" "a second text"',
        ),
    )
    p.add_argument("--vocab", required=True, help="vocab.txt")
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("texts", nargs="+", metavar="TEXT", help="texts to tokenize")
    p.set_defaults(run=cmd_tokenize)

    p = _add_command(
        sub, "vocab", "learn a WordPiece vocab.txt from raw text",
        (
            "kbert vocab --corpus corpus.txt.gz --size 30522 --out vocab.txt",
            "kbert vocab --corpus 'shards/*.txt' --size 8000 --min-count 5 --cased --out vocab.txt",
        ),
    )
    p.add_argument("--corpus", required=True, help="text file(s) or glob; .gz read transparently")
    p.add_argument("--size", required=True, type=positive_int, help="largest vocabulary")
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("--min-count", type=positive_int, default=10, help="rarest piece kept")
    p.add_argument("--out", required=True, help="vocab.txt to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=cmd_vocab)

    p = _add_command(
        sub, "pretraining-data", "masked-LM / next-sentence TFRecords (google-research/bert format)",
        (
            "kbert pretraining-data --corpus corpus.txt.gz --vocab vocab.txt --out records",
            "kbert pretraining-data --corpus corpus.txt.gz --vocab vocab.txt --max-seq-length 512 \\\n"
            "      --max-predictions-per-seq 76 --whole-word-masking --out records-512",
        ),
    )
    p.add_argument(
        "--corpus", required=True,
        help="one sentence per line, blank lines between documents; file(s) or glob",
    )
    p.add_argument("--vocab", required=True, help="vocab.txt")
    p.add_argument("--out", required=True, help="folder for the shards")
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("--max-seq-length", type=positive_int, default=128, help="packed length")
    p.add_argument("--max-predictions-per-seq", type=positive_int, default=20, help="most masked positions")
    p.add_argument("--masked-lm-prob", type=fraction, default=0.15, help="share of the pieces masked")
    p.add_argument("--dupe-factor", type=positive_int, default=10, help="maskings of each document")
    p.add_argument("--short-seq-prob", type=fraction, default=0.1, help="share of shorter sequences")
    p.add_argument("--whole-word-masking", action="store_true", help="mask all pieces of a chosen word")
    p.add_argument("--random-seed", type=int, default=12345, help="seed of the masking and pairing")
    p.add_argument("--num-shards", type=positive_int, default=16, help="TFRecord files written")
    p.add_argument("--workers", type=positive_int, default=None, help="processes (default: CPU count)")
    p.add_argument("--overwrite", action="store_true", help="replace earlier shards in --out")
    p.set_defaults(run=cmd_pretraining_data)

    p = _add_command(
        sub, "pretrain", "masked-LM pretraining; rerun the same command to resume",
        (
            "kbert pretrain --records records --config bert_tiny --steps 10000 \\\n"
            "      --checkpoint-every 1000 --out runs/pretrain",
            "kbert pretrain --corpus corpus.txt.gz --vocab vocab.txt --config config.json --steps 10000 \\\n"
            "      --whole-word-masking --out runs/pretrain-dynamic",
        ),
    )
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--records", help="TFRecords: folder or glob from pretraining-data")
    data.add_argument("--corpus", help="raw text, masked on the fly (RoBERTa's dynamic masking)")
    p.add_argument(
        "--config", "--init", required=True, dest="config",
        help="BertConfig preset, a BertConfig .json file, or a checkpoint folder to continue",
    )
    p.add_argument("--vocab", help="vocab.txt (default: the one in the --records folder)")
    p.add_argument("--cased", action="store_true", help="with --corpus: keep case and accents")
    p.add_argument("--steps", type=positive_int, required=True, help="optimizer steps")
    p.add_argument("--batch-size", type=positive_int, default=64, help="global batch")
    p.add_argument("--seq-len", type=positive_int, default=128, help="packed length")
    p.add_argument(
        "--max-predictions", type=positive_int, default=20,
        help="with --corpus: most masked positions per sequence",
    )
    p.add_argument(
        "--whole-word-masking", action="store_true",
        help="with --corpus: mask all pieces of a chosen word",
    )
    p.add_argument("--out", required=True, help="run folder (logs/, backup/, encoder/, ...)")
    p.add_argument(
        "--checkpoint-every", type=positive_int, default=None, metavar="K",
        help="save the training state every K steps; rerunning resumes from it (default: at the end only)",
    )
    p.add_argument("--log-every", type=positive_int, default=100, help="steps per logged window")
    p.add_argument(
        "--lr", type=learning_rate, default=None,
        help="peak learning rate (default: the optimizer's; LAMB: 1e-3)",
    )
    p.add_argument("--optimizer", choices=["lamb", "adamw"], default="lamb", help="LAMB (large batches) or AdamW")
    p.add_argument("--warmup-steps", type=int, default=None, help="default: 10%% of --steps")
    p.add_argument("--no-jit", action="store_true", help="do not compile with XLA")
    p.add_argument(
        "--dtype", choices=["float32", "mixed_bfloat16", "mixed_float16", "auto"], default="auto",
        help="auto: mixed_bfloat16 where the device multiplies bfloat16 natively, else float32",
    )
    p.add_argument("--seed", type=int, default=0, help="initial weights, dropout and shuffles")
    p.add_argument(
        "--deterministic", action="store_true",
        help="TensorFlow op determinism: bitwise reproducible, also across a resume",
    )
    p.add_argument(
        "--strategy",
        default="auto",
        help="tf.distribute strategy: auto, default, mirrored, multiworker (every worker "
        "runs this command with its TF_CONFIG) or tpu; --batch-size is the global batch",
    )
    p.set_defaults(run=cmd_pretrain)


def build_parser():
    """The `kbert` command's parser, every subcommand included; imports no TensorFlow."""
    from kbert.export.cli import add_export_parser
    from kbert.tasks import EMBEDDING_TASK, TASKS

    parser = argparse.ArgumentParser(
        prog="kbert", description=DESCRIPTION, formatter_class=HelpFormatter,
        epilog=_examples(
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
    _add_pretraining_commands(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    # SIGTERM (a killed job, `timeout`) unwinds like Ctrl-C: half-written
    # outputs are removed, and one line says what was kept.
    previous = signal.signal(signal.SIGTERM, raise_interrupted) if in_main_thread() else None
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
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one while reporting
        try:
            line = interrupted_line(args)
        except Exception:  # noqa: BLE001  (the one line matters more than its detail)
            line = "interrupted"
        print(f"kbert: {line}", file=sys.stderr)
        return 128 + stop.signum if isinstance(stop, Interrupted) else EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return status or 0




if __name__ == "__main__":
    sys.exit(main())
