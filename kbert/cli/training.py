"""The training commands of `kbert`: finetune and distill.

`add_training_commands(subparsers, tasks)` adds them; each `cmd_*` runs one and
imports TensorFlow only then, so `kbert --help` stays instant; each refuses
a bad `--init`, `--teacher` or `--out` before it loads (`check_finetune`,
`check_distill`), and finetune its bad data too.
"""

import argparse

from kbert.cliargs import (
    DEBIAN,
    TRAINING_DTYPES,
    add_command,
    add_task_options,
    check_sequence_length,
    count,
    dropout_rate,
    fraction,
    learning_rate,
    positive_float,
    positive_fraction,
    positive_int,
    rate,
    task_options,
)
from kbert.cliio import print_json
from kbert.config import check_init
from kbert.modelfolder import check_model_out, check_student_out
from kbert.recipes import DISTILLATION, check_probe
from kbert.tasks import DEFAULT_TASK, TASKS, get_task


def check_finetune(args):
    """finetune's refusals that need no TensorFlow, made before it loads; finetune makes
    them again: its --init and --out, then its data (each bad row named by file and line)."""
    check_init(args.init, args.vocab)
    task = get_task(args.task)
    if args.seq_len is not None:
        task.check_sequence_length(args.seq_len, "--seq-len")
    if args.probe_head is not None:
        check_probe(task, args.probe_head)
    inputs = {"--train": args.train, "--dev": args.dev, "--init": args.init, "--vocab": args.vocab}
    check_model_out(args.out, args.overwrite, inputs)
    if args.tensorboard:
        _check_tensorboard(args.tensorboard, {"--out": args.out, **inputs})
    task.read_training(args.train, args.dev, _finetune_options(args))


def _check_tensorboard(folder, inputs):
    """Refuses a `--tensorboard` folder that is a file, or one of the command's inputs or
    its output (TensorBoard adds event files to a folder; it replaces nothing)."""
    import os

    from kbert.fileio import check_distinct

    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise ValueError(f"--tensorboard {folder}: a file of that name exists; expected a folder")
    check_distinct({"--tensorboard": folder}, inputs)


def _finetune_options(args):
    return task_options(args, [o.name for o in get_task(args.task).options])


def cmd_finetune(args):
    from kbert.training.finetune import finetune

    task = get_task(args.task)
    metrics = finetune(
        args.train,
        args.dev,
        args.init,
        args.out,
        task=args.task,
        options=_finetune_options(args),
        sequence_length=args.seq_len,
        batch_size=args.batch_size,
        epochs=args.epochs,
        learning_rate=args.lr,
        warmup_fraction=args.warmup,
        weight_decay=args.weight_decay,
        adapt_steps=args.adapt_steps,
        probe_head=args.probe_head,
        init_head=args.init_head,
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
        callbacks=_tensorboard(args.tensorboard),
    )
    summary = {**task.summary(metrics), "train_seconds": metrics["train_seconds"]}
    adaptation = {"adaptation": metrics["adaptation"]} if "adaptation" in metrics else {}
    print_json({"model": args.out, "task": args.task, "dev": summary, **adaptation})


def _tensorboard(folder):
    """Keras's TensorBoard callback logging to `folder` (`--tensorboard`), or none."""
    if not folder:
        return []
    import keras

    return [keras.callbacks.TensorBoard(log_dir=folder)]


def check_distill(args):
    """distill's refusals of its teacher, --seq-len and --out, made before TensorFlow loads;
    distill makes them again."""
    check_student_out(args.teacher, args.out, args.overwrite, args.train, args.dev, args.unlabelled, args.student)
    if args.seq_len is not None:
        check_sequence_length(args.seq_len, args.teacher, option="--teacher")


def cmd_distill(args):
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
        options=task_options(args),
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
    print_json({
        "model": args.out,
        "task": task.name,
        "dev": {**task.summary(metrics), "train_seconds": metrics["train_seconds"]},
        "teacher_dev": task.summary(metrics["teacher"]),
    })


def _add_training_data(p):
    p.add_argument("--train", required=True, metavar="FILE", help="training data, in the task's format")
    p.add_argument("--dev", required=True, metavar="FILE", help="dev data, evaluated after training")


def _recipe_default(tasks, field, show=str):
    """`--help`'s default of a recipe flag: each task's value."""
    values = "; ".join(f"{task.name}: {show(getattr(task.recipe, field))}" for task in tasks)
    return f"default: the task's recipe ({values})"


def _on_off(value):
    return "on" if value else "off"


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
        recipe.add_argument(
            "--seq-len", type=positive_int, help="packed length; " + _recipe_default(tasks, "sequence_length")
        )
        recipe.add_argument(
            "--batch-size", type=positive_int, help="global batch; " + _recipe_default(tasks, "batch_size")
        )
        recipe.add_argument(
            "--epochs", type=positive_int, help="passes over --train; " + _recipe_default(tasks, "epochs")
        )
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
        recipe.add_argument(
            "--adapt-steps", type=count, metavar="N",
            help="masked-LM steps on the training texts before fine-tuning (task-adaptive "
            "pretraining), 0 for none; " + _recipe_default(tasks, "adapt_steps"),
        )
        recipe.add_argument(
            "--probe-head", action=argparse.BooleanOptionalAction, default=None,
            help="start the head as a logistic regression on the frozen encoder's [CLS] vectors "
            "(a linear probe), then fine-tune all; " + _recipe_default(tasks, "probe_head", _on_off),
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
        "--dtype", default="auto", choices=TRAINING_DTYPES,
        help="dtype policy; auto: mixed_bfloat16 where the device multiplies bfloat16 natively "
        "(Ampere GPUs, TPUs, CPUs with AVX512_BF16 or AMX), else float32",
    )
    run.add_argument("--xla", action="store_true", help="compile the train step with XLA")
    run.add_argument("--seed", type=int, default=0, help="weights of new layers, dropout and shuffles")
    run.add_argument(
        "--deterministic", action="store_true",
        help="TensorFlow op determinism: bitwise reproducible, also across a resume",
    )
    return recipe, run


def _add_finetune(sub, tasks):
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
    p.add_argument(
        "--init-head", action=argparse.BooleanOptionalAction, default=None,
        help="start from the head of a fine-tuned transformers --init folder (BertForSequenceClassification...); "
        "default: where its id2label names are the training data's labels, else a new head; "
        "--no-init-head: its encoder alone",
    )
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
        "--tensorboard", metavar="DIR",
        help="also write Keras's TensorBoard logs (loss and metrics per epoch) to DIR; "
        "the model folder has training.png either way; default: none",
    )
    run.add_argument(
        "--strategy", default="auto",
        help="tf.distribute strategy: auto, default, mirrored, multiworker or tpu; "
        "--batch-size is the global batch",
    )
    add_task_options(p, tasks)
    p.set_defaults(run=cmd_finetune, check=check_finetune, reads=("train", "dev", "vocab"))


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
    p.set_defaults(run=cmd_distill, check=check_distill, reads=("train", "dev", "unlabelled"))


def add_training_commands(sub, tasks):
    """finetune and distill, for `tasks` (those that train)."""
    _add_finetune(sub, tasks)
    _add_distill(sub, tasks)
