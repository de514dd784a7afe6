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
