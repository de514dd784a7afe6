"""What the two training workers of `gpu_train.py` share: the job, the batches, the result.

A job is one measurement (a model shape, a sequence length, a batch size) run
in its own process, so each stack has the whole accelerator and its peak
memory is that job's alone. The worker reads the job as JSON from argv and
prints its result as the last line of stdout, after `RESULT_PREFIX`.
Nothing here imports a framework.
"""

import json
import resource
import sys
import time

import numpy as np

RESULT_PREFIX = "RESULT "
# The losses shown beside the sanity check: the mean of the first and of the
# last fifth of the timed steps (at least one step each). The check itself is
# the slope of a line fitted to all timed losses, which one noisy batch at
# either end does not flip.
LOSS_WINDOW_FRACTION = 0.2


def read_job():
    return json.loads(sys.argv[1])


def report(result):
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def load_batches(path, part, batch_size, count):
    """`count` consecutive batches of `part` (e.g. "pretrain_128"), cycling over its rows.

    Returns a list of dicts of int32/float32 numpy arrays, the same for every
    stack, so both train on the same real text in the same order.
    """
    with np.load(path) as data:
        prefix = part + "."
        arrays = {k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)}
    if not arrays:
        raise ValueError(f"{path} holds no arrays of {part!r}; run tools/benchmarks/gpu_data.py")
    rows = len(arrays["token_ids"])
    batches = []
    for step in range(count):
        index = (np.arange(batch_size) + step * batch_size) % rows
        batches.append({
            name: value[index].astype("float32" if name == "masked_lm_weights" else "int32")
            for name, value in arrays.items()
        })
    return batches


def timed_training(step, batches, warmup_steps):
    """Runs `step(batch) -> float loss` over `batches`; the first `warmup_steps` untimed.

    Each step returns a host float, so every step is waited for and the time
    is the training time, not the time to enqueue it.
    """
    start = time.perf_counter()
    losses = [step(batch) for batch in batches[:warmup_steps]]
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    timed = [step(batch) for batch in batches[warmup_steps:]]
    elapsed = time.perf_counter() - start
    window = max(1, int(len(timed) * LOSS_WINDOW_FRACTION))
    first, last = float(np.mean(timed[:window])), float(np.mean(timed[-window:]))
    slope = float(np.polyfit(np.arange(len(timed)), timed, 1)[0])
    return {
        "step_s": elapsed / len(timed),
        "warmup_s": round(warmup_s, 2),
        "loss_first": round(first, 4),
        "loss_last": round(last, 4),
        "loss_slope_per_step": round(slope, 5),
        "loss_fell": bool(np.isfinite(timed).all() and slope < 0),
        "losses": [round(float(x), 4) for x in losses + timed],
    }


def host_peak_bytes():
    """Peak resident memory of this process (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def matmul_tflops(matmul, size, products, repeats):
    """Median rate of `matmul()` (`products` size³ products, waited for) after two warm-ups."""
    matmul()
    matmul()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul()
        times.append(time.perf_counter() - start)
    return 2 * size**3 * products / float(np.median(times)) / 1e12
