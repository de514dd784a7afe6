"""A kbert model as a keras-hub preset folder (`kbert export --formats keras-hub`).

| kbert head (`kbert.models.heads`) | keras-hub preset | loaded with |
| --- | --- | --- |
| `DenseHead` on the pooled [CLS] | `BertTextClassifier`: the backbone, its preprocessor (`BertTokenizer`, `sequence_length`) and the head's Dense as its "logits" | `keras_hub.models.BertTextClassifier.from_preset(path)` |
| any other head | the `BertBackbone` and its `BertTokenizer` (the head stays kbert's) | `keras_hub.models.BertBackbone.from_preset(path)`, `keras_hub.models.BertTokenizer.from_preset(path)` |

keras-hub's `BertBackbone` computes GELU by its tanh approximation, always
(`kbert.checkpoints.keras_hub`), while BERT checkpoints, and the models
fine-tuned from them, use the exact form. The preset is therefore held to
`FLOAT_TOLERANCE` against kbert's model computed with keras-hub's GELU on the
same weights (`keras_hub_twin`), which is kbert's model itself when it was
built with `activation="gelu_approximate"`; against the model as trained, its
agreement is reported (`to_model`) and the task's metric must
stay within 0.1 point. A multi-label classifier's preset gives logits (a
label is predicted where its sigmoid reaches kbert's threshold, which the
README states); a pair regressor's cross-cosine head, a pair read both ways,
and a ReLU encoder are refused by `check_exportable`, which says what to do.
"""

import collections
import dataclasses
import os

import keras
import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.export.huggingface import METRIC_CHANGE, METRIC_CHANGE_IN_POINTS, check_one_pass
from kbert.models.heads import HEAD_LAYER, DenseHead

# The export folder's sub-folder.
FOLDER = "keras-hub"
# What `pip install` a user needs to load the folder.
NEEDS = "pip install keras-hub"
CLASSIFIER = "BertTextClassifier"
BACKBONE = "BertBackbone"


def kind_of(folder):
    """`CLASSIFIER` or `BACKBONE`: what keras-hub class holds `folder`'s model
    (a `kbert.modelfolder.ModelFolder`); `ValueError` naming what keras-hub cannot
    compute, and what to do instead."""
    from kbert.checkpoints.keras_hub import KERAS_HUB_ACTIVATION

    head = folder.model.get_layer(HEAD_LAYER)
    check_one_pass(folder, "keras-hub", CLASSIFIER, FOLDER)
    if not folder.config.activation.startswith("gelu"):
        raise ValueError(
            f"activation={folder.config.activation!r}: keras-hub's BertBackbone computes {KERAS_HUB_ACTIVATION} "
            "only; export this model to savedmodel, onnx or tflite"
        )
    if isinstance(head, DenseHead) and head.reads == "pooled_output":
        return CLASSIFIER
    return BACKBONE


def check_exportable(folder):
    """`ValueError` unless `folder`'s model has a keras-hub form (`kind_of`) and keras-hub is installed."""
    import importlib.util

    kind_of(folder)
    if importlib.util.find_spec("keras_hub") is None:
        raise ValueError(f"--formats keras-hub is written and verified by keras-hub, which this Python lacks: {NEEDS}")


def write_keras_hub(folder, path):
    """Writes `folder`'s model as a keras-hub preset at `path` (a new folder).

    Args:
        folder: `kbert.modelfolder.ModelFolder`.
        path: str. Where the preset goes; written in place (the exporter
            writes it in its work folder and renames the whole).

    Returns:
        str: `CLASSIFIER` or `BACKBONE`, what the preset is.

    Example:
    >>> from kbert.modelfolder import ModelFolder
    >>> write_keras_hub(ModelFolder.load("runs/debian-minilm"), "keras-hub-debian")  # doctest: +SKIP
    >>> keras_hub.models.BertTextClassifier.from_preset("keras-hub-debian")  # doctest: +SKIP
    """
    import keras_hub

    from kbert.checkpoints.keras_hub import to_keras_hub

    kind = kind_of(folder)
    backbone = to_keras_hub(folder.encoder_layer, dtype="float32")
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=list(folder.vocabulary), lowercase=bool(folder.lowercase))
    if kind == CLASSIFIER:
        head = folder.model.get_layer(HEAD_LAYER)
        dense = head.dense
        preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=folder.sequence_length)
        # kbert's head is keras-hub's: dropout (at kbert's rate, for a keras-hub user who fine-tunes on), then "logits".
        classifier = keras_hub.models.BertTextClassifier(backbone, num_classes=int(dense.units),
                                                         preprocessor=preprocessor, dropout=head.rate)
        classifier.output_dense.kernel.assign(dense.kernel.numpy())
        classifier.output_dense.bias.assign(dense.bias.numpy())
        classifier.save_to_preset(path)
    else:
        backbone.save_to_preset(path)
        tokenizer.save_to_preset(path)
    with open(os.path.join(path, "README.md"), "w", encoding="utf-8") as f:
        f.write(_readme(folder, kind))
    return kind


def _readme(folder, kind):
    """The preset's README: how to load it, and what keras-hub does otherwise than kbert."""
    task = folder.task
    if kind == CLASSIFIER:
        load = ("import keras_hub\n\n"
                f"classifier = keras_hub.models.{CLASSIFIER}.from_preset(\"PATH\")\n"
                + ("logits = classifier.predict([\"A text.\"])" if len(task.text_inputs) == 1
                   else "logits = classifier.predict(([\"A first text.\"], [\"A second text.\"]))"))
    else:
        load = ("import keras_hub\n\n"
                f"backbone = keras_hub.models.{BACKBONE}.from_preset(\"PATH\")\n"
                "tokenizer = keras_hub.models.BertTokenizer.from_preset(\"PATH\")")
    lines = [
        f"# {task.name}: a kbert model for keras-hub",
        "",
        f"Written by `kbert export --formats keras-hub` as keras-hub's `{kind}`"
        + (f"; texts are cut at {folder.sequence_length} word pieces." if kind == CLASSIFIER else
           f": the encoder of kbert's {task.name} model; its head ({type(folder.model.get_layer(HEAD_LAYER)).__name__}) "
           "is kbert's, and not in this folder."),
        "",
        "```python",
        load,
        "```",
    ]
    field = getattr(task.objective, "field", None)
    if kind == CLASSIFIER and field:
        lines += ["", "Outputs, in order: " + ", ".join(f"`{name}`" for name in getattr(task, field)) + "."]
    if hasattr(task, "decision_threshold"):
        lines += ["", f"The outputs are logits of independent labels: a label is predicted where its sigmoid "
                      f"reaches {float(task.decision_threshold):g} (kbert chose it on the dev set); keras-hub's "
                      "softmax does not apply."]
    if folder.config.activation == "gelu":
        lines += ["", "keras-hub computes GELU by its tanh approximation; kbert's model uses the exact form, so "
                      "the outputs differ from kbert's a little (the export report gives by how much)."]
    return "\n".join(lines) + "\n"


# === Verification: keras-hub loads the preset and runs it ===


def keras_hub_twin(folder):
    """kbert's task model with keras-hub's GELU on the same weights, in float32 (the
    model itself where it already computes keras-hub's GELU), and its encoder."""
    from kbert.checkpoints.keras_hub import KERAS_HUB_ACTIVATION
    from kbert.models import bert_encoder

    model = folder.float32_model()
    if folder.config.activation == KERAS_HUB_ACTIVATION:
        return model, model.get_layer("bert_encoder")
    encoder = bert_encoder(dataclasses.replace(folder.config, activation=KERAS_HUB_ACTIVATION), dtype="float32")
    encoder.set_weights(folder.encoder_layer.get_weights())
    return _on_encoder(encoder, model.get_layer(HEAD_LAYER)), encoder


def _on_encoder(encoder, head):
    """The task model: kbert's `head` on `encoder`'s outputs (kbert's or a keras-hub backbone)."""
    inputs = {name: keras.Input(shape=(None,), dtype="int32", name=name) for name in ENCODER_INPUTS}
    return keras.Model(inputs=inputs, outputs=head(encoder(inputs), inputs))


Ran = collections.namedtuple("Ran", ["outputs", "twin", "call", "extra"])


def run_keras_hub(folder, path, kind, reference):
    """The preset at `path`, loaded fresh by keras-hub, on the export's rows.

    Returns:
        `Ran(outputs, twin, call, extra)`: the task's outputs (`CLASSIFIER`:
        keras-hub's logits; `BACKBONE`: kbert's head on keras-hub's backbone),
        those of `keras_hub_twin` on the same rows, the loaded model as a
        callable on one batch (to time), and the report entry's extra fields.
    """
    import keras_hub

    from kbert.export.serving import serving_for

    task, features = folder.task, reference.features
    twin, twin_encoder = keras_hub_twin(folder)
    if kind == CLASSIFIER:
        classifier = keras_hub.models.BertTextClassifier.from_preset(path)
        backbone = classifier.backbone

        def call(batch):
            return classifier(batch, training=False)

        outputs = {task.outputs[0]: _in_batches(call, features)}
    else:
        backbone = keras_hub.models.BertBackbone.from_preset(path)
        keras_hub.models.BertTokenizer.from_preset(path)  # the tokenizer loads too
        model = _on_encoder(backbone, folder.model.get_layer(HEAD_LAYER))

        def call(batch):
            return model(batch, training=False)

        outputs = task.run(model, features)
    twin_outputs = reference.outputs if twin is folder.model else task.run(twin, features)
    extra = {
        "class": kind,
        "max_abs_diff_backbone": _backbone_difference(backbone, twin_encoder, features),
        # Against the model as trained (exact GELU): what keras-hub's GELU moves.
        "to_model": serving_for(task).agreement(outputs, reference.outputs),
        "activation": {"kbert": folder.config.activation, "keras_hub": "gelu_approximate"},
        "versions": {"keras_hub": keras_hub.__version__},
    }
    if kind == CLASSIFIER:
        extra["keras_hub_tokenizer"] = _with_own_preprocessing(classifier, reference)
    return Ran(outputs, twin_outputs, call, extra)


def _in_batches(call, features):
    from kbert.export.steps import in_batches

    return in_batches(lambda batch: {"out": keras.ops.convert_to_numpy(call(batch))}, features)["out"]


def _backbone_difference(backbone, encoder, features):
    """The largest difference of `sequence_output` (at the tokens) and `pooled_output`."""
    from kbert.export.steps import in_batches

    def run(model):
        return in_batches(lambda b: {k: keras.ops.convert_to_numpy(v) for k, v in model(b, training=False).items()},
                          features)

    ours, theirs, mask = run(encoder), run(backbone), np.asarray(features["padding_mask"]) == 1
    return {
        "sequence_output": float(np.abs(ours["sequence_output"][mask] - theirs["sequence_output"][mask]).max()),
        "pooled_output": float(np.abs(ours["pooled_output"] - theirs["pooled_output"]).max()),
    }


def _with_own_preprocessing(classifier, reference):
    """The task's figures with keras-hub's preprocessor on the examples' texts, and
    how many rows' token ids differ from kbert's."""
    from kbert.export.serving import serving_for

    task, features = reference.task, reference.features
    strings = serving_for(task).strings(reference.examples)
    texts = [np.asarray(strings[name], dtype=object) for name in task.text_inputs]
    if any(len(values) != len(features["token_ids"]) for values in texts):
        return None  # rows are not the examples' texts
    # x= by name: a tuple given alone is read as (x, y); keras-hub packs a tuple x as a pair.
    packed = classifier.preprocessor(x=texts[0] if len(texts) == 1 else tuple(texts))
    packed = {k: keras.ops.convert_to_numpy(v).astype(np.int32) for k, v in packed.items()}
    logits = _in_batches(lambda batch: classifier(batch, training=False), packed)
    figures = reference.figures(outputs={task.outputs[0]: logits})
    ids, ours = packed["token_ids"], np.asarray(features["token_ids"])
    width = min(ids.shape[1], ours.shape[1])
    differ = (ids[:, :width] != ours[:, :width]).any(axis=1) | (ids[:, width:] != 0).any(axis=1)
    return {"tokenizer": "keras_hub.models.BertTextClassifierPreprocessor", **figures, "rows": int(len(ids)),
            "rows_whose_token_ids_differ": int(differ.sum())}


def judge(entry, reference):
    """`entry` (judged by the task against `keras_hub_twin`'s outputs) held also to the
    model as trained: the task's metric within 0.1 point of its Keras figures."""
    from kbert.export.serving import serving_for

    task = reference.task
    limit = METRIC_CHANGE_IN_POINTS if serving_for(task).metric_in_points else METRIC_CHANGE
    change = abs(reference.keras[task.metric] - entry[task.metric])
    scale = 100 if task.metric_scale == 100 else 1
    entry["metric_change"] = round(scale * change, 6)
    said = f"{task.metric} within 0.1 point"
    entry["budget"] = f"{entry['budget']} (against kbert's model with keras-hub's GELU)" + (
        "" if said in entry["budget"] else f", {said}")
    entry["passed"] = bool(entry["passed"] and change <= limit + 1e-9)
    return entry
