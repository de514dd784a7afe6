"""Pretrain a small BERT (L-4/H-256) from scratch on the Debian package corpus.

Four stages, each skipped when its output is already in `--out`:

1. `vocab.txt`: a WordPiece vocabulary learned from the corpus (tf-text's learner);
2. `records/`: masked-LM / next-sentence TFRecords in google-research/bert's
   format, written in parallel; the last shard is held out for evaluation;
3. `model/`: pretraining with `model.fit` (XLA), logged every `--log-every`
   steps to `model/history.json`, with the curves drawn in `curves.png`;
4. `finetune/`: the Debian package classifier fine-tuned from the pretrained
   encoder and from random initialisation (same shape and vocabulary) at
   each `--finetune-lr`, with otherwise equal settings; each encoder's best
   learning rate is compared in `finetune/comparison.json`, so neither side
   is judged at a learning rate that suits only the other.

The encoder lands in `model/encoder/` as a Hugging Face folder, so it can be
fine-tuned with `kbert finetune --init <out>/model/encoder`.

    # the README's hour on 2 CPU cores: AdamW 1e-3, 2500 steps of 64, bf16, no XLA
    python tools/benchmarks/pretrain_debian.py --corpus corpus.txt.gz --out runs/pretrain-debian \\
        --warmup-steps 200 --mixed-precision --no-jit
    python tools/benchmarks/pretrain_debian.py --corpus corpus.txt.gz --out runs/smoke \\
        --steps 20 --log-every 10 --dupe-factor 1 --max-documents 500   # smoke test
"""

import argparse
import gzip
import json
import os
import sys

# Stage 2 only reads corpus files; --max-documents writes a cut of the corpus.
SMOKE_CORPUS = "corpus-head.txt.gz"


def parse_args(argv=None):
    from kbert.cliargs import positive_int

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--corpus", required=True, help="one sentence per line, blank lines between documents"
    )
    p.add_argument("--out", default="runs/pretrain-debian")
    p.add_argument("--preset", default="bert_mini", help="model shape (bert_mini = L-4/H-256/A-4)")
    p.add_argument("--vocab-size", type=positive_int, default=8192)
    p.add_argument("--seq-len", type=positive_int, default=128)
    p.add_argument("--max-predictions", type=positive_int, default=20)
    p.add_argument("--dupe-factor", type=positive_int, default=4)
    p.add_argument("--whole-word-masking", action="store_true")
    p.add_argument("--num-shards", type=positive_int, default=16)
    p.add_argument("--workers", type=positive_int, default=None, help="processes writing records")
    p.add_argument("--max-documents", type=positive_int, default=None, help="use the first N documents")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--steps", type=positive_int, default=2500)
    p.add_argument("--warmup-steps", type=int, default=None, help="default: 10%% of --steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", choices=["lamb", "adamw"], default="adamw")
    p.add_argument("--log-every", type=positive_int, default=125)
    p.add_argument("--eval-steps", type=positive_int, default=20)
    p.add_argument("--mixed-precision", action="store_true", help="mixed_bfloat16")
    p.add_argument(
        "--no-jit", action="store_true",
        help="no XLA (on CPU, BERT-mini trains 1.5x faster without it)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train", default="data/debian-packages/train.csv", help="stage 4 training CSV")
    p.add_argument("--dev", default="data/debian-packages/dev.csv", help="stage 4 dev CSV")
    p.add_argument("--finetune-epochs", type=positive_int, default=3)
    p.add_argument(
        "--finetune-lr", type=float, nargs="+", default=[3e-4, 1e-3],
        help="peak learning rates tried for each encoder",
    )
    p.add_argument("--finetune-batch-size", type=positive_int, default=32)
    p.add_argument("--no-finetune", action="store_true", help="stop after stage 3")
    args = p.parse_args(argv)
    # Checked before an hour of pretraining, not after it.
    for lr in args.finetune_lr:
        if lr <= 0:
            p.error(f"--finetune-lr {lr:g}: expected a positive learning rate")
    if not args.no_finetune:
        for path in (args.train, args.dev):
            if not os.path.isfile(path):
                p.error(f"{path}: no such CSV for fine-tuning (see --train, --dev, --no-finetune)")
    return args


def cut_corpus(corpus, out, max_documents):
    """Writes the first `max_documents` documents of `corpus` to `out`."""
    from kbert.pretraining import read_documents

    documents = read_documents(corpus)[:max_documents]
    with gzip.open(out, "wt", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(document) for document in documents) + "\n")
    return out


def plot_curves(history, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = history["windows"]
    steps = [w["step"] for w in windows]
    panels = [
        ("loss", "loss (MLM + NSP)"),
        ("masked_lm_accuracy", "masked-LM accuracy"),
        ("next_sentence_accuracy", "next-sentence accuracy"),
    ]
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for axis, (name, title) in zip(axes, panels):
        axis.plot(steps, [w[name] for w in windows], label="train")
        if f"val_{name}" in windows[0]:
            axis.plot(steps, [w[f"val_{name}"] for w in windows], label="held-out shard")
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        axis.legend()
    settings = history["settings"]
    figure.suptitle(
        f"{settings['init']} {settings['optimizer']} lr={settings['learning_rate']} "
        f"batch={settings['batch_size']} seq={settings['seq_len']}: "
        f"{history['throughput']['sequences_per_second']:.0f} sequences/s"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def pretrain_stage(args, train_shards, eval_shards, model_dir, vocabulary):
    """Stage 3: pretraining with `kbert.pretraining.pretrain`; returns its history."""
    from kbert.pretraining import pretrain

    return pretrain(
        train_shards,
        model_dir,
        vocabulary,
        init=args.preset,
        eval_data=eval_shards,
        batch_size=args.batch_size,
        num_train_steps=args.steps,
        num_warmup_steps=args.warmup_steps,
        learning_rate=args.lr,
        optimizer=args.optimizer,
        log_every=args.log_every,
        eval_steps=args.eval_steps,
        jit_compile=not args.no_jit,
        dtype="mixed_bfloat16" if args.mixed_precision else None,
        seed=args.seed,
    )


def compare_finetuning(args, encoder, vocab_path):
    """Stage 4: fine-tunes from `encoder` and from random init; returns the comparison.

    Each encoder is fine-tuned at every `--finetune-lr`; the comparison is
    between each one's best dev accuracy (and the gain at every rate).
    """
    from kbert.fileio import write_file
    from kbert.training.finetune import finetune

    folder = os.path.join(args.out, "finetune")
    comparison_path = os.path.join(folder, "comparison.json")
    if os.path.isfile(comparison_path):
        print(f"[4/4] fine-tuning: reusing {comparison_path}", flush=True)
        with open(comparison_path) as f:
            return json.load(f)
    settings = dict(
        sequence_length=args.seq_len,
        batch_size=args.finetune_batch_size,
        epochs=args.finetune_epochs,
        dtype="mixed_bfloat16" if args.mixed_precision else None,
        seed=args.seed,
        strategy="default",
        verbose=2,
    )
    comparison = {"settings": {**settings, "train": args.train, "dev": args.dev}, "runs": []}
    for learning_rate in args.finetune_lr:
        for name, init, vocab in (
            ("pretrained", encoder, None),
            ("random_init", args.preset, vocab_path),
        ):
            model_dir = os.path.join(folder, f"{name}-lr{learning_rate:g}")
            if os.path.isfile(os.path.join(model_dir, "metrics.json")):
                # a run finished before an interruption
                print(f"[4/4] fine-tuning {name}: reusing {model_dir}", flush=True)
                with open(os.path.join(model_dir, "metrics.json")) as f:
                    metrics = json.load(f)
            else:
                print(f"[4/4] fine-tuning {name} ({init}) at lr {learning_rate:g}", flush=True)
                metrics = finetune(
                    args.train, args.dev, init, model_dir, vocab=vocab,
                    learning_rate=learning_rate, **settings,
                )
            run = {"init": name, "learning_rate": learning_rate}
            run.update({k: metrics[k] for k in ("accuracy", "macro_f1", "n", "train_seconds")})
            comparison["runs"].append(run)
            print(json.dumps(run), flush=True)
    for name in ("pretrained", "random_init"):
        runs = [run for run in comparison["runs"] if run["init"] == name]
        comparison[name] = max(runs, key=lambda run: run["accuracy"])
    for metric in ("accuracy", "macro_f1"):
        comparison[f"{metric}_gain"] = round(
            comparison["pretrained"][metric] - comparison["random_init"][metric], 4
        )
    comparison["accuracy_gain_at_each_lr"] = {
        f"{lr:g}": round(pretrained["accuracy"] - random_init["accuracy"], 4)
        for lr, pretrained, random_init in zip(
            args.finetune_lr, comparison["runs"][0::2], comparison["runs"][1::2]
        )
    }
    write_file(comparison_path, lambda f: json.dump(comparison, f, indent=2), "w")
    return comparison


def main(argv=None):
    args = parse_args(argv)
    from kbert.pretraining import learn_vocabulary, read_metadata, write_pretraining_data
    from kbert.text import load_vocab, save_vocab

    os.makedirs(args.out, exist_ok=True)
    corpus = args.corpus
    if args.max_documents:
        corpus = cut_corpus(corpus, os.path.join(args.out, SMOKE_CORPUS), args.max_documents)

    vocab_path = os.path.join(args.out, "vocab.txt")
    if os.path.isfile(vocab_path):
        print(f"[1/4] vocabulary: reusing {vocab_path}", flush=True)
        vocabulary = load_vocab(vocab_path)
    else:
        print(f"[1/4] vocabulary: learning {args.vocab_size} pieces from {corpus}", flush=True)
        vocabulary = learn_vocabulary(corpus, args.vocab_size)
        save_vocab(vocabulary, vocab_path)
    print(f"      {len(vocabulary)} tokens", flush=True)

    records = os.path.join(args.out, "records")
    if os.path.isfile(os.path.join(records, "pretraining_data.json")):
        print(f"[2/4] records: reusing {records}", flush=True)
    else:
        print(f"[2/4] records: writing {records}", flush=True)
        write_pretraining_data(
            corpus,
            vocabulary,
            records,
            max_seq_length=args.seq_len,
            max_predictions_per_seq=args.max_predictions,
            dupe_factor=args.dupe_factor,
            whole_word_masking=args.whole_word_masking,
            random_seed=12345 + args.seed,
            num_shards=args.num_shards,
            num_workers=args.workers,
            overwrite=True,
        )
    metadata = read_metadata(records)
    shards = sorted(os.path.join(records, name) for name in metadata["shards"])
    train_shards, eval_shards = (shards[:-1], shards[-1:]) if len(shards) > 1 else (shards, None)
    print(
        f"      {metadata['num_instances']} instances in {len(shards)} shards "
        f"({'last one held out' if eval_shards else 'no held-out shard'})",
        flush=True,
    )

    model_dir = os.path.join(args.out, "model")
    history_path = os.path.join(model_dir, "history.json")
    if os.path.isfile(history_path):
        print(f"[3/4] pretraining: reusing {model_dir}", flush=True)
        with open(history_path) as f:
            history = json.load(f)
    else:
        print(f"[3/4] pretraining {args.preset} for {args.steps} steps into {model_dir}", flush=True)
        history = pretrain_stage(args, train_shards, eval_shards, model_dir, vocabulary)
    plot_curves(history, os.path.join(args.out, "curves.png"))
    final = history["final"]
    summary = {
        "steps": final["step"],
        "masked_lm_accuracy": final["masked_lm_accuracy"],
        "next_sentence_accuracy": final["next_sentence_accuracy"],
        "val_masked_lm_accuracy": final.get("val_masked_lm_accuracy"),
        "val_next_sentence_accuracy": final.get("val_next_sentence_accuracy"),
        **history["throughput"],
        "history": os.path.join(model_dir, "history.json"),
        "curves": os.path.join(args.out, "curves.png"),
        "encoder": os.path.join(model_dir, "encoder"),
    }
    if not args.no_finetune:
        summary["finetune"] = compare_finetuning(args, summary["encoder"], vocab_path)
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
