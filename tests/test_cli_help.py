"""`kbert --help`: instant and quiet, every default shown, each command's own options and
examples; and the recipes the defaults come from."""

import argparse
import functools
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from importlib import metadata

from kbert.cli.main import DESCRIPTION, build_parser
from kbert.cliargs import rate, task_options
from kbert.recipes import DISTILLATION, Recipe
from kbert.tasks import TASKS

ROOT = os.path.join(os.path.dirname(__file__), "..")
# Options with no default: an input given one way or another (predict's TEXT or
# --input, search's --corpus or --index's model...).
INPUTS = {"--input", "--corpus", "--queries", "--records", "--model"}
# Each trainable task's recipe as its guide states it (the sentence or table that
# gives it: epochs, peak rate, batch and packed length), read from the docs, which
# are written from the measurements, apart from the code's constants.
DOCUMENTED_RECIPES = {
    "text-classification": (
        "docs/tasks/text-classification.md",
        r"\| epochs \| (?P<epochs>\d+) \|.*?\| peak learning rate \| (?P<lr>\S+) \|.*?"
        r"\| sequence length \| (?P<length>\d+) pieces \|.*?\| batch size \| (?P<batch>\d+) \|",
    ),
    "text-pair-classification": (
        "docs/tasks/text-pairs.md",
        r"pair classification first reads the training pairs' own text for (?P<adapt>[\d,]+) masked-LM steps "
        r".*? then trains (?P<epochs>\d+) epochs at (?P<lr>\S+) .*? "
        r"both at batch (?P<batch>\d+), (?P<length>\d+) pieces",
    ),
    "text-pair-regression": (
        "docs/tasks/text-pairs.md",
        r"pair regression trains (?P<epochs>\d+) epochs at (?P<lr>[^;\s]+); both at batch (?P<batch>\d+), "
        r"(?P<length>\d+) pieces",
    ),
    "multi-label-classification": (
        "docs/tasks/multi-label-classification.md",
        r"With no recipe flag: a linear probe, then (?P<epochs>\d+) epochs at (?P<lr>\S+) \(AdamW, 10% warm-up, "
        r"linear decay\), batch (?P<batch>\d+), (?P<length>\d+) pieces",
    ),
    "token-classification": (
        "docs/tasks/token-classification.md",
        r"With no recipe flag: (?P<epochs>\d+) epochs at (?P<lr>\S+) \(AdamW, 10% warm-up, linear decay\), "
        r"batch (?P<batch>\d+), (?P<length>\d+) pieces",
    ),
    "question-answering": (
        "docs/tasks/question-answering.md",
        r"With no recipe flag: (?P<epochs>\d+) epochs at (?P<lr>[^,\s]+), batch (?P<batch>\d+), (?P<length>\d+) pieces",
    ),
}


def doc_text(path):
    """A page of the docs with its line breaks as spaces."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return " ".join(f.read().split())


@functools.cache
def documented_recipes():
    """task name -> the `Recipe` its guide states, the settings every recipe shares and
    which start the head as a linear probe from docs/command-line.md; "distillation"
    -> docs/distillation.md's."""
    options = doc_text("docs/command-line.md")
    shared = re.search(r"in every task's recipe BERT's (?P<warmup>[\d.]+) and (?P<decay>[\d.]+)", options)
    probe = re.search(r"on in (?P<on>[a-z -]+?(?:'s and [a-z -]+?)*)'s recipes?, off in (?P<off>[a-z ]+)'s; "
                      r"other tasks refuse it", options)
    assert shared and probe, "docs/command-line.md no longer states the shared recipe settings"
    recipes = {}
    for name, (page, pattern) in DOCUMENTED_RECIPES.items():
        found = re.search(pattern, doc_text(page))
        assert found, f"{page} no longer states {name}'s recipe as expected: {pattern}"
        recipes[name] = Recipe(
            epochs=int(found["epochs"]), learning_rate=float(found["lr"]), batch_size=int(found["batch"]),
            sequence_length=int(found["length"]), warmup_fraction=float(shared["warmup"]),
            weight_decay=float(shared["decay"]),
            adapt_steps=int((found.groupdict().get("adapt") or "0").replace(",", "")),
            probe_head=name in {task.replace(" ", "-") for task in probe["on"].split("'s and ")},
        )
    distillation = doc_text("docs/distillation.md")
    found = re.search(r"(?P<epochs>\d+) epochs at (?P<lr>[^,\s]+), batch (?P<batch>\d+), temperature", distillation)
    assert found and "| `--seq-len N` | packed length | the teacher's |" in distillation
    recipes["distillation"] = Recipe(epochs=int(found["epochs"]), learning_rate=float(found["lr"]),
                                     batch_size=int(found["batch"]), sequence_length=None)
    return recipes


def commands():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def quiet_env():
    """The environment of a user who set no TensorFlow logging level."""
    return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def test_help_prints_nothing_on_stderr():
    for command in ["", *commands()]:
        result = subprocess.run(
            [sys.executable, "-m", "kbert.cli", *command.split(), "--help"],
            capture_output=True, text=True, cwd=ROOT, env=quiet_env(), timeout=60,
        )
        assert result.returncode == 0 and result.stdout.startswith("usage: kbert"), command
        assert result.stderr == "", (command, result.stderr)


def test_kbert_alone_shows_the_commands_and_fails():
    result = subprocess.run([sys.executable, "-m", "kbert.cli"], capture_output=True, text=True, cwd=ROOT,
                            env=quiet_env(), timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == build_parser().format_help() and "\n    finetune " in result.stderr


def test_build_parser_imports_no_tensorflow():
    code = (
        "import sys, kbert.cli; kbert.cli.build_parser(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'tensorflow_text', 'keras', 'jax'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def test_version_names_kbert_and_its_libraries_without_importing_them():
    code = (
        "import sys\nfrom kbert.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit as stop:\n"
        "    print(stop.code, 'tensorflow' in sys.modules or 'keras' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    line, status = result.stdout.splitlines()
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in ("tensorflow", "keras", "tensorflow-text"))
    assert line == f"kbert {metadata.version('kbert')} ({versions}, Python {platform.python_version()})"
    assert status == "0 False" and result.stderr == "", result.stderr


# A command and the option of a file it reads that is not there.
MISSING_INPUTS = [
    ("finetune --dev given.csv --init all-minilm-l6-v2 --out runs/never", "--train"),
    ("finetune --train given.csv --init all-minilm-l6-v2 --out runs/never", "--dev"),
    ("finetune --train given.csv --dev given.csv --init bert_tiny --out runs/never", "--vocab"),
    ("distill --teacher given --train given.csv --out runs/never", "--dev"),
    ("distill --teacher given --train given.csv --dev given.csv --out runs/never", "--unlabelled"),
    ("evaluate --model given", "--data"),
    ("predict --model given", "--input"),
    ("embed --model given --output runs/never.npy", "--input"),
    ("search --model given --index runs/never.kbert-index", "--corpus"),
    ("export --model given --data given.csv --out saved_models/never", "--calibration"),
    ("tokenize hello", "--vocab"),
    ("pretraining-data --corpus given.txt --out runs/never", "--vocab"),
]


def run_in_one_process(argvs, cwd):
    """Runs `kbert ARGV` for each of `argvs` in one fresh Python, in `cwd`.

    Returns their exit statuses, whether TensorFlow was imported, and stderr's lines.
    """
    code = (
        "import json, shlex, sys\nfrom kbert.cli import main\n"
        "statuses = [main(shlex.split(argv)) for argv in json.loads(sys.argv[1])]\n"
        "print(json.dumps([statuses, 'tensorflow' in sys.modules]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(argvs)], capture_output=True, text=True, cwd=cwd,
        env={**quiet_env(), "PYTHONPATH": os.path.abspath(ROOT)}, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    statuses, tensorflow_loaded = json.loads(result.stdout)
    return statuses, tensorflow_loaded, result.stderr.splitlines()


def test_a_missing_input_is_refused_before_tensorflow_loads(tmp_path):
    """One line naming the option and the file, status 2, and no TensorFlow start-up (seconds) first."""
    for name in ["given", "given.csv", "given.txt"]:
        (tmp_path / name).write_text("text,label\n", encoding="utf-8")
    argvs = [f"{argv} {option} missing-{i}" for i, (argv, option) in enumerate(MISSING_INPUTS)]
    statuses, tensorflow_loaded, lines = run_in_one_process(argvs, tmp_path)
    assert statuses == [2] * len(argvs) and not tensorflow_loaded, lines
    assert lines == [f"kbert: error: {option} missing-{i}: no such file" for i, (_, option) in enumerate(MISSING_INPUTS)]


TRAIN = "--train given.csv --dev given.csv"
NO_MODEL = "--model nowhere: no such model folder"
# What is refused before TensorFlow loads, beside missing inputs: (arguments, the error).
# A bad --init, --model or --out; options that do not go together; data the command cannot read.
EARLY_REFUSALS = [
    (f"finetune {TRAIN} --init nowhere --out runs/m",
     "--init nowhere: no such checkpoint folder, packaged checkpoint (all-minilm-l6-v2) or preset "
     "(such as bert_base)"),
    (f"finetune {TRAIN} --init bert_tiny --out runs/m", "--init bert_tiny is a preset, with no vocabulary; pass --vocab"),
    (f"finetune {TRAIN} --init bert_tiny --vocab given.txt --out mine",
     "--out mine is not empty and is not a kbert model folder; kbert replaces only its own model folders: "
     "choose a new or empty folder"),
    (f"finetune {TRAIN} --init all-minilm-l6-v2 --out given.csv",
     "--out given.csv is --train given.csv, which this command reads; choose another --out"),
    (f"finetune {TRAIN} --init all-minilm-l6-v2 --out given.txt",
     "--out given.txt: a file of that name exists; expected a model folder"),
    (f"finetune {TRAIN} --init all-minilm-l6-v2 --out runs/m", "given.csv has a header but no rows"),
    (f"finetune --task text-pair-classification {TRAIN} --init all-minilm-l6-v2 --out runs/m",
     "given.csv has no column 'sentence1'; its columns are ['text', 'label']"),
    ("finetune --train games.csv --dev games.csv --init all-minilm-l6-v2 --out runs/m",
     "games.csv has 1 distinct label(s) ['games']; need at least 2"),
    ("finetune --train topics.csv --dev games.csv --init all-minilm-l6-v2 --out runs/m",
     "games.csv, line 2: label 'games' is not one the model knows (1 unknown: ['games']); "
     "expected one of ['editors', 'web']"),
    ("finetune --task token-classification --train ner.txt --dev mine/ner.txt --init all-minilm-l6-v2 --out runs/m",
     "mine/ner.txt, line 1: tag 'B-PER' was not in the training data; the model knows ['O', 'B-LOC']"),
    ("predict --model nowhere hello",
     f"{NO_MODEL}; a pretrained checkpoint needs --task, one that needs no training (sentence-embedding, fill-mask)"),
    ("evaluate --model given.csv --data given.csv", "--model given.csv: no such model folder; a pretrained checkpoint "
     "needs --task, one that needs no training (sentence-embedding, fill-mask)"),
    ("export --model nowhere --task fill-mask --data given.csv --out saved_models/m",
     f"{NO_MODEL}, checkpoint folder or packaged checkpoint (all-minilm-l6-v2)"),
    ("embed --model nowhere --input given.txt --output runs/e.npy",
     f"{NO_MODEL}, checkpoint folder or packaged checkpoint (all-minilm-l6-v2)"),
    ("search --model nowhere --corpus given.txt --index runs/i.kbert-index",
     f"{NO_MODEL}, checkpoint folder or packaged checkpoint (all-minilm-l6-v2)"),
    ("export --model nowhere --data given.csv --out saved_models/m --formats onnx,tflit",
     "unknown format 'tflit'; expected some of savedmodel, tflite, onnx, mediapipe, huggingface, keras-hub"),
    ("export --model nowhere --data given.csv --out given.txt",
     "--out given.txt: a file of that name exists; expected an export folder"),
    (f"distill --teacher nowhere {TRAIN} --out runs/s",
     "--teacher nowhere is not a kbert model folder (what kbert finetune --out writes)"),
    (f"distill --teacher topics {TRAIN} --out given.csv",
     "--out given.csv is --train given.csv, which this command reads; choose another --out"),
    ("evaluate --model topics --data given.csv", "given.csv has a header but no rows"),
    ("evaluate --task sentence-embedding --model all-minilm-l6-v2 --data given.csv",
     "given.csv has no column 'sentence1'; its columns are ['text', 'label']"),
    ("predict --model topics --input games.csv --text-column body",
     "games.csv has no column 'body'; its columns are ['text', 'label']"),
    ("export --model topics --data given.csv --out saved_models/m", "given.csv has a header but no rows"),
    ("embed --model all-minilm-l6-v2 --input mine/empty.txt --output e.npy", "mine/empty.txt holds no texts"),
    ("predict --model topics --task token-classification hello",
     "--task token-classification does not match --model topics, a text-classification model folder: "
     "omit --task, or pass a token-classification model folder"),
    ("predict --model all-minilm-l6-v2 --task sentence-embedding", "give either TEXT arguments or --input FILE"),
    ("embed --model all-minilm-l6-v2 --input given.txt --output runs/e.txt",
     "--output runs/e.txt: expected a .npy file name"),
    ("search --index runs/i.kbert-index --corpus given.txt", "--corpus needs --model: the model that embeds it"),
    ("search --index runs/i.kbert-index", "give QUERY arguments or --queries FILE, or --corpus to build the index"),
    ("search --index runs/i.kbert-index hello",
     "--index runs/i.kbert-index: no such index file (build it with --corpus)"),
    ("search --index given.txt hello", "given.txt is not a kbert index (not a NumPy .npz archive)"),
    ("vocab --corpus given.txt --size 10 --out given.txt",
     "--out given.txt is --corpus given.txt, which this command reads; choose another --out"),
    ("pretraining-data --corpus mine/notes.txt --vocab given.txt --out mine",
     "--out mine holds --corpus mine/notes.txt, which this command reads; choose another --out"),
    ("pretrain --corpus given.txt --config bert_tiny --steps 1 --out runs/p",
     "--vocab is required with --corpus and --init bert_tiny, which has no vocabulary"),
    ("pretrain --corpus given.txt --init mine --steps 1 --out runs/p", "--init mine holds no vocab.txt; pass --vocab"),
    ("pretrain --corpus given.txt --init bert_mni --steps 1 --out runs/p",
     "--init bert_mni: no such checkpoint folder, packaged checkpoint (all-minilm-l6-v2), preset (such as "
     "bert_mini) or BertConfig .json file"),
    ("pretrain --records given.txt --vocab given.txt --init nowhere.json --steps 1 --out runs/p",
     "--init nowhere.json: no such checkpoint folder, packaged checkpoint (all-minilm-l6-v2), preset (such as "
     "bert_mini) or BertConfig .json file"),
    ("pretrain --records mine --config bert_tiny --steps 1 --out runs/p",
     "--records mine holds no vocab.txt; pass --vocab"),
    ("pretrain --corpus given.txt --vocab given.txt --config bert_tiny --steps 1 --out mine",
     "--out mine exists and is not empty; choose a new folder"),
    ("pretrain --corpus given.txt --vocab given.txt --config bert_tiny --steps 1 --out given.txt",
     "--out given.txt is --corpus given.txt, which this command reads; choose another --out"),
]


def test_what_needs_no_tensorflow_is_refused_before_it_loads(tmp_path):
    for name in ["given.csv", "given.txt", "mine/notes.txt"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("text,label\n", encoding="utf-8")
    (tmp_path / "games.csv").write_text("text,label\nA game of chess.,games\n", encoding="utf-8")
    (tmp_path / "topics.csv").write_text("text,label\nA text editor.,editors\nA web server.,web\n", encoding="utf-8")
    (tmp_path / "ner.txt").write_text("Paris B-LOC\nwins O\n", encoding="utf-8")
    (tmp_path / "topics").mkdir()  # what kbert.json says of a model folder, which is all these checks read
    (tmp_path / "mine" / "empty.txt").write_text("")
    (tmp_path / "mine" / "ner.txt").write_text("Bob B-PER\nwins O\n", encoding="utf-8")
    (tmp_path / "topics" / "kbert.json").write_text(
        '{"task": "text-classification", "task_settings": {"labels": ["editors", "games"]}, "bert_config": {}}'
    )
    statuses, tensorflow_loaded, lines = run_in_one_process([argv for argv, _ in EARLY_REFUSALS], tmp_path)
    assert statuses == [2] * len(EARLY_REFUSALS) and not tensorflow_loaded, lines
    assert lines == [f"kbert: error: {error}" for _, error in EARLY_REFUSALS]
    written = sorted(os.listdir(tmp_path))
    assert written == ["games.csv", "given.csv", "given.txt", "mine", "ner.txt", "topics", "topics.csv"]  # nothing new


def test_every_option_shows_its_default():
    for name, parser in commands().items():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if (not action.option_strings or action.required or action.help == argparse.SUPPRESS
                    or isinstance(action, (argparse._HelpAction, argparse._StoreTrueAction))):
                continue
            assert action.help, (name, action.option_strings)  # argparse shows no default without one
            text = formatter._expand_help(action)
            if action.default is None and set(action.option_strings) & INPUTS:
                continue
            assert "default" in text, (name, action.option_strings, text)
            if action.default is not None:
                shown = [str(action.default)] + ([rate(action.default)] if isinstance(action.default, float) else [])
                assert any(value in text for value in shown), (name, action.option_strings, text)


def test_each_command_lists_the_options_of_its_tasks():
    helps = {name: parser.format_help() for name, parser in commands().items()}
    # No task finetune trains reads sentence-embedding pooling.
    for option in ("--pooling", "--normalize"):
        assert option not in helps["finetune"] and option not in helps["distill"]
        for name in ("evaluate", "predict", "embed", "search", "export"):
            assert option in helps[name], (name, option)
    for option in ("--truncate", "--tag-scheme", "--doc-stride", "--head"):
        assert option in helps["finetune"] and option not in helps["embed"]
    assert "question-answering options:" in helps["finetune"]
    assert "text-classification and text-pair-classification options:" in helps["evaluate"]
    assert "--text-column" in helps["search"]


def test_finetune_help_shows_each_tasks_recipe():
    text = " ".join(commands()["finetune"].format_help().split())
    assert "--epochs EPOCHS passes over --train; default: the task's recipe (text-classification: 2;" in text
    assert "question-answering: 3e-4)" in text and "question-answering: 384)" in text
    assert "--warmup WARMUP share of the steps warming up; default: the task's recipe (text-classification: 0.1;" \
        in text
    assert "--probe-head, --no-probe-head start the head as a logistic regression" in text
    assert "(text-classification: on;" in text and " text-pair-classification: off;" in text
    assert "(default: auto)" in text


def test_description_names_every_command_and_every_help_ends_with_examples():
    parser = build_parser()
    for name, sub in commands().items():
        assert re.search(rf"\b{re.escape(name)}\b", DESCRIPTION), name
        help_text = sub.format_help()
        examples = help_text[help_text.index("\nexamples:\n"):]
        assert help_text.rstrip().endswith(examples.rstrip())
        lines = examples.replace("\\\n", " ").splitlines()[2:]
        assert 2 <= len(lines) <= 3, (name, lines)
        for line in lines:
            argv = shlex.split(line.strip())
            assert argv[:2] == ["kbert", name], line
            parser.parse_args(argv[1:])  # each example is a valid command
    assert "\nexamples:\n" in parser.format_help()


def test_each_trainable_task_has_the_recipe_its_guide_states():
    recipes = documented_recipes()
    trainable = {name for name, task in TASKS.items() if task.trainable}
    assert trainable == set(recipes) - {"distillation"}
    for name in trainable:
        assert TASKS[name].recipe == recipes[name], name
    assert TASKS["sentence-embedding"].recipe is None
    assert "| long texts | cut in the middle: the first 63 and the last 63 pieces | `--truncate` |" in doc_text(
        "docs/tasks/text-classification.md")
    assert TASKS["text-classification"].resolve_options({})["truncate"] == "head_tail"
    assert DISTILLATION == recipes["distillation"]


def test_recipe_flags_override_the_tasks_recipe():
    argv = ["finetune", "--task", "question-answering", "--train", "t", "--dev", "d", "--init", "i", "--out", "o"]
    args = build_parser().parse_args(argv)
    assert (args.seq_len, args.batch_size, args.epochs, args.lr, args.dtype) == (None, None, None, None, "auto")
    recipe = TASKS[args.task].recipe.override(sequence_length=args.seq_len, epochs=args.epochs)
    assert recipe == documented_recipes()[args.task]
    args = build_parser().parse_args([*argv, "--epochs", "2", "--lr", "5e-5"])
    assert TASKS[args.task].recipe.override(epochs=args.epochs, learning_rate=args.lr) == Recipe(
        epochs=2, learning_rate=5e-5, batch_size=16, sequence_length=384
    )


def _resolved(argv):
    """What `kbert finetune argv` trains with: the recipe, the data options and every other setting."""
    args = build_parser().parse_args(argv)
    task = TASKS[args.task]
    recipe = task.recipe.override(
        sequence_length=args.seq_len, batch_size=args.batch_size, epochs=args.epochs, learning_rate=args.lr
    )
    options = task_options(args)
    settings = {k: v for k, v in vars(args).items()
                if k not in {"seq_len", "batch_size", "epochs", "lr", "run", *options}}
    return recipe, task.resolve_options(options), settings


def _make_run_command():
    """The `kbert finetune` command of the Makefile's `run` target, as argv after `kbert`."""
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        makefile = f.read().replace("\\\n", " ")
    target = makefile[makefile.index("\nrun:"):]
    line = next(line for line in target.splitlines() if "bin/kbert finetune" in line)
    return shlex.split(line.replace("$(OUT)", "runs/debian-minilm"))[1:]


def test_make_run_trains_what_it_trained_before_the_recipes():
    argv = _make_run_command()
    assert argv[0] == "finetune" and not {"--seq-len", "--batch-size", "--epochs", "--lr", "--dtype"} & set(argv)
    # `make run` before the tasks' recipes became the defaults.
    before = argv + ["--seq-len", "128", "--batch-size", "32", "--epochs", "2", "--lr", "1e-4",
                     "--truncate", "head_tail", "--dtype", "auto"]
    assert _resolved(argv) == _resolved(before)
    assert _resolved(argv)[2]["seed"] == 0


def test_a_command_prints_no_tensorflow_start_up_lines():
    """TensorFlow's oneDNN, CUDA and CPU-flag lines are held back unless TF_CPP_MIN_LOG_LEVEL is set."""
    from kbert.checkpoints import resolve_checkpoint

    vocab = os.path.join(resolve_checkpoint("all-minilm-l6-v2"), "vocab.txt")
    argv = [sys.executable, "-m", "kbert.cli", "tokenize", "--vocab", vocab, "hello world"]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=quiet_env(), timeout=120)
    assert result.returncode == 0 and result.stdout == "[101, 7592, 2088, 102]\n"
    assert not re.search(r"absl::InitializeLog|oneDNN|cuda|cpu_feature_guard", result.stderr), result.stderr
