"""`kbert export` of the quantized files only: TFLite fp16, dynamic, int8 and 16x8, ONNX dynamic.

Takes `kbert export`'s arguments (`kbert export --help`); `--formats` and
`--quantize` given here replace the two below. Each file is verified against
the Keras model on --data; int8 and 16x8 calibrate on --calibration.

    python tools/quantize.py --model runs/debian-minilm --out saved_models/debian-int8 \
        --data data/debian-packages/dev.csv --calibration data/debian-packages/train.csv
"""

import sys

from kbert.cli import main
from kbert.export.options import QUANTIZATIONS

if __name__ == "__main__":
    quantized = ",".join(q for q in QUANTIZATIONS if q != "none")
    sys.exit(main(["export", "--formats", "tflite,onnx", "--quantize", quantized, *sys.argv[1:]]))
