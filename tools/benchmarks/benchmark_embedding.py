"""Figures of the sentence-embedding task on all-MiniLM-L6-v2. Prints JSON.

Parts (`--parts`, default all):

| part | measures |
| --- | --- |
| `evaluate` | STS-B dev Pearson and Spearman by cosine, Keras, at sentence-transformers' length (256) and at `--seq-len`; the longest dev text in word pieces |
| `export` | `kbert export --task sentence-embedding` at `--seq-len` on STS-B dev (calibration: STS-B train): every artefact's Spearman, cosines to Keras, batch-1 latency, size, verdict |
| `latency` | batch-1 latency of the export's artefacts and the Keras model, interleaved in rounds (MediaPipe's is in `export`: it runs in its own process) |
| `mediapipe` | MediaPipe's `TextEmbedder` (length 256) on the held-out sentences of `tests/data/minilm_reference`, cosine to sentence-transformers' embeddings, and whether its token ids are the reference's |
| `tokenizer` | how often MediaPipe's BERT tokenizer gives other ids than the checkpoint's, on STS-B dev, Debian dev and Debian corpus documents |
| `search` | `kbert search` on Debian corpus documents: index build (texts/s), queries/s embedded one at a time and in one batch, search time alone |
| `search_scaling` | search time alone on the `search` part's index repeated to `SCALING_ROWS` rows, one query at a time and in batches |

    python tools/benchmarks/benchmark_embedding.py --out runs/embedding-benchmark > embedding.json

Data are read from `../shared/data` beside the repository (STS-B, the Debian
corpus) and from `data/debian-packages`. The load average is printed before
and after each part: the machine may be shared.
"""

import argparse
import gzip
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(REPO, "..", "shared", "data")
STSB_DEV = os.path.join(SHARED, "glue-stsb", "dev.tsv")
STSB_TRAIN = os.path.join(SHARED, "glue-stsb", "train.tsv")
DEBIAN_CORPUS = os.path.join(SHARED, "debian-packages", "corpus.txt.gz")
DEBIAN_DEV = os.path.join(REPO, "data", "debian-packages", "dev.csv")
REFERENCE = os.path.join(REPO, "tests", "data", "minilm_reference")
CHECKPOINT = "all-minilm-l6-v2"
TASK = "sentence-embedding"
PARTS = ("evaluate", "export", "latency", "mediapipe", "tokenizer", "search", "search_scaling")
# Latency: timed batch-1 runs per artefact and round; rounds interleave the
# artefacts so that a burst of load on a shared machine hits them alike.
LATENCY_RUNS_PER_ROUND = 20
LATENCY_ROUNDS = 5
# Rows of the synthetic index of `search_scaling`: where brute force stops being the tool.
SCALING_ROWS = 1_000_000
SCALING_BATCH = 64
# sentence-transformers' max_seq_length for all-MiniLM-L6-v2.
REFERENCE_LENGTH = 256


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated, of " + ", ".join(PARTS))
    parser.add_argument("--out", required=True, help="folder for the export and the index (new or reused)")
    parser.add_argument("--seq-len", type=int, default=128, help="export length")
    parser.add_argument("--quantize", default="none,fp16,dynamic,int8", help="export quantizations")
    parser.add_argument("--max-examples", type=int, default=None, help="export: verify on the first N pairs")
    parser.add_argument("--latency-runs", type=int, default=50)
    parser.add_argument("--documents", type=int, default=None, help="search: first N corpus documents (default all)")
    parser.add_argument("--queries", type=int, default=200, help="search: queries from Debian dev")
    parser.add_argument("--tokenizer-documents", type=int, default=5000, help="tokenizer: corpus documents compared")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}; expected some of {', '.join(PARTS)}")
    return args


def milliseconds(seconds):
    """Median and 90th percentile of `seconds`, in milliseconds."""
    import numpy as np

    return [round(1e3 * float(np.percentile(seconds, q)), 3) for q in (50, 90)]


def debian_documents(limit=None):
    """The corpus's documents (blank-line separated), each one line of text."""
    documents, sentences = [], []
    with gzip.open(DEBIAN_CORPUS, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                sentences.append(line)
            elif sentences:
                documents.append(" ".join(sentences))
                sentences = []
                if limit and len(documents) == limit:
                    return documents
    if sentences:
        documents.append(" ".join(sentences))
    return documents[:limit] if limit else documents


def part_evaluate(args):
    import numpy as np

    from kbert.modelfolder import open_model

    result = {}
    for length in sorted({REFERENCE_LENGTH, args.seq_len}):
        folder = open_model(CHECKPOINT, TASK, sequence_length=length)
        examples = folder.task.read(STSB_DEV)
        start = time.perf_counter()
        metrics = folder.evaluate(examples, STSB_DEV)
        result[f"keras_length_{length}"] = {**metrics, "seconds": round(time.perf_counter() - start, 2)}
    features = folder.task.encode(examples, targets=False).features
    result["longest_dev_text_word_pieces"] = int(np.asarray(features["padding_mask"]).sum(axis=1).max())
    return result


def part_export(args):
    from kbert.export import export_model

    out = os.path.join(args.out, "export")
    report = export_model(
        CHECKPOINT, out, data=STSB_DEV, calibration=STSB_TRAIN, task=TASK, sequence_length=args.seq_len,
        quantizations=args.quantize, max_examples=args.max_examples, latency_runs=args.latency_runs,
        overwrite=True, log=lambda line: print(line.splitlines()[0], file=sys.stderr, flush=True),
    )
    keep = ("path", "quantization", "input", "pearson", "spearman", "metric_drop", "min_cosine",
            "mean_cosine", "min_cosine_all_texts", "size_bytes", "passed", "budget")
    artefacts = []
    for entry in report["artefacts"]:
        row = {k: entry[k] for k in keep if k in entry}
        row["latency_ms"] = entry["latency"]["median_ms"]
        if "texts_whose_token_ids_differ" in entry:
            row["texts_whose_token_ids_differ"] = entry["texts_whose_token_ids_differ"]
        if "tokenization" in entry:
            row["texts_whose_token_ids_differ"] = entry["tokenization"]["texts_whose_token_ids_differ"]
            row["texts"] = entry["tokenization"]["texts"]
        artefacts.append(row)
    keras = {k: report["keras"][k] for k in ("pearson", "spearman")}
    keras["latency_ms"] = report["keras"]["latency"]["median_ms"]
    return {
        "sequence_length": report["sequence_length"], "examples": report["examples"],
        "threads": report["threads"], "keras": keras, "artefacts": artefacts,
        "onnx_fusions": report["onnx_fusions"], "passed": report["passed"], "report": os.path.join(out, "report.md"),
    }


def part_latency(args):
    import tensorflow as tf

    from kbert.export import savedmodel
    from kbert.export.onnx import OnnxRunner
    from kbert.export.tflite import TfliteRunner
    from kbert.modelfolder import open_model

    out = os.path.join(args.out, "export")
    if not os.path.isdir(out):
        raise SystemExit(f"{out} not found: run the export part first")
    folder = open_model(CHECKPOINT, TASK, sequence_length=args.seq_len)
    text = folder.task.read(STSB_DEV)[0].texts[0]
    one = folder.task.encode(folder.task.examples_from_texts([text])).features
    tensors = {name: tf.constant(value) for name, value in one.items()}
    loaded = savedmodel.load_savedmodel(os.path.join(out, "1"))
    calls = {
        "keras": lambda: folder.model.predict_on_batch(one),
        "savedmodel_tokens": lambda: loaded.signatures[savedmodel.TOKENS_SIGNATURE](**tensors),
        "savedmodel_text": lambda: loaded.signatures[savedmodel.TEXT_SIGNATURE](text=tf.constant([text])),
    }
    for name in ("model.onnx", "model_int8.onnx"):
        runner = OnnxRunner(os.path.join(out, "onnx", name), 2)
        calls[f"onnx/{name}"] = lambda runner=runner: runner.run(one, ["embedding"])
    for name in sorted(os.listdir(os.path.join(out, "tflite"))):
        runner = TfliteRunner(os.path.join(out, "tflite", name), 2, text=name == "model_text.tflite")
        if name == "model_text.tflite":
            calls[f"tflite/{name}"] = lambda runner=runner: runner.run_text({"text": [text]})
        else:
            calls[f"tflite/{name}"] = lambda runner=runner: runner.run(one)
    times = {name: [] for name in calls}
    for call in calls.values():
        call()
        call()
    for _ in range(LATENCY_ROUNDS):
        for name, call in calls.items():
            for _ in range(LATENCY_RUNS_PER_ROUND):
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    return {
        "sequence_length": args.seq_len, "threads": 2, "input": "one full-length row (fixed length for TFLite)",
        "median_p90_ms": {name: milliseconds(values) for name, values in times.items()},
        "runs": LATENCY_ROUNDS * LATENCY_RUNS_PER_ROUND,
    }


def part_mediapipe(args):
    import numpy as np

    from kbert.export import mediapipe
    from kbert.modelfolder import open_model
    from kbert.tasks.sentence_embedding import row_cosines

    with open(os.path.join(REFERENCE, "sentences.json"), encoding="utf-8") as f:
        sentences = json.load(f)
    with open(os.path.join(REFERENCE, "token_ids.json"), encoding="utf-8") as f:
        reference_ids = json.load(f)
    expected = np.load(os.path.join(REFERENCE, "minilm_reference.npz"))["sentence_embeddings"]
    folder = open_model(CHECKPOINT, TASK, sequence_length=REFERENCE_LENGTH)
    path = os.path.join(args.out, "minilm_text_embedder.tflite")
    mediapipe.write_text_embedder(folder.model, folder.vocabulary, REFERENCE_LENGTH, folder.task, path)
    vectors, times = mediapipe.embed(path, sentences)
    ids = mediapipe.mediapipe_token_ids(folder.vocabulary, REFERENCE_LENGTH, sentences)
    cosines = row_cosines(vectors, expected)
    rows = []
    for i, text in enumerate(sentences):
        mediapipe_ids = ids["token_ids"][i][ids["padding_mask"][i] == 1].tolist()
        rows.append({
            "text": text[:60], "cosine_to_sentence_transformers": float(cosines[i]),
            "token_ids_equal_reference": mediapipe_ids == reference_ids[i] if i < len(reference_ids) else None,
        })
    return {"sequence_length": REFERENCE_LENGTH, "sentences": rows,
            "median_ms_per_text": round(float(np.median(times)) * 1e3, 2)}


def part_tokenizer(args):
    import numpy as np

    from kbert.export import mediapipe
    from kbert.export.serving import serving_for
    from kbert.modelfolder import open_model
    from kbert.tabular import read_table

    folder = open_model(CHECKPOINT, TASK, sequence_length=args.seq_len)
    sources = {
        "stsb_dev_texts": serving_for(folder.task).strings(folder.task.read(STSB_DEV))["text"],
        "debian_dev_texts": [row["text"] for row in read_table(DEBIAN_DEV, ["text"])],
        "debian_corpus_documents": debian_documents(args.tokenizer_documents),
    }
    result = {"sequence_length": args.seq_len}
    for name, texts in sources.items():
        examples = folder.task.examples_from_texts(texts)
        report, differ = mediapipe.compare_tokenizers(folder, examples, texts)
        result[name] = {"texts": len(texts), "differ": int(differ.sum()),
                        "percent": round(100 * float(np.mean(differ)), 2),
                        "examples": report["examples"][:5]}
    return result


def part_search(args):
    import numpy as np

    from kbert import search
    from kbert.modelfolder import open_model
    from kbert.tabular import read_table

    documents = debian_documents(args.documents)
    folder = open_model(CHECKPOINT, TASK)
    path = os.path.join(args.out, "debian.kbert-index")
    summary = search.build_index(folder, documents, list(range(1, len(documents) + 1)), path, DEBIAN_CORPUS,
                                 log=lambda line: print(line, file=sys.stderr, flush=True))
    start = time.perf_counter()
    index = search.load_index(path)
    load_seconds = time.perf_counter() - start
    folder = search.index_model(index, path)
    queries = [row["text"].split(". ")[0] for row in read_table(DEBIAN_DEV, ["text"])][: args.queries]
    folder.embed(queries[:8])  # traces the shapes of short rows
    embed_and_search, search_only = [], []
    for query in queries:
        start = time.perf_counter()
        vector = folder.embed([query], batch_size=1)
        middle = time.perf_counter()
        search.search(index, vector, 10)
        end = time.perf_counter()
        embed_and_search.append(end - start)
        search_only.append(end - middle)
    start = time.perf_counter()
    vectors = folder.embed(queries)
    rows, _ = search.search(index, vectors, 10)
    batched = time.perf_counter() - start
    return {
        "documents": len(documents), "sequence_length": folder.sequence_length,
        "index_bytes": os.path.getsize(path), "index_load_seconds": round(load_seconds, 3),
        "build": summary, "queries": len(queries),
        "queries_per_second_one_at_a_time": round(len(queries) / sum(embed_and_search), 2),
        "one_query_ms_median_p90": milliseconds(embed_and_search),
        "queries_per_second_batched": round(len(queries) / batched, 2),
        "search_only_ms_median_p90": milliseconds(search_only),
        "example": {"query": queries[0], "top3": [index.text(int(i))[:100] for i in rows[0][:3]]},
        "mean_words_per_document": round(float(np.mean([len(d.split()) for d in documents])), 1),
    }


def part_search_scaling(args):
    import numpy as np

    from kbert import search

    path = os.path.join(args.out, "debian.kbert-index")
    if not os.path.isfile(path):
        raise SystemExit(f"{path} not found: run the search part first")
    index = search.load_index(path)
    queries = index.embeddings[: SCALING_BATCH * 2] + np.float32(0.01)
    repeats = -(-SCALING_ROWS // len(index))
    index.embeddings = np.tile(index.embeddings, (repeats, 1))[:SCALING_ROWS]
    one = []
    for vector in queries[:20]:
        start = time.perf_counter()
        search.search(index, vector[None], 10)
        one.append(time.perf_counter() - start)
    start = time.perf_counter()
    search.search(index, queries[:SCALING_BATCH], 10)
    batch = time.perf_counter() - start
    return {
        "rows": len(index), "index_megabytes": round(index.embeddings.nbytes / 2**20, 1),
        "one_query_ms_median_p90": milliseconds(one),
        f"ms_per_query_in_batches_of_{SCALING_BATCH}": round(1e3 * batch / SCALING_BATCH, 2),
    }


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.makedirs(args.out, exist_ok=True)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from kbert.export.verify import load_average, machine

    results = {"checkpoint": CHECKPOINT, "machine": machine()}
    for part in args.parts:
        before, start = load_average(), time.perf_counter()
        results[part] = globals()[f"part_{part}"](args)
        results[part]["load_average_before_after"] = [before, load_average()]
        results[part]["wall_seconds"] = round(time.perf_counter() - start, 1)
        print(f"{part}: done in {results[part]['wall_seconds']} s", file=sys.stderr, flush=True)
    print(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
