"""The `kbert` command line: its parser and `main`.

The commands live by what they are for: `kbert.cli.training` (finetune,
distill), `kbert.cli.use` (evaluate, predict, embed, search),
`kbert.cli.export` (export) and `kbert.cli.pretraining`.

Every subcommand imports TensorFlow only when it runs, so `--help` is instant,
and what can be refused without it is refused first: a missing input (each
command's `reads`) and the command's own `check` (e.g. an `--out` it may not
write). Bad input ends with one line `kbert: error: ...` on stderr and exit
status 2.
"""

import argparse
import signal
import sys

from kbert.cliargs import DEBIAN, HelpFormatter, examples_epilog
from kbert.cliio import (
    EXIT_INTERRUPTED,
    CliError,
    check_inputs,
    in_main_thread,
    input_paths,
    interrupted_line,
    is_tensorflow_data_error,
    json_stdout,
    last_line,
    tensorflow_reason,
)
from kbert.interrupts import Interrupted, handle_signals, restore
from kbert.quiet import quiet_tensorflow

def version_line():
    """`kbert --version`: kbert's version and those of the libraries it runs on, for a bug report.

    Read from the installed packages' metadata: nothing is imported.
    """
    import platform
    from importlib import metadata

    from kbert import __version__

    found = []
    for name in ("tensorflow", "keras", "tensorflow-text"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return f"kbert {__version__} ({', '.join(found)}, Python {platform.python_version()})"


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose error line (a bad value quoted whole) keeps to `last_line`'s length."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(2, last_line(f"{self.prog}: error: ", message) + "\n")


class _Version(argparse.Action):
    """`--version`, whose line is made only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


# What `kbert --help` says: every command, by what it is for.
DESCRIPTION = """\
BERT for Keras 3, from raw text to served models.

  train:     finetune (a task on a pretrained checkpoint), distill (into a smaller student)
  use:       evaluate, predict, embed, search
  serve:     export (TF Serving, TFLite, ONNX, MediaPipe; each verified),
             serve-web (an export's MediaPipe model in the browser)
  pretrain:  tokenize, vocab, pretraining-data, pretrain
"""


def build_parser():
    """The `kbert` command's parser, every subcommand included; imports no TensorFlow."""
    from kbert.cli.pretraining import add_pretraining_commands
    from kbert.cli.training import add_training_commands
    from kbert.cli.use import add_use_commands
    from kbert.cli.export import add_export_parser
    from kbert.cli.web import add_serve_web_parser
    from kbert.tasks import EMBEDDING_TASK, TASKS

    parser = _Parser(
        prog="kbert", description=DESCRIPTION, formatter_class=HelpFormatter,
        epilog=examples_epilog(
            f"kbert finetune --train {DEBIAN}/train.csv --dev {DEBIAN}/dev.csv \\\n"
            "      --init all-minilm-l6-v2 --out runs/debian-minilm",
            'kbert predict --model runs/debian-minilm "an IMAP mail client for the terminal"',
            f"kbert export --model runs/debian-minilm --data {DEBIAN}/dev.csv --out saved_models/debian",
        ) + "\n\nkbert COMMAND --help: the command's options, their defaults and examples.",
    )
    parser.add_argument("--version", action=_Version, help="kbert's version and its libraries', then exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    trainable = [task for task in TASKS.values() if task.trainable]
    add_training_commands(sub, trainable)
    add_use_commands(sub, list(TASKS.values()), [TASKS[EMBEDDING_TASK]])
    add_export_parser(sub)
    add_serve_web_parser(sub)
    add_pretraining_commands(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_help(sys.stderr)  # bare `kbert`: what it does, not only that a command is missing
        return 2
    args = parser.parse_args(argv)
    # SIGTERM (a killed job, `timeout`) unwinds like Ctrl-C: half-written
    # outputs are removed, and one line says what was kept.
    previous = handle_signals() if in_main_thread() else None
    try:
        check_inputs(args)
        if hasattr(args, "check"):
            args.check(args)
        quiet_tensorflow()
        with json_stdout():
            status = args.run(args)
    except (CliError, ValueError, OSError) as error:
        print(last_line("kbert: error: ", str(error).strip() or type(error).__name__), file=sys.stderr)
        return 2
    except Exception as error:
        if not is_tensorflow_data_error(error):
            raise
        reason = tensorflow_reason(error)
        read = ", ".join(f"--{name.replace('_', '-')} {value}" for name, value in input_paths(args))
        print(last_line("kbert: error: ", f"an input is damaged or unreadable ({reason}); this command reads "
                        f"{read or 'no file'}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        if previous is not None:
            for signum in previous:  # a second one while reporting
                signal.signal(signum, signal.SIG_IGN)
        try:
            line = interrupted_line(args)
        except Exception:  # noqa: BLE001  (the one line matters more than its detail)
            line = "interrupted"
        print(last_line("kbert: ", line), file=sys.stderr)
        return 128 + stop.signum if isinstance(stop, Interrupted) else EXIT_INTERRUPTED
    finally:
        if previous is not None:
            restore(previous)
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
