"""`kbert pretrain --strategy multiworker`: two workers on localhost, then a SIGKILL;
and `kbert finetune` adapting first on two workers.

Each worker is `python -m kbert.cli pretrain ... --strategy multiworker` with
its own `TF_CONFIG` (two free loopback ports picked at test time), on the
tiny records of `test_pretrain_cli`. Every wait is bounded, so a hung
collective fails the test instead of blocking CI.

What TensorFlow 2.21 does when one MultiWorkerMirroredStrategy worker is
SIGKILLed, as checked here: the survivor neither goes on alone nor waits for
a replacement. Its next all-reduce raises `UnavailableError` and it exits
with status 1, 10 to 20 s after the kill: either the coordination service
missed the dead worker's heartbeats ("The following tasks are unhealthy
(stopped sending heartbeats)") or the collective found the peer's connection
gone first; which one comes first depends on timing. Both workers are then restarted
with the same commands (what a cluster scheduler does) and resume from the
chief's last checkpoint. With `--deterministic` the resumed run ends with the
uninterrupted run's weights and optimizer state bit for bit: the collectives'
ring order is fixed, and every worker skips the same global batches (DATA
sharding), so nothing differs across the kill.

About 2.5 minutes on two busy CPU cores, mostly TensorFlow start-up, XLA
compilation and the survivor's 20 s wait: marked slow.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from kbert.cli import main
from kbert.pretraining.train import BACKUP_FOLDER, HISTORY_FILE, WEIGHTS_FILE
from tests.test_adaptation import tiny  # noqa: F401 (a fixture)
from tests.test_pretrain_cli import ROOT, records, weights  # noqa: F401 (records: fixture)

STEPS, CHECKPOINT_EVERY = 16, 4
# Bounds each cluster run (XLA compilation included) and the survivor's wait.
WORKER_TIMEOUT_S = 180
SURVIVOR_TIMEOUT_S = 90


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_worker(arguments, out, ports, index):
    """`python -m kbert.cli ARGUMENTS --strategy multiworker` as worker `index`."""
    tf_config = {
        "cluster": {"worker": [f"localhost:{port}" for port in ports]},
        "task": {"type": "worker", "index": index},
    }
    # Each run's temporary files (the scratch folder of the worker that is
    # not the chief) in a folder of its own, beside its output: the worker
    # killed with SIGKILL cannot delete its scratch, and left it in /tmp.
    scratch = out.parent / f"{out.name}-tmp"
    scratch.mkdir(exist_ok=True)
    env = dict(
        os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(tf_config),
        TMPDIR=str(scratch),
    )
    command = [sys.executable, "-m", "kbert.cli", *arguments, "--strategy", "multiworker", "--out", str(out)]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def start_cluster(records, config, out, ports=None):
    ports = ports or free_ports(2)
    arguments = [
        "pretrain", "--records", str(records), "--config", str(config), "--steps", str(STEPS),
        "--checkpoint-every", str(CHECKPOINT_EVERY), "--batch-size", "8", "--seq-len", "32",
        "--lr", "1e-2", "--deterministic", "--seed", "7", "--dtype", "float32",
    ]
    return [start_worker(arguments, out, ports, index) for index in range(2)]


def finish(workers, timeout=WORKER_TIMEOUT_S):
    """The final JSON line of each worker; every worker is killed on a timeout."""
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for worker in workers:
            output, _ = worker.communicate(timeout=max(1, deadline - time.monotonic()))
            assert worker.returncode == 0, output[-3000:]
            outputs.append(output)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
    # The summary is the last JSON line: TensorFlow's coordination service may
    # still log after it while the workers shut down.
    return outputs, [
        json.loads(next(line for line in reversed(o.splitlines()) if line.startswith("{")))
        for o in outputs
    ]


@pytest.mark.slow
def test_two_workers_agree_and_resume_after_sigkill(records, tmp_path):
    records, config = records
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    # The reference cluster and the cluster to kill share the cores. Their
    # ports are picked together: picked apart, the second pick could get a
    # port the first cluster has not bound yet.
    ports = free_ports(4)
    reference = start_cluster(records, config, uninterrupted, ports[:2])
    victims = start_cluster(records, config, resumed, ports[2:])
    checkpoint = resumed / BACKUP_FOLDER / "latest" / "windows.json"
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    while not checkpoint.exists() and victims[1].poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    victims[1].send_signal(signal.SIGKILL)
    victims[1].communicate()
    assert victims[1].returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (resumed / HISTORY_FILE).exists()

    killed_at = time.monotonic()
    # The survivor cannot go on alone: its next all-reduce is aborted as
    # unavailable (missed heartbeats, or the peer's connection gone).
    survivor_output, _ = victims[0].communicate(timeout=SURVIVOR_TIMEOUT_S)
    survivor_seconds = time.monotonic() - killed_at
    print(f"survivor ended {survivor_seconds:.1f}s after the kill, rc={victims[0].returncode}")
    assert victims[0].returncode != 0, survivor_output[-3000:]
    assert "UnavailableError" in survivor_output, survivor_output[-3000:]
    assert not (resumed / HISTORY_FILE).exists()
    steps_done = CHECKPOINT_EVERY * json.loads(
        (resumed / BACKUP_FOLDER / "latest" / "training_metadata.json").read_text()
    )["epoch"]
    assert 0 < steps_done < STEPS

    # Restarted with the same commands, the cluster resumes from backup/.
    outputs, summaries = finish(start_cluster(records, config, resumed))
    reference_outputs, reference_summaries = finish(reference)

    # (a) Both workers end with the same weights, bit for bit, in both runs.
    for summaries_ in (reference_summaries, summaries):
        assert summaries_[0]["weights_sha256"] == summaries_[1]["weights_sha256"]
        assert [s["final"]["step"] for s in summaries_] == [STEPS, STEPS]
    assert all("global batch 8 = 2 replicas x 4 per replica" in o for o in reference_outputs)
    expected_history = json.loads((uninterrupted / HISTORY_FILE).read_text())
    settings = expected_history["settings"]
    assert settings["num_replicas"] == 2 and settings["xla_compiled"], settings
    # Only the chief wrote: one history, no scratch folders left in the run folders.
    assert sorted(os.listdir(uninterrupted)) == sorted(os.listdir(resumed))

    # (b) Resumed at the checkpoint: the windows before it were not run again.
    windows_run = [len(re.findall(rf"^steps \d+-\d+ of {STEPS}$", o, re.M)) for o in outputs]
    assert windows_run == [(STEPS - steps_done) // CHECKPOINT_EVERY] * 2, windows_run
    assert not (resumed / BACKUP_FOLDER).exists()
    history = json.loads((resumed / HISTORY_FILE).read_text())
    assert [w["step"] for w in history["windows"]] == list(range(4, STEPS + 1, 4))
    assert history["windows"][-1]["loss"] == expected_history["windows"][-1]["loss"]
    # Op determinism, the same data position and ring all-reduce order: the
    # same weights, optimizer moments and step counter as the uninterrupted
    # cluster, bit for bit (tolerance 0).
    assert summaries[0]["weights_sha256"] == reference_summaries[0]["weights_sha256"]
    expected, actual = weights(uninterrupted / WEIGHTS_FILE), weights(resumed / WEIGHTS_FILE)
    assert sorted(actual) == sorted(expected) and any("optimizer" in name for name in actual)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


@pytest.mark.slow
def test_two_workers_fine_tune_from_the_adapted_encoder(tiny, tmp_path):
    """`kbert finetune --adapt-steps N --strategy multiworker`: every worker loads the
    encoder the chief wrote once it is whole (an all-reduce after the chief's write)."""
    pairs, out = str(tiny / "pairs.tsv"), tmp_path / "m"
    arguments = [
        "finetune", "--task", "text-pair-classification", "--train", pairs, "--dev", pairs,
        "--init", str(tiny / "bert"), "--batch-size", "4", "--seq-len", "32", "--epochs", "1",
        "--dtype", "float32", "--adapt-steps", "4",
    ]
    ports = free_ports(2)
    outputs, results = finish([start_worker(arguments, out, ports, index) for index in range(2)])
    assert all("adaptation: 4 masked-LM steps of 4" in output for output in outputs)
    # Both workers trained the same replicated weights; only their clocks differ.
    untimed = [{key: {k: v for k, v in r[key].items() if k != "train_seconds"} for key in ("dev", "adaptation")}
               for r in results]
    assert untimed[0] == untimed[1] and untimed[0]["adaptation"]["steps"] == 4
    with open(out / "kbert.json") as f:
        assert json.load(f)["training"]["adapt_steps"] == 4
    # The chief wrote the model; the resume folder, the adaptation in it, is gone.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "m-tmp"]


def test_bad_strategy_is_a_one_line_error(records, tmp_path, capsys, monkeypatch):
    records, config = records
    command = ["pretrain", "--records", str(records), "--config", str(config), "--steps", "2",
               "--out", str(tmp_path / "run")]
    assert main([*command, "--strategy", "horovod"]) == 2
    error = capsys.readouterr().err.strip()
    assert "strategy='horovod' is not one of" in error and "\n" not in error
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert main([*command, "--strategy", "multiworker"]) == 2
    assert "needs TF_CONFIG" in capsys.readouterr().err
