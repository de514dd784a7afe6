"""The `kbert` command line.

Every subcommand imports TensorFlow only when it runs, so `--help` is instant.
Bad input ends with one line `kbert: error: ...` on stderr and exit status 2.
"""

import argparse
import json
import os
import sys

from kbert.cliargs import (
    add_model_arguments,
    add_task_options,
    dropout_rate,
    fraction,
    learning_rate,
    positive_float,
    positive_fraction,
    positive_int,
)
from kbert.fileio import write_file

class CliError(Exception):
    """An error to report in one line, without a traceback."""


def _quiet_tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _read_texts(path):
    """Texts from a .txt file (one per line) or a .json file (a list of strings)."""
    if not os.path.isfile(path):
        raise CliError(f"{path}: no such file")
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            try:
                texts = json.load(f)
            except json.JSONDecodeError as error:
                raise CliError(f"{path} is not valid JSON: {error}") from None
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise CliError(f"{path} must hold a JSON list of strings")
        else:
            texts = [line.rstrip("\n") for line in f]
    if not texts:
        raise CliError(f"{path} holds no texts")
    return texts


def _check_output_file(path, overwrite):
    """Refuses, before any work, an output file kbert may not write.

    An existing file is replaced only with --overwrite: kbert does not know
    whether it wrote it.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"{folder}: no such folder for {path}")
    if os.path.isdir(path):
        raise CliError(f"{path} is a folder; expected a file name")
    if os.path.lexists(path) and not overwrite:
        raise CliError(f"{path} exists; pass --overwrite to replace it")


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


def cmd_predict(args):
    if bool(args.texts) == bool(args.input):
        raise CliError("give either TEXT arguments or --input FILE")
    folder, options = _load_model_folder(args)
    task = folder.task
    if args.input and os.path.splitext(args.input)[1].lower() in (".csv", ".tsv", ".jsonl"):
        examples = task.read(args.input, options, targets=False)
    else:
        examples = task.examples_from_texts(args.texts or _read_texts(args.input))
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
    _check_output_file(args.output, args.overwrite)
    texts = _read_texts(args.input)
    folder, _ = _load_model_folder(args)
    embeddings = folder.embed(texts, batch_size=args.batch_size)
    write_file(args.output, lambda f: np.save(f, embeddings))
    print(json.dumps({"output": args.output, "shape": list(embeddings.shape)}))


def cmd_search(args):
    from kbert import search

    queries = list(args.queries) + (_read_texts(args.queries_file) if args.queries_file else [])
    if args.corpus:
        if not args.model:
            raise CliError("--corpus needs --model: the model that embeds it")
        _check_output_file(args.index, args.overwrite)
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

    _check_output_file(args.out, args.overwrite)
    vocabulary = learn_vocabulary(
        args.corpus, args.size, lowercase=not args.cased, min_count=args.min_count
    )
    text = "".join(token + "\n" for token in vocabulary).encode("utf-8")
    write_file(args.out, lambda f: f.write(text))
    print(json.dumps({"vocab": args.out, "size": len(vocabulary)}))


def cmd_pretraining_data(args):
    from kbert.pretraining import read_metadata, write_pretraining_data

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


def _add_training_data(p):
    p.add_argument("--train", required=True, help="training data, in the task's format")
    p.add_argument("--dev", required=True, help="dev data, evaluated after training")


def _add_training_arguments(p):
    """What `finetune` and `distill` both take: batches, epochs, the optimizer, the output."""
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--lr", type=learning_rate, default=5e-5, help="peak learning rate, in (0, 1]")
    p.add_argument("--warmup", type=fraction, default=0.1, help="share of the steps warming up")
    p.add_argument("--weight-decay", type=fraction, default=0.01, help="AdamW's decoupled weight decay")
    p.add_argument("--xla", action="store_true", help="compile the train step with XLA")
    p.add_argument(
        "--dtype", default=None,
        help="dtype policy, e.g. mixed_bfloat16; auto: mixed_bfloat16 where the device multiplies "
             "bfloat16 natively (Ampere GPUs, TPUs, CPUs with AVX512_BF16 or AMX), else float32",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="model folder to write (a new or empty folder)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace --out if it is a kbert model folder"
    )
    p.add_argument(
        "--deterministic", action="store_true",
        help="TensorFlow op determinism: bitwise reproducible, also across a resume",
    )


def build_parser():
    from kbert.tasks import DEFAULT_TASK, EMBEDDING_TASK, TASKS

    parser = argparse.ArgumentParser(
        prog="kbert", description="BERT for Keras 3: pretrain, fine-tune, evaluate, predict, embed."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    trainable = [task for task in TASKS.values() if task.trainable]
    p = sub.add_parser("finetune", help="fine-tune a task (classification by default)")
    p.add_argument(
        "--task", default=DEFAULT_TASK, choices=[task.name for task in trainable],
        help="the task; default %(default)s. " + "; ".join(f"{t.name}: {t.description}" for t in trainable),
    )
    _add_training_data(p)
    p.add_argument(
        "--init",
        required=True,
        help="Hugging Face checkpoint folder, 'all-minilm-l6-v2', or a BertConfig preset",
    )
    p.add_argument("--vocab", help="vocab.txt (required when --init is a preset)")
    p.add_argument("--seq-len", type=positive_int, default=128)
    _add_training_arguments(p)
    p.add_argument(
        "--layer-decay", type=positive_fraction, default=1.0,
        help="layer-wise learning-rate decay in (0, 1]; 1 is off",
    )
    p.add_argument(
        "--ema", type=fraction, default=None, metavar="MOMENTUM",
        help="end on a moving average of the weights with this momentum, e.g. 0.99",
    )
    p.add_argument("--reinit-pooler", action="store_true", help="re-initialise the pooler")
    p.add_argument(
        "--attention-dropout", type=dropout_rate, default=None, metavar="RATE",
        help="dropout on the attention probabilities while fine-tuning, in [0, 1); "
        "default: the checkpoint's (0.1)",
    )
    p.add_argument(
        "--strategy",
        default="auto",
        help="tf.distribute strategy: auto, default, mirrored, multiworker or tpu; "
        "--batch-size is the global batch",
    )
    add_task_options(p)
    p.set_defaults(run=cmd_finetune)

    p = sub.add_parser(
        "distill",
        help="knowledge distillation of a fine-tuned model folder into a smaller student",
        description="Trains a student on the teacher's task from the gold labels and the "
        "teacher's outputs (softened by --temperature for classifiers), and writes it as a "
        "model folder of the teacher's task, labels, vocabulary and sequence length.",
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
        "between documents, a document one text; .gz read too",
    )
    p.add_argument("--unlabelled-limit", type=positive_int, default=None, metavar="N",
                   help="take at most N unlabelled texts")
    p.add_argument("--temperature", type=positive_float, default=2.0,
                   help="softens the teacher's and the student's distributions; default %(default)s")
    p.add_argument("--alpha", type=fraction, default=0.5,
                   help="weight of the gold labels' loss in [0, 1]; the teacher's takes 1 - alpha")
    p.add_argument("--seq-len", type=positive_int, default=None, help="packed length (default: the teacher's)")
    _add_training_arguments(p)
    add_task_options(p, stored=True)
    # kbert.training.distill's DEFAULT_LEARNING_RATE (not imported: --help loads no TensorFlow).
    p.set_defaults(run=cmd_distill, lr=1e-4)

    p = sub.add_parser("evaluate", help="the task's metrics of a model on a labelled file, as JSON")
    add_model_arguments(p)
    p.add_argument("--data", required=True, help="labelled data in the task's format")
    p.add_argument("--batch-size", type=positive_int, default=64)
    add_task_options(p, stored=True)
    p.set_defaults(run=cmd_evaluate)

    p = sub.add_parser("predict", help="the task's predictions as JSON lines")
    add_model_arguments(p)
    p.add_argument("texts", nargs="*", metavar="TEXT")
    p.add_argument(
        "--input",
        help="a .txt file (one text per line), a .json list, or a data file in the task's "
        "format (.csv, .tsv, .jsonl)",
    )
    p.add_argument("--batch-size", type=positive_int, default=64)
    add_task_options(p, stored=True)
    p.set_defaults(run=cmd_predict)

    p = sub.add_parser("embed", help="sentence embeddings (float32, one row per text) to a .npy file")
    add_model_arguments(p, task=EMBEDDING_TASK)
    p.add_argument("--input", required=True, help="a .txt file (one text per line) or a .json list")
    p.add_argument("--output", required=True, help="the .npy file to write")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    p.add_argument("--batch-size", type=positive_int, default=64)
    add_task_options(p)
    p.set_defaults(run=cmd_embed)

    p = sub.add_parser(
        "search",
        help="exact semantic search: embed a corpus once into an index file, then query it",
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
    p.add_argument("queries", nargs="*", metavar="QUERY")
    p.add_argument("--queries", dest="queries_file", help="a .txt file of queries, one a line")
    p.add_argument("-k", "--top-k", type=positive_int, default=10, help="texts per query")
    p.add_argument("--overwrite", action="store_true", help="with --corpus: replace --index if it exists")
    p.add_argument("--batch-size", type=positive_int, default=64)
    add_task_options(p)
    p.set_defaults(run=cmd_search)

    p = sub.add_parser("tokenize", help="WordPiece ids with [CLS]/[SEP], one JSON list per text")
    p.add_argument("--vocab", required=True, help="vocab.txt")
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.set_defaults(run=cmd_tokenize)

    p = sub.add_parser("vocab", help="learn a WordPiece vocab.txt from raw text")
    p.add_argument("--corpus", required=True, help="text file(s) or glob; .gz read transparently")
    p.add_argument("--size", required=True, type=positive_int, help="largest vocabulary")
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("--min-count", type=positive_int, default=10, help="rarest piece kept")
    p.add_argument("--out", required=True, help="vocab.txt to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=cmd_vocab)

    p = sub.add_parser(
        "pretraining-data", help="masked-LM / next-sentence TFRecords (google-research/bert format)"
    )
    p.add_argument(
        "--corpus", required=True,
        help="one sentence per line, blank lines between documents; file(s) or glob",
    )
    p.add_argument("--vocab", required=True, help="vocab.txt")
    p.add_argument("--out", required=True, help="folder for the shards")
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("--max-seq-length", type=positive_int, default=128)
    p.add_argument("--max-predictions-per-seq", type=positive_int, default=20)
    p.add_argument("--masked-lm-prob", type=fraction, default=0.15)
    p.add_argument("--dupe-factor", type=positive_int, default=10)
    p.add_argument("--short-seq-prob", type=fraction, default=0.1)
    p.add_argument("--whole-word-masking", action="store_true")
    p.add_argument("--random-seed", type=int, default=12345)
    p.add_argument("--num-shards", type=positive_int, default=16)
    p.add_argument("--workers", type=positive_int, default=None, help="default: CPU count")
    p.add_argument("--overwrite", action="store_true", help="replace earlier shards in --out")
    p.set_defaults(run=cmd_pretraining_data)

    p = sub.add_parser(
        "pretrain", help="masked-LM pretraining; rerun the same command to resume"
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
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--seq-len", type=positive_int, default=128)
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
        "--checkpoint-every", type=positive_int, default=None,
        help="save the training state every K steps; rerunning resumes from it",
    )
    p.add_argument("--log-every", type=positive_int, default=100, help="steps per logged window")
    p.add_argument("--lr", type=learning_rate, default=None, help="peak learning rate (LAMB: 1e-3)")
    p.add_argument("--optimizer", choices=["lamb", "adamw"], default="lamb")
    p.add_argument("--warmup-steps", type=int, default=None, help="default: 10%% of --steps")
    p.add_argument("--no-jit", action="store_true", help="do not compile with XLA")
    p.add_argument(
        "--dtype", choices=["float32", "mixed_bfloat16", "mixed_float16", "auto"],
        help="auto: mixed_bfloat16 where the device multiplies bfloat16 natively, else float32",
    )
    p.add_argument("--seed", type=int, default=0)
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
    from kbert.export.cli import add_export_parser

    add_export_parser(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_tensorflow()
    try:
        status = args.run(args)
    except (CliError, ValueError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"kbert: error: {message}", file=sys.stderr)
        return 2
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
