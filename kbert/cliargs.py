"""`argparse` pieces shared by the `kbert` command and its `export` subcommand.

The types reject a bad value at parse time, with one line naming it, so that
a typo never surfaces after an hour of training. Nothing here imports
TensorFlow: `kbert --help` answers at once.
"""

import argparse
import math
import textwrap


# The repository's example data, as the commands' examples name it.
DEBIAN = "data/debian-packages"
# The dtype policies a training command takes (`--dtype`): "auto" picks one of
# the next two by the device (`kbert.hardware`); mixed_float16 for GPUs that
# lack bfloat16. Others (float8, int8 policies) are Keras's quantized
# inference policies, not training ones.
TRAINING_DTYPES = ("auto", "float32", "mixed_bfloat16", "mixed_float16")


def positive_int(value):
    """An integer of at least 1."""
    return _integer(value, 1, "a positive integer")


def count(value):
    """An integer of at least 0."""
    return _integer(value, 0, "an integer of 0 or more")


def _integer(value, least, expected):
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < least:
        raise argparse.ArgumentTypeError(f"{value} is not {expected}")
    return number


def _finite(value):
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{value} is not a finite number")
    return number


def positive_float(value):
    """A finite number above 0."""
    number = _finite(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return number


def learning_rate(value):
    """A learning rate: a finite number in (0, 1]."""
    number = positive_float(value)
    if number > 1:
        raise argparse.ArgumentTypeError(
            f"{value} is not a learning rate; expected a number in (0, 1] such as 5e-5"
        )
    return number


def positive_fraction(value):
    """A finite number in (0, 1]."""
    number = _finite(value)
    if not 0 < number <= 1:
        raise argparse.ArgumentTypeError(f"{value} is not in (0, 1]")
    return number


def dropout_rate(value):
    """A dropout rate: a finite number in [0, 1)."""
    number = _finite(value)
    if not 0 <= number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1)")
    return number


def fraction(value):
    """A finite number in [0, 1]."""
    number = _finite(value)
    if not 0 <= number <= 1:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1]")
    return number


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Prose wrapped, examples as written; each option's default after its help.

    A paragraph (text between blank lines) with an indented line or a line
    ending in ":" (a list of commands) is printed as written; the others are
    wrapped to the terminal. Defaults as argparse's
    `ArgumentDefaultsHelpFormatter` shows them, less "(default: None)" and a
    flag's "(default: False)", and not where the help says its default.
    """

    def _fill_text(self, text, width, indent):
        paragraphs = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.startswith(" ") or line.endswith(":") for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append("\n".join(
                    indent + line for line in self._split_lines(paragraph, width - len(indent))
                ))
        return "\n\n".join(paragraphs)

    def _split_lines(self, text, width):
        # Task names (text-pair-classification) stay whole.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            not action.option_strings
            or action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
            or "default" in text
        ):
            return text
        return f"{text} (default: %(default)s)"


def rate(value):
    """A learning rate as people write it: 0.0001 -> "1e-4", 3e-05 -> "3e-5"."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def add_task_options(parser, tasks, stored=False):
    """The data options of `tasks`, grouped under the names of the tasks that read them.

    An option several tasks take (the same name means the same thing) is
    listed once, in a group that names them all.

    Args:
        parser: an `argparse` parser.
        tasks: list of `kbert.tasks.Task` classes, in the order to list them.
        stored: bool. The command reads a model folder, whose stored options
            apply unless given again.
    """
    readers = {}
    for task in tasks:
        for option in task.options:
            readers.setdefault(option.name, (option, []))[1].append(task.name)
    groups = {}
    for option, names in readers.values():
        if tuple(names) not in groups:
            title = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
            groups[tuple(names)] = parser.add_argument_group(f"{title} options")
        # A command on a model folder uses the options stored with it.
        defaults = (["the model's"] if stored else []) + ([] if option.default is None else [str(option.default)])
        default = f" (default: {', else '.join(defaults)})" if defaults else ""
        groups[tuple(names)].add_argument(
            "--" + option.name.replace("_", "-"), dest=option.name, default=None,
            choices=option.choices, help=option.help + ("" if "default" in option.help else default),
        )


def check_model(args):
    """Refuses, before TensorFlow loads, a `--model` that names nothing
    (`kbert.modelfolder.check_model_name`) and a `--seq-len` that its task or its
    model cannot take (`check_sequence_length`)."""
    from kbert.modelfolder import check_model_name

    if args.model is not None:
        check_model_name(args.model, args.task)
        if args.seq_len is not None:
            check_sequence_length(args.seq_len, args.model, args.task)


def check_sequence_length(seq_len, model, task=None, option="--model"):
    """`--seq-len` against the least its task packs text in (`Task.check_sequence_length`;
    `task`, else the model folder's) and the positions of a model folder's
    encoder (`kbert.json`'s `bert_config`); `option` names `model` in messages."""
    from kbert.tasks import get_task

    settings = _stored_settings(model)
    task = task or settings.get("task")
    if task is not None:
        get_task(task).check_sequence_length(seq_len, "--seq-len")
    positions = (settings.get("bert_config") or {}).get("max_position_embeddings")
    if isinstance(positions, int) and seq_len > positions:
        raise ValueError(
            f"--seq-len {seq_len} exceeds the {positions} positions of {option} {model} (max_position_embeddings)"
        )


def _stored_settings(model):
    """A model folder's `kbert.json` (`kbert.modelfolder.stored_settings`); {} for anything
    else, or one that is not what kbert writes (loading it names what is wrong)."""
    from kbert.modelfolder import is_model_folder, stored_settings

    try:
        return stored_settings(model) if is_model_folder(model) else {}
    except (KeyError, TypeError, ValueError):
        return {}


def check_model_data(args, path, targets=True):
    """Reads `path` as the command will (a model folder's task with its stored
    options and those given, or a `--task` that needs no training with those
    given), so that data it cannot read is refused before TensorFlow loads;
    `targets=False` for inputs alone. A model folder's targets are checked
    against what it learned (`Task.check_learned`: a label it does not know)."""
    from kbert.modelfolder import is_model_folder, stored_data_options, stored_settings
    from kbert.tasks import get_task

    given = task_options(args)
    task_class = None if args.task is None else get_task(args.task)
    if task_class is not None and not task_class.trainable:
        task_class.read(path, task_class.resolve_options(given), targets=targets)
    elif is_model_folder(args.model) and (stored := stored_data_options(args.model, given)) is not None:
        task_class, options = stored
        examples = task_class.read(path, options, targets=targets)
        if targets:
            task_class.check_learned(stored_settings(args.model)["task_settings"], examples, path)


def add_model_arguments(parser, task=None, required=True):
    """`--model`, `--task` and `--seq-len`: a model folder, or a task built on a checkpoint.

    A `--model` that names nothing is refused at once (`check_model`).
    """
    parser.set_defaults(check=check_model)
    parser.add_argument(
        "--model", required=required,
        help="a model folder (kbert finetune --out); with --task naming a task that needs no "
        "training: a Hugging Face or google-research/bert checkpoint folder, a packaged name "
        "('all-minilm-l6-v2') or a model folder, whose encoder is used",
    )
    parser.add_argument(
        "--task", default=task,
        help="the task to run on --model" + (f" (default {task})" if task else " (default: the model folder's)"),
    )
    parser.add_argument(
        "--seq-len", type=positive_int, default=None,
        help="packed length (default: the model folder's, or the checkpoint's own)",
    )


def examples_epilog(*commands):
    """An epilog of example commands, as `--help` prints them last."""
    return "examples:\n" + "\n".join("  " + command for command in commands)


def add_command(sub, name, help, examples, description=None, usage=None):
    """A subcommand whose `--help` shows defaults and ends with `examples`."""
    return sub.add_parser(
        name, help=help, description=description or help[0].upper() + help[1:] + ".",
        epilog=examples_epilog(*examples), formatter_class=HelpFormatter, usage=usage,
    )


def task_options(args, names=None):
    """The task data options given on the command line (None where not given).

    `names`: the options to take; default every task's.
    """
    if names is None:
        from kbert.tasks import TASKS

        names = {o.name for task in TASKS.values() for o in task.options}
    return {name: getattr(args, name, None) for name in names}
