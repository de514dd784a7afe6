"""Records a figure in docs/results.json, the one file the docs' figures come from.

Each key names one figure, dotted from the general to the particular
(`text-classification.debian.quickstart.dev.accuracy`), and holds
`{"value", "command", "machine", "date"}` and an optional `"note"`:

- value: a number, or a list of numbers quoted together in that order
  (`[87.40, 0.61]` for "87.40 ± 0.61", `[316, 355]` for "316–355 s").
  Percentages are stored as percent (87.05); a page may quote them as a
  fraction (0.8705), as the commands print them.
- command: what reproduces it. machine: a name of docs/benchmarks.md's
  machines table (A, B, C, H200). date: YYYY-MM-DD of the run.

A page quotes a figure with a marker right after it, `87.05<!--r:KEY-->`, or
lists the keys of a code block's figures on the line above its fence,
`<!--r-block: KEY KEY-->`; tests/test_results_consistency.py holds every
marked figure to this file.

    python tools/benchmarks/results.py KEY VALUE [VALUE ...] --command "..." --machine A [--date D] [--note "..."]

or, from a benchmark script, `record(key, value, command, machine)`.
"""

import argparse
import datetime
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results.json")
# A key: lower-case words of letters, digits, `-` and `_`, joined by dots.
KEY = re.compile(r"^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
FIELDS = ("value", "command", "machine", "date", "note")


def load(path=RESULTS):
    """The figures of `path` as a dict key -> entry; {} when the file does not exist."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def check_entry(key, entry):
    """Raises ValueError naming `key` unless `entry` is a figure of the documented form."""
    if not KEY.match(key):
        raise ValueError(f"results key {key!r}: expected lower-case words joined by dots")
    if not isinstance(entry, dict) or set(entry) - set(FIELDS) or not {"value", "command", "machine", "date"} <= set(entry):
        raise ValueError(f"results key {key!r}: expected {{value, command, machine, date[, note]}}, got {entry!r}")
    values = entry["value"] if isinstance(entry["value"], list) else [entry["value"]]
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"results key {key!r}: value {entry['value']!r} is not a number or a list of numbers")
    for field in ("command", "machine"):
        if not isinstance(entry[field], str) or not entry[field].strip():
            raise ValueError(f"results key {key!r}: {field} {entry[field]!r} is empty")
    if not isinstance(entry["date"], str) or not DATE.match(entry["date"]):
        raise ValueError(f"results key {key!r}: date {entry['date']!r} is not YYYY-MM-DD")


def record(key, value, command, machine, date=None, note=None, path=RESULTS):
    """Sets figure `key` in `path` (docs/results.json) and returns its entry.

    Args:
        key: str. The figure's dotted name.
        value: float or list of float. The figure, or the numbers quoted together.
        command: str. The command that reproduces it.
        machine: str. A machine of docs/benchmarks.md (A, B, C, H200).
        date: str. YYYY-MM-DD of the run; today (UTC) when None.
        note: str. What a reader needs to read the figure right (seeds, load).
        path: str. The results file.

    Example:
        record("text-classification.debian.tfidf.dev.accuracy", 81.7,
               "python tools/benchmarks/benchmark_finetune.py ... --baselines tfidf", "A")
    """
    entry = {
        "value": [float(v) for v in value] if isinstance(value, (list, tuple)) else value,
        "command": command,
        "machine": machine,
        "date": date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }
    if note:
        entry["note"] = note
    check_entry(key, entry)
    results = load(path)
    results[key] = entry
    # Written aside and renamed, so a crash never leaves half a file.
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(dict(sorted(results.items())), f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(temporary, path)
    return entry


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("key")
    parser.add_argument("value", nargs="+", type=float, help="the figure, or the numbers quoted together")
    parser.add_argument("--command", required=True, help="the command that reproduces it")
    parser.add_argument("--machine", required=True, help="a machine of docs/benchmarks.md: A, B, C, H200")
    parser.add_argument("--date", help="YYYY-MM-DD of the run (default: today, UTC)")
    parser.add_argument("--note")
    parser.add_argument("--results", default=RESULTS, help="the results file (default: docs/results.json)")
    args = parser.parse_args(argv)
    value = args.value[0] if len(args.value) == 1 else args.value
    try:
        entry = record(args.key, value, args.command, args.machine, args.date, args.note, args.results)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps({args.key: entry}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
