"""Exports a fine-tuned kbert model to TF Serving, TFLite and ONNX, verified.

The same program as `kbert export` (see `kbert/export/cli.py`):

    python tools/export.py --model runs/debian-minilm --out saved_models/debian \
        --data data/debian-packages/dev.csv --calibration data/debian-packages/train.csv

Exit status: 0 all artefacts within budget, 1 one is not, 2 bad input.
"""

import argparse
import sys

from kbert.export.cli import add_export_parser, run_export


def main(argv=None):
    parser = argparse.ArgumentParser(prog="export")
    add_export_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["export"] + list(sys.argv[1:] if argv is None else argv))
    try:
        return run_export(args)
    except (ValueError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"export: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
