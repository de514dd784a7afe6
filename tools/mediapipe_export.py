"""Exports a fine-tuned model folder for MediaPipe's TextClassifier (Android app).

Writes into OUT (default `saved_models/NAME-mediapipe/`):

| file | for |
| --- | --- |
| `text_classifier.tflite` | MediaPipe `TextClassifier` (metadata by MediaPipe's writer) |
| `bert_nl_classifier.tflite` | TFLite Task Library `BertNLClassifier` (metadata by tflite-support's writer) |
| `labels.txt` | the labels in output order, one per line (the app reads it) |
| `report.json` | the contract read back, and with `--dev`, MediaPipe against Keras |

Both `.tflite` files hold the same float32 model with a softmax on top, at one
fixed sequence length (the model folder's unless `--seq-len`). MediaPipe and
tflite-support run in environments of their own, created under `--cache-dir`
on first use (about a minute of pip). See `kbert.export.mediapipe`.

    python tools/mediapipe_export.py runs/debian-minilm --dev data/debian-packages/dev.csv
    python tools/copy_model_to_app.py saved_models/debian-minilm-mediapipe
"""

import argparse
import json
import os
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="fine-tuned model folder (kbert finetune --out)")
    parser.add_argument("--out", help="output folder (default: saved_models/NAME-mediapipe)")
    parser.add_argument("--seq-len", type=int, help="fixed input length (default: the model's)")
    parser.add_argument("--dev", help="labelled CSV to compare MediaPipe with Keras on")
    parser.add_argument(
        "--no-task-library", action="store_true", help="skip bert_nl_classifier.tflite"
    )
    parser.add_argument(
        "--cache-dir",
        help="where the tool environments live (default: $XDG_CACHE_HOME/kbert or ~/.cache/kbert)",
    )
    args = parser.parse_args(argv)
    name = os.path.basename(os.path.normpath(args.model))
    out = args.out or os.path.join("saved_models", f"{name}-mediapipe")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from kbert.export.mediapipe import export_for_mediapipe
    from kbert.export.mediapipe_env import ToolEnvironmentError

    try:
        report = export_for_mediapipe(
            args.model, out, args.seq_len, args.dev, not args.no_task_library, args.cache_dir
        )
    except (ValueError, ToolEnvironmentError) as error:
        sys.exit(f"mediapipe_export: error: {error}")
    summary = {"out": out, "files": sorted(report["files"])}
    if "comparison" in report:
        comparison = report["comparison"]
        summary["dev"] = {
            "n": comparison["n"],
            "keras_accuracy": comparison["keras"]["accuracy"],
            "mediapipe": {
                key: comparison["mediapipe"][key]
                for key in (
                    "accuracy",
                    "top1_agreement_with_keras",
                    "top1_disagreements",
                    "top1_disagreements_where_token_ids_differ",
                    "milliseconds_per_text",
                )
            },
            "texts_whose_token_ids_differ": comparison["tokenization"]["texts_whose_token_ids_differ"],
        }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
