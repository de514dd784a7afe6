"""The model card: `README.md` in every model folder and export folder.

The card follows Hugging Face's model-card format: YAML front matter
(`library_name`, `pipeline_tag`, `base_model`, `language`, `datasets`,
`metrics` and a `model-index` with the dev figures), then what the model
does, its labels, the recipe it was trained with, its figures, its limits and
how to use it. Everything in it comes from the folder's own `kbert.json` and
`metrics.json` (and, for an export, `report.json`), and from the task, which
it asks for its description, its learned settings (labels, tags, a score
range) and its metric; it never tests the task's name.

| card | written by |
| --- | --- |
| model folder | `write_model_folder` (`kbert finetune`, `kbert distill`, `TaskModel.save_folder`) |
| export folder | `kbert export` (`export_card`), with each artefact's size, latency and metric |

Example:
>>> text = model_card("debian-minilm", task, settings, metrics)  # doctest: +SKIP
"""

import dataclasses
import hashlib
import json
import os

CARD_FILE = "README.md"
# What the Hub calls the packaged checkpoints, and the language they were trained on.
HUB_MODEL_IDS = {"all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2"}
CHECKPOINT_LANGUAGES = {"all-minilm-l6-v2": ["en"]}
# What an example input reads, per input name (`Task.text_inputs`), in the usage examples.
EXAMPLE_INPUTS = {
    "text": "A text editor for the terminal.",
    "sentence1": "A man plays a guitar.",
    "sentence2": "A man plays music.",
    "question": "Who wrote it?",
    "context": "Ann wrote it in 1999.",
}
READ_CHUNK = 1 << 20


# === Data ===


def sha256_of(path):
    """The SHA-256 of the file `path`, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def data_files(**paths):
    """What `kbert.json` records of the data a model learned from: role -> `file`
    (its name), `sha256` and `bytes`, for each role given a path (`train="..."`)."""
    return {
        role: {"file": os.path.basename(path), "sha256": sha256_of(path), "bytes": os.path.getsize(path)}
        for role, path in paths.items() if path
    }


# === YAML ===


def front_matter(values):
    """`values` (str keys; str, number, bool, None, list and dict values) as a
    YAML front matter block between `---` lines. Scalars are written as JSON,
    which YAML reads as the same values."""
    return "---\n" + "".join(_yaml(key, value, 0) for key, value in values.items()) + "---\n"


def _yaml(key, value, indent):
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return f"{pad}{key}: {{}}\n"
        return f"{pad}{key}:\n" + "".join(_yaml(k, v, indent + 2) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        if not value:
            return f"{pad}{key}: []\n"
        lines = f"{pad}{key}:\n"
        for item in value:
            if isinstance(item, dict) and item:
                body = "".join(_yaml(k, v, indent + 4) for k, v in item.items())
                lines += f"{pad}  - " + body[indent + 4:]
            else:
                lines += f"{pad}  - {_scalar(item)}\n"
        return lines
    return f"{pad}{key}: {_scalar(value)}\n"


def _scalar(value):
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    if isinstance(value, float) and "e" in text and "." not in text.split("e")[0]:
        # YAML 1.1 (PyYAML) reads a float only with a point in its mantissa: 1e-12 is a string there.
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


# === What the card says ===


def _figures(task, metrics):
    """The task's summary figures in `metrics` (no `n`), name -> value, the task's metric first."""
    shown = {k: v for k, v in task.summary(metrics).items() if k != "n" and isinstance(v, (int, float))}
    if task.metric in shown:
        shown = {task.metric: shown.pop(task.metric), **shown}
    return shown


def _shown(value, scale):
    return f"{100 * value:.2f}" if scale == 100 else f"{value:.4f}"


def _learned(task):
    """`(name, help, value)` of the settings the training data gave the task (labels, tags, a score range)."""
    settings = task.settings()
    return [
        (field.name, field.metadata.get("help", ""), settings.get(field.name))
        for field in dataclasses.fields(task.Config)
        if not field.metadata.get("flag") and settings.get(field.name) is not None
    ]


def _options(task):
    """`(name, value)` of the task's options (the flags it was trained and reads data with)."""
    settings = task.settings()
    return [(option.name, settings.get(option.name)) for option in task.options]


def _pipeline_tag(task):
    return task.hub_pipeline_tag or task.name


def _metadata(name, task, settings, figures, dataset):
    """The front matter: Hugging Face's keys, and kbert's own under `kbert`."""
    init = settings.get("init")
    data = settings.get("data") or {}
    values = {"library_name": "kbert", "pipeline_tag": _pipeline_tag(task),
              "tags": ["kbert", "keras", "bert", task.name]}
    if init in HUB_MODEL_IDS:
        values["base_model"] = HUB_MODEL_IDS[init]
    if init in CHECKPOINT_LANGUAGES:
        values["language"] = CHECKPOINT_LANGUAGES[init]
    if data:
        values["datasets"] = [entry["file"] for entry in data.values()]
    if figures:
        values["metrics"] = list(figures)
        values["model-index"] = [{
            "name": name,
            "results": [{
                "task": {"type": _pipeline_tag(task), "name": task.name},
                "dataset": dataset,
                "metrics": [{"type": key, "value": value, "name": f"{dataset['split']} {key}"}
                            for key, value in figures.items()],
            }],
        }]
    values["kbert"] = {
        "task": task.name,
        "sequence_length": settings.get("sequence_length"),
        "lowercase": settings.get("lowercase"),
        "init": init,
        "data": data,
    }
    return values


def _dataset(settings, split="dev"):
    """The model-index `dataset` of the `split` file `kbert.json` names: by its file name and SHA-256."""
    entry = (settings.get("data") or {}).get(split)
    if not entry:  # a folder written before kbert.json named its data
        return {"name": f"the {split} set", "type": "unknown", "split": split}
    return {"name": entry["file"], "type": entry["file"], "split": split, "revision": f"sha256:{entry['sha256']}"}


def _inputs_python(task):
    texts = [EXAMPLE_INPUTS.get(name, f"your {name}") for name in task.text_inputs]
    if len(texts) == 1:
        return json.dumps(texts, ensure_ascii=False)
    return "(" + ", ".join(json.dumps([t], ensure_ascii=False) for t in texts) + ")"


def _instance(task):
    texts = [EXAMPLE_INPUTS.get(name, f"your {name}") for name in task.text_inputs]
    return texts[0] if len(texts) == 1 else dict(zip(task.text_inputs, texts))


def _usage(task, model_path, name, rest_request=None, android=False, serving=True):
    """How to use the model: the command line, Python, TF Serving (the export `name`; a
    `rest_request` is an export's own) where `serving`, and Android where the task runs there."""
    texts = " ".join(json.dumps(EXAMPLE_INPUTS.get(field, f"your {field}"), ensure_ascii=False)
                     for field in task.text_inputs)
    request = rest_request or {"signature_name": "serving_default", "instances": [_instance(task)]}
    quoted = json.dumps(request, ensure_ascii=False).replace("'", "'\\''")  # inside the shell's single quotes
    lines = [
        "## How to use it", "",
        "Command line:", "",
        "```sh",
        f"kbert predict --model {model_path} {texts}",
        f"kbert evaluate --model {model_path} --data dev-file --plots plots/",
        "```", "",
        "Python:", "",
        "```python",
        "import kbert",
        "",
        f'model = kbert.TaskModel.from_folder("{model_path}")',
        f"print(model.predict_labels({_inputs_python(task)}))",
        "```", "",
    ]
    if serving:
        lines += [
            f"TF Serving, with this folder as `saved_models/{name}`:" if rest_request else
            f"TF Serving, after `kbert export --model {model_path} --out saved_models/{name} --data dev-file`:", "",
            "```sh",
            f'docker run -p 8501:8501 -v "$PWD/saved_models/{name}:/models/{name}" \\',
            f"    tensorflow/serving --model_config_file=/models/{name}/models.config",
            f"curl -s localhost:8501/v1/models/{name}:predict -d '{quoted}'",
            "```", "",
        ]
    if android:
        lines += [
            "Android: `kbert export` writes the MediaPipe file (`mediapipe/`); "
            "`mobile/README.md` in kbert's repository puts it in an app.", "",
        ]
    return lines


def _where(dataset):
    return f"`{dataset['name']}`" if dataset.get("revision") else dataset["name"]


def _limits(task, settings, metrics, dataset, figures):
    init = settings.get("init")
    language = ", ".join(CHECKPOINT_LANGUAGES[init]) if init in CHECKPOINT_LANGUAGES else None
    truncate = task.settings().get("truncate")
    casing = "lowercased" if settings.get("lowercase") else "cased"
    lines = [
        "## Limits", "",
        f"- The model reads at most {settings.get('sequence_length')} WordPiece pieces at once"
        + (f"; longer texts are cut (`truncate={truncate}`)" if truncate else "")
        + f". Text is {casing}, with a vocabulary of {settings.get('vocabulary_size')} pieces.",
        f"- Language: {language} (the base checkpoint's)." if language
        else "- Language: that of the training data; kbert does not record it.",
    ]
    if figures:
        lines.append(f"- Its figures are on {_where(dataset)} alone ({metrics.get('n', '?')} examples); "
                     "expect lower ones on text unlike it.")
    else:
        lines.append("- No dev figures are recorded with this model.")
    lines += [
        "- Not tested on other domains, other languages, text longer than the sequence length, "
        "or adversarial input; no evaluation of bias was made.",
        "",
    ]
    return lines


def _recipe(settings, metrics):
    lines = ["## How it was trained", ""]
    init, training = settings.get("init"), settings.get("training") or {}
    distillation = settings.get("distillation")
    if distillation:
        lines.append(f"Distilled (`kbert distill`) from the teacher `{distillation.get('teacher')}`, "
                     f"student `{distillation.get('student')}`.")
    elif training:
        lines.append(f"Fine-tuned (`kbert finetune`) from `{init}`.")
    else:
        lines.append("Trained in Python (`kbert.TaskModel`); its recipe is the caller's." if init is None
                     else f"Built from `{init}`.")
    lines.append("")
    rows = [(key, value) for key, value in {**training, **(distillation or {})}.items() if key not in ("teacher", "task")]
    rows += [(key, settings[key]) for key in ("dtype",) if settings.get(key)]
    rows += [(key, metrics[key]) for key in ("train_examples", "epochs", "steps_per_epoch", "train_seconds")
             if key in metrics and key not in dict(rows)]
    if rows:
        lines += ["| setting | value |", "| --- | --- |"]
        lines += [f"| `{key}` | {json.dumps(value, ensure_ascii=False)} |" for key, value in rows]
        lines.append("")
    data = settings.get("data") or {}
    if data:
        lines += ["| data | file | bytes | SHA-256 |", "| --- | --- | --- | --- |"]
        lines += [f"| {role} | `{e['file']}` | {e['bytes']} | `{e['sha256']}` |" for role, e in data.items()]
        lines.append("")
    config = settings.get("bert_config") or {}
    if config:
        shape = ", ".join(f"{key} {config[key]}" for key in ("num_layers", "hidden_size", "num_heads",
                                                            "intermediate_size") if key in config)
        lines += [f"Encoder: {shape}. The full settings are in `kbert.json`.", ""]
    return lines


def _what(name, task):
    lines = [f"# {name}", "", f"A kbert `{task.name}` model: {task.description}.", ""]
    learned = _learned(task)
    if learned:
        lines += ["## What it predicts", ""]
        for field, help_text, value in learned:
            value = json.loads(json.dumps(value))  # as kbert.json holds it (a tuple as a list)
            shown = ", ".join(f"`{v}`" for v in value) if isinstance(value, list) else f"`{value}`"
            lines.append(f"- {field}: {shown}" + (f" — {help_text}" if help_text else ""))
        lines.append("")
    options = _options(task)
    if options:
        lines += ["Options it reads data with: " + ", ".join(f"`{k}={v}`" for k, v in options) + ".", ""]
    return lines


def model_card(name, task, settings, metrics, plot=None):
    """The model card of a model folder, as Markdown with YAML front matter.

    Args:
        name: str. The model's name (the folder's).
        task: the `Task` instance.
        settings: dict. What `kbert.json` holds.
        metrics: dict. What `metrics.json` holds (dev figures; may be empty).
        plot: str or None. The training picture's file name in the folder.
    """
    figures = _figures(task, metrics)
    dataset = _dataset(settings)
    lines = [front_matter(_metadata(name, task, settings, figures, dataset))]
    lines += _what(name, task)
    lines += _recipe(settings, metrics)
    if figures:
        scale = task.metric_scale
        lines += ["## Dev figures", "", f"On {_where(dataset)}, {metrics.get('n', '?')} examples"
                  + (" (points)" if scale == 100 else "") + ":", ""]
        lines += ["| " + " | ".join(figures) + " |", "|" + " --- |" * len(figures),
                  "| " + " | ".join(_shown(v, scale) for v in figures.values()) + " |", ""]
    if plot:
        lines += [f"![training loss and dev figures]({plot})", ""]
    lines += _limits(task, settings, metrics, dataset, figures)
    lines += _usage(task, name, name, android=_on_device(task))
    return "\n".join(lines)


def _on_device(task):
    """Whether `kbert export` writes a MediaPipe file of `task` (Android)."""
    from kbert.export.serving import serving_for

    return serving_for(task).on_device is not None


def write_model_card(folder, task, settings, metrics, name=None, plot=None):
    """Writes `README.md` into the (staging) model folder `folder`; `name`: the model's name."""
    text = model_card(name or os.path.basename(os.path.normpath(folder)), task, settings, metrics, plot)
    with open(os.path.join(folder, CARD_FILE), "w", encoding="utf-8") as f:
        f.write(text)


# === Export ===


def export_card(model, report, rest_request=None, chart=None):
    """The model card of an export folder: the model's card, its dev figures replaced by the
    verification's, and each artefact's size, latency and metric.

    Args:
        model: `kbert.modelfolder.ModelFolder` that was exported.
        report: dict. The export's report (`export_model`).
        rest_request: dict or None. The REST request `rest_example.json` holds.
        chart: str or None. The report chart's file name in the export folder.
    """
    task, settings = model.task, {**model.settings, "vocabulary_size": len(model.vocabulary)}
    settings.setdefault("init", report["model"])  # a pretrained checkpoint, exported as it is
    name, metric, scale = report["name"], report["metric"], report.get("metric_scale", 1)
    keras = report["keras"]
    figures = {key: keras[key] for key in report["figures"] if key in keras}
    dataset = {"name": os.path.basename(report["data"]), "type": os.path.basename(report["data"]),
               "split": "verification"}
    if os.path.isfile(report["data"]):
        dataset["revision"] = f"sha256:{sha256_of(report['data'])}"
    values = _metadata(name, task, settings, figures, dataset)
    values["kbert"]["exported_from"] = report["model"]
    lines = [front_matter(values)]
    lines += _what(name, task)
    lines += [
        "## Artefacts", "",
        f"Each file verified on {report['examples']} examples of `{dataset['name']}` at sequence length "
        f"{report['sequence_length']}; latency is batch 1, median of {report['latency_runs']} runs on "
        f"{report['threads']} threads. `report.md` has the full table.", "",
        f"| file | format | quantization | size | latency | {metric} | within budget |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| Keras model (`{report['model']}`) | keras | none | | {keras['latency']['median_ms']:.2f} ms "
        f"| {_shown(keras[metric], scale)} | |",
    ]
    for entry in report["artefacts"]:
        latency = (entry.get("latency") or {}).get("median_ms")
        lines.append(
            f"| `{entry['path']}` | {entry['format']} | {entry['quantization']} | "
            f"{entry['size_bytes'] / 2**20:.1f} MiB | " + ("—" if latency is None else f"{latency:.2f} ms")
            + f" | {_shown(entry[metric], scale) if metric in entry else '—'} | {'yes' if entry['passed'] else '**no**'} |"
        )
    lines.append("")
    if chart:
        lines += [f"![size, latency and {metric} of each file]({chart})", ""]
    from kbert.modelfolder import METRICS_FILE, is_model_folder

    if is_model_folder(model.path) and os.path.isfile(os.path.join(model.path, METRICS_FILE)):
        with open(os.path.join(model.path, METRICS_FILE), encoding="utf-8") as f:
            lines += _recipe(settings, json.load(f))  # the model folder's: how it was trained
    metrics = {**keras, "n": report["examples"]}
    lines += _limits(task, settings, metrics, dataset, figures)
    android = any(entry["format"] == "mediapipe" for entry in report["artefacts"])
    serving = any(entry["format"] == "savedmodel" for entry in report["artefacts"])
    lines += _usage(task, report["model"], name, rest_request, android=android, serving=serving)
    lines += ["ONNX (`onnxruntime`) and TFLite (LiteRT) files take `token_ids`, `segment_ids` and "
              "`padding_mask` (int32) from the tokenizer of `vocab.txt`.", ""]
    return "\n".join(lines)


def write_export_card(path, model, report):
    """Writes `README.md` into the (work) export folder `path`, showing `report.png` if it is there."""
    from kbert.plots import REPORT_PLOT

    chart = REPORT_PLOT if os.path.isfile(os.path.join(path, REPORT_PLOT)) else None
    rest = os.path.join(path, "rest_example.json")
    request = None
    if os.path.isfile(rest):
        with open(rest, encoding="utf-8") as f:
            request = json.load(f).get("request")
    with open(os.path.join(path, CARD_FILE), "w", encoding="utf-8") as f:
        f.write(export_card(model, report, request, chart))
