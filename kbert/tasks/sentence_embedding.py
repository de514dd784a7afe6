"""`sentence-embedding`: a text -> one vector, as sentence-transformers computes it.

Needs no training: `kbert evaluate`, `predict`, `embed`, `search` and `export`
take `--task sentence-embedding` with any checkpoint kbert loads as `--model`
(a Hugging Face folder, a google-research/bert folder, a packaged name such
as `all-minilm-l6-v2`) or a kbert model folder, whose fine-tuned encoder is
used. The vector is the pooled last hidden states:

| setting | values | default |
| --- | --- | --- |
| `--pooling` | `mean` over the real tokens, `cls` (the first token's vector), `max` over the real tokens | `auto`: the checkpoint's `1_Pooling/config.json`, else `mean` |
| `--normalize` | `true`: divide by the L2 norm; `false` | `auto`: `true` if the checkpoint's `modules.json` lists a `Normalize` module, `false` if it has a `modules.json` without one, `true` without a `modules.json` |
| `--seq-len` | texts are cut to this many word pieces | `sentence_bert_config.json`'s `max_seq_length`, else 512 |

Data for `kbert evaluate` (and the export's verification): STS-style pairs, a
CSV or TSV file with `sentence1`, `sentence2` and a numeric `score` column.
The figures are the Pearson and Spearman correlation of each pair's cosine
similarity with the score, the STS evaluation of sentence-transformers'
`EmbeddingSimilarityEvaluator`. Each text of a pair is embedded on its own
(one row each). `kbert predict` prints the cosine of each pair of a file, or
the vector of each text given as TEXT or in a `.txt` file.
"""

import dataclasses
import json
import os

import numpy as np

from kbert.config import POOLINGS
from kbert.tasks.base import INFERENCE_BATCH_SIZE, METRIC_BUDGETS
from kbert.tasks.objectives import Embedding
from kbert.tasks.records import TextExample
from kbert.tasks.task_config import BOOLEANS, option
from kbert.tasks.inference import run_by_length
from kbert.tasks.text_task import TextTask
from kbert.tasks.text_pair_classification import PairColumns
from kbert.tasks.text_pair_regression import TextPairRegression, regression_metrics

DEFAULT_POOLING = "mean"
DEFAULT_NORMALIZE = True
# A float32 artefact must give every text a vector at this cosine or more from
# the Keras model's (the bar; float32 reordering gives ~1 - 1e-7).
MIN_COSINE = 0.9999
# A quantized artefact is judged by the Spearman it loses, which a vector's
# sign or scale does not change; its vectors must also stay near the float
# model's on average. Mean cosines measured on MiniLM, STS-B dev (3000 texts,
# L=128): TFLite fp16 1.0000, dynamic 0.9978, int8 0.9993; ONNX dynamic int8
# 0.9928 (0.969 with per-tensor weight scales); TFLite 16x8 0.997 (200 texts,
# L=64). A 16x8 model that flipped every vector's sign scored -0.99.
QUANTIZED_MIN_MEAN_COSINE = 0.95
# sentence-transformers' files in a checkpoint folder.
MODULES_FILE = "modules.json"
SENTENCE_BERT_CONFIG_FILE = "sentence_bert_config.json"
POOLING_CONFIG_FILE = "config.json"
# `pooling_mode_*` switches of sentence-transformers' Pooling config -> kbert's pooling.
POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}
# The sentence-transformers modules kbert computes (by class name).
KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")
# The value of --pooling and --normalize that reads them from the checkpoint.
AUTO = "auto"


class SentenceEmbedding(TextTask):
    """Texts -> float32 vectors; pairs scored by cosine similarity."""

    name = "sentence-embedding"
    hub_pipeline_tag = "sentence-similarity"
    description = (
        "a text -> one vector (no training: --model takes a checkpoint); "
        "evaluated on CSV/TSV pairs with sentence1, sentence2, score"
    )

    @dataclasses.dataclass(frozen=True)
    class Config(PairColumns):
        score_column: str = option("column holding the numeric score", "score")
        pooling: str = option(
            f"sentence-embedding pooling: mean, cls or max; {AUTO}: the checkpoint's "
            "sentence-transformers config, else mean",
            AUTO, (*POOLINGS, AUTO), built=True,
        )
        normalize: object = option(
            f"sentence-embedding L2 normalisation: true or false; {AUTO}: the checkpoint's "
            "sentence-transformers modules, else true",
            AUTO, built=True,
        )

    text_options = ("sentence1_column", "sentence2_column")
    target_option = "score_column"
    text_inputs = ("text",)
    objective = Embedding()
    metric = "spearman"
    budgets = METRIC_BUDGETS
    trainable = False

    def configure(self):
        """`auto` without a checkpoint to ask: mean pooling, normalised."""
        settings = self.pretrained_settings(None, {"pooling": self.pooling, "normalize": self.normalize})
        self.config = dataclasses.replace(self.config, **settings)

    def use_options(self, options):
        """`auto` pooling or normalisation keeps what the checkpoint gave (`pretrained_settings`)."""
        super().use_options({name: value for name, value in (options or {}).items() if value != AUTO})

    @classmethod
    def parse_target(cls, value, path, line):
        return TextPairRegression.parse_target(value, path, line)

    @classmethod
    def pretrained_settings(cls, checkpoint, options):
        """Pooling and normalisation: the options given, else the checkpoint's modules."""
        options = cls.resolve_options(options)
        modules = sentence_transformers_modules(checkpoint) if checkpoint else {}
        pooling, normalize = options["pooling"], options["normalize"]
        if pooling == AUTO:
            pooling = modules.get("pooling", DEFAULT_POOLING)
        if normalize == AUTO:
            normalize = modules.get("normalize", DEFAULT_NORMALIZE)
        elif not isinstance(normalize, bool):
            normalize = BOOLEANS.get(str(normalize).strip().lower())
            if normalize is None:
                raise ValueError(f"--normalize {options['normalize']!r}; expected true, false or {AUTO}")
        return {"pooling": pooling, "normalize": normalize}

    @classmethod
    def pretrained_sequence_length(cls, checkpoint):
        """`max_seq_length` of sentence-transformers' `sentence_bert_config.json`, if any."""
        path = os.path.join(checkpoint, SENTENCE_BERT_CONFIG_FILE)
        if not os.path.isfile(path):
            return None
        length = _read_json(path).get("max_seq_length")
        if length is not None and (not isinstance(length, int) or length < 2):
            raise ValueError(f"{path}: max_seq_length={length!r}; expected an integer of at least 2")
        return length

    def check(self, examples, source):
        single = next((e for e in examples if len(e.texts) != 2 or e.target is None), None)
        if single is not None:
            raise ValueError(
                f"{source}: the sentence-embedding figures need pairs with a score; "
                f"line {single.line} has {len(single.texts)} text(s)"
            )

    # === Preprocessing ===

    def encode(self, examples, targets=True):
        """One row per text: a pair's texts are embedded apart, in order."""
        widths = np.array([len(example.texts) for example in examples], np.int64)
        rows = [TextExample(texts=(text,)) for example in examples for text in example.texts]
        encoded = super().encode(rows, targets=False)
        encoded.example_of_row = np.repeat(np.arange(len(examples)), widths)
        return encoded

    def targets(self, examples):
        return np.array([e.target for e in examples], np.float32)

    # === Inference ===

    def run(self, model, features, batch_size=INFERENCE_BATCH_SIZE):
        """The model's vectors, one a row (`kbert.tasks.inference.run_by_length`).

        Pooling reads only the real tokens, so the padding after them is
        work wasted: each batch runs at its longest row's length.
        """
        return run_by_length(model, features, self.outputs, self.sequence_length, batch_size)

    def decode(self, examples, encoded, outputs):
        """Per example, its texts' vectors: float32 `(texts, dimension)`."""
        vectors = np.asarray(outputs["embedding"], np.float32)
        counts = np.bincount(encoded.example_of_row, minlength=len(examples))
        return np.split(vectors, np.cumsum(counts)[:-1])

    def evaluate(self, examples, predictions):
        self.check(examples, "data")
        gold = np.array([e.target for e in examples], np.float64)
        metrics = regression_metrics(gold, pair_cosines(predictions))
        return {key: metrics[key] for key in ("pearson", "spearman", "n")}

    def predict_json(self, examples, predictions):
        rows = []
        for example, vectors in zip(examples, predictions):
            if len(vectors) == 2:
                a, b = example.texts
                rows.append({"sentence1": a, "sentence2": b, "score": float(pair_cosines([vectors])[0])})
            else:
                rows.append({"text": example.texts[0], "embedding": [float(v) for v in vectors[0]]})
        return rows

    def embeddings(self, predictions):
        if any(len(vectors) != 1 for vectors in predictions):
            raise ValueError("embeddings come from single texts; got pairs")
        return np.stack([vectors[0] for vectors in predictions]).astype(np.float32)


def row_cosines(a, b):
    """Cosine similarity of each row of `a` with the same row of `b`, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norms = np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)
    return np.sum(a * b, axis=-1) / norms


def pair_cosines(predictions):
    """The cosine of each pair's two vectors (predictions of `decode`)."""
    if not len(predictions):
        return np.zeros(0)
    pairs = np.stack(predictions)
    return row_cosines(pairs[:, 0], pairs[:, 1])


def sentence_transformers_modules(folder):
    """Pooling and normalisation that a sentence-transformers checkpoint's files name.

    Returns:
        dict with `pooling` and `normalize` as `modules.json` and the Pooling
        module's `config.json` say; empty when `folder` has no `modules.json`.

    Raises:
        ValueError: naming the file, for a module kbert does not compute (a
            `Dense` projection) or several pooling modes at once.
    """
    path = os.path.join(folder, MODULES_FILE)
    if not os.path.isfile(path):
        return {}
    modules = _read_json(path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{path} holds no list of modules")
    kinds = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
    unknown = [kind for kind in kinds if kind not in KNOWN_MODULES]
    if unknown:
        raise ValueError(
            f"{path} names the module {unknown[0]!r}; kbert computes {', '.join(KNOWN_MODULES)} only"
        )
    found = {"normalize": "Normalize" in kinds}
    for module, kind in zip(modules, kinds):
        if kind != "Pooling":
            continue
        config_path = os.path.join(folder, module.get("path", ""), POOLING_CONFIG_FILE)
        if not os.path.isfile(config_path):
            raise ValueError(f"{config_path} not found; {path} names a Pooling module there")
        config = _read_json(config_path)
        modes = sorted(key for key, value in config.items() if key.startswith("pooling_mode_") and value is True)
        if len(modes) != 1 or modes[0] not in POOLING_MODES:
            raise ValueError(
                f"{config_path} turns on {modes or 'no pooling mode'}; kbert computes one of "
                f"{', '.join(sorted(POOLING_MODES))}"
            )
        found["pooling"] = POOLING_MODES[modes[0]]
    return found


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None
