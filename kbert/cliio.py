"""What every `kbert` command reads and writes, and how it stops.

- Results: `print_json` prints one JSON line, and refuses NaN and infinity;
  while a command runs (`json_stdout`) nothing else reaches stdout.
- Inputs: `check_inputs` refuses a missing file before TensorFlow loads.
- Texts: `read_texts` reads a .txt file (one text a line) or a .json list,
  and names the file and line of what it refuses.
- Output files: `check_output_file` refuses, before any work, a file kbert
  may not write: one that is an input, one not of kbert's kind (whatever
  `--overwrite` says), one of kbert's kind without `--overwrite`.
- Interrupts: SIGTERM and Ctrl-C are raised as `kbert.interrupts.Interrupted`,
  a `KeyboardInterrupt` (half-written outputs removed on the way out), and
  `interrupted_line` says in one line what was kept and how to go on.
- Damaged data that TensorFlow reads (a TFRecord shard) is one line too
  (`is_tensorflow_data_error`, `tensorflow_reason`).
"""

import contextlib
import json
import os
import signal
import sys

from kbert.fileio import check_distinct, decode_utf8


class CliError(Exception):
    """An error to report in one line, without a traceback."""


# Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 128 + signal.SIGINT
# The longest line kbert ends a command with: a message that quotes user data
# shortens each value (`kbert.tabular.quoted`); this cap holds any other.
MAX_LINE = 300


def last_line(prefix, message):
    """`prefix` and the first line of `message`, at most `MAX_LINE` characters:
    a longer one loses its middle to an ellipsis, keeping its start (the file
    and line) and its end (what was expected)."""
    line = prefix + (message.splitlines()[0] if message.strip() else "")
    if len(line) <= MAX_LINE:
        return line
    keep = (MAX_LINE - 3) // 2
    return line[:keep] + " … " + line[len(line) - (MAX_LINE - 3 - keep):]


# Where `print_json` writes while a command runs (`json_stdout`); None: sys.stdout.
_results = None


@contextlib.contextmanager
def json_stdout():
    """While a command runs: `print_json` writes its results to standard output,
    and everything else printed there (Keras's progress lines, a library's
    prints) goes to standard error, so that stdout is JSON lines only."""
    global _results
    previous, _results = _results, sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _results = previous


def print_json(value, flush=True):
    """One JSON line on stdout; NaN and infinity are refused, never printed.
    `flush=False` leaves it buffered until the next flush (`flush_json`)."""
    stream = _results or sys.stdout
    stream.write(json_line(value))
    if flush:
        stream.flush()


def flush_json():
    """Sends the JSON lines `print_json` left buffered on their way."""
    (_results or sys.stdout).flush()


def json_line(value):
    """`value` as one line of JSON, its newline included; NaN and infinity are refused."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False) + "\n"
    except ValueError:
        raise CliError("the result holds NaN or infinity; the model is broken") from None


def check_inputs(args):
    """Refuses a file the command reads that is not there, or is a folder, before TensorFlow loads.

    `args.reads`: the options naming files the command reads, set by its parser
    (a file given, not a checkpoint name or a glob); `args.stdin`: those of
    them that read standard input when given "-".
    """
    for name in getattr(args, "reads", ()):
        path = getattr(args, name, None)
        option = f"--{name.replace('_', '-')} {path}"
        if path == "-" and name not in getattr(args, "stdin", ()):
            raise CliError(f"{option}: this option reads no standard input; give a file")
        if path is None or path == "-":
            continue
        if os.path.isdir(path):
            raise CliError(f"{option} is a folder; expected a file")
        if not os.path.exists(path):
            raise CliError(f"{option}: no such file")


def read_texts(path, option="--input", column=None):
    """Texts of a file, read by its extension as every command reads it.

    A table (`.csv`, `.tsv`, `.jsonl`): the texts in `column` (default
    "text", `kbert.tabular.read_column`); a `.json` file: a list of strings;
    any other name, and "-" (standard input): one text a line. A stream
    (standard input, a pipe) is read once and kept (`kbert.tabular.read_bytes`).

    Every failure names the file and, for a .txt file, the line: a byte that
    is not UTF-8, a blank line (blank lines that end the file are dropped), an
    empty text in a .json list (`kbert.tabular.check_text`), a file that holds no texts, a CoNLL
    file (one token and its tag a line, which `predict` reads when named .conll).
    """
    from kbert.tabular import is_table, read_bytes, read_column

    if is_table(path):
        return read_column(path, column)[0]
    if column is not None:
        raise CliError(f"--text-column {column}: {option} {path} is not a table (.csv, .tsv, .jsonl)")
    where = "standard input" if path == "-" else path
    content = decode_utf8(read_bytes(path), where).removeprefix("\ufeff")
    texts = _json_texts(content, where) if path.endswith(".json") else _text_lines(content, where, option)
    if not texts:
        raise CliError(f"{where} holds no texts")
    return texts


def _json_texts(content, where):
    """The strings of a JSON list, each a text (`kbert.tabular.check_text`)."""
    from kbert.tabular import check_text

    try:
        texts = json.loads(content)
    except json.JSONDecodeError as error:
        raise CliError(f"{where} is not valid JSON: {error}") from None
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise CliError(f"{where} must hold a JSON list of strings")
    for number, text in enumerate(texts, 1):
        check_text(text, f"{where}, item {number}")
    return texts


def _text_lines(content, where, option):
    """One text a line; blank lines that end the file dropped, any other refused."""
    from kbert.tabular import quoted
    from kbert.tasks.conll import looks_like_conll

    texts = content.splitlines()
    conll = looks_like_conll(texts)
    if conll:
        raise CliError(
            f"{where}, line {conll}: {quoted(texts[conll - 1].strip())} looks like CoNLL (a token and its tag "
            f"a line); a .txt {option} is one text a line (to tag a CoNLL file, name it .conll)"
        )
    while texts and not texts[-1].strip():  # blank lines that end the file
        texts.pop()
    blank = [i for i, text in enumerate(texts, 1) if not text.strip()]
    if blank:
        raise CliError(f"{where}, line {blank[0]}: a blank line; expected one text a line")
    return texts


def check_output_file(option, path, overwrite, is_ours, what, inputs):
    """Refuses, before any work, an output file kbert may not write.

    Args:
        option: str. The option that names it ("--output"), for messages.
        path: str. The file to write.
        overwrite: bool. Whether an existing file of kbert's kind may be replaced.
        is_ours: callable(path) -> bool. Whether an existing file is one
            kbert writes (an index, an array, a vocabulary): nothing else is
            replaced, --overwrite or not.
        what: str. What kbert writes there, for messages.
        inputs: dict. Option -> path the command reads; `path` is none of them.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"{option} {path}: no such folder {folder}")
    if os.path.isdir(path):
        raise CliError(f"{option} {path} is a folder; expected a file name")
    check_distinct({option: path}, inputs)
    if os.path.lexists(path):
        if not is_ours(path):
            raise CliError(
                f"{option} {path} exists and is not {what}; kbert replaces only its own files: "
                f"choose another {option}"
            )
        if not overwrite:
            raise CliError(f"{option} {path} exists; pass --overwrite to replace it")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"{option} {path}: cannot write in {folder} (permission denied)")


def is_npy(path):
    """Whether `path` is a NumPy .npy array file (what `kbert embed` writes)."""
    import numpy as np

    try:
        with open(path, "rb") as f:
            np.lib.format.read_magic(f)
        return True
    except (OSError, ValueError):
        return False


def is_vocab_file(path):
    """Whether `path` is a WordPiece vocabulary (UTF-8, one token a line, BERT's special tokens)."""
    from kbert.text import load_vocab

    try:
        return {"[UNK]", "[CLS]", "[SEP]"} <= set(load_vocab(path))
    except (OSError, ValueError):
        return False


def interrupted_line(args):
    """What an interrupted command kept, and how to go on, in one line; a
    command that keeps work of its own says so (its parser's `interrupted`)."""
    if hasattr(args, "interrupted"):
        return args.interrupted(args)
    out = getattr(args, "out", None)
    if args.command in ("finetune", "distill"):
        from kbert.fitting.backup import AtomicBackup
        from kbert.training.finetune import resume_folder

        resume = resume_folder(out)
        if AtomicBackup.restore_point(resume)[0] is not None:
            return (f"interrupted; the last complete epoch is in {resume}; "
                    "run the same command again to resume")
        return f"interrupted before the first epoch ended; {out} was not written"
    if args.command == "pretrain":
        from kbert.pretraining.run_folder import BACKUP_FOLDER

        if args.checkpoint_every and os.path.isdir(os.path.join(out, BACKUP_FOLDER)):
            return (f"interrupted; the last checkpoint is in {os.path.join(out, BACKUP_FOLDER)}; "
                    "run the same command again to resume")
        return f"interrupted; {out} holds no checkpoint to resume from (--checkpoint-every saves them)"
    if args.command == "predict" and not getattr(args, "output", None):
        # `kbert.cli.use.cmd_predict` counts each line once written, so a stop just
        # after a write may leave the last line printed uncounted, never the reverse.
        printed = getattr(args, "printed", 0)
        return (f"interrupted; the predictions of the first {printed} examples were printed, whole lines "
                "(perhaps one more: count the lines to resume)")
    written = {"embed": "output", "search": "index", "vocab": "out",
               "pretraining-data": "out", "predict": "output"}.get(args.command)
    if written and getattr(args, written, None):
        return f"interrupted; {getattr(args, written)} was not written or changed"
    return "interrupted"


# Options that name files or folders a command reads, for messages.
_INPUT_OPTIONS = ("model", "teacher", "train", "dev", "data", "input", "corpus", "records", "vocab", "index",
                  "calibration", "unlabelled", "init")


def input_paths(args):
    """`(option, path)` of every input of `args` that exists."""
    return [
        (name, getattr(args, name)) for name in _INPUT_OPTIONS
        if isinstance(getattr(args, name, None), str) and os.path.exists(getattr(args, name))
    ]


def is_tensorflow_data_error(error):
    """Whether `error` is TensorFlow's on reading data (a damaged TFRecord, a missing shard)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(
        error, (tf.errors.DataLossError, tf.errors.NotFoundError, tf.errors.InvalidArgumentError)
    )


def tensorflow_reason(error):
    """The line of a TensorFlow error that says what is wrong, not where (its last plain line)."""
    lines = [line.strip() for line in str(getattr(error, "message", error)).splitlines()]
    plain = [
        line for line in lines
        if line and not line.startswith(("File ", "[[", "Graph execution error", "Detected at node"))
    ]
    return plain[-1] if plain else type(error).__name__


def in_main_thread():
    import threading

    return threading.current_thread() is threading.main_thread()
