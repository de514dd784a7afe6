"""No page quotes a figure that disagrees with docs/results.json.

A figure that comes from a measurement is written once, in docs/results.json
(key -> {value, command, machine, date[, note]}; `tools/benchmarks/results.py`
writes it), and each page that quotes it marks the quote:

- inline, a marker right after the figure: `87.05<!--r:text-classification.debian.quickstart.dev.accuracy-->`.
  The marker holds the last numbers written before it in its table cell (or
  since the previous marker): one number for a single value, all of them in
  order for a list (`87.40 ± 0.61<!--r:KEY-->` with value [87.40, 0.61]);
  `<!--r:KEY[0]-->` holds one element of a list.
- in a code block, where a comment would show, the line above the fence lists
  the keys: `<!--r-block: KEY KEY-->`; each key's numbers must appear in the block.

A quoted number agrees when it equals the stored value rounded to the quoted
digits (87.05 may be quoted 87.05, 87.1 or 87.0 with half-even rounding;
4.86e-08 as 4.9e-08), as a percentage or as a fraction (87.05 or 0.8705).

To add a figure: `python tools/benchmarks/results.py KEY VALUE --command "..." --machine A`
(or `record(...)` from the benchmark script), then write it with its marker in
docs/benchmarks.md's table for its task and wherever else it is quoted. Every key is
quoted in docs/benchmarks.md, the reference; a key no page marks fails here too.
"""

import decimal
import importlib.util
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tools/ is scripts, not a package: the helper is loaded from its file.
_spec = importlib.util.spec_from_file_location("results", os.path.join(ROOT, "tools", "benchmarks", "results.py"))
results_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results_module)
RESULTS, check_entry = results_module.RESULTS, results_module.check_entry

# The pages held to the results file.
PAGES = ["README.md", "mobile/README.md", "docs/benchmarks.md", "docs/distillation.md", "docs/export.md"] + sorted(
    os.path.join("docs", "tasks", name) for name in os.listdir(os.path.join(ROOT, "docs", "tasks")) if name.endswith(".md")
)
REFERENCE = "docs/benchmarks.md"
MARKER = re.compile(r"<!--r:([a-z0-9_.-]+)(?:\[(\d+)\])?-->")
BLOCK_MARKER = re.compile(r"^<!--r-block:([^>]*)-->\s*\n```[^\n]*\n(.*?)^```", re.M | re.S)
# A number as the docs write it: thousands commas, a Unicode minus, an exponent.
NUMBER = re.compile(r"(?<![\w.])[−-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])[−-]?\d+(?:\.\d+)?(?:e[−+-]?\d+)?(?![\w])")
# A quote may give a percentage as a fraction, or the reverse.
SCALES = (1, 100, decimal.Decimal("0.01"))


def results():
    with open(RESULTS, encoding="utf-8") as f:
        return json.load(f)


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def parse(text):
    """The Decimal a doc's number stands for."""
    return decimal.Decimal(text.replace(",", "").replace("−", "-"))


def agrees(quoted, value):
    """Whether the quoted text is `value` rounded to the quoted digits, as percent or fraction."""
    quoted_number = parse(quoted)
    quantum = decimal.Decimal((0, (1,), quoted_number.as_tuple().exponent))
    for scale in SCALES:
        exact = decimal.Decimal(repr(value)) * scale
        for rounding in (decimal.ROUND_HALF_UP, decimal.ROUND_HALF_EVEN):
            if exact.quantize(quantum, rounding=rounding) == quoted_number:
                return True
    return False


def values(entry, index=None):
    value = entry["value"] if isinstance(entry["value"], list) else [entry["value"]]
    return value if index is None else [value[int(index)]]


def quotes(text):
    """(line, key, index, the numbers written before the marker) of each inline marker of `text`."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        start = 0
        for match in MARKER.finditer(line):
            before = line[start:match.start()]
            before = before[before.rfind("|") + 1:]  # this table cell alone
            found.append((number, match.group(1), match.group(2), NUMBER.findall(before)))
            start = match.end()
    return found


def block_quotes(text):
    """(line, key, the numbers of the code block) of each key of each `r-block` marker."""
    found = []
    for match in BLOCK_MARKER.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        numbers = NUMBER.findall(match.group(2))
        found += [(line, key, numbers) for key in match.group(1).split()]
    return found


def disagreements(path, text, figures):
    """One message per marked figure of `text` that is missing from or disagrees with `figures`."""
    problems = []
    for line, key, index, numbers in quotes(text):
        if key not in figures:
            problems.append(f"{path}:{line}: {key} is not in docs/results.json")
            continue
        wanted = values(figures[key], index)
        written = numbers[-len(wanted):] if len(numbers) >= len(wanted) else numbers
        if len(written) < len(wanted) or not all(agrees(q, v) for q, v in zip(written, wanted)):
            problems.append(f"{path}:{line}: {key} quotes {written}, results.json holds {wanted}")
    for line, key, numbers in block_quotes(text):
        if key not in figures:
            problems.append(f"{path}:{line}: {key} is not in docs/results.json")
            continue
        for value in values(figures[key]):
            if not any(agrees(q, value) for q in numbers):
                problems.append(f"{path}:{line}: the block below quotes no figure that is {key} = {value}")
    return problems


def test_every_entry_is_well_formed():
    figures = results()
    assert figures, "docs/results.json holds no figure"
    for key, entry in figures.items():
        check_entry(key, entry)


@pytest.mark.parametrize("path", PAGES)
def test_page_agrees_with_results(path):
    problems = disagreements(path, read(path), results())
    assert not problems, "\n".join(problems)


def test_the_reference_quotes_every_figure():
    text = read(REFERENCE)
    marked = {key for _, key, _, _ in quotes(text)} | {key for _, key, _ in block_quotes(text)}
    missing = sorted(set(results()) - marked)
    assert not missing, f"{REFERENCE} quotes no figure of these keys: {missing}"


# A version, not a figure: "keras-hub 0.32", "SQuAD 2.0".
VERSION = re.compile(r"(keras-hub|SQuAD|TensorFlow|Keras|MediaPipe|transformers|PyTorch|tasks-text:) ?v?$")
# Tables where every decimal figure must carry a marker: page -> headings of the sections.
MARKED_TABLES = {
    "README.md": ("## Results at a glance", "### Choose a quantization"),
    "mobile/README.md": ("## What to expect", "## A smaller model"),
}


def unmarked(text, headings):
    """(line, number) of each decimal number in a table row of the sections `headings` that no marker holds."""
    found, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            inside = line.strip() in headings
        if not inside or not line.startswith("|") or set(line) <= set("|- "):
            continue
        for cell in line.strip("|").split("|")[1:]:  # the first cell names the row
            held, start = set(), 0
            for match in MARKER.finditer(cell):
                numbers = [m for m in NUMBER.finditer(cell, start, match.start())]
                held |= {m.start() for m in numbers[-len(values_of(match)):]} if values_of(match) else set()
                start = match.end()
            found += [(number, m.group(0)) for m in NUMBER.finditer(cell)
                      if "." in m.group(0) and m.start() not in held and not VERSION.search(cell[:m.start()])]
    return found


def values_of(match):
    """The figures a marker holds, or [] when its key is not in the results file."""
    figures = results()
    return values(figures[match.group(1)], match.group(2)) if match.group(1) in figures else []


@pytest.mark.parametrize("path", sorted(MARKED_TABLES))
def test_the_main_tables_mark_every_figure(path):
    text = read(path)
    missing = unmarked(text, MARKED_TABLES[path])
    assert not missing, f"{path}: figures without a results marker (line, figure): {missing}"


def test_a_stale_figure_fails():
    """The check itself: the quickstart's accuracy edited by one hundredth is caught, inline and in a block."""
    figures = results()
    key = "text-classification.debian.quickstart.dev.accuracy"
    value = figures[key]["value"]
    fresh = f"| quickstart | {value:.2f}<!--r:{key}--> |\n<!--r-block: {key}-->\n```json\n{{\"accuracy\": {value / 100:.4f}}}\n```\n"
    assert disagreements("page.md", fresh, figures) == []
    stale_value = value + 0.01
    stale = f"| quickstart | {stale_value:.2f}<!--r:{key}--> |\n<!--r-block: {key}-->\n```json\n{{\"accuracy\": {stale_value / 100:.4f}}}\n```\n"
    assert len(disagreements("page.md", stale, figures)) == 2


@pytest.mark.parametrize("quoted, value, expected", [
    ("87.05", 87.05, True), ("87.1", 87.05, True), ("0.8705", 87.05, True), ("87.2", 87.05, False),
    ("1,089.8", 1089.8, True), ("4.9e-08", 4.86153268752787e-08, True), ("5.6e-08", 4.86153268752787e-08, False),
    ("−0.32", -0.32, True), ("0.999998", 0.9999982118606567, True), ("86.63", 87.05, False),
])
def test_agrees(quoted, value, expected):
    assert agrees(quoted, value) is expected


def test_record_writes_a_figure_and_refuses_a_bad_one(tmp_path):
    path = str(tmp_path / "results.json")
    results_module.record("task.data.dev.accuracy", [87.4, 0.61], "kbert finetune ...", "A", "2026-12-06", path=path)
    results_module.record("task.data.dev.f1", 85.1, "kbert finetune ...", "C", "2026-12-06", note="seed 0", path=path)
    with open(path, encoding="utf-8") as f:
        written = json.load(f)
    assert written == {
        "task.data.dev.accuracy": {"value": [87.4, 0.61], "command": "kbert finetune ...", "machine": "A", "date": "2026-12-06"},
        "task.data.dev.f1": {"value": 85.1, "command": "kbert finetune ...", "machine": "C", "date": "2026-12-06", "note": "seed 0"},
    }
    for key, value, machine in (("Accuracy", 1.0, "A"), ("task.data.f1", "high", "A"), ("task.data.f1", 1.0, "")):
        with pytest.raises(ValueError, match="results key"):
            results_module.record(key, value, "kbert finetune ...", machine, "2026-12-06", path=path)
    assert os.listdir(tmp_path) == ["results.json"]
