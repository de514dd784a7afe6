"""The commands of `kbert` that put a model to work: evaluate, predict, embed, search.

`add_use_commands(subparsers, tasks, embedding_tasks)` adds them; each `cmd_*`
runs one and imports TensorFlow only then, so `kbert --help` stays instant.
Each `check_*` makes the command's refusals that need no TensorFlow (a
`--model` that names nothing, options that do not go together, an output
kbert may not write, data the task cannot read), before it loads.
"""

import itertools
import os

from kbert.cli.streaming import NpyRows, count_texts, input_texts, json_lines_file
from kbert.cliargs import (
    DEBIAN,
    add_command,
    add_model_arguments,
    add_task_options,
    check_model,
    check_model_data,
    positive_int,
    task_options,
)
from kbert.cliio import CliError, check_output_file, flush_json, is_npy, json_line, print_json, read_texts
from kbert.fileio import check_distinct, written_aside
from kbert.logs import Progress, to_stderr
from kbert.tabular import TABLES, check_texts, is_table
from kbert.tasks.inference import CHUNK_EXAMPLES


def _load_model_folder(args):
    """The model of `--model` (and `--task`) and its data options (stored, then given)."""
    from kbert.modelfolder import open_model

    given = task_options(args)
    folder = open_model(args.model, args.task, given, args.seq_len)
    return folder, folder.use_options(given)


def check_evaluate(args):
    check_model(args)
    check_model_data(args, args.data)
    if args.plots:
        from kbert.plots import check_plots_folder

        check_distinct({"--plots": args.plots}, {"--model": args.model, "--data": args.data})
        check_plots_folder(args.plots)


def cmd_evaluate(args):
    folder, options = _load_model_folder(args)
    examples = folder.task.read(args.data, options)
    with Progress("evaluate", len(examples), "examples") as bar:
        metrics, predictions = folder.evaluated(
            examples, source=args.data, batch_size=args.batch_size, on_chunk=bar.update
        )
    if args.plots:
        from kbert.plots import evaluation_plots

        drawn = evaluation_plots(folder.task, examples, predictions, metrics, args.plots)
        for path in drawn:
            to_stderr(f"kbert: drew {path}")
        if not drawn:
            to_stderr(f"kbert: task {folder.task.name!r} has no picture of its figures; --plots drew none")
    print_json(metrics)


# `predict --input` files read by the task's data reader (without targets):
# tables, as every command reads them, and CoNLL; any other is texts
# (`read_texts`): a .json list, or one text a line.
PREDICT_DATA_FILES = (*TABLES, ".conll")


def check_predict(args):
    check_model(args)
    if bool(args.texts) == bool(args.input):
        raise CliError("give either TEXT arguments or --input FILE")
    if args.output:
        if not args.output.endswith(".jsonl"):
            raise CliError(f"--output {args.output}: expected a .jsonl file name")
        check_output_file(
            "--output", args.output, args.overwrite, json_lines_file, "a JSON Lines file of objects",
            {"--input": args.input, "--model": args.model},
        )
    check_texts(args.texts)
    args.input_texts = None
    if args.input and _is_data_file(args.input):
        check_model_data(args, args.input, targets=False)
    elif args.input:
        args.input_texts = count_texts(args.input)


def _is_data_file(path):
    """Whether `predict --input` reads `path` with the task's data reader."""
    return os.path.splitext(path)[1].lower() in PREDICT_DATA_FILES


def cmd_predict(args):
    texts = None if args.texts or _is_data_file(args.input) else _read_ahead(input_texts(args.input))
    folder, options = _load_model_folder(args)
    examples, total = _predict_examples(args, folder.task, options, texts)
    if args.output:
        _predict_to_file(folder, examples, total, args)
        return
    args.printed = 0  # what `kbert.cliio.interrupted_line` reports
    for chunk, predictions in folder.predict_chunks(examples, args.batch_size):
        for row in folder.task.predict_json(chunk, predictions):
            # Counted once written, before it is flushed: a stop after a reader
            # saw the line finds it counted; one just before the count finds the
            # line uncounted, and still flushed on the way out.
            print_json(row, flush=False)
            args.printed += 1
            flush_json()


def _predict_examples(args, task, options, texts):
    """`(examples, count)`: what `predict` runs, an iterable read as it is used, and
    how many (None: not known before the end of a stream)."""
    if args.texts:
        examples = task.examples_from_texts(args.texts)
    elif texts is None:
        examples = task.read(args.input, options, targets=False)
    elif len(task.text_inputs) == 1:
        return _one_text_examples(task, texts), args.input_texts
    else:
        # Examples of several texts span lines, and are numbered among all of them.
        examples = task.examples_from_texts(list(texts))
    return examples, len(examples)


def _one_text_examples(task, texts):
    for group in _batched(texts, CHUNK_EXAMPLES):
        yield from task.examples_from_texts(group)


def _predict_to_file(folder, examples, total, args):
    """`predict --output`: the rows written beside the file, renamed into place once all are written."""
    count = 0
    with (
        written_aside(args.output) as staged,
        open(staged, "w", encoding="utf-8") as f,
        Progress("predict", total, "examples") as bar,
    ):
        for chunk, predictions in folder.predict_chunks(examples, args.batch_size):
            f.writelines(json_line(row) for row in folder.task.predict_json(chunk, predictions))
            count += len(chunk)
            bar.update(len(chunk))
    print_json({"output": args.output, "examples": count})


def check_embed(args):
    check_model(args)
    if not args.output.endswith(".npy"):
        raise CliError(f"--output {args.output}: expected a .npy file name")
    check_output_file(
        "--output", args.output, args.overwrite, is_npy, "a .npy array file",
        {"--input": args.input, "--model": args.model},
    )
    args.input_texts = count_texts(args.input, column=args.text_column)


def cmd_embed(args):
    texts = _read_ahead(input_texts(args.input, column=args.text_column))
    folder, _ = _load_model_folder(args)
    with (
        written_aside(args.output, suffix=".npy") as staged,
        open(staged, "wb") as f,
        Progress("embed", args.input_texts, "texts") as bar,
    ):
        rows = NpyRows(f)
        for group in _batched(texts, CHUNK_EXAMPLES):
            rows.append(folder.embed(group, batch_size=args.batch_size))
            bar.update(len(group))
        rows.finish()
    print_json({"output": args.output, "shape": [rows.rows, rows.dimension]})


def _read_ahead(texts):
    """`texts` (an iterator) with its first chunk read now, before TensorFlow loads:
    a stream's first lines are refused at once, as a file's all are (`count_texts`)."""
    ahead = list(itertools.islice(texts, CHUNK_EXAMPLES))
    return itertools.chain(ahead, texts)


def _batched(items, size):
    """Lists of `size` consecutive `items` (the last one shorter), read as they are used."""
    items = iter(items)
    while group := list(itertools.islice(items, size)):
        yield group


def check_search(args):
    from kbert import search

    check_model(args)
    if args.corpus:
        if not args.model:
            raise CliError("--corpus needs --model: the model that embeds it")
        check_output_file(
            "--index", args.index, args.overwrite, search.is_index, "a kbert index",
            {"--corpus": args.corpus, "--queries": args.queries_file, "--model": args.model},
        )
    elif not args.queries and not args.queries_file:
        raise CliError("give QUERY arguments or --queries FILE, or --corpus to build the index")
    else:
        search.check_index_file(args.index)
    check_texts(args.queries, "query")


def cmd_search(args):
    from kbert import search

    queries = list(args.queries) + (read_texts(args.queries_file, "--queries", _table_column(args, args.queries_file))
                                    if args.queries_file else [])
    if args.corpus:
        folder, _ = _load_model_folder(args)
        texts, lines = search.read_corpus(args.corpus, args.text_column)
        print_json(search.build_index(folder, texts, lines, args.index, args.corpus, args.batch_size))
        if not queries:
            return
        index = search.load_index(args.index)
    else:
        index = search.load_index(args.index)
        folder = search.index_model(index, args.index, args.model)
    rows, scores = search.search(index, folder.embed(queries, batch_size=args.batch_size), args.top_k)
    for query, found, score in zip(queries, rows, scores):
        print_json({
            "query": query,
            "results": [
                {"score": float(s), "line": int(index.lines[i]), "text": index.text(i)}
                for i, s in zip(found, score)
            ],
        })


def _table_column(args, path):
    """`--text-column` where `path` is a table, whose column it names; None for other files."""
    return args.text_column if is_table(path) else None


def add_use_commands(sub, tasks, embedding_tasks):
    """evaluate, predict, embed, search: a model folder (or a checkpoint and a task) at work."""
    from kbert.tasks import EMBEDDING_TASK

    p = add_command(
        sub, "evaluate", "the task's metrics of a model on a labelled file, as JSON",
        (
            f"kbert evaluate --model runs/debian-minilm --data {DEBIAN}/dev.csv",
            f"kbert evaluate --model runs/debian-minilm --data {DEBIAN}/dev.csv --plots plots/debian",
            "kbert evaluate --model all-minilm-l6-v2 --task sentence-embedding --data sts-dev.tsv",
        ),
        usage="kbert evaluate --model MODEL --data FILE [options]",
    )
    add_model_arguments(p)
    p.add_argument("--data", required=True, help="labelled data in the task's format")
    p.add_argument("--batch-size", type=positive_int, default=64, help="texts per inference batch")
    p.add_argument(
        "--plots", metavar="DIR",
        help="also draw the figures as PNG files in DIR: a confusion matrix (classifiers), each label's "
        "or entity type's precision, recall and F1 (multi-label, named entities), or predicted against "
        "gold scores (pair regression, embeddings); default: none",
    )
    add_task_options(p, tasks, stored=True)
    p.set_defaults(run=cmd_evaluate, check=check_evaluate, reads=("data",))

    p = add_command(
        sub, "predict", "the task's predictions as JSON lines",
        (
            'kbert predict --model runs/debian-minilm "an IMAP mail client for the terminal"',
            "kbert predict --model runs/debian-minilm --input texts.txt --output predictions.jsonl",
            'kbert predict --model runs/squad "Who led the Normans?" "Rollo led the Normans to Normandy."',
        ),
        usage="kbert predict --model MODEL (TEXT ... | --input FILE) [options]",
    )
    add_model_arguments(p)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to predict (or --input)")
    p.add_argument(
        "--input",
        help="a .txt file (one text per line; - reads standard input), a .json list, or a data "
        "file in the task's format (.csv, .tsv, .jsonl)",
    )
    p.add_argument(
        "--output",
        help="a .jsonl file to write the JSON lines to, with progress on stderr (default: standard output, "
        "each chunk's lines as they are computed)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    p.add_argument("--batch-size", type=positive_int, default=64, help="texts per inference batch")
    add_task_options(p, tasks, stored=True)
    p.set_defaults(run=cmd_predict, check=check_predict, reads=("input",), stdin=("input",))

    p = add_command(
        sub, "embed", "sentence embeddings (float32, one row per text) to a .npy file",
        (
            "kbert embed --model all-minilm-l6-v2 --input texts.txt --output embeddings.npy",
            "kbert embed --model all-minilm-l6-v2 --input texts.json --output embeddings.npy --pooling cls",
        ),
        usage="kbert embed --model MODEL --input FILE --output FILE.npy [options]",
    )
    add_model_arguments(p, task=EMBEDDING_TASK)
    p.add_argument(
        "--input", required=True,
        help="a .txt file (one text per line; - reads standard input), a .json list, or a table "
        "(.csv, .tsv, .jsonl: the texts in --text-column)",
    )
    p.add_argument("--text-column", help="the column of a table --input holding the texts (default: text)")
    p.add_argument("--output", required=True, help="the .npy file to write")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    p.add_argument("--batch-size", type=positive_int, default=64, help="texts per inference batch")
    add_task_options(p, embedding_tasks)
    p.set_defaults(run=cmd_embed, check=check_embed, reads=("input",), stdin=("input",))

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
        usage="kbert search --model MODEL --corpus FILE --index FILE [QUERY ...] [options]\n"
        "       kbert search --index FILE (QUERY ... | --queries FILE) [options]",
    )
    add_model_arguments(p, task=EMBEDDING_TASK, required=False)
    p.add_argument("--index", required=True, help="the index file to write (with --corpus) or read")
    p.add_argument(
        "--corpus",
        help="texts to index: a text file, one text a line (.gz read too), or a table "
        "(.csv, .tsv, .jsonl: the texts in --text-column)",
    )
    p.add_argument(
        "--text-column", help="the column of a table --corpus or --queries holding the texts (default: text)"
    )
    p.add_argument("queries", nargs="*", metavar="QUERY", help="queries (or --queries)")
    p.add_argument(
        "--queries", dest="queries_file",
        help="a .txt file of queries, one a line, a .json list or a table (the texts in --text-column)",
    )
    p.add_argument("-k", "--top-k", type=positive_int, default=10, help="texts per query")
    p.add_argument("--overwrite", action="store_true", help="with --corpus: replace --index if it exists")
    p.add_argument("--batch-size", type=positive_int, default=64, help="texts per inference batch")
    add_task_options(p, embedding_tasks)
    p.set_defaults(run=cmd_search, check=check_search, reads=("corpus",))
