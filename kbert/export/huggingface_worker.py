"""Runs a transformers folder on PyTorch, for the export's verification.

PyTorch and TensorFlow crash together in one process, so `run_worker` runs
this module in a process of its own, which imports neither TensorFlow nor the
rest of kbert:

    python -m kbert.export.huggingface_worker REQUEST.json REPLY.json

The request names the folder, its `kind` (`KINDS`) and an `.npz` of int32
rows (`token_ids`, `segment_ids`, `padding_mask`, kbert's own), and may hold
`texts` to tokenize with the folder's own tokenizer (`AutoTokenizer`). The
worker loads the model as a user does (`AutoModelFor...from_pretrained`,
or `SentenceTransformer` for an embedding folder), runs it on both, and
writes the outputs, under kbert's output names, to `request["outputs"]`
(`.npz`: `tokens/NAME` for kbert's rows, `texts/NAME` and `texts/input_ids`
for the tokenizer's); the reply (JSON) holds what `from_pretrained` found
missing or unexpected, the batch-1 latency and the library versions.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The worker's kinds (`kbert.export.huggingface.Head.kind`) and the transformers class each loads.
KINDS = {
    "sequence": "AutoModelForSequenceClassification",
    "tokens": "AutoModelForTokenClassification",
    "spans": "AutoModelForQuestionAnswering",
    "masked-lm": "AutoModelForMaskedLM",
    "embedding": "SentenceTransformer",
}
# Rows a model call.
BATCH_SIZE = 32
# Untimed batch-1 calls before the timed ones (as `kbert.export.verify.WARMUP_RUNS`).
WARMUP_RUNS = 5
# Kept of a failing worker's output in the error message.
OUTPUT_TAIL_CHARS = 3000


class WorkerError(RuntimeError):
    """The worker failed: transformers refused the folder, or PyTorch crashed."""


def run_worker(request, timeout=3600):
    """Runs this module on `request` (a JSON-able dict) in a new process; its reply.

    Raises:
        ValueError: naming what to install, where transformers or PyTorch is missing.
        WorkerError: the worker failed otherwise; quotes its output.
    """
    import kbert

    root = os.path.dirname(os.path.dirname(os.path.abspath(kbert.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
               USE_TF="0", TRANSFORMERS_NO_ADVISORY_WARNINGS="1", TOKENIZERS_PARALLELISM="false")
    with tempfile.TemporaryDirectory(prefix="kbert-hf-") as tmp:
        paths = [os.path.join(tmp, name) for name in ("request.json", "reply.json")]
        with open(paths[0], "w", encoding="utf-8") as f:
            json.dump(request, f)
        result = subprocess.run([sys.executable, "-m", "kbert.export.huggingface_worker", *paths],
                                capture_output=True, text=True, env=env, timeout=timeout)
        if result.returncode != 0:
            output = result.stderr + result.stdout
            missing = next((line for line in output.splitlines() if line.startswith(MISSING)), None)
            if missing:  # one line for the user, as bad input gets (`kbert.cli.main`)
                raise ValueError(missing)
            code = result.returncode
            how = f"crashed with signal {-code}" if code < 0 else f"exited with status {code}"
            tail = output if len(output) <= OUTPUT_TAIL_CHARS else "..." + output[-OUTPUT_TAIL_CHARS:]
            raise WorkerError(f"the transformers worker {how}:\n{tail}")
        with open(paths[1], encoding="utf-8") as f:
            return json.load(f)


# The first words of the line the worker prints when a library is missing.
MISSING = "the huggingface export is verified by transformers on PyTorch"


def _imports(kind):
    """torch, transformers (and sentence_transformers for embeddings), or exit naming what to install."""
    try:
        import torch
        import transformers

        st = None
        if kind == "embedding":
            import sentence_transformers as st
    except ImportError as error:
        what = "transformers torch sentence-transformers" if kind == "embedding" else "transformers torch"
        sys.exit(f"{MISSING}, which this Python lacks ({error}): pip install {what}")
    return torch, transformers, st


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: python -m kbert.export.huggingface_worker REQUEST.json REPLY.json")
    with open(argv[1], encoding="utf-8") as f:
        request = json.load(f)
    reply = run(request)
    with open(argv[2], "w", encoding="utf-8") as f:
        json.dump(reply, f)


def run(request):
    import numpy as np

    kind = request["kind"]
    torch, transformers, st = _imports(kind)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(request["threads"])
    folder = request["folder"]
    if kind == "embedding":
        # Loaded as a user loads it; its weights checked as the Transformer module loads them.
        _, info = transformers.AutoModel.from_pretrained(folder, output_loading_info=True)
        model = st.SentenceTransformer(folder, device="cpu")
        model.eval()
    else:
        auto = getattr(transformers, KINDS[kind])
        model, info = auto.from_pretrained(folder, output_loading_info=True)
        model.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    with np.load(request["features"]) as saved:
        features = {name: saved[name] for name in saved.files}
    call = _caller(kind, model, torch, np, request)
    saved = {f"tokens/{k}": v for k, v in _in_batches(call, features, np).items()}
    texts = request.get("texts")
    if texts:
        encoded = tokenizer(*texts, truncation=True, max_length=request["max_length"], padding="max_length",
                            return_tensors="np", return_token_type_ids=True)
        rows = {"token_ids": encoded["input_ids"], "segment_ids": encoded["token_type_ids"],
                "padding_mask": encoded["attention_mask"]}
        saved.update({f"texts/{k}": v for k, v in _in_batches(call, rows, np).items()})
        saved["texts/input_ids"] = encoded["input_ids"]
    np.savez(request["outputs"], **saved)
    one = {k: v[:1] for k, v in features.items()}
    return {
        "loading_info": {key: sorted(map(str, value)) for key, value in info.items()},
        "latency": _latency(lambda: call(one), request["latency_runs"]),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     **({"sentence_transformers": st.__version__} if st else {})},
        "tokenizer": type(tokenizer).__name__,
    }


def _caller(kind, model, torch, np, request):
    """`call(rows)`: the model on a dict of int rows -> kbert's outputs (numpy)."""

    def tensors(rows):
        return {"input_ids": torch.tensor(rows["token_ids"], dtype=torch.long),
                "token_type_ids": torch.tensor(rows["segment_ids"], dtype=torch.long),
                "attention_mask": torch.tensor(rows["padding_mask"], dtype=torch.long)}

    @torch.no_grad()
    def call(rows):
        inputs = tensors(rows)
        if kind == "embedding":
            return {"embedding": model(inputs)["sentence_embedding"].numpy()}
        outputs = model(**inputs)
        if kind == "spans":
            return {"start_logits": outputs.start_logits.numpy(), "end_logits": outputs.end_logits.numpy()}
        if kind == "masked-lm":
            return _fill_mask(outputs.logits, rows["token_ids"], request["fill_mask"], torch, np)
        return {"logits": outputs.logits.numpy()}

    return call


def _fill_mask(logits, token_ids, settings, torch, np):
    """The `top_k` words of each row's first `max_masks` `[MASK]`s and their probabilities,
    as kbert's fill-mask gives them: ids -1 and probabilities 0 past a row's `[MASK]`s."""
    rows, masks, top_k = len(token_ids), settings["max_masks"], settings["top_k"]
    ids = np.full((rows, masks, top_k), -1, np.int32)
    scores = np.zeros((rows, masks, top_k), np.float32)
    probabilities = torch.softmax(logits.float(), dim=-1)
    for row in range(rows):
        positions = np.flatnonzero(np.asarray(token_ids[row]) == settings["mask_id"])[:masks]
        for slot, position in enumerate(positions):
            top = torch.topk(probabilities[row, position], top_k)
            ids[row, slot], scores[row, slot] = top.indices.numpy(), top.values.numpy()
    return {"word_ids": ids, "word_scores": scores}


def _in_batches(call, rows, np):
    count = len(next(iter(rows.values())))
    chunks = [call({k: v[start : start + BATCH_SIZE] for k, v in rows.items()}) for start in range(0, count, BATCH_SIZE)]
    return {name: np.concatenate([chunk[name] for chunk in chunks]) for name in chunks[0]}


def _latency(call, runs):
    """Median and 90th percentile of `runs` timed calls in milliseconds, as `kbert.export.verify.measure_latency`."""
    for _ in range(WARMUP_RUNS):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return {"median_ms": round(statistics.median(times), 3),
            "p90_ms": round(times[min(len(times) - 1, int(0.9 * len(times)))], 3), "runs": runs}


if __name__ == "__main__":
    main(sys.argv)
