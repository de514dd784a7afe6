"""What the transformers peers share (`transformers_ner.py`, `transformers_qa.py`).

A peer's process runs PyTorch, and kbert's checkpoint and scoring helpers on
Keras over JAX's CPU backend: never TensorFlow, which crashes beside PyTorch
in one process here. Import this module before kbert. `train` is the loop
transformers' `Trainer` runs (the `Trainer` itself needs `accelerate`).
"""

import argparse
import os
import random
import sys
import time

import numpy as np
import torch
import transformers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ["JAX_PLATFORMS"] = "cpu"

from kbert.cliargs import positive_int  # noqa: E402


def arguments(doc):
    """A parser of the flags every peer takes (`--train`, `--dev`, `--init`, `--seed`, `--threads`),
    described by the first paragraph of `doc`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--dev", required=True)
    parser.add_argument("--init", default="all-minilm-l6-v2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive_int, default=os.cpu_count())
    return parser


def seed(value, threads):
    """Python's, NumPy's and PyTorch's generators from `value`; PyTorch on `threads` threads."""
    torch.set_num_threads(threads)
    random.seed(value), np.random.seed(value), torch.manual_seed(value)


def train(model, rows, recipe, seed_value, loss):
    """`Trainer`'s steps: AdamW at the recipe's peak with a linear decay and no
    warm-up, gradients clipped to norm 1 (`max_grad_norm`), the rows in a new
    order each epoch.

    Args:
        model: a transformers PyTorch model.
        rows: int. How many training rows there are.
        recipe: dict with `epochs`, `learning_rate`, `batch_size`, `weight_decay`.
        seed_value: int. Seeds the order of the rows.
        loss: callable. A batch's list of row indices -> its loss tensor.

    Returns:
        float. Seconds the training took; the model is left in eval mode.
    """
    size = recipe["batch_size"]
    steps = recipe["epochs"] * -(-rows // size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["learning_rate"],
                                  weight_decay=recipe["weight_decay"])
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, 0, steps)
    generator = torch.Generator().manual_seed(seed_value)
    started = time.perf_counter()
    model.train()
    for _ in range(recipe["epochs"]):
        for batch in torch.randperm(rows, generator=generator).split(size):
            loss(batch.tolist()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step(), schedule.step(), optimizer.zero_grad()
    seconds = time.perf_counter() - started
    model.eval()
    return seconds
