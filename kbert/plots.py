"""Pictures a user would rather look at than read, drawn with matplotlib (its Agg canvas, not pyplot).

| picture | written by | from |
| --- | --- | --- |
| `training.png` | `write_model_folder` (finetune, distill) | metrics.json's `training_curve` and `history` |
| `confusion_matrix.png` | `kbert evaluate --plots` | a classifier's predicted and gold labels |
| `per_label.png` | `kbert evaluate --plots` | a multi-label classifier's `per_label` figures |
| `per_entity_type.png` | `kbert evaluate --plots` | named entities' `per_type` figures |
| `predicted_vs_gold.png` | `kbert evaluate --plots` | a scorer's predicted and gold scores |
| `report.png` | `kbert export` | each artefact's size, latency and metric |

Which evaluation picture a model gets follows from what its task gives
(`evaluation_plots`), never from the task's name. matplotlib is imported
inside the functions, so that `import kbert` does not load it. Every PNG is
marked as kbert's (`SOFTWARE`), so that a later run replaces only its own
(`is_kbert_png`).
"""

import os
import struct

from kbert.fileio import written_aside

# The PNG `Software` text that marks a picture as kbert's.
SOFTWARE = "kbert"
DPI = 110
TRAINING_PLOT = "training.png"
REPORT_PLOT = "report.png"
# `kbert evaluate --plots DIR`: what each kind of figure is saved as.
CONFUSION_PLOT = "confusion_matrix.png"
PER_LABEL_PLOT = "per_label.png"
PER_TYPE_PLOT = "per_entity_type.png"
SCATTER_PLOT = "predicted_vs_gold.png"
EVALUATION_PLOTS = (CONFUSION_PLOT, PER_LABEL_PLOT, PER_TYPE_PLOT, SCATTER_PLOT)
# Labels past which a confusion matrix no longer prints counts in its cells (unreadable).
ANNOTATED_LABELS_AT_MOST = 30
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _subplots(figsize, *args, **kwargs):
    """`(figure, axes)`: a matplotlib `Figure` of its own, outside pyplot, so that
    drawing changes no backend or figure of the caller's (a notebook's)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize)
    return figure, figure.subplots(*args, **kwargs)


def save(figure, path):
    """Writes `figure` to the PNG `path` (beside it, then renamed)."""
    with written_aside(path, suffix=".png") as staged:
        figure.savefig(staged, dpi=DPI, format="png", bbox_inches="tight", metadata={"Software": SOFTWARE})
    return path


def is_kbert_png(path):
    """Whether `path` is a PNG whose `Software` text says kbert wrote it."""
    try:
        with open(path, "rb") as f:
            if f.read(8) != PNG_SIGNATURE:
                return False
            while True:
                head = f.read(8)
                if len(head) < 8:
                    return False
                length, kind = struct.unpack(">I4s", head)
                if kind in (b"IDAT", b"IEND"):  # text chunks come before the image
                    return False
                data = f.read(length)
                f.read(4)  # CRC
                if kind == b"tEXt" and data == b"Software\0" + SOFTWARE.encode("latin-1"):
                    return True
    except OSError:
        return False


def check_plots_folder(folder, names=EVALUATION_PLOTS):
    """Refuses, before any work, a `folder` kbert may not write its `names` in: a file
    in the way, or a file of one of those names that kbert did not draw."""
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise ValueError(f"--plots {folder}: a file of that name exists; expected a folder")
    for name in names:
        path = os.path.join(folder, name)
        if os.path.lexists(path) and not is_kbert_png(path):
            raise ValueError(
                f"--plots {folder}: {name} exists and is not a picture kbert drew; kbert replaces only "
                "its own files: move it, or choose another folder"
            )


# === Training ===


def training_figures(metrics):
    """What `training_plot` draws from metrics.json's `metrics`: `(steps, losses, dev,
    per_interval)`: the training curve's steps and losses, `{name: (epochs, values)}` of
    each dev figure Keras kept per epoch (`history`'s `val_*`), and whether the losses
    are each interval's mean; None if there is no curve.

    Keras logs the running mean of the loss since the epoch began. Where metrics.json
    has `steps_per_epoch`, each point becomes the mean over the steps since the point
    before it in its epoch (exact for batches of one size, the last one aside);
    without it, the running means are drawn as they are.
    """
    curve = metrics.get("training_curve") or []
    if not curve:
        return None
    steps = [int(point["step"]) for point in curve]
    losses = [float(point["loss"]) for point in curve]
    per_epoch = metrics.get("steps_per_epoch")
    per_interval = isinstance(per_epoch, int) and per_epoch > 0
    if per_interval:
        losses = interval_losses(steps, losses, per_epoch)
    history = metrics.get("history") or {}
    first = int(metrics.get("resumed_from_epoch") or 0)
    dev = {}
    for name, values in history.items():
        if name.startswith("val_") and values:
            dev[name[len("val_"):]] = (list(range(first + 1, first + 1 + len(values))), list(values))
    return steps, losses, dev, per_interval


def interval_losses(steps, running, per_epoch):
    """The mean loss of each interval between logged `steps`, from Keras's `running`
    mean since the epoch began (epochs of `per_epoch` steps)."""
    means, before = [], (None, 0, 0.0)  # (epoch, steps into it, running mean)
    for step, mean in zip(steps, running):
        epoch, into = (step - 1) // per_epoch, step - ((step - 1) // per_epoch) * per_epoch
        start, start_mean = (before[1], before[2]) if before[0] == epoch else (0, 0.0)
        means.append((into * mean - start * start_mean) / (into - start) if into > start else mean)
        before = (epoch, into, mean)
    return means


def training_plot(metrics, path, title):
    """Draws `training.png`: the training loss per logged step, and the dev figures per epoch.

    Args:
        metrics: dict. metrics.json (`kbert.training.epochs.fit_epochs`' figures).
        path: str. The PNG to write.
        title: str. What the picture is of (the model folder's name).

    Returns:
        str or None. `path`, or None where `metrics` hold no training curve
        (a model saved without `fit_epochs`: nothing to draw).
    """
    figures = training_figures(metrics)
    if figures is None:
        return None
    steps, losses, dev, per_interval = figures
    dev_metrics = {name: series for name, series in dev.items() if name != "loss"}
    panels = 2 if dev else 1
    figure, axes = _subplots((5.2 * panels, 3.6), 1, panels, squeeze=False)
    loss_axis = axes[0][0]
    label = "mean of each interval" if per_interval else "mean since the epoch began"
    loss_axis.plot(steps, losses, color="tab:blue", linewidth=1.4, label=label)
    per_epoch = metrics.get("steps_per_epoch")
    if per_interval:
        for boundary in range(per_epoch, steps[-1], per_epoch):
            loss_axis.axvline(boundary, color="tab:gray", linewidth=0.8, linestyle=":")
        # Each epoch's mean as Keras kept it: exact, where the intervals' means assume
        # batches of one size (length buckets leave some smaller).
        epoch_losses = (metrics.get("history") or {}).get("loss") or []
        first = int(metrics.get("resumed_from_epoch") or 0)
        ends = [(first + i + 1) * per_epoch for i in range(len(epoch_losses))]
        loss_axis.plot(ends, epoch_losses, linestyle="none", marker="D", color="tab:red", label="mean of the epoch")
    loss_axis.set_xlabel("step" + (f" (dotted: epochs of {per_epoch} steps)" if per_interval else ""))
    loss_axis.set_ylabel("loss")
    every = _interval(steps)
    loss_axis.set_title("training loss, every " + ("step" if every == 1 else f"{every} steps"))
    loss_axis.xaxis.get_major_locator().set_params(integer=True)
    loss_axis.grid(alpha=0.3)
    loss_axis.legend(loc="upper right")
    if dev:
        dev_axis = axes[0][1]
        for name, (epochs, values) in dev_metrics.items():
            dev_axis.plot(epochs, values, marker="o", label=f"dev {name}")
        handles_of = [dev_axis]
        if "loss" in dev:
            # Loss and a metric differ in scale: the dev loss has an axis of its own.
            loss_twin = dev_axis.twinx() if dev_metrics else dev_axis
            epochs, values = dev["loss"]
            loss_twin.plot(epochs, values, marker="s", markerfacecolor="none", markersize=9, linestyle="--",
                           color="tab:gray", label="dev loss")  # hollow: a metric's point on it shows
            loss_twin.set_ylabel("dev loss")
            if loss_twin is not dev_axis:
                handles_of.append(loss_twin)
        handles = [h for axis in handles_of for h in axis.get_legend_handles_labels()[0]]
        dev_axis.legend(handles, [h.get_label() for h in handles], loc="upper center",
                        bbox_to_anchor=(0.5, -0.2), ncol=len(handles), frameon=False)
        dev_axis.set_xlabel("epoch")
        dev_axis.set_xticks(sorted({e for epochs, _ in dev.values() for e in epochs}))
        dev_axis.set_title("dev set, after each epoch")
        dev_axis.grid(alpha=0.3)
        if dev_metrics:
            dev_axis.set_ylabel("dev " + ", ".join(dev_metrics))
    figure.suptitle(title)
    figure.tight_layout()
    return save(figure, path)


def _interval(steps):
    return steps[1] - steps[0] if len(steps) > 1 else steps[0]


# === Evaluation ===


def evaluation_plots(task, examples, predictions, metrics, folder):
    """Draws the picture the task's figures call for into `folder` (made if missing).

    Which picture follows from what the task gives, not from its name: figures
    per entity type (`per_type`), per label (`per_label`), a predicted label
    per example (`predict_json`'s `label`: a confusion matrix), or a predicted
    score per example against a numeric gold score (a scatter).

    Args:
        task: the `Task` that evaluated.
        examples: its labelled examples.
        predictions: its predictions on them.
        metrics: dict. `task.evaluate(examples, predictions)`.
        folder: str. Where to write.

    Returns:
        dict. File written -> the data drawn (for a confusion matrix: `labels`
        and `counts`, gold by row, predicted by column); empty where the task
        gives nothing to draw.
    """
    os.makedirs(folder, exist_ok=True)
    drawn = {}
    if isinstance(metrics.get("per_type"), dict):
        path = os.path.join(folder, PER_TYPE_PLOT)
        drawn[path] = figures_chart(metrics["per_type"], path, "named entities by type", "entity type")
    if isinstance(metrics.get("per_label"), dict):
        path = os.path.join(folder, PER_LABEL_PLOT)
        drawn[path] = figures_chart(metrics["per_label"], path, "each label", "label")
    if drawn:
        return drawn
    rows = task.predict_json(examples, predictions)
    gold = [getattr(example, "target", None) for example in examples]
    if rows and all("label" in row for row in rows) and all(isinstance(g, str) for g in gold):
        labels = list(getattr(task, task.objective.field))
        counts = confusion_counts(labels, gold, [row["label"] for row in rows])
        path = os.path.join(folder, CONFUSION_PLOT)
        save(confusion_figure(labels, counts, _summary_title(task, metrics)), path)
        drawn[path] = {"labels": labels, "counts": counts}
    elif rows and all("score" in row for row in rows) and all(_is_number(g) for g in gold):
        predicted = [float(row["score"]) for row in rows]
        path = os.path.join(folder, SCATTER_PLOT)
        save(scatter_figure([float(g) for g in gold], predicted, _summary_title(task, metrics)), path)
        drawn[path] = {"gold": [float(g) for g in gold], "predicted": predicted}
    return drawn


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _summary_title(task, metrics):
    shown = {k: v for k, v in task.summary(metrics).items() if k != "n" and isinstance(v, float)}
    figures = ", ".join(f"{name} {value:.4f}" for name, value in shown.items())
    return f"{task.name}, {metrics.get('n', '?')} examples: {figures}"


def confusion_counts(labels, gold, predicted):
    """int `(labels, labels)` list of lists: examples of gold label i (row) predicted as j (column)."""
    index = {label: i for i, label in enumerate(labels)}
    counts = [[0] * len(labels) for _ in labels]
    for g, p in zip(gold, predicted, strict=True):
        counts[index[g]][index[p]] += 1
    return counts


def confusion_figure(labels, counts, title):
    """The confusion matrix as a figure: each cell's count, shaded by its share of its gold row."""
    import numpy as np

    matrix = np.asarray(counts, dtype=np.int64)
    totals = matrix.sum(axis=1, keepdims=True)
    shares = np.divide(matrix, totals, out=np.zeros(matrix.shape), where=totals > 0)
    side = max(4.0, 0.45 * len(labels) + 2.0)
    figure, axis = _subplots((side + 1.2, side))
    image = axis.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04, label="share of the gold label's examples")
    axis.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    axis.set_yticks(range(len(labels)), labels)
    axis.set_xlabel("predicted label")
    axis.set_ylabel("gold label")
    if len(labels) <= ANNOTATED_LABELS_AT_MOST:
        for i in range(len(labels)):
            for j in range(len(labels)):
                if matrix[i, j]:
                    axis.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=8,
                              color="white" if shares[i, j] > 0.5 else "black")
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    return figure


def figures_chart(per_name, path, what, axis_name):
    """Draws precision, recall and F1 of each name in `per_name` (name -> dict with
    `precision`, `recall`, `f1`, `support`) as grouped horizontal bars.

    Returns:
        dict. Name -> the three values drawn.
    """
    import numpy as np

    names = list(per_name)
    keys = ("precision", "recall", "f1")
    values = {name: [float(per_name[name][key]) for key in keys] for name in names}
    figure, axis = _subplots((7.0, max(2.5, 0.55 * len(names) + 1.2)))
    height = 0.26
    positions = np.arange(len(names))
    for k, (key, color) in enumerate(zip(keys, ("tab:blue", "tab:orange", "tab:green"))):
        bars = [values[name][k] for name in names]
        axis.barh(positions + (k - 1) * height, bars, height, label=key, color=color)
    for position, name in zip(positions, names):
        axis.text(1.01, position, f"F1 {values[name][2]:.3f}", va="center", fontsize=8)
    labels = [f"{name} ({per_name[name].get('support', '?')})" for name in names]
    axis.set_yticks(positions, labels)
    axis.invert_yaxis()
    axis.set_xlim(0, 1.15)
    axis.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    axis.set_ylabel(f"{axis_name} (gold count)")
    axis.set_title(f"{what}: precision, recall and F1")
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3, fontsize=8, frameon=False)
    axis.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    save(figure, path)
    return values


def scatter_figure(gold, predicted, title):
    """Predicted against gold scores, with the line where they are equal."""
    figure, axis = _subplots((5.0, 5.0))
    axis.scatter(gold, predicted, s=10, alpha=0.5, edgecolors="none")
    low, high = min(gold), max(gold)
    span, predicted_span = high - low, max(predicted) - min(predicted)
    # The diagonal only where the scores share the gold scale (not a cosine against 0 to 5).
    if span > 0 and predicted_span >= 0.25 * span and low - span <= min(predicted) and max(predicted) <= high + span:
        axis.plot([low, high], [low, high], color="tab:gray", linestyle="--", linewidth=1, label="predicted = gold")
        axis.legend(loc="upper left")
    axis.set_xlabel("gold score")
    axis.set_ylabel("predicted score")
    axis.set_title(title, fontsize=9)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


# === Export ===


def report_chart(report, path):
    """Draws `report.png`: each artefact's size, batch-1 latency and metric, side by side.

    Args:
        report: dict. `kbert.export.exporter.export_model`'s report.
        path: str. The PNG to write.

    Returns:
        dict. `paths`, and the `size_mib`, `latency_ms` and metric values drawn, in order.
    """
    entries = report["artefacts"]
    metric, scale = report["metric"], report.get("metric_scale", 1)
    paths = [entry["path"] if "/" in entry["path"] else f"{entry['path']}/ ({entry['format']})" for entry in entries]

    def values(read):
        """`read(entry)` of each entry, None where it lacks the figure."""
        out = []
        for entry in entries:
            try:
                out.append(float(read(entry)))
            except (KeyError, TypeError):
                out.append(None)
        return out

    series = {
        "size_mib": values(lambda entry: entry["size_bytes"] / 2**20),
        "latency_ms": values(lambda entry: entry["latency"]["median_ms"]),
        metric: values(lambda entry: scale * entry[metric]),
    }
    colors = ["tab:blue" if entry["passed"] else "tab:red" for entry in entries]
    keras = report.get("keras") or {}
    references = {"latency_ms": keras.get("latency", {}).get("median_ms"),
                  metric: scale * keras[metric] if metric in keras else None}
    titles = {"size_mib": "size (MiB)", "latency_ms": "latency, batch 1 (ms)",
              metric: f"{metric}" + (" (points)" if scale == 100 else "")}
    figure, axes = _subplots((13.0, max(2.6, 0.42 * len(entries) + 1.4)), 1, 3, sharey=True)
    for axis, (key, column) in zip(axes, series.items()):
        drawn = [value for value in column if value is not None]
        axis.barh(range(len(column)), [0.0 if value is None else value for value in column], color=colors)
        for i, value in enumerate(column):
            axis.text(0.0 if value is None else value, i, " —" if value is None else f" {value:.4g}",
                      va="center", fontsize=8)
        reference = references.get(key)
        if reference is not None:
            axis.axvline(reference, color="black", linestyle="--", linewidth=1, label="Keras model")
            axis.legend(loc="best", fontsize=8)
            drawn.append(reference)
        if key == metric and drawn:
            low, high = min(drawn), max(drawn)
            margin = max(0.5 * (high - low), 0.01 * abs(high) + 1e-9)
            axis.set_xlim(low - 4 * margin, high + 4 * margin)  # the differences, not the bar lengths, matter
        elif drawn:
            axis.set_xlim(0, 1.25 * max(drawn) or 1.0)
        axis.set_title(titles[key])
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(paths)), paths)
    axes[0].invert_yaxis()
    failed = "" if report.get("passed", True) else " (red: over its budget)"
    figure.suptitle(f"export of {report.get('model', report.get('name'))} ({report['task']}), "
                    f"{report['examples']} examples{failed}")
    figure.tight_layout()
    save(figure, path)
    return {"paths": paths, **series}
