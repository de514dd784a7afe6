"""`kbert.TaskModel.fit` against `kbert finetune`: the same dev figures for the same seed, and the time.

Both train the default recipe of a text task on one checkpoint in one process,
one after the other: `finetune` writes a model folder, `TaskModel` trains from
Python on the same rows (read by the task's own reader). Prints JSON: each
one's dev figures and `fit` seconds, and the largest difference of their dev
outputs.

    python tools/benchmarks/benchmark_task_model.py --train data/debian-packages/train.csv \
        --dev data/debian-packages/dev.csv --seed 0
"""

import argparse
import json
import os
import sys
import tempfile
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--dev", required=True)
    parser.add_argument("--task", default="text-classification")
    parser.add_argument("--init", default="all-minilm-l6-v2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto", help="a dtype policy, or auto (as kbert finetune)")
    parser.add_argument("--deterministic", action="store_true",
                        help="TensorFlow op determinism for both (as kbert finetune --deterministic): "
                        "without it, threaded bfloat16 sums may differ from run to run")
    parser.add_argument("--out", help="also write the JSON here")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    from kbert.export.verify import machine
    from kbert.modelfolder import ModelFolder
    from kbert.tasks import get_task
    from kbert.training.finetune import finetune
    from kbert.training.task_model import TaskModel

    task_class = get_task(args.task)
    train, dev = task_class.read(args.train), task_class.read(args.dev)
    labels = task_class.learn(train, args.train).get("labels")

    def columns(examples):
        texts = [example.texts for example in examples]
        return [t[0] for t in texts] if len(task_class.text_inputs) == 1 else tuple(zip(*texts))

    result = {"task": args.task, "init": args.init, "seed": args.seed, "dtype": args.dtype,
              "deterministic": args.deterministic, "machine": machine()}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "model")
        metrics = finetune(args.train, args.dev, args.init, out, task=args.task, dtype=args.dtype,
                           seed=args.seed, deterministic=args.deterministic, verbose=0)
        folder = ModelFolder.load(out)
        reference = folder.task.run(folder.model, folder.task.encode(dev, targets=False).features)
        result["finetune"] = {**folder.task.summary(metrics), "fit_seconds": metrics["train_seconds"]}

    keras.utils.set_random_seed(args.seed)
    model = TaskModel.from_checkpoint(args.init, task=args.task, labels=labels, dtype=args.dtype)
    model.compile()
    targets = [example.target for example in train]
    start = time.perf_counter()
    model.fit(columns(train), targets, seed=args.seed, verbose=0)
    seconds = time.perf_counter() - start
    figures = model.figures(columns(dev), [example.target for example in dev])
    result["task_model"] = {**model.task.summary(figures), "fit_seconds": round(seconds, 1)}
    outputs = model.predict(columns(dev))
    name = folder.task.outputs[0]
    result["max_abs_output_diff"] = float(np.abs(np.asarray(outputs) - reference[name]).max())
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
