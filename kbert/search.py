"""Exact semantic search: a corpus embedded once into an index file, then queried.

    kbert search --model all-minilm-l6-v2 --task sentence-embedding \\
        --corpus docs.txt --index docs.kbert-index
    kbert search --index docs.kbert-index "a text editor for the terminal" -k 5

The index is a NumPy `.npz` archive (uncompressed), written beside its final
name and renamed into place:

| array | content |
| --- | --- |
| `meta` | UTF-8 JSON: `format`, `version`, `model`, `task`, `task_settings`, `sequence_length`, `corpus`, `count`, `dimension` |
| `embeddings` | float32 `(count, dimension)`, each row of L2 norm 1 |
| `text_bytes`, `text_offsets` | the texts in UTF-8, end to end, and where each starts (`count + 1` offsets) |
| `lines` | int64 `(count,)`: the line (or CSV record) each text comes from |

A damaged index (a copy cut short loses the zip directory at its end) is
still known as kbert's by its first bytes: `meta` is the archive's first
member, `meta.npy`, whose JSON starts `{"format": "kbert-index"`. It is
named as damaged, and `--overwrite` may replace it.

A query is embedded by the model the index names, and scored against every
row by one matrix product: exact cosine similarity, brute force. Memory and
time grow with `count x dimension`: for a million 384-dimensional texts,
1.5 GB held in memory and, on two CPU cores, 0.13 s per query alone or
0.02 s per query in batches of 64 (`tools/benchmarks/benchmark_embedding.py`). That is
where it stops being the right tool; beyond, use an approximate index
(FAISS's IVF or HNSW, ScaNN) on the same unit vectors.
"""

import gzip
import json
import os
import sys
import time
import zipfile

import numpy as np

from kbert.fileio import decode_utf8
from kbert.logs import to_stderr

INDEX_FORMAT = "kbert-index"
INDEX_VERSION = 1
# Corpus texts embedded per call; a progress line is written between chunks.
EMBED_CHUNK = 2048
# Index rows scored per matrix product: bounds the scores held at once to
# SCORE_CHUNK x queries floats.
SCORE_CHUNK = 65536
# At query time the index's first text is embedded again: a model that gives
# it a vector at a lower cosine from the stored one is not the one that built
# the index (the same model agrees to float rounding, ~1 - 1e-7).
SAME_MODEL_COSINE = 0.9999
_ARRAYS = ("meta", "embeddings", "text_bytes", "text_offsets", "lines")
# What survives of a damaged index: `np.savez` writes `meta` first, as the zip
# member "meta.npy", and its JSON starts with the format (`build_index`).
_FIRST_MEMBER = b"meta.npy"
_META_START = json.dumps({"format": INDEX_FORMAT})[:-1].encode("utf-8")
# Bytes read for them: the zip entry's header (30 bytes, the name, a zip64
# field) and the .npy header (64 or 128 bytes) come first.
_HEAD_BYTES = 1024


class Index:
    """A loaded index: `meta` (dict), `embeddings`, `lines`, and `text(i)`."""

    def __init__(self, meta, embeddings, text_bytes, text_offsets, lines):
        self.meta = meta
        self.embeddings = embeddings
        self.lines = lines
        self._bytes = text_bytes
        self._offsets = text_offsets

    def __len__(self):
        return len(self.embeddings)

    def text(self, i):
        return self._bytes[self._offsets[i] : self._offsets[i + 1]].tobytes().decode("utf-8")


def read_corpus(path, column=None):
    """The texts of a corpus file and the line each comes from.

    Args:
        path: str. A table, `.csv`, `.tsv` or `.jsonl` (the texts in
            `column`, default "text": `kbert.tabular.read_column`), or a text
            file with one text a line (`.gz` read transparently; blank lines
            skipped).
        column: str or None.

    Returns:
        `(texts, lines)`: list of str and list of int (1-based lines).
    """
    from kbert.tabular import is_table, read_column

    if is_table(path):  # as every command reads a table
        return read_column(path, column)
    if column is not None:
        raise ValueError(f"--text-column {column}: --corpus {path} is not a table (.csv, .tsv, .jsonl)")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a folder; expected a file")
    if not os.path.exists(path):
        raise ValueError(f"{path}: no such file")
    opener = gzip.open if path.endswith(".gz") else open
    texts, lines = [], []
    try:
        with opener(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                text = decode_utf8(raw, path, first_line=number).rstrip("\r\n")
                if number == 1:
                    text = text.removeprefix("\ufeff")
                if text.strip():
                    texts.append(text)
                    lines.append(number)
    except (OSError, EOFError) as error:  # a damaged .gz
        raise ValueError(f"{path} cannot be read ({error}); expected a text file, one text a line") from None
    if not texts:
        raise ValueError(f"{path} holds no texts")
    return texts, lines


def unit_rows(vectors):
    """`vectors` (float32) with each row divided by its L2 norm."""
    vectors = np.asarray(vectors, np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def build_index(folder, texts, lines, path, corpus, batch_size=64, log=None):
    """Embeds `texts` with `folder`'s task and writes the index file `path`.

    Args:
        folder: `kbert.modelfolder.ModelFolder` whose task gives embeddings.
        texts, lines: from `read_corpus`.
        path: str. The index file to write (its folder must exist).
        corpus: str. Where the texts come from, for the record.
        batch_size: int.
        log: callable taking one str, for progress lines (default: stderr if a terminal).

    Returns:
        dict. A summary: `index`, `texts`, `dimension`, `seconds`, `texts_per_second`.
    """
    from kbert.fileio import write_file

    if log is None:
        log = to_stderr if sys.stderr.isatty() else (lambda line: None)
    if not texts or len(texts) != len(lines):
        raise ValueError(f"{len(texts)} texts and {len(lines)} lines; expected one line per text, at least one")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"--index {path}: no such folder {parent}")
    if os.path.isdir(path):
        raise ValueError(f"--index {path} is a folder; expected an index file name")
    start = time.perf_counter()
    chunks = []
    for first in range(0, len(texts), EMBED_CHUNK):
        chunks.append(unit_rows(folder.embed(texts[first : first + EMBED_CHUNK], batch_size)))
        log(f"embedded {min(first + EMBED_CHUNK, len(texts))} of {len(texts)} texts")
    embeddings = np.concatenate(chunks)
    seconds = time.perf_counter() - start
    encoded = [text.encode("utf-8") for text in texts]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    meta = {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "model": os.path.abspath(folder.path) if os.path.isdir(folder.path) else folder.path,
        "task": folder.task.name,
        "task_settings": folder.task.settings(),
        "sequence_length": folder.sequence_length,
        "corpus": corpus,
        "count": len(texts),
        "dimension": int(embeddings.shape[1]),
    }
    arrays = {
        "meta": np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8),
        "embeddings": embeddings,
        "text_bytes": np.frombuffer(b"".join(encoded), np.uint8),
        "text_offsets": offsets,
        "lines": np.asarray(lines, np.int64),
    }
    write_file(path, lambda f: np.savez(f, **arrays))
    return {
        "index": path,
        "texts": len(texts),
        "dimension": meta["dimension"],
        "seconds": round(seconds, 3),
        "texts_per_second": round(len(texts) / seconds, 2),
    }


def is_index(path):
    """Whether `path` is a kbert index file (what `build_index` writes, any version),
    whole or damaged (`starts_as_index`): what `--overwrite` may replace."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(archive["meta"].tobytes().decode("utf-8"))
        return isinstance(meta, dict) and meta.get("format") == INDEX_FORMAT
    except Exception:  # noqa: BLE001  (NumPy and zipfile raise many types for other files)
        return starts_as_index(path)


def starts_as_index(path):
    """Whether the file `path` begins as an index does: a zip entry named
    `meta.npy` whose bytes start `{"format": "kbert-index"` (the module's note)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError:
        return False
    if len(head) < 30 or not head.startswith(b"PK\x03\x04"):  # a zip entry's local header
        return False
    name_length = int.from_bytes(head[26:28], "little")
    return head[30 : 30 + name_length] == _FIRST_MEMBER and _META_START in head[30 + name_length :]


def check_index_file(path):
    """Refuses a path that holds no whole index (missing, damaged, or not a NumPy .npz archive); cheap."""
    if not os.path.isfile(path):
        raise ValueError(f"--index {path}: no such index file (build it with --corpus)")
    if zipfile.is_zipfile(path):
        return
    if starts_as_index(path):
        raise ValueError(
            f"{path} is a damaged kbert index: not a complete .npz archive (truncated?); "
            "build it again with --corpus and --overwrite"
        )
    raise ValueError(f"{path} is not a kbert index (not a NumPy .npz archive)")


def load_index(path):
    """Reads an index file; `ValueError` naming it if it is not one this version wrote."""
    check_index_file(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [name for name in _ARRAYS if name not in archive.files]
            if missing:
                raise ValueError(f"{path} is not a kbert index: {', '.join(missing)} missing")
            arrays = {name: archive[name] for name in _ARRAYS}
        meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
    except (OSError, EOFError, ValueError, UnicodeDecodeError, zipfile.BadZipFile, KeyError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        if reason.startswith(path):
            raise ValueError(reason) from None
        raise ValueError(
            f"{path} is not a readable kbert index (damaged or truncated?): {reason}; "
            "build it again with --corpus"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != INDEX_FORMAT:
        raise ValueError(f"{path} is not a kbert index")
    if meta.get("version") != INDEX_VERSION:
        raise ValueError(f"{path} is a kbert index of version {meta.get('version')}; this kbert reads {INDEX_VERSION}")
    missing = [key for key in ("model", "task", "task_settings", "sequence_length", "count", "dimension") if key not in meta]
    if missing:
        raise ValueError(f"{path} is a damaged kbert index: its metadata lacks {', '.join(missing)}; build it again with --corpus")
    count, embeddings = meta["count"], arrays["embeddings"]
    if embeddings.shape != (count, meta["dimension"]) or len(arrays["text_offsets"]) != count + 1:
        raise ValueError(f"{path}: its arrays do not hold the {count} texts its metadata names")
    return Index(meta, embeddings, arrays["text_bytes"], arrays["text_offsets"], arrays["lines"])


def index_model(index, path, model=None):
    """The model that built `index`, checked on the index's first text.

    Args:
        index: `Index`.
        path: str. The index file, for messages.
        model: str or None. Where to load the model from instead of the
            index's record (the checkpoint or folder moved); the index's task
            settings and sequence length hold.

    Raises:
        ValueError: the model gives the first text another vector.
    """
    from kbert.modelfolder import open_model

    meta = index.meta
    if model is None and not os.path.exists(meta["model"]) and os.path.isabs(meta["model"]):
        raise ValueError(
            f"{path}: the index's model {meta['model']} is missing: pass --model, the model folder "
            "or checkpoint that built the index"
        )
    folder = open_model(model or meta["model"], meta["task"], meta["task_settings"], meta["sequence_length"])
    cosine = float(np.dot(unit_rows(folder.embed([index.text(0)]))[0], index.embeddings[0]))
    if cosine < SAME_MODEL_COSINE:
        raise ValueError(
            f"{path} was built by another model: {model or meta['model']} gives its first text a "
            f"vector at cosine {cosine:.6f} from the stored one; rebuild the index with --corpus"
        )
    return folder


def search(index, queries, k):
    """The `k` texts of `index` closest to each query vector by cosine.

    Args:
        index: `Index`.
        queries: float `(q, dimension)` query vectors (any norm).
        k: int.

    Returns:
        `(rows, scores)`: int `(q, k')` indices into the index and float32
        `(q, k')` cosines, best first; `k' = min(k, len(index))`.
    """
    queries = unit_rows(queries)
    if queries.shape[1] != index.embeddings.shape[1]:
        raise ValueError(
            f"query vectors have {queries.shape[1]} dimensions; the index has {index.embeddings.shape[1]}"
        )
    k = min(k, len(index))
    best_rows = np.zeros((len(queries), 0), np.int64)
    best_scores = np.zeros((len(queries), 0), np.float32)
    for first in range(0, len(index), SCORE_CHUNK):
        scores = queries @ index.embeddings[first : first + SCORE_CHUNK].T
        keep = min(k, scores.shape[1])
        top = np.argpartition(-scores, keep - 1, axis=1)[:, :keep]
        best_rows = np.concatenate([best_rows, top + first], axis=1)
        best_scores = np.concatenate([best_scores, np.take_along_axis(scores, top, axis=1)], axis=1)
        if best_rows.shape[1] > k:
            top = np.argpartition(-best_scores, k - 1, axis=1)[:, :k]
            best_rows = np.take_along_axis(best_rows, top, axis=1)
            best_scores = np.take_along_axis(best_scores, top, axis=1)
    order = np.argsort(-best_scores, axis=1, kind="stable")
    return np.take_along_axis(best_rows, order, axis=1), np.take_along_axis(best_scores, order, axis=1)
