"""The pretraining commands of `kbert`: tokenize, vocab, pretraining-data, pretrain.

`add_pretraining_commands(subparsers)` adds them; each `cmd_*` runs one and
imports TensorFlow only then, so `kbert --help` stays instant. Each `check_*`
makes the command's refusals that need no TensorFlow, before it loads.
"""

import os
import sys

from kbert.cliargs import add_command, fraction, learning_rate, positive_int
from kbert.cliio import CliError, check_output_file, is_vocab_file, print_json
from kbert.config import PACKAGED_CHECKPOINTS, PRESETS, resolve_checkpoint
from kbert.fileio import check_distinct, write_file
from kbert.pretraining.records_folder import check_records_out, is_records_folder, read_records_metadata
from kbert.pretraining.run_folder import check_run_folder


def cmd_tokenize(args):
    from kbert.text import BertPreprocessor, WordPieceTokenizer

    tokenizer = WordPieceTokenizer(args.vocab, lowercase=not args.cased)
    preprocessor = BertPreprocessor(tokenizer, sequence_length=None)
    for text in args.texts:
        packed = preprocessor([text])
        ids = packed["token_ids"][0].numpy()
        print_json([int(i) for i in ids[packed["padding_mask"][0].numpy() == 1]])


def check_vocab(args):
    check_output_file(
        "--out", args.out, args.overwrite, is_vocab_file, "a WordPiece vocabulary", {"--corpus": args.corpus}
    )


def cmd_vocab(args):
    from kbert.pretraining import learn_vocabulary

    vocabulary = learn_vocabulary(
        args.corpus, args.size, lowercase=not args.cased, min_count=args.min_count
    )
    text = "".join(token + "\n" for token in vocabulary).encode("utf-8")
    write_file(args.out, lambda f: f.write(text))
    print_json({"vocab": args.out, "size": len(vocabulary)})


def check_pretraining_data(args):
    check_distinct({"--out": args.out}, {"--corpus": args.corpus, "--vocab": args.vocab})
    check_records_out(args.out, args.overwrite)


def cmd_pretraining_data(args):
    from kbert.pretraining import read_metadata, write_pretraining_data

    write_pretraining_data(
        args.corpus,
        args.vocab,
        args.out,
        lowercase=not args.cased,
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob,
        dupe_factor=args.dupe_factor,
        short_seq_prob=args.short_seq_prob,
        whole_word_masking=args.whole_word_masking,
        random_seed=args.random_seed,
        num_shards=args.num_shards,
        num_workers=args.workers,
        overwrite=args.overwrite,
        progress=sys.stderr.isatty(),
    )
    metadata = read_metadata(args.out)
    print_json({
        "records": args.out,
        "shards": len(metadata["shards"]),
        "num_instances": metadata["num_instances"],
    })


def _pretraining_init(config):
    """A preset name or checkpoint as is; a BertConfig .json file read."""
    from kbert.config import BertConfig

    if _is_config_file(config):
        return BertConfig.from_json(config)
    return config


def _is_config_file(config):
    return config.endswith(".json") and os.path.isfile(config)


def _continues_checkpoint(args):
    """Whether --init names a checkpoint (a folder or a packaged name), not a preset or a config."""
    return not (args.config in PRESETS or _is_config_file(args.config))


def _pretraining_vocab(args):
    """The vocab.txt pretrain reads: --vocab, else the --records folder's, else the --init checkpoint's."""
    if args.vocab:
        return args.vocab
    if args.records and os.path.isdir(args.records):
        vocab = os.path.join(args.records, "vocab.txt")
        if not os.path.isfile(vocab):
            raise CliError(f"--records {args.records} holds no vocab.txt; pass --vocab")
        return vocab
    if _continues_checkpoint(args):
        vocab = os.path.join(resolve_checkpoint(args.config), "vocab.txt")
        if not os.path.isfile(vocab):
            raise CliError(f"--init {args.config} holds no vocab.txt; pass --vocab")
        return vocab
    data = "--corpus" if args.corpus else "a --records glob"
    raise CliError(f"--vocab is required with {data} and --init {args.config}, which has no vocabulary")


def check_pretrain(args):
    if bool(args.records) == bool(args.corpus):
        raise CliError("give either --records or --corpus")
    if _continues_checkpoint(args) and not (os.path.isdir(args.config) or args.config in PACKAGED_CHECKPOINTS):
        raise CliError(
            f"--init {args.config}: no such checkpoint folder, packaged checkpoint "
            f"({', '.join(sorted(PACKAGED_CHECKPOINTS))}), preset (such as bert_mini) or BertConfig .json file"
        )
    if args.records and args.whole_word_masking:
        raise CliError(
            "--whole-word-masking needs --corpus: records carry their masks "
            "(see kbert pretraining-data --whole-word-masking)"
        )
    vocab = _pretraining_vocab(args)
    check_distinct({"--out": args.out}, {"--records": args.records, "--corpus": args.corpus, "--vocab": vocab})
    check_run_folder(args.out, resumable=args.checkpoint_every is not None, name=f"--out {args.out}")
    _check_batch(args, vocab)


def _check_batch(args, vocab):
    """Refuses a --batch-size larger than the records, or than the machine's memory holds
    (`kbert.pretraining.batch_size`); reads a --config .json file, naming what is wrong in it."""
    from kbert.pretraining.batch_size import check_batch_size, model_shape

    metadata = read_records_metadata(args.records) if args.records and is_records_folder(args.records) else {}
    with open(vocab, "rb") as f:
        vocab_size = sum(1 for _ in f)
    check_batch_size(
        args.batch_size, args.records, model_shape(args.config, vocab_size),
        metadata.get("max_seq_length", args.seq_len), metadata.get("max_predictions_per_seq", args.max_predictions),
        (f"--batch-size {args.batch_size}", f"--records {args.records}"),
    )


def cmd_pretrain(args):
    import keras

    from kbert.fitting.distribute import get_strategy
    from kbert.pretraining import (
        make_dynamic_masking_dataset,
        make_pretraining_dataset,
        pretrain,
        read_metadata,
    )

    vocab = _pretraining_vocab(args)
    lowercase = not args.cased
    if args.records and os.path.isdir(args.records):
        try:
            lowercase = read_metadata(args.records)["lowercase"]
        except ValueError:
            pass
    elif args.corpus and _continues_checkpoint(args):
        from kbert.checkpoints import checkpoint_lowercase

        # The corpus is read as the checkpoint's tokenizer reads text.
        lowercase = checkpoint_lowercase(args.config)
        if args.cased and lowercase:
            raise CliError(f"--cased: --init {args.config} is uncased (its tokenizer lowercases); drop --cased")
    # Before any tf.data pipeline: MultiWorkerMirroredStrategy must configure
    # TensorFlow's collective ops first.
    strategy = get_strategy(args.strategy)
    if args.records:
        train = make_pretraining_dataset(
            args.records, args.batch_size, seq_len=args.seq_len, seed=args.seed
        )
    else:
        # Seeded before the pipeline is built, whose masking ops take their
        # seeds then: --seed fixes the masks too.
        keras.utils.set_random_seed(args.seed)
        train = make_dynamic_masking_dataset(
            args.corpus,
            vocab,
            args.batch_size,
            args.seq_len,
            args.max_predictions,
            lowercase=lowercase,
            seed=args.seed,
            whole_word_masking=args.whole_word_masking,
        )
    kwargs = {} if args.lr is None else {"learning_rate": args.lr}
    history = pretrain(
        train,
        args.out,
        vocab,
        init=_pretraining_init(args.config),
        batch_size=args.batch_size,
        num_train_steps=args.steps,
        num_warmup_steps=args.warmup_steps,
        optimizer=args.optimizer,
        log_every=args.log_every,
        lowercase=lowercase,
        jit_compile=not args.no_jit,
        dtype=args.dtype,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        deterministic=args.deterministic,
        strategy=strategy,
        next_sentence=bool(args.records),
        **kwargs,
    )
    final = {k: v for k, v in history["final"].items() if k in ("step", "loss", "masked_lm_accuracy")}
    print_json({
        "model": args.out,
        "final": final,
        "throughput": history["throughput"],
        "weights_sha256": history["weights_sha256"],
    })


def add_pretraining_commands(sub):
    """tokenize, vocab, pretraining-data, pretrain: BERT from raw text."""
    p = add_command(
        sub, "tokenize", "WordPiece ids with [CLS]/[SEP], one JSON list per text",
        (
            'kbert tokenize --vocab vocab.txt "Résumé of a package"',
            'kbert tokenize --vocab vocab.txt --cased "Résumé of a package" "a second text"',
        ),
    )
    p.add_argument("--vocab", required=True, help="vocab.txt")
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("texts", nargs="+", metavar="TEXT", help="texts to tokenize")
    p.set_defaults(run=cmd_tokenize, reads=("vocab",))

    p = add_command(
        sub, "vocab", "learn a WordPiece vocab.txt from raw text",
        (
            "kbert vocab --corpus corpus.txt.gz --size 30522 --out vocab.txt",
            "kbert vocab --corpus 'shards/*.txt' --size 8000 --min-count 5 --cased --out vocab.txt",
        ),
        usage="kbert vocab --corpus FILE --size N --out vocab.txt [options]",
    )
    p.add_argument("--corpus", required=True, help="text file(s) or glob; .gz read transparently")
    p.add_argument("--size", required=True, type=positive_int, help="largest vocabulary")
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("--min-count", type=positive_int, default=10, help="rarest piece kept")
    p.add_argument("--out", required=True, help="vocab.txt to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=cmd_vocab, check=check_vocab)

    p = add_command(
        sub, "pretraining-data", "masked-LM / next-sentence TFRecords (google-research/bert format)",
        (
            "kbert pretraining-data --corpus corpus.txt.gz --vocab vocab.txt --out records",
            "kbert pretraining-data --corpus corpus.txt.gz --vocab vocab.txt --max-seq-length 512 \\\n"
            "      --max-predictions-per-seq 76 --whole-word-masking --out records-512",
        ),
        usage="kbert pretraining-data --corpus FILE --vocab FILE --out DIR [options]",
    )
    p.add_argument(
        "--corpus", required=True,
        help="one sentence per line, blank lines between documents; file(s) or glob",
    )
    p.add_argument("--vocab", required=True, help="vocab.txt")
    p.add_argument("--out", required=True, help="folder for the shards")
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("--max-seq-length", type=positive_int, default=128, help="packed length")
    p.add_argument("--max-predictions-per-seq", type=positive_int, default=20, help="most masked positions")
    p.add_argument("--masked-lm-prob", type=fraction, default=0.15, help="share of the pieces masked")
    p.add_argument("--dupe-factor", type=positive_int, default=10, help="maskings of each document")
    p.add_argument("--short-seq-prob", type=fraction, default=0.1, help="share of shorter sequences")
    p.add_argument("--whole-word-masking", action="store_true", help="mask all pieces of a chosen word")
    p.add_argument("--random-seed", type=int, default=12345, help="seed of the masking and pairing")
    p.add_argument("--num-shards", type=positive_int, default=16, help="TFRecord files written")
    p.add_argument("--workers", type=positive_int, default=None, help="processes (default: CPU count)")
    p.add_argument("--overwrite", action="store_true", help="replace the records an earlier run wrote in --out")
    p.set_defaults(run=cmd_pretraining_data, check=check_pretraining_data, reads=("vocab",))

    p = add_command(
        sub, "pretrain", "masked-LM pretraining; rerun the same command to resume",
        (
            "kbert pretrain --records records --config bert_tiny --steps 10000 \\\n"
            "      --checkpoint-every 1000 --out runs/pretrain",
            "kbert pretrain --corpus corpus.txt.gz --vocab vocab.txt --config config.json --steps 10000 \\\n"
            "      --whole-word-masking --out runs/pretrain-dynamic",
            "kbert pretrain --corpus domain.txt --init all-minilm-l6-v2 --steps 2000 --batch-size 32 \\\n"
            "      --optimizer adamw --lr 1e-4 --out runs/domain",
        ),
        usage="kbert pretrain (--records DIR | --corpus FILE [--vocab FILE]) --config CONFIG --steps N "
        "--out DIR [options]",
    )
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--records", help="TFRecords: folder or glob from pretraining-data")
    data.add_argument("--corpus", help="raw text, masked on the fly (RoBERTa's dynamic masking)")
    p.add_argument(
        "--config", "--init", required=True, dest="config",
        help="BertConfig preset, a BertConfig .json file, or a checkpoint folder to continue",
    )
    p.add_argument("--vocab", help="vocab.txt (default: the --records folder's, else the --init checkpoint's)")
    p.add_argument(
        "--cased", action="store_true",
        help="with --corpus: keep case and accents (a checkpoint's own casing goes without it)",
    )
    p.add_argument("--steps", type=positive_int, required=True, help="optimizer steps")
    p.add_argument("--batch-size", type=positive_int, default=64, help="global batch")
    p.add_argument("--seq-len", type=positive_int, default=128, help="packed length")
    p.add_argument(
        "--max-predictions", type=positive_int, default=20,
        help="with --corpus: most masked positions per sequence",
    )
    p.add_argument(
        "--whole-word-masking", action="store_true",
        help="with --corpus: mask all pieces of a chosen word",
    )
    p.add_argument("--out", required=True, help="run folder (logs/, backup/, encoder/, ...)")
    p.add_argument(
        "--checkpoint-every", type=positive_int, default=None, metavar="K",
        help="save the training state every K steps; rerunning resumes from it (default: at the end only)",
    )
    p.add_argument("--log-every", type=positive_int, default=100, help="steps per logged window")
    p.add_argument(
        "--lr", type=learning_rate, default=None,
        help="peak learning rate (default: the optimizer's; LAMB: 1e-3)",
    )
    p.add_argument("--optimizer", choices=["lamb", "adamw"], default="lamb", help="LAMB (large batches) or AdamW")
    p.add_argument("--warmup-steps", type=int, default=None, help="default: 10%% of --steps")
    p.add_argument("--no-jit", action="store_true", help="do not compile with XLA")
    p.add_argument(
        "--dtype", choices=["float32", "mixed_bfloat16", "mixed_float16", "auto"], default="auto",
        help="auto: mixed_bfloat16 where the device multiplies bfloat16 natively, else float32",
    )
    p.add_argument("--seed", type=int, default=0, help="initial weights, dropout and shuffles")
    p.add_argument(
        "--deterministic", action="store_true",
        help="TensorFlow op determinism: bitwise reproducible, also across a resume",
    )
    p.add_argument(
        "--strategy",
        default="auto",
        help="tf.distribute strategy: auto, default, mirrored, multiworker (every worker "
        "runs this command with its TF_CONFIG) or tpu; --batch-size is the global batch",
    )
    p.set_defaults(run=cmd_pretrain, check=check_pretrain, reads=("vocab",))
