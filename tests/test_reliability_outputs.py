"""One output rule, one reader rule, a clean interrupt (issue 55, reliability round two).

Outputs: `--overwrite` replaces only what kbert's manifest lists (or, in a
folder written before manifests, kbert's known names); an output is never an
input. Readers: every damaged or misread input ends in one line naming the
file. Interrupts: one line saying what was kept, exit 130 (Ctrl-C) or 143
(SIGTERM), nothing half-written.
"""

import gc
import json
import os
import re
import shutil
import signal
import stat
import sys
import time
import weakref

import numpy as np
import pytest

from kbert import fileio
from kbert.cli import main
from tests.task_harness import minilm_vocabulary, write_task_folder
from tests.test_export_units import TINY
from tests.test_reliability import error_of, finetune_args, small_csvs, vocab_file  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A tiny text-classification model folder, as kbert finetune writes it (with a manifest)."""
    return write_task_folder(
        tmp_path_factory.mktemp("classifier") / "model", "text-classification", {"labels": ["a", "b"]}, TINY
    )


def copy_folder(folder, to):
    shutil.copytree(folder, to)
    return str(to)


# === Outputs: --overwrite replaces only what kbert wrote ===


def test_model_folder_lists_its_files_in_a_manifest(classifier):
    listed = fileio.read_manifest(classifier)
    assert listed == {"kbert.json", "metrics.json", "model.keras", "vocab.txt", "README.md"}  # the card
    assert fileio.foreign_entries(classifier) == []


def test_finetune_overwrite_keeps_a_users_notes_and_export(tmp_path, classifier, small_csvs, vocab_file, capsys):
    model = copy_folder(classifier, tmp_path / "model")
    os.makedirs(os.path.join(model, "export", "1"))
    (tmp_path / "model" / "export" / "report.json").write_text("{}")
    (tmp_path / "model" / "notes.txt").write_text("what I tried")
    err = error_of(finetune_args(small_csvs, vocab_file, model, "--overwrite"), capsys)
    assert f"--out {model} holds export/, notes.txt, which kbert did not write" in err  # a folder of theirs, whole
    assert "--overwrite replaces only kbert's own files" in err
    assert (tmp_path / "model" / "notes.txt").read_text() == "what I tried"
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_a_folder_without_manifest_counts_kberts_known_names(tmp_path, classifier):
    from kbert.modelfolder import MODEL_FOLDER_NAMES, is_model_folder

    old = copy_folder(classifier, tmp_path / "old")
    for name in (fileio.MANIFEST_FILE, "README.md"):  # written before manifests (and model cards)
        os.remove(os.path.join(old, name))
    fileio.check_output_folder(old, "model", is_model_folder, True, MODEL_FOLDER_NAMES)
    (tmp_path / "old" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds notes.txt, which kbert did not write"):
        fileio.check_output_folder(old, "model", is_model_folder, True, MODEL_FOLDER_NAMES)


def test_overwrite_replaces_kberts_own_folder_whole(tmp_path):
    is_ours = lambda path: os.path.isfile(os.path.join(path, "kbert.json"))  # noqa: E731
    out = str(tmp_path / "out")
    for content in ("first", "second"):
        with fileio.staged_folder(out, is_ours, overwrite=True) as staging:
            with open(os.path.join(staging, "kbert.json"), "w") as f:
                f.write(json.dumps(content))
            os.makedirs(os.path.join(staging, "sub", "empty"))
            open(os.path.join(staging, "sub", "a.bin"), "wb").close()
    assert json.loads((tmp_path / "out" / "kbert.json").read_text()) == "second"
    assert fileio.read_manifest(out) == {"kbert.json", "sub/a.bin", "sub/", "sub/empty/"}
    (tmp_path / "out" / "sub" / "mine.txt").write_text("x")
    with pytest.raises(ValueError, match="holds sub/mine.txt, which kbert did not write"):
        with fileio.staged_folder(out, is_ours, overwrite=True):
            pass
    assert (tmp_path / "out" / "sub" / "mine.txt").exists()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, vocab_file):
    """Inputs the writers below read, in a folder of their own: a dev file, a corpus."""
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "dev.csv").write_text("text,label\na text,a\n")
    words = "the editor of a mail client and a chess game for the terminal".split()
    (folder / "corpus.txt").write_text("".join(" ".join(words[i:] + words[:i]) + ".\n" + ("\n" if i % 3 == 2 else "")
                                               for i in range(12)))
    return {"dev": str(folder / "dev.csv"), "corpus": str(folder / "corpus.txt"), "vocab": vocab_file}


def records_args(inputs, out, *extra):
    return ["pretraining-data", "--corpus", inputs["corpus"], "--vocab", inputs["vocab"], "--out", str(out),
            "--num-shards", "1", "--dupe-factor", "2", "--max-seq-length", "32", "--workers", "1", *extra]


@pytest.fixture(scope="module")
def kbert_folders(tmp_path_factory, classifier, inputs):
    """A folder of each kind kbert writes with a manifest: model, export, records."""
    from kbert.export.options import is_export_folder

    export = str(tmp_path_factory.mktemp("export") / "export")
    with fileio.staged_folder(export, is_export_folder) as staging:  # as `kbert export` writes its report
        with open(os.path.join(staging, "report.json"), "w") as f:
            json.dump({"artefacts": []}, f)
    records = tmp_path_factory.mktemp("records") / "records"
    assert main(records_args(inputs, records)) == 0
    return {"model": classifier, "export": export, "records": str(records)}


# Every writer of a kbert folder: the kind of folder it replaces with --overwrite.
FOLDER_WRITERS = {"finetune": "model", "export": "export", "pretraining-data": "records",
                  "TaskModel.save_folder": "model"}


def overwrite_argv(writer, out, inputs, small_csvs, model):
    """The command that asks `writer` to replace `out`."""
    return {
        "finetune": finetune_args(small_csvs, inputs["vocab"], out, "--overwrite"),
        "export": ["export", "--model", model, "--data", inputs["dev"], "--out", out, "--overwrite"],
        "pretraining-data": records_args(inputs, out, "--overwrite"),
    }[writer]


@pytest.mark.parametrize("writer", sorted(FOLDER_WRITERS))
def test_overwrite_keeps_the_users_empty_folders(tmp_path, writer, kbert_folders, inputs, small_csvs, capsys):
    """Empty folders the user added (`.git/`, `notes/`) are theirs too: --overwrite refuses, as for a file."""
    from kbert.training.task_model import TaskModel

    out = copy_folder(kbert_folders[FOLDER_WRITERS[writer]], tmp_path / "out")
    for name in (".git", "notes"):
        os.makedirs(os.path.join(out, name))
    before = sorted(os.listdir(out))
    expected = rf"--out {re.escape(out)} holds \.git/, notes/, which kbert did not write; --overwrite replaces only"
    if writer == "TaskModel.save_folder":
        with pytest.raises(ValueError, match=expected):
            TaskModel.from_folder(kbert_folders["model"]).save_folder(out, overwrite=True)
    else:
        argv = overwrite_argv(writer, out, inputs, small_csvs, kbert_folders["model"])
        assert re.search(expected, error_of(argv, capsys))
    assert sorted(os.listdir(out)) == before and sorted(os.listdir(tmp_path)) == ["out"]


def test_pretraining_data_replaces_only_records_it_wrote(tmp_path, kbert_folders, inputs, capsys):
    """A folder of the user's is refused, --overwrite or not; kbert's own is replaced with --overwrite only,
    and only while it holds nothing else; the command line speaks of --overwrite, never overwrite=True."""
    users = tmp_path / "mine"
    users.mkdir()
    (users / "vocab.txt").write_text("my words\n")
    (users / "pretraining_data.json").write_text('{"mine": 1}')
    for extra in ((), ("--overwrite",)):
        err = error_of(records_args(inputs, users, *extra), capsys)
        assert re.search(rf"--out {re.escape(str(users))} is not empty and is not a kbert records folder; kbert "
                         "replaces only its own records folders", err)
    assert (users / "vocab.txt").read_text() == "my words\n" and sorted(os.listdir(users)) == [
        "pretraining_data.json", "vocab.txt"]
    ours = copy_folder(kbert_folders["records"], tmp_path / "records")
    err = error_of(records_args(inputs, ours), capsys)
    assert re.search(rf"--out {re.escape(ours)} holds a kbert records folder; pass --overwrite to replace it", err)
    assert "overwrite=True" not in err
    (tmp_path / "records" / "notes.txt").write_text("mine")
    err = error_of(records_args(inputs, ours, "--overwrite"), capsys)
    assert re.search(r"holds notes\.txt, which kbert did not write", err)
    os.remove(tmp_path / "records" / "notes.txt")
    assert main(records_args(inputs, ours, "--overwrite", "--dupe-factor", "1")) == 0
    assert json.loads((tmp_path / "records" / "pretraining_data.json").read_text())["dupe_factor"] == 1
    assert sorted(os.listdir(tmp_path)) == ["mine", "records"]


def test_task_model_save_replaces_only_a_keras_file_it_wrote(tmp_path, classifier):
    """Keras's `save` replaces any file; a TaskModel's replaces, with overwrite=True, only a TaskModel
    .keras file, and never half-writes it."""
    import keras

    from kbert.training.task_model import TaskModel

    model = TaskModel.from_folder(classifier)
    users = tmp_path / "user.keras"
    users.write_text("my notes")
    other = tmp_path / "other.keras"  # a Keras file, but not kbert's
    keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]).save(other)
    content = other.read_bytes()
    for path in (users, other):
        for overwrite in (False, True):
            with pytest.raises(ValueError, match=rf"{re.escape(str(path))} exists and is not a TaskModel \.keras "
                                                 "file kbert wrote; kbert replaces only its own files"):
                model.save(path, overwrite=overwrite)
    assert users.read_text() == "my notes" and other.read_bytes() == content
    own = tmp_path / "model.keras"
    model.save(own)
    with pytest.raises(ValueError, match=r"model\.keras exists; pass overwrite=True to replace it"):
        model.save(own)
    model.save(own, overwrite=True)
    assert isinstance(keras.saving.load_model(own), TaskModel)
    assert sorted(os.listdir(tmp_path)) == ["model.keras", "other.keras", "user.keras"]  # nothing left beside


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def assert_follows_umask_027(path):
    """`path` and everything under it as `open` and `mkdir` make them under umask 027."""
    entries = [path] + [os.path.join(root, name) for root, dirs, files in os.walk(path) for name in dirs + files]
    modes = {os.path.relpath(p, path): stat.S_IMODE(os.stat(p).st_mode) for p in entries}
    assert modes == {p: 0o750 if os.path.isdir(os.path.join(path, p)) else 0o640 for p in modes}


def _write_safetensors_in_a_staged_folder(out):
    from safetensors.numpy import save_file

    with fileio.staged_folder(out, lambda path: False) as staging:
        os.makedirs(os.path.join(staging, "encoder"))
        save_file({"a": np.zeros(2, "float32")}, os.path.join(staging, "encoder", "model.safetensors"))


def _save_hf_checkpoint(out):
    from kbert.checkpoints import save_hf_checkpoint
    from kbert.models import bert_encoder

    save_hf_checkpoint(bert_encoder(TINY), TINY, list(minilm_vocabulary()), out)


# Every way kbert writes files, each under umask 027 (safetensors writes its files 0600, tempfile 0600 and 0700).
UMASK_WRITERS = {
    "write_file": lambda out, classifier, inputs: fileio.write_file(out, lambda f: f.write(b"x")),
    "staged_folder": lambda out, classifier, inputs: _write_safetensors_in_a_staged_folder(out),
    "save_hf_checkpoint": lambda out, classifier, inputs: _save_hf_checkpoint(out),
    "TaskModel.save": lambda out, classifier, inputs: _task_model(classifier).save(out + ".keras"),
    "pretraining-data": lambda out, classifier, inputs: main(records_args(inputs, out)),
}


def _task_model(classifier):
    from kbert.training.task_model import TaskModel

    return TaskModel.from_folder(classifier)


@pytest.mark.parametrize("writer", sorted(UMASK_WRITERS))
def test_outputs_follow_the_umask(tmp_path, writer, classifier, inputs, umask_027):
    UMASK_WRITERS[writer](str(tmp_path / "out"), classifier, inputs)
    (written,) = os.listdir(tmp_path)
    assert_follows_umask_027(str(tmp_path / written))


def test_export_overwrite_keeps_a_users_file(tmp_path, classifier, capsys):
    out = tmp_path / "export"
    out.mkdir()
    (out / "report.json").write_text(json.dumps({"artefacts": []}))  # an export of before manifests
    (out / "deploy-notes.md").write_text("how we serve it")
    data = tmp_path / "dev.csv"
    data.write_text("text,label\na text,a\n")
    err = error_of(["export", "--model", classifier, "--data", str(data), "--out", str(out), "--overwrite"], capsys)
    assert "holds deploy-notes.md, which kbert did not write" in err
    assert (out / "deploy-notes.md").read_text() == "how we serve it"


def test_search_overwrite_replaces_only_a_kbert_index(tmp_path, classifier, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a text editor\na mail client\n")
    users = tmp_path / "notes.txt"
    users.write_text("my notes")
    err = error_of(["search", "--model", classifier, "--task", "sentence-embedding", "--corpus", str(corpus),
                    "--index", str(users), "--overwrite"], capsys)
    assert f"--index {users} exists and is not a kbert index; kbert replaces only its own files" in err
    assert users.read_text() == "my notes"


def test_embed_and_vocab_replace_only_their_own_kind(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("a text\n")
    users = tmp_path / "table.npy"
    users.write_text("not an array")
    err = error_of(["embed", "--model", "all-minilm-l6-v2", "--input", str(texts), "--output", str(users),
                    "--overwrite"], capsys)
    assert "exists and is not a .npy array file" in err and users.read_text() == "not an array"
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("my word list\n")
    err = error_of(["vocab", "--corpus", str(texts), "--size", "10", "--out", str(vocab), "--overwrite"], capsys)
    assert "exists and is not a WordPiece vocabulary" in err and vocab.read_text() == "my word list\n"


@pytest.mark.parametrize("command", ["embed", "vocab", "search", "pretraining-data", "finetune"])
def test_an_output_that_is_an_input_is_refused_before_any_work(tmp_path, command, small_csvs, vocab_file, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("a text\n")
    argv = {
        "embed": ["embed", "--model", "all-minilm-l6-v2", "--input", str(texts), "--output", str(texts),
                  "--overwrite"],
        "vocab": ["vocab", "--corpus", str(texts), "--size", "10", "--out", str(texts), "--overwrite"],
        "search": ["search", "--model", "all-minilm-l6-v2", "--corpus", str(texts), "--index", str(texts),
                   "--overwrite"],
        "pretraining-data": ["pretraining-data", "--corpus", str(texts), "--vocab", vocab_file,
                             "--out", str(tmp_path)],
        "finetune": finetune_args(small_csvs, vocab_file, os.path.dirname(small_csvs[0]), "--overwrite"),
    }[command]
    if command == "embed":
        argv[argv.index("--output") + 1] = str(tmp_path / "texts.npy")
        argv[argv.index("--input") + 1] = str(tmp_path / "texts.npy")
        (tmp_path / "texts.npy").write_text("a text\n")
    err = error_of(argv, capsys)
    assert "which this command reads" in err, err
    assert texts.read_text() == "a text\n"


def test_out_inside_the_model_folder_read_is_refused(tmp_path, classifier, capsys):
    model = copy_folder(classifier, tmp_path / "model")
    data = tmp_path / "dev.csv"
    data.write_text("text,label\na text,a\n")
    out = os.path.join(model, "export")
    err = error_of(["export", "--model", model, "--data", str(data), "--out", out], capsys)
    assert f"--out {out} is inside --model {model}, which this command reads" in err
    assert sorted(os.listdir(model)) == sorted(os.listdir(classifier))


def test_read_only_output_folder_is_named_by_its_option(tmp_path, classifier):
    """`kbert search` in a process that a read-only folder holds back: as root (CI), root
    without the capabilities that let it write anywhere (`tests.skips.unprivileged_prefix`)."""
    import subprocess
    import sys

    from tests.skips import unprivileged_prefix

    prefix = unprivileged_prefix()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a text\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    index = locked / "i.kbert-index"
    try:
        run = subprocess.run(
            [*prefix, sys.executable, "-m", "kbert.cli", "search", "--model", classifier, "--task",
             "sentence-embedding", "--corpus", str(corpus), "--index", str(index)],
            capture_output=True, text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)),
        )
    finally:
        locked.chmod(0o755)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr == f"kbert: error: --index {index}: cannot write in {locked} (permission denied)\n"
    assert os.listdir(locked) == []


# === Damaged kbert files: one line naming the file ===


@pytest.fixture(scope="module")
def index(tmp_path_factory, classifier):
    """A kbert index built by the tiny classifier's encoder, and its corpus."""
    folder = tmp_path_factory.mktemp("index")
    corpus = folder / "corpus.txt"
    corpus.write_text("a text editor\na mail client\na chess engine\n")
    path = folder / "corpus.kbert-index"
    assert main(["search", "--model", classifier, "--task", "sentence-embedding", "--corpus", str(corpus),
                 "--index", str(path)]) == 0
    return str(path)


def test_damaged_index_is_one_line(tmp_path, index, capsys):
    content = open(index, "rb").read()
    damaged = tmp_path / "damaged.kbert-index"
    middle = len(content) // 2
    damaged.write_bytes(content[:middle] + bytes(64) + content[middle + 64:])
    err = error_of(["search", "--index", str(damaged), "a query"], capsys)
    assert f"{damaged} is not a readable kbert index (damaged or truncated?)" in err
    damaged.write_bytes(content[: len(content) - 100])
    assert f"{damaged} is a damaged kbert index: not a complete .npz archive (truncated?)" in error_of(
        ["search", "--index", str(damaged), "a query"], capsys)


def test_index_whose_model_moved_says_pass_model(tmp_path, classifier, capsys):
    moved = copy_folder(classifier, tmp_path / "model")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a text editor\na mail client\n")
    index = tmp_path / "i.kbert-index"
    assert main(["search", "--model", moved, "--task", "sentence-embedding", "--corpus", str(corpus),
                 "--index", str(index)]) == 0
    capsys.readouterr()
    os.rename(moved, tmp_path / "elsewhere")
    err = error_of(["search", "--index", str(index), "a query"], capsys)
    assert f"the index's model {moved} is missing: pass --model" in err
    assert main(["search", "--index", str(index), "--model", str(tmp_path / "elsewhere"), "-k", "1", "a mail"]) == 0


def test_damaged_vocab_and_settings_name_the_file(tmp_path, classifier, capsys):
    model = copy_folder(classifier, tmp_path / "model")
    vocab = os.path.join(model, "vocab.txt")
    with open(vocab, "ab") as f:
        f.write(b"caf\xe9\n")
    err = error_of(["predict", "--model", model, "a text"], capsys)
    assert f"vocab.txt, line {len(minilm_vocabulary()) + 1}: byte 0xe9 is not UTF-8" in err
    shutil.copy(os.path.join(classifier, "vocab.txt"), vocab)
    settings = os.path.join(model, "kbert.json")
    with open(settings, "w") as f:
        f.write('{"task": "text-classification", "bert_')
    assert f"{settings} is not valid JSON" in error_of(["predict", "--model", model, "a text"], capsys)


def test_task_that_does_not_match_the_folder_is_named(classifier, capsys):
    err = error_of(["predict", "--model", classifier, "--task", "token-classification", "a text"], capsys)
    assert "--task token-classification does not match --model" in err
    assert "a text-classification model folder" in err


# === Texts read by predict, embed, search: file and line ===


def test_non_utf8_and_blank_lines_name_file_and_line(tmp_path, classifier, capsys):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("a text\nun éditeur\n".encode("latin-1"))
    err = error_of(["predict", "--model", classifier, "--input", str(latin)], capsys)
    assert f"{latin}, line 2: byte 0xe9 is not UTF-8" in err
    blank = tmp_path / "blank.txt"
    blank.write_text("a text\n\nanother\n\n")
    err = error_of(["predict", "--model", classifier, "--input", str(blank)], capsys)
    assert f"{blank}, line 2: a blank line; expected one text a line" in err
    err = error_of(["embed", "--model", classifier, "--task", "sentence-embedding", "--input", str(latin),
                    "--output", str(tmp_path / "e.npy")], capsys)
    assert f"{latin}, line 2: byte 0xe9 is not UTF-8" in err and not (tmp_path / "e.npy").exists()


# === Interrupts: one line, what was kept, exit 130 or 143 ===


def _interrupt_after_first_epoch(monkeypatch, how):
    from kbert.fitting.backup import AtomicBackup

    saved = AtomicBackup.on_epoch_end

    def on_epoch_end(self, epoch, logs=None):
        saved(self, epoch, logs)
        if how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(AtomicBackup, "on_epoch_end", on_epoch_end)


@pytest.mark.parametrize("how, status", [("ctrl-c", 130), ("sigterm", 143)])
def test_interrupted_finetune_says_how_to_resume(tmp_path, small_csvs, vocab_file, monkeypatch, capsys, how, status):
    _interrupt_after_first_epoch(monkeypatch, how)
    out = tmp_path / "model"
    code = main(finetune_args(small_csvs, vocab_file, out, "--epochs", "2"))
    err = capsys.readouterr().err.splitlines()
    resume = tmp_path / ".kbert-resume-model"
    assert code == status
    assert err[-1] == (f"kbert: interrupted; the last complete epoch is in {resume}; "
                       "run the same command again to resume")
    assert "Traceback" not in "\n".join(err)
    assert sorted(os.listdir(tmp_path)) == [".kbert-resume-model"]  # no model, no staging
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_interrupted_export_writes_nothing(tmp_path, classifier, monkeypatch, capsys):
    from kbert.export import exporter

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(exporter, "_export", interrupted)
    data = tmp_path / "dev.csv"
    data.write_text("text,label\na text,a\n")
    out = tmp_path / "export"
    code = main(["export", "--model", classifier, "--data", str(data), "--out", str(out), "--formats", "onnx"])
    err = capsys.readouterr().err
    assert code == 130 and err.endswith(f"kbert: interrupted; {out} was not written or changed\n"), err
    assert sorted(os.listdir(tmp_path)) == ["dev.csv"]


def test_interrupted_embed_writes_nothing(tmp_path, classifier, monkeypatch, capsys):
    from kbert.modelfolder import ModelFolder

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(ModelFolder, "embed", interrupted)
    texts = tmp_path / "texts.txt"
    texts.write_text("a text\n")
    out = tmp_path / "e.npy"
    code = main(["embed", "--model", classifier, "--task", "sentence-embedding", "--input", str(texts),
                 "--output", str(out)])
    assert code == 143 and capsys.readouterr().err == f"kbert: interrupted; {out} was not written or changed\n"
    assert sorted(os.listdir(tmp_path)) == ["texts.txt"]


class _Watched:
    """An object a weak reference's callback watches."""


class _Dropped:
    """An object whose `__del__` receives a signal, as a collected one's may at any moment."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("where", ["gc callback", "weakref callback", "__del__"])
def test_a_signal_inside_a_callback_is_raised_once_it_returns(where, monkeypatch):
    """JAX's `_xla_gc_callback` runs at every garbage collection, often while TensorFlow and Keras load: a
    Ctrl-C whose handler ran inside it (or inside a weak reference's callback or a `__del__`) was printed as "Exception ignored in ..." with a traceback, and the
    raise was lost. A real signal, handled inside a real callback: raised after it, nothing printed."""
    from kbert import interrupts

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    fired = []

    def callback(phase, info):
        if not fired:
            fired.append(phase)
            os.kill(os.getpid(), signal.SIGTERM)

    previous = interrupts.handle_signals()
    callbacks = [callback] if where == "gc callback" else []
    gc.callbacks.extend(callbacks)
    try:
        with pytest.raises(interrupts.Interrupted):
            if where == "gc callback":
                gc.collect()
            elif where == "weakref callback":
                dropped = _Watched()
                weakref.finalize(dropped, os.kill, os.getpid(), signal.SIGTERM)
                del dropped  # its finalizer runs here
            else:
                _Dropped()  # no name holds it: its __del__ runs here
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.001)
    finally:
        for registered in callbacks:
            gc.callbacks.remove(registered)
        interrupts.restore(previous)
    assert unraisable == []


def test_npy_check_reads_only_the_header(tmp_path):
    from kbert.cliio import is_npy

    path = tmp_path / "a.npy"
    np.save(path, np.zeros(3))
    assert is_npy(str(path)) and not is_npy(str(tmp_path / "missing.npy"))


# === Inputs read as the wrong format, errors naming the wrong cause ===


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    """A tiny token-classification model folder."""
    return write_task_folder(
        tmp_path_factory.mktemp("tagger") / "model", "token-classification",
        {"tags": ["O", "B-ORG", "I-ORG", "B-PER", "I-PER"], "scheme": "IOB2"}, TINY,
    )


CONLL = "-DOCSTART- -X- -X- O\n\nLEICESTERSHIRE NNP B-NP B-ORG\nTAKE NNP I-NP O\n\nWest NNP B-NP B-PER\n"


def test_predict_refuses_a_conll_txt_and_reads_a_conll_file(tmp_path, tagger, capsys):
    txt = tmp_path / "dev.txt"
    txt.write_text(CONLL.replace("-DOCSTART- -X- -X- O\n\n", ""))
    err = error_of(["predict", "--model", tagger, "--input", str(txt)], capsys)
    assert (f"{txt}, line 1: 'LEICESTERSHIRE NNP B-NP B-ORG' looks like CoNLL (a token and its tag a line); "
            "a .txt --input is one text a line (to tag a CoNLL file, name it .conll)") in err
    conll = tmp_path / "dev.conll"
    conll.write_text(CONLL)
    assert main(["predict", "--model", tagger, "--input", str(conll)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [len(row["tags"]) for row in rows] == [2, 1]
    assert main(["evaluate", "--model", tagger, "--data", str(txt)]) == 0  # evaluate: CoNLL as before
    capsys.readouterr()
    plain = tmp_path / "texts.txt"
    plain.write_text("Take vitamin B-12\nLeicestershire beat Essex\n")
    assert main(["predict", "--model", tagger, "--input", str(plain)]) == 0


def test_a_pair_tsv_given_to_a_tagger_is_named_as_such(tmp_path, tagger, capsys):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tlabel\nA man is playing.\tA man plays.\t1\n")
    err = error_of(["evaluate", "--model", tagger, "--data", str(pairs)], capsys)
    assert f"{pairs}, line 2: a column holds words with spaces ('A man is playing. | A man plays. | 1')" in err
    assert "expected CoNLL, one token a line with its tag last (a data file of another task?)" in err


def test_jsonl_tokens_as_a_string_is_named(tmp_path, tagger, capsys):
    data = tmp_path / "dev.jsonl"
    data.write_text('{"tokens": "EU rejects German call", "tags": ["B-ORG", "O", "O", "O"]}\n')
    err = error_of(["evaluate", "--model", tagger, "--data", str(data)], capsys)
    assert f"{data}, line 1: 'tokens' is a str; expected a list of token strings" in err


def test_stray_regression_scores_are_refused_naming_the_lines(tmp_path, vocab_file, capsys):
    rng = np.random.default_rng(0)
    lines = ["sentence1\tsentence2\tscore"]
    for i in range(60):
        lines.append(f"text number {i}\tanother text {i}\t{rng.uniform(0, 5):.2f}")
    lines[12] = "a stray\tscore\t50"
    lines[40] = "a negative\tscore\t-3"
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(lines) + "\n")
    err = error_of(["finetune", "--task", "text-pair-regression", "--train", str(train), "--dev", str(train),
                    "--init", "bert_tiny", "--vocab", vocab_file, "--out", str(tmp_path / "model")], capsys)
    assert f"{train}: scores far outside the rest at line 13 (50), line 41 (-3);" in err
    assert "the task scales its score to the training scores' range, here mostly" in err
    assert sorted(os.listdir(tmp_path)) == ["train.tsv"]


def test_a_student_larger_than_its_teacher_is_warned_of(tmp_path, classifier, capsys):
    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"text {i},{'ab'[i % 2]}\n" for i in range(8)))
    out = tmp_path / "student"
    assert main(["distill", "--teacher", classifier, "--student", "bert_tiny", "--train", str(data),
                 "--dev", str(data), "--seq-len", "16", "--batch-size", "8", "--epochs", "1",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: student bert_tiny has " in err and "more than the teacher's" in err


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_a_real_signal_ends_finetune_in_one_line(tmp_path, small_csvs, vocab_file, how):
    """Ctrl-C and SIGTERM from outside, after the first epoch's checkpoint: one line, no traceback."""
    import subprocess
    import sys
    import time

    out = tmp_path / "model"
    command = [sys.executable, "-m", "kbert.cli", *finetune_args(small_csvs, vocab_file, out, "--epochs", "50")]
    # A command typed in a shell starts with SIGINT at its default; one started
    # in the background of a script (as CI may run the suite) inherits SIGINT
    # ignored, as Unix wants, so the child is given the default back.
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    checkpoint = tmp_path / ".kbert-resume-model" / "latest" / "training_metadata.json"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "finetune ended before its first epoch's checkpoint was seen"
    process.send_signal(how)
    try:
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()  # nothing, when it has stopped
    assert process.returncode == 128 + how, err[-2000:]
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("kbert: interrupted; the last complete epoch is in ")
    assert sorted(os.listdir(tmp_path)) == [".kbert-resume-model"]


def test_search_corpus_names_the_line_that_is_not_utf8(tmp_path):
    import gzip

    from kbert.search import read_corpus

    path = tmp_path / "corpus.txt.gz"
    with gzip.open(path, "wb") as f:
        f.write("a text\n\nun éditeur\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"corpus.txt.gz, line 3: byte 0xe9 is not UTF-8"):
        read_corpus(str(path))
    path.write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(ValueError, match="corpus.txt.gz cannot be read"):
        read_corpus(str(path))


def test_a_damaged_tfrecord_is_one_line(tmp_path, vocab_file, capsys):
    corpus = tmp_path / "corpus.txt"
    words = "the editor of a mail client and a chess game for the terminal".split()
    corpus.write_text("".join(" ".join(words[i:] + words[:i]) + ".\n" + ("\n" if i % 3 == 2 else "")
                              for i in range(12)))
    records = tmp_path / "records"
    assert main(["pretraining-data", "--corpus", str(corpus), "--vocab", vocab_file, "--out", str(records),
                 "--num-shards", "1", "--dupe-factor", "2", "--max-seq-length", "32", "--workers", "1"]) == 0
    (shard,) = [p for p in records.iterdir() if ".tfrecord" in p.name]
    content = shard.read_bytes()
    shard.write_bytes(content[: len(content) // 2] + bytes(40) + content[len(content) // 2 + 40:])
    capsys.readouterr()
    err = error_of(["pretrain", "--records", str(records), "--config", "bert_tiny", "--steps", "2",
                    "--batch-size", "2", "--seq-len", "32", "--no-jit", "--out", str(tmp_path / "run")],
                   capsys, after_progress=True)
    assert "an input is damaged or unreadable (corrupted record at" in err and f"--records {records}" in err


def test_damaged_pretraining_metadata_names_the_file(tmp_path):
    from kbert.pretraining import read_metadata

    (tmp_path / "pretraining_data.json").write_text('{"shards": ')
    with pytest.raises(ValueError, match=r"pretraining_data.json is not valid JSON \(Expecting value"):
        read_metadata(str(tmp_path))


def test_a_signal_whose_raise_was_lost_still_stops_training():
    """SIGTERM's handler raises where Python runs next; code that swallows that
    raise (a C extension's callback) must not let training go on."""
    import keras

    from kbert import interrupts
    from kbert.fitting.backup import PendingInterrupt

    previous = interrupts.handle_signals()
    try:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except interrupts.Interrupted:
            pass  # swallowed, as the C code would
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        with pytest.raises(interrupts.Interrupted):
            model.fit(np.zeros((8, 2)), np.zeros((8, 1)), epochs=3, batch_size=2, verbose=0,
                      callbacks=[PendingInterrupt()])
    finally:
        interrupts.restore(previous)
    interrupts.raise_pending()  # forgotten once the handlers are restored
