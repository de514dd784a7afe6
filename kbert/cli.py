"""The `kbert` command line.

Every subcommand imports TensorFlow only when it runs, so `--help` is instant.
Bad input ends with one line `kbert: error: ...` on stderr and exit status 2.
"""

import argparse
import json
import os
import sys
import tempfile

# sentence-transformers' all-MiniLM-L6-v2 truncates at 256 word pieces.
DEFAULT_EMBED_LENGTH = 256


class CliError(Exception):
    """An error to report in one line, without a traceback."""


def _quiet_tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _read_texts(path):
    """Texts from a .txt file (one per line) or a .json file (a list of strings)."""
    if not os.path.isfile(path):
        raise CliError(f"{path}: no such file")
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            try:
                texts = json.load(f)
            except json.JSONDecodeError as error:
                raise CliError(f"{path} is not valid JSON: {error}") from None
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise CliError(f"{path} must hold a JSON list of strings")
        else:
            texts = [line.rstrip("\n") for line in f]
    if not texts:
        raise CliError(f"{path} holds no texts")
    return texts


def _write_atomically(path, write):
    """Calls `write(file)` on a temporary file beside `path`, then renames it."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"{folder}: no such folder for {path}")
    fd, tmp = tempfile.mkstemp(prefix=".kbert-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def cmd_finetune(args):
    from kbert.training.finetune import finetune

    metrics = finetune(
        args.train,
        args.dev,
        args.init,
        args.out,
        text_column=args.text_column,
        label_column=args.label_column,
        sequence_length=args.seq_len,
        batch_size=args.batch_size,
        epochs=args.epochs,
        learning_rate=args.lr,
        jit_compile=args.xla,
        dtype=args.dtype,
        seed=args.seed,
        vocab=args.vocab,
    )
    summary = {k: metrics[k] for k in ("accuracy", "macro_f1", "n", "train_seconds")}
    print(json.dumps({"model": args.out, "dev": summary}))


def cmd_evaluate(args):
    from kbert.training.finetune import FinetunedModel, read_labelled_csv

    model = FinetunedModel.load(args.model)
    texts, labels = read_labelled_csv(args.data, args.text_column, args.label_column)
    metrics = model.evaluate(texts, labels, source=args.data, batch_size=args.batch_size)
    print(json.dumps(metrics))


def cmd_predict(args):
    from kbert.training.finetune import FinetunedModel

    if bool(args.texts) == bool(args.input):
        raise CliError("give either TEXT arguments or --input FILE")
    texts = args.texts or _read_texts(args.input)
    model = FinetunedModel.load(args.model)
    for row in model.predict(texts, batch_size=args.batch_size):
        print(json.dumps(row, ensure_ascii=False))


def cmd_embed(args):
    import numpy as np

    from kbert.models import bert_embedder
    from kbert.text import BertPreprocessor, WordPieceTokenizer
    from kbert.training.finetune import SETTINGS_FILE, FinetunedModel, text_dataset

    texts = _read_texts(args.input)
    if not args.output.endswith(".npy"):
        raise CliError(f"--output {args.output}: expected a .npy file name")
    if os.path.isfile(os.path.join(args.model, SETTINGS_FILE)):
        finetuned = FinetunedModel.load(args.model)
        config, encoder = finetuned.config, finetuned.encoder
        vocabulary, lowercase = finetuned.vocabulary, finetuned.lowercase
    else:
        from kbert.checkpoints import load_hf_checkpoint

        config, vocabulary, lowercase, encoder = load_hf_checkpoint(args.model)
    length = min(args.seq_len, config.max_position_embeddings)
    preprocessor = BertPreprocessor(WordPieceTokenizer(vocabulary, lowercase=lowercase), length)
    embeddings = bert_embedder(encoder).predict(
        text_dataset(texts, preprocessor, args.batch_size), verbose=0
    )
    _write_atomically(args.output, lambda f: np.save(f, embeddings.astype("float32")))
    print(json.dumps({"output": args.output, "shape": list(embeddings.shape)}))


def cmd_tokenize(args):
    from kbert.text import BertPreprocessor, WordPieceTokenizer

    tokenizer = WordPieceTokenizer(args.vocab, lowercase=not args.cased)
    preprocessor = BertPreprocessor(tokenizer, sequence_length=None)
    for text in args.texts:
        packed = preprocessor([text])
        ids = packed["token_ids"][0].numpy()
        print(json.dumps([int(i) for i in ids[packed["padding_mask"][0].numpy() == 1]]))


def _positive_int(value):
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return number


def build_parser():
    parser = argparse.ArgumentParser(
        prog="kbert", description="BERT for Keras 3: fine-tune, evaluate, predict, embed."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("finetune", help="fine-tune a classifier on a labelled CSV")
    p.add_argument("--train", required=True, help="training CSV")
    p.add_argument("--dev", required=True, help="dev CSV, evaluated after training")
    p.add_argument("--text-column", default="text")
    p.add_argument("--label-column", default="label")
    p.add_argument(
        "--init",
        required=True,
        help="Hugging Face checkpoint folder, 'all-minilm-l6-v2', or a BertConfig preset",
    )
    p.add_argument("--vocab", help="vocab.txt (required when --init is a preset)")
    p.add_argument("--seq-len", type=_positive_int, default=128)
    p.add_argument("--batch-size", type=_positive_int, default=32)
    p.add_argument("--epochs", type=_positive_int, default=3)
    p.add_argument("--lr", type=float, default=5e-5, help="peak learning rate")
    p.add_argument("--xla", action="store_true", help="compile the train step with XLA")
    p.add_argument("--dtype", default=None, help="dtype policy, e.g. mixed_bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="model folder to write")
    p.set_defaults(run=cmd_finetune)

    p = sub.add_parser("evaluate", help="accuracy and macro-F1 of a model on a labelled CSV")
    p.add_argument("--model", required=True, help="fine-tuned model folder")
    p.add_argument("--data", required=True, help="labelled CSV")
    p.add_argument("--text-column", default="text")
    p.add_argument("--label-column", default="label")
    p.add_argument("--batch-size", type=_positive_int, default=64)
    p.set_defaults(run=cmd_evaluate)

    p = sub.add_parser("predict", help="labels and scores as JSON lines")
    p.add_argument("--model", required=True, help="fine-tuned model folder")
    p.add_argument("texts", nargs="*", metavar="TEXT")
    p.add_argument("--input", help="a .txt file (one text per line) or a .json list")
    p.add_argument("--batch-size", type=_positive_int, default=64)
    p.set_defaults(run=cmd_predict)

    p = sub.add_parser("embed", help="L2-normalised sentence embeddings to a .npy file")
    p.add_argument(
        "--model", required=True,
        help="fine-tuned model folder, Hugging Face folder, or 'all-minilm-l6-v2'",
    )
    p.add_argument("--input", required=True, help="a .txt file (one text per line) or a .json list")
    p.add_argument("--output", required=True, help="the .npy file to write")
    p.add_argument("--seq-len", type=_positive_int, default=DEFAULT_EMBED_LENGTH)
    p.add_argument("--batch-size", type=_positive_int, default=64)
    p.set_defaults(run=cmd_embed)

    p = sub.add_parser("tokenize", help="WordPiece ids with [CLS]/[SEP], one JSON list per text")
    p.add_argument("--vocab", required=True, help="vocab.txt")
    p.add_argument("--cased", action="store_true", help="keep case and accents")
    p.add_argument("texts", nargs="+", metavar="TEXT")
    p.set_defaults(run=cmd_tokenize)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_tensorflow()
    try:
        args.run(args)
    except (CliError, ValueError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"kbert: error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
