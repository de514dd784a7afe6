"""Texts per second of `kbert predict` beside transformers' pipeline and onnxruntime, in one run. Prints JSON.

| impl | what runs | tokenizer |
| --- | --- | --- |
| `kbert` | `kbert predict --model M --input texts.txt --output F.jsonl`, as a user runs it | kbert's (tf-text) |
| `transformers` | `pipeline("text-classification")` on PyTorch, `batch_size` texts a call, on the model folder converted to a Hugging Face `BertForSequenceClassification` | Hugging Face's fast BERT tokenizer, `truncation=True` |
| `onnxruntime` | kbert's ONNX int8 export (`kbert export --formats onnx --quantize dynamic`), texts sorted by length in batches of `batch_size` | Hugging Face's fast BERT tokenizer, texts cut as kbert cuts them |

    python tools/benchmarks/benchmark_predict.py --model runs/debian-minilm --work runs/bench-predict

Each impl runs in a process of its own (PyTorch and TensorFlow crash together in
one process here), on `--threads` threads, over the same texts: the training
texts of `data/debian-packages`, repeated to `--texts`. Each is timed end to end
on those texts and on `SMALL` of them, in rounds that alternate the impls'
order; texts/s is `(texts - SMALL) / (seconds - seconds on SMALL)`, start-up
(imports, loading, first traces) left out, the median over rounds. Before the
figures count, each impl's labels are compared with kbert's, and so are the
scores of texts kbert does not cut (pipeline truncation keeps a text's start,
kbert's default its start and end). The load average is printed with each run:
the machine may be shared.
"""

import argparse
import csv
import datetime
import itertools
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "data", "debian-packages", "train.csv")
IMPLS = ("kbert", "transformers", "onnxruntime")
# Each impl's name in docs/results.json's keys.
RESULT_NAMES = {"kbert": "kbert", "transformers": "transformers", "onnxruntime": "onnxruntime-int8"}
# Texts of the short run whose time, subtracted, leaves out each impl's start-up.
SMALL = 64
# A peer agrees with kbert when its scores of texts kbert does not cut are
# within this of kbert's: kbert's Debian model computes in bfloat16 (2^-8
# relative rounding), the peers in float32.
SCORE_TOLERANCE = 0.05


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="runs/debian-minilm", help="a text-classification model folder")
    parser.add_argument("--work", default="runs/bench-predict", help="folder for texts, outputs, conversions")
    parser.add_argument("--export", help="a kbert export folder with onnx/model_int8.onnx (default: WORK/export, "
                        "made if missing)")
    parser.add_argument("--texts", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--batch-size", type=int, default=64, help="texts a model call (kbert's default)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--record", metavar="MACHINE",
                        help="also write each texts/s to docs/results.json (predict.debian.IMPL.texts_per_second), "
                             "naming this machine of docs/benchmarks.md (A, B, C)")
    # A peer's own process (never TensorFlow beside PyTorch), and the conversion to Hugging Face.
    parser.add_argument("--run", choices=IMPLS[1:], help=argparse.SUPPRESS)
    parser.add_argument("--convert", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# === The run ===


def main(argv=None):
    args = parse_args(argv)
    if args.convert:
        return convert(args.model, args.output)
    if args.run:
        return run_peer(args)
    os.makedirs(args.work, exist_ok=True)
    texts = write_texts(args.work, args.texts)
    export = args.export or os.path.join(args.work, "export")
    files = {"onnx": os.path.join(export, "onnx", "model_int8.onnx"), "hf": os.path.join(args.work, "hf")}
    impls = args.impls.split(",")
    if "onnxruntime" in impls and not os.path.isfile(files["onnx"]):
        make_export(args.model, export)
    if "transformers" in impls and not os.path.isdir(files["hf"]):
        subprocess.run([sys.executable, __file__, "--convert", "--model", args.model, "--output", files["hf"]],
                       check=True)
    runs = {impl: [] for impl in impls}
    for round_number in range(args.rounds):
        for impl in impls if round_number % 2 == 0 else impls[::-1]:
            small = timed(impl, texts["small"], args, files)
            whole = timed(impl, texts["all"], args, files)
            runs[impl].append({"start_up_s": round(small["seconds"], 2), "seconds": round(whole["seconds"], 2),
                               "load": [small["load"], whole["load"]]})
            log(f"{impl}, round {round_number + 1}: {whole['seconds']:.1f} s ({small['seconds']:.1f} s on {SMALL})")
    figures = {impl: summary(impl_runs, args.texts) for impl, impl_runs in runs.items()}
    agreement = {impl: agree(args.work, impl) for impl in impls if impl != "kbert"} if "kbert" in impls else {}
    fastest = max(figure["texts_per_second"] for figure in figures.values())
    print(json.dumps({
        "command": "python tools/benchmarks/benchmark_predict.py " + " ".join(argv or sys.argv[1:]),
        "date": datetime.date.today().isoformat(), "machine": cpu_name(), "cores": os.cpu_count(),
        "threads": args.threads, "texts": args.texts, "batch_size": args.batch_size, "model": args.model,
        "figures": figures, "agreement_with_kbert": agreement,
        "kbert_over_fastest": round(figures["kbert"]["texts_per_second"] / fastest, 3) if "kbert" in figures else None,
    }, indent=2))
    if args.record:
        from results import record  # tools/benchmarks/results.py, beside this script

        command = "python tools/benchmarks/benchmark_predict.py " + " ".join(argv or sys.argv[1:])
        for impl, figure in figures.items():
            record(f"predict.debian.{RESULT_NAMES[impl]}.texts_per_second", figure["texts_per_second"], command,
                   args.record, note=f"{args.texts:,} texts, batch {args.batch_size}, {args.threads} threads")


def write_texts(work, count):
    """`{"all": path, "small": path}`: text files of `count` and `SMALL` Debian training texts, one a line."""
    with open(TRAIN, newline="", encoding="utf-8") as f:
        texts = [" ".join(row["text"].split()) for row in csv.DictReader(f)]
    paths = {"all": os.path.join(work, f"texts-{count}.txt"), "small": os.path.join(work, f"texts-{SMALL}.txt")}
    for path, n in ((paths["all"], count), (paths["small"], SMALL)):
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(text + "\n" for text in itertools.islice(itertools.cycle(texts), n))
    return paths


def make_export(model, export):
    subprocess.run([sys.executable, "-m", "kbert.cli", "export", "--model", model, "--out", export,
                    "--data", os.path.join(REPO, "data", "debian-packages", "dev.csv"), "--formats", "onnx",
                    "--quantize", "none,dynamic", "--latency-runs", "1", "--max-examples", "200"],
                   check=True, stdout=subprocess.DEVNULL)


def timed(impl, texts, args, files):
    """`{"seconds", "load"}` of one run of `impl` on the file `texts`, its predictions in WORK/IMPL.jsonl."""
    output = os.path.join(args.work, f"{impl}.jsonl")
    if os.path.exists(output):
        os.remove(output)
    threads = str(args.threads)
    if impl == "kbert":
        command = [sys.executable, "-m", "kbert.cli", "predict", "--model", args.model, "--input", texts,
                   "--output", output, "--batch-size", str(args.batch_size)]
    else:
        model = files["hf"] if impl == "transformers" else files["onnx"]
        command = [sys.executable, __file__, "--run", impl, "--model", model, "--input", texts, "--output", output,
                   "--threads", threads, "--batch-size", str(args.batch_size)]
    # TensorFlow's pools take their sizes from these; PyTorch and onnxruntime from --threads.
    env = {**os.environ, "TF_NUM_INTRAOP_THREADS": threads, "TF_NUM_INTEROP_THREADS": threads,
           "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return {"seconds": time.perf_counter() - start, "load": round(os.getloadavg()[0], 2)}


def summary(runs, texts):
    """texts/s of each round, and their median, start-up left out."""
    rates = sorted((texts - SMALL) / (run["seconds"] - run["start_up_s"]) for run in runs)
    median = rates[len(rates) // 2] if len(rates) % 2 else sum(rates[len(rates) // 2 - 1 : len(rates) // 2 + 1]) / 2
    return {"texts_per_second": round(median, 1), "each_round": [round(rate, 1) for rate in rates], "runs": runs}


def agree(work, impl):
    """How `impl`'s predictions of the last run agree with kbert's: the share of equal labels, and
    the largest score difference over texts kbert did not cut (both read them whole)."""
    ours, theirs = (read_lines(os.path.join(work, f"{name}.jsonl")) for name in ("kbert", impl))
    uncut = read_lines(os.path.join(work, "uncut.json"))[0] if impl == "transformers" else None
    same = sum(a["label"] == b["label"] for a, b in zip(ours, theirs)) / len(ours)
    compared = [(a, b) for i, (a, b) in enumerate(zip(ours, theirs)) if uncut is None or uncut[i]]
    diff = max(abs(a["scores"][label] - b["scores"][label]) for a, b in compared for label in a["scores"])
    if impl == "transformers" and diff > SCORE_TOLERANCE:
        raise SystemExit(f"transformers' scores differ from kbert's by {diff:.3f}: the conversion is wrong")
    return {"same_label": round(same, 4), "max_score_diff": round(diff, 4), "texts_compared": len(compared)}


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f] if path.endswith(".jsonl") else [json.load(f)]


def cpu_name():
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")


def log(line):
    print(f"{line} (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)


# === The conversion: a kbert folder as Hugging Face's BertForSequenceClassification ===


def convert(model, out):
    """Writes `out`: the model folder as transformers' `BertForSequenceClassification`
    (`kbert.export.huggingface.write_huggingface`, what `kbert export --formats huggingface`
    writes); and `uncut.json` beside it: which benchmark texts kbert reads whole."""
    from kbert.export.huggingface import write_huggingface
    from kbert.modelfolder import ModelFolder

    folder = ModelFolder.load(model)
    write_huggingface(folder, out)
    write_uncut(folder, os.path.dirname(os.path.abspath(out)))


def write_uncut(folder, work):
    """WORK/uncut.json: for each text of the largest WORK/texts-N.txt, whether kbert reads it whole."""
    paths = [name for name in os.listdir(work) if name.startswith("texts-") and name.endswith(".txt")]
    path = max(paths, key=lambda name: int(name[len("texts-"):-len(".txt")]))
    with open(os.path.join(work, path), encoding="utf-8") as f:
        texts = f.read().splitlines()
    encoded = folder.task.encode(folder.task.examples_from_texts(texts), targets=False)
    # A text packed shorter than the sequence length was not cut (one exactly as long may have been).
    uncut = encoded.features["padding_mask"].sum(axis=1) < folder.sequence_length
    with open(os.path.join(work, "uncut.json"), "w") as f:
        json.dump(uncut.tolist(), f)


# === The peers, each in a process of its own ===


def run_peer(args):
    with open(args.input, encoding="utf-8") as f:
        texts = f.read().splitlines()
    rows = transformers_pipeline(args, texts) if args.run == "transformers" else onnx_runtime(args, texts)
    with open(args.output, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": text, **row}, ensure_ascii=False) + "\n" for text, row in zip(texts, rows))


def transformers_pipeline(args, texts):
    os.environ["USE_TF"] = "0"
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    classify = transformers.pipeline("text-classification", model=args.model, device="cpu", top_k=None)
    rows = []
    for scores in classify(texts, batch_size=args.batch_size, truncation=True, max_length=128):
        best = max(scores, key=lambda s: s["score"])
        rows.append({"label": best["label"], "scores": {s["label"]: s["score"] for s in scores}})
    return rows


def onnx_runtime(args, texts):
    """kbert's int8 ONNX model on the texts cut and packed as kbert packs them (`head_tail`), sorted by
    length in batches (each padded to its longest)."""
    import numpy as np
    import onnxruntime
    from tokenizers import BertWordPieceTokenizer

    export = os.path.dirname(os.path.dirname(os.path.abspath(args.model)))
    tokenizer = BertWordPieceTokenizer(os.path.join(export, "vocab.txt"), lowercase=True)
    with open(os.path.join(export, "labels.txt"), encoding="utf-8") as f:
        labels = f.read().splitlines()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    session = onnxruntime.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    with open(os.path.join(export, "report.json"), encoding="utf-8") as f:
        length = json.load(f)["sequence_length"]
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    rows = [[cls, *head_tail(encoding.ids, length - 2), sep]
            for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]
    scores = np.zeros((len(texts), len(labels)), np.float32)
    order = np.argsort([len(row) for row in rows], kind="stable")
    for begin in range(0, len(order), args.batch_size):
        index = order[begin : begin + args.batch_size]
        width = max(len(rows[i]) for i in index)
        ids = np.zeros((len(index), width), np.int32)
        for k, i in enumerate(index):
            ids[k, : len(rows[i])] = rows[i]
        feeds = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": (ids > 0).astype(np.int32)}
        scores[index] = session.run(["scores"], feeds)[0]
    return [{"label": labels[int(row.argmax())], "scores": dict(zip(labels, map(float, row)))} for row in scores]


def head_tail(ids, keep):
    """kbert's `head_tail` cut: a text of more than `keep` pieces keeps its first half
    (rounded down) and its last pieces."""
    if len(ids) <= keep:
        return ids
    return ids[: keep // 2] + ids[len(ids) - (keep - keep // 2) :]


if __name__ == "__main__":
    sys.exit(main())
