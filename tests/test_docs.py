"""The docs cannot drift from the code.

Every `kbert ...` command in a code block of the user docs parses with the real
command line; every script they name exists; every relative link resolves
(headings included); the README's
Python snippets run, on a tiny checkpoint; the README stays short, with its
first `kbert finetune` near the top.
"""

import csv
import glob
import os
import re
import shlex

import pytest

from tests.task_harness import ROOT, TINY_LABELS, TINY_TEXTS, minilm_vocabulary

# The README's promise to a reader: short, with a command to copy early on.
README_MAX_LINES = 300
README_FIRST_FINETUNE_BY_LINE = 80

SHELL_LANGUAGES = ("", "bash", "sh", "shell", "console")
# How a command line starts the kbert command line, in the docs.
KBERT_PREFIXES = (("kbert",), (".venv/bin/kbert",), ("python", "-m", "kbert.cli"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def doc_files():
    """The user docs, relative to the repository root."""
    paths = ["README.md", "CONTRIBUTING.md", "mobile/README.md", "saved_models/README.md", "tools/README.md",
             "tools/benchmarks/README.md"]
    paths += sorted(
        os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    )
    return [path for path in paths if os.path.isfile(os.path.join(ROOT, path))]


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def code_blocks(text, languages):
    """(language, body, line of the body's first line) of each fenced block in `languages`."""
    for match in FENCE.finditer(text):
        if match.group(1) in languages:
            yield match.group(1), match.group(2), text.count("\n", 0, match.start(2)) + 1


def shell_commands(body):
    """The logical lines of a shell block (continuations joined), as argv lists, with their offset."""
    lines, start, current = [], 0, ""
    for offset, line in enumerate(body.splitlines()):
        if not current:
            start = offset
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        lines.append((start, current + line))
        current = ""
    for offset, line in lines:
        for part in re.split(r"&&|\|\||;|\|", line):
            argv = shlex.split(part, comments=True)
            while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):  # VAR=value kbert ...
                argv = argv[1:]
            if argv:
                yield offset, argv


def kbert_commands():
    """(where, argv after the program name) of every kbert command in the docs' shell blocks."""
    found = []
    for path in doc_files():
        for _, body, line in code_blocks(read(path), SHELL_LANGUAGES):
            for offset, argv in shell_commands(body):
                for prefix in KBERT_PREFIXES:
                    if tuple(argv[: len(prefix)]) == prefix:
                        found.append((f"{path}:{line + offset}", argv[len(prefix):]))
    return found


def test_the_docs_hold_commands():
    where = {place.split(":")[0] for place, _ in kbert_commands()}
    assert {"README.md", "docs/tasks/text-classification.md", "mobile/README.md"} <= where


@pytest.mark.parametrize("where, argv", kbert_commands(), ids=lambda value: value if isinstance(value, str) else None)
def test_command_parses(where, argv):
    from kbert.cli import build_parser

    try:
        build_parser().parse_args(argv)
    except SystemExit as exit:
        if exit.code:
            pytest.fail(f"{where}: `kbert {shlex.join(argv)}` does not parse (exit {exit.code})")


def named_scripts():
    """(where, path) of every script under tools/ or mobile/ that the docs name."""
    script = re.compile(r"(?<![\w/.])((?:tools|mobile)/[\w/]*\.py)\b")
    found = []
    for path in doc_files():
        for number, line in enumerate(read(path).splitlines(), 1):
            found += [(f"{path}:{number}", match.group(1)) for match in script.finditer(line)]
    return found


@pytest.mark.parametrize("where, script", named_scripts(), ids=lambda value: value if isinstance(value, str) else None)
def test_named_script_exists(where, script):
    assert os.path.isfile(os.path.join(ROOT, script)), f"{where}: {script} does not exist"


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    text = FENCE.sub("", read(path))
    return {slug(match.group(1)) for match in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def relative_links():
    found = []
    for path in doc_files():
        text = FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), read(path))
        for match in LINK.finditer(text):
            target = match.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            found.append((f"{path}:{text.count(chr(10), 0, match.start()) + 1}", path, target))
    return found


@pytest.mark.parametrize("where, path, target", relative_links(), ids=lambda value: value if isinstance(value, str) else None)
def test_link_resolves(where, path, target):
    file_part, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
    assert os.path.exists(os.path.join(ROOT, resolved)), f"{where}: {target} -> {resolved} does not exist"
    if anchor and resolved.endswith(".md"):
        assert anchor in anchors(resolved), f"{where}: {resolved} has no heading #{anchor}"


def test_readme_is_short_and_starts_with_a_command():
    lines = read("README.md").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"
    first = next((n for n, line in enumerate(lines, 1) if re.match(r"^\s*kbert finetune\b", line)), None)
    assert first is not None and first <= README_FIRST_FINETUNE_BY_LINE, (
        f"README.md's first `kbert finetune` command is at line {first}; "
        f"expected by line {README_FIRST_FINETUNE_BY_LINE}"
    )


def test_no_commit_hashes():
    """The docs say what is true now; how a figure was reached belongs in git."""
    commit = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
    found = [f"{path}: {match.group(0)}" for path in doc_files() for match in commit.finditer(read(path))]
    assert not found, f"commit hashes in the docs: {found}"


# === The README's Python, on a tiny checkpoint ===



@pytest.fixture
def tiny_workspace(tmp_path, monkeypatch):
    """A working folder where the README's names mean tiny things.

    `all-minilm-l6-v2` is a folder here (a checkpoint name resolves to a folder
    of that name first), holding a one-block, 16-wide BERT on MiniLM's
    vocabulary; `data/debian-packages/` holds a few rows of the Debian format.
    """
    from kbert.checkpoints import save_hf_checkpoint
    from kbert.config import BertConfig
    from kbert.models import bert_encoder

    config = BertConfig(
        hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=128
    )
    save_hf_checkpoint(bert_encoder(config), config, list(minilm_vocabulary()), str(tmp_path / "all-minilm-l6-v2"))
    data = tmp_path / "data" / "debian-packages"
    data.mkdir(parents=True)
    for name in ("train.csv", "dev.csv"):
        with open(data / name, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            for index, text in enumerate(TINY_TEXTS):
                writer.writerow([text, TINY_LABELS[index % len(TINY_LABELS)]])
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_readme_python_runs(tiny_workspace):
    blocks = [body for _, body, _ in code_blocks(read("README.md"), ("python",))]
    assert blocks, "README.md has no python block"
    for index, body in enumerate(blocks):
        try:
            exec(compile(body, f"README.md python block {index + 1}", "exec"), {"__name__": "readme"})
        except Exception as error:
            pytest.fail(f"README.md python block {index + 1} fails: {type(error).__name__}: {error}")
    assert (tiny_workspace / "runs" / "debian-python" / "model.keras").is_file()


# === The task guides' example data and commands ===

# A header of a CSV example: column names and commas alone.
CSV_HEADER = re.compile(r"^\w+(,\w+)+$")
# The commands of a task guide that run here in a few seconds, on the tiny
# workspace of `guide_workspace`: page -> the subcommands run.
CHEAP_GUIDE_COMMANDS = {"docs/tasks/fill-mask.md": ("predict", "evaluate")}


def example_data():
    """(where, task, body) of each example data file of a task guide (docs/tasks/TASK.md):
    a `text` block whose first line is a CSV header."""
    from kbert.tasks import TASKS

    found = []
    for path in doc_files():
        task = os.path.splitext(os.path.basename(path))[0]
        if not path.startswith("docs/tasks/") or task not in TASKS:
            continue
        for _, body, line in code_blocks(read(path), ("text", "csv")):
            if CSV_HEADER.match(body.splitlines()[0]):
                found.append((f"{path}:{line}", task, body))
    return found


def test_the_task_guides_hold_example_data():
    assert {"fill-mask", "text-classification"} <= {task for _, task, _ in example_data()}


@pytest.mark.parametrize("where, task, body", [pytest.param(*found, id=found[0]) for found in example_data()])
def test_example_data_is_read_by_its_task(where, task, body, tmp_path):
    """Every row of a guide's example data is one its task reads, learns from and encodes
    (on MiniLM's vocabulary, the guides' checkpoint): what `kbert finetune`,
    `evaluate` and `export --data` refuse first."""
    from kbert.tasks import get_task
    from tests.task_harness import task_instance

    path = tmp_path / "data.csv"
    path.write_text(body, encoding="utf-8")
    task_class = get_task(task)
    examples = task_class.read(str(path))
    settings = task_class.learn(examples, str(path)) if task_class.trainable else task_class.pretrained_settings(None, {})
    instance = task_instance(task, settings, sequence_length=64)
    try:
        instance.check(examples, where)
        instance.encode(examples)
    except ValueError as error:
        pytest.fail(f"{where}: the example data fails: {error}")


@pytest.fixture
def guide_workspace(tmp_path, monkeypatch):
    """A working folder where the fill-mask guide's names mean tiny things: `runs/pretrain/encoder`
    a one-block BERT with a masked-LM head on MiniLM's vocabulary, `cloze.csv` the guide's data."""
    import keras

    from kbert.checkpoints import save_hf_checkpoint
    from kbert.config import BertConfig
    from kbert.models import bert_pretrainer

    config = BertConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=64)
    keras.utils.set_random_seed(0)
    pretrainer = bert_pretrainer(config)
    save_hf_checkpoint(pretrainer.encoder, config, list(minilm_vocabulary()), str(tmp_path / "runs" / "pretrain" / "encoder"),
                       pretrainer=pretrainer)
    (_, _, body), = [found for found in example_data() if found[1] == "fill-mask"]
    (tmp_path / "cloze.csv").write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_fill_mask_guide_s_commands_run(guide_workspace, capsys):
    from kbert.cli import main

    page = "docs/tasks/fill-mask.md"
    ran = []
    for where, argv in kbert_commands():
        if where.startswith(page + ":") and argv[0] in CHEAP_GUIDE_COMMANDS[page]:
            code = main(argv)
            captured = capsys.readouterr()
            assert code == 0, f"{where}: `kbert {shlex.join(argv)}` exits {code}: {captured.err.strip()[-500:]}"
            ran.append(argv[0])
    assert sorted(ran) == sorted(CHEAP_GUIDE_COMMANDS[page])
