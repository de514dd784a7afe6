"""The `kbert` command line: `main` (the console entry point) and `build_parser`.

`kbert.cli.main` holds the parser and the task commands; the pretraining
commands are in `kbert.cli.pretraining`, export's in `kbert.export.cli`.
"""

from kbert.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
