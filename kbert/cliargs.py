"""`argparse` types shared by the `kbert` command and its `export` subcommand.

Each rejects a bad value at parse time, with one line naming it, so that a
typo never surfaces after an hour of training.
"""

import argparse
import math


def positive_int(value):
    """An integer of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
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


def add_task_options(parser, stored=False):
    """Every task's data options, each once (the same name means the same thing)."""
    from kbert.tasks import TASKS

    group = parser.add_argument_group(
        "data options (each task reads those it names"
        + ("; default: as the model was trained)" if stored else ")")
    )
    seen = set()
    for task in TASKS.values():
        for option in task.options:
            if option.name in seen:
                continue
            seen.add(option.name)
            users = [t.name for t in TASKS.values() if option.name in {o.name for o in t.options}]
            default = "" if option.default is None else f"default {option.default!r}; "
            group.add_argument(
                "--" + option.name.replace("_", "-"), dest=option.name, default=None,
                choices=option.choices,
                help=f"{option.help} ({default}{', '.join(users)})",
            )


def add_model_arguments(parser, task=None, required=True):
    """`--model`, `--task` and `--seq-len`: a model folder, or a task built on a checkpoint."""
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
