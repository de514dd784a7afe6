"""The `kbert` command line: `main` (the console entry point) and `build_parser`.

`kbert.cli.main` holds the parser and `main`; the commands are in
`kbert.cli.training` (finetune, distill), `kbert.cli.use` (evaluate, predict,
embed, search), `kbert.cli.export` (export) and `kbert.cli.pretraining`.
"""

from kbert.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
