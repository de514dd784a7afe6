"""The head of a fine-tuned transformers `--init` folder, which `kbert finetune` continues from.

`--init` a folder of a transformers task class (`kbert.checkpoints.hf_tasks`)
and fine-tuning starts from its head as well as its encoder, where that head
computes what the task trains: the class is the task's (`Task.hf_architecture`)
and what `config.json` states of the task (its `id2label` names,
`Task.settings_from_hf_labels`) is what the training data taught, the labels
in any order (the head's rows are put in the task's). Where the labels
differ, or the kind of output (a `problem_type`, a number of outputs), the
head starts afresh, as transformers' `ignore_mismatched_sizes` does, and one
line on stderr says what differs. `init_head=False`
(`--no-init-head`) takes the encoder alone; `True` (`--init-head`) refuses
a head it cannot keep.
"""

import collections
import os

from kbert.checkpoints.hf_tasks import hf_task_settings, load_head, task_class_of, task_classes
from kbert.logs import to_stderr

# A head kept: the folder it comes from and its output rows in the task's order (None: as stored).
KeptHead = collections.namedtuple("KeptHead", ["folder", "order"])
# How many names of a label set that differs a line shows.
NAMES_SHOWN = 4
ENCODER_ALONE = "--no-init-head starts from its encoder alone"
NEW_HEAD = "a new head is trained (as transformers' ignore_mismatched_sizes does)"


def check_init_head(init, task_class, init_head=None, log=None):
    """What the transformers task folder `init` states of `task_class`'s settings
    (its labels), or None where no head is to be read from it; reads `config.json` alone.

    Args:
        init: str. `finetune`'s `--init`.
        task_class: the `Task` subclass to fine-tune.
        init_head: bool or None. None: keep the head of a task folder where it
            fits; True: it must (`ValueError` for a folder without one); False:
            read none.
        log: callable taking a str: where a head of another class, or of the
            task's class computing another kind of output (a `problem_type`, a
            number of outputs), is said to start afresh.

    Raises:
        ValueError: one line, with `init_head=True`, if `init`'s class or its
            kind of output does not fit the task.
    """
    if init_head is False:
        return None
    architecture = task_class_of(init) if os.path.isdir(init) else None
    if architecture is None:
        if init_head:
            raise ValueError(
                f"--init-head: {init} is no fine-tuned transformers folder "
                f"({', '.join(task_classes())}); it has no head to keep"
            )
        return None
    if architecture != task_class.hf_architecture:
        need = task_class.hf_architecture
        keeps = f"keeps the head of a {need}" if need else "has no transformers head to keep"
        line = f"--init {init} is a transformers {architecture}; --task {task_class.name} {keeps}"
        if init_head:
            raise ValueError(f"--init-head: {line}; {ENCODER_ALONE}")
        (log or to_stderr)(f"{line}: its encoder alone is read; {NEW_HEAD}")
        return None
    try:
        return hf_task_settings(init, task_class.name)
    except ValueError as error:
        if init_head:
            raise ValueError(f"--init-head: {error}; {ENCODER_ALONE}") from None
        (log or to_stderr)(f"{init}'s head is not kept: {error}; {NEW_HEAD}")
        return None


def plan_head(init, stated, task, init_head, source, log):
    """The `KeptHead` of `init` for `task`, or None for a new head; logs which.

    Args:
        init: str. The `--init` folder.
        stated: dict or None. What `check_init_head` returned.
        task: the `Task` built from the training data (`source`, its path).
        init_head: bool or None. As for `check_init_head`.
        log: callable taking a str.

    Raises:
        ValueError: with `init_head=True`, if the folder's labels are not the data's.
    """
    if stated is None:
        return None
    ours = task.settings()
    order, differences = None, []
    for key, theirs in stated.items():
        mine = ours.get(key)
        if mine == theirs:
            continue
        if _same_names(mine, theirs):
            order = [theirs.index(name) for name in mine]
        else:
            differences.append(_difference(key, theirs, mine, source))
    if differences:
        line = f"{init}'s head is not kept: {'; '.join(differences)}"
        if init_head:
            raise ValueError(f"--init-head: {line}; fix the data, or {ENCODER_ALONE} and a new head")
        log(f"{line}; {NEW_HEAD}")
        return None
    rows = ", its rows put in the training data's order" if order else ""
    log(f"the head starts as {init}'s ({task_class_of(init)}{rows})")
    return KeptHead(init, order)


def keep_head(model, head):
    """Sets `model`'s head to the `KeptHead`'s weights."""
    load_head(model, head.folder, head.order)


def _same_names(mine, theirs):
    """Whether two lists hold the same distinct names, in any order."""
    return (isinstance(mine, list) and isinstance(theirs, list) and len(set(theirs)) == len(theirs) == len(mine)
            and set(mine) == set(theirs))


def _difference(key, theirs, mine, source):
    """What differs between the folder's `key` and the task's, briefly."""
    if isinstance(mine, list) and isinstance(theirs, list):
        only_folder = [name for name in theirs if name not in mine]
        only_data = [name for name in mine if name not in theirs]
        parts = [f"{_names(only_folder)} only in the folder" if only_folder else "",
                 f"{_names(only_data)} only in {source}" if only_data else ""]
        shown = ", ".join(part for part in parts if part)
        return f"its {key} differ" + (f" ({shown})" if shown else "")
    return f"its {key} is {theirs!r}, the task's {mine!r}"


def _names(names):
    shown = ", ".join(map(str, names[:NAMES_SHOWN]))
    return shown + (f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")
