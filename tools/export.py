"""`kbert export` as a script: a fine-tuned model to TF Serving, TFLite, ONNX and MediaPipe, each verified.

Takes `kbert export`'s arguments and returns its exit status (`kbert export --help`):

    python tools/export.py --model runs/debian-minilm --out saved_models/debian \
        --data data/debian-packages/dev.csv --calibration data/debian-packages/train.csv
"""

import sys

from kbert.cli import main

if __name__ == "__main__":
    sys.exit(main(["export", *sys.argv[1:]]))
