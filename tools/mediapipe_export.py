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
on first use (about a minute of pip).

    python tools/mediapipe_export.py runs/debian-minilm --dev data/debian-packages/dev.csv
    python tools/copy_model_to_app.py saved_models/debian-minilm-mediapipe
"""

import argparse
import json
import os
import sys
import time


def export(model_folder, out, sequence_length=None, dev_csv=None, task_library=True, cache_dir=None):
    """Writes the files of the table above into `out`; returns the report."""
    from kbert.export import mediapipe
    from kbert.training.finetune import FinetunedModel, read_labelled_csv

    finetuned = FinetunedModel.load(model_folder)
    sequence_length = sequence_length or finetuned.sequence_length
    finetuned.config.check_sequence_length(sequence_length)
    if dev_csv is not None:
        texts, gold = read_labelled_csv(dev_csv)
    os.makedirs(out, exist_ok=True)
    paths = {"mediapipe": os.path.join(out, mediapipe.MEDIAPIPE_FILE)}
    if task_library:
        paths["task_library"] = os.path.join(out, mediapipe.TASK_LIBRARY_FILE)

    start = time.perf_counter()
    contracts = mediapipe.write_text_classifier(
        finetuned.model, finetuned.vocabulary, finetuned.labels, sequence_length, paths,
        cache_dir=cache_dir,
    )
    report = {
        "model": model_folder,
        "sequence_length": sequence_length,
        "export_seconds": round(time.perf_counter() - start, 1),
        "files": {},
    }
    for runtime, path in paths.items():
        contract = contracts[runtime]
        report["files"][os.path.basename(path)] = {
            "runtime": runtime,
            "bytes": os.path.getsize(path),
            "inputs": [
                {k: t[k] for k in ("signature_name", "metadata_name", "dtype", "shape")}
                for t in contract["inputs"]
            ],
            "output": {k: contract["outputs"][0][k] for k in ("metadata_name", "dtype", "shape")},
            "associated_files": contract["associated_files"],
        }
    _write_text(os.path.join(out, mediapipe.LABELS_FILE), "".join(f"{l}\n" for l in finetuned.labels))
    if dev_csv is not None:
        report["dev"] = mediapipe.compare_runtimes(
            finetuned.model, finetuned.vocabulary, finetuned.labels, finetuned.lowercase,
            paths["mediapipe"], texts, gold=gold, task_library_path=paths.get("task_library"),
            cache_dir=cache_dir,
        )
        report["dev"]["data"] = dev_csv
    _write_text(os.path.join(out, "report.json"), json.dumps(report, indent=2, ensure_ascii=False))
    return report


def _write_text(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="fine-tuned model folder (kbert finetune --out)")
    parser.add_argument("--out", help="output folder (default: saved_models/NAME-mediapipe)")
    parser.add_argument("--seq-len", type=int, help="fixed input length (default: the model's)")
    parser.add_argument("--dev", help="labelled CSV to compare MediaPipe with Keras on")
    parser.add_argument("--no-task-library", action="store_true",
                        help="skip the BertNLClassifier file")
    parser.add_argument("--cache-dir", help="where the tool environments live "
                        "(default: $XDG_CACHE_HOME/kbert or ~/.cache/kbert)")
    args = parser.parse_args(argv)
    name = os.path.basename(os.path.normpath(args.model))
    out = args.out or os.path.join("saved_models", f"{name}-mediapipe")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        report = export(args.model, out, args.seq_len, args.dev, not args.no_task_library,
                        args.cache_dir)
    except ValueError as error:
        sys.exit(f"mediapipe_export: error: {error}")
    summary = {"out": out, "files": sorted(report["files"])}
    if "dev" in report:
        dev = report["dev"]
        summary["dev"] = {
            "n": dev["n"],
            "keras_accuracy": dev["keras"]["accuracy"],
            "mediapipe": {k: dev["mediapipe"][k] for k in (
                "accuracy", "top1_agreement_with_keras", "top1_disagreements",
                "top1_disagreements_where_token_ids_differ")},
            "texts_whose_token_ids_differ": dev["tokenization"]["texts_whose_token_ids_differ"],
        }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
