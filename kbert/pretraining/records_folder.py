"""The folder `pretraining-data` writes: its names, whether a folder is one, and what may be written there.

No TensorFlow here: `kbert pretraining-data` refuses an `--out` it may not
write, and `kbert pretrain` a batch larger than the records, before
TensorFlow loads.
"""

import os

from kbert.fileio import check_output_folder, read_json

SHARD_PATTERN = "pretraining-{index:05d}-of-{count:05d}.tfrecord"
METADATA_FILE = "pretraining_data.json"
VOCAB_FILE = "vocab.txt"
# The "format" field of `METADATA_FILE`, which marks a records folder as kbert's.
RECORDS_FORMAT = "google-research/bert create_pretraining_data.py"
# What messages call such a folder ("a kbert records folder").
WHAT = "records"


def read_records_metadata(folder, remedy="; write the records again with --overwrite"):
    """The `METADATA_FILE` of `folder`, a JSON object.

    Raises:
        ValueError: one line naming the file: missing, not JSON, or not an object.
    """
    path = os.path.join(folder, METADATA_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"{path} not found; expected a folder from write_pretraining_data")
    metadata = read_json(path, remedy)
    if not isinstance(metadata, dict):
        raise ValueError(f"{path} holds {type(metadata).__name__}; expected the JSON object pretraining-data writes")
    return metadata


def is_records_folder(path):
    """Whether `path` is a folder `pretraining-data` wrote (its metadata says so)."""
    try:
        metadata = read_records_metadata(path)
    except (OSError, ValueError):
        return False
    return metadata.get("format") == RECORDS_FORMAT and isinstance(metadata.get("shards"), dict)


def records_names(path):
    """The names a records folder written before manifests holds: its shards,
    as its metadata lists them, its vocabulary and its metadata."""
    try:
        shards = list(read_records_metadata(path).get("shards", {}))
    except (OSError, ValueError, AttributeError):
        shards = []
    return (*shards, VOCAB_FILE, METADATA_FILE)


def check_records_out(out, overwrite):
    """Refuses, before any work, an `out` that `pretraining-data` may not write:
    a file, a folder of the user's, kbert's own records without `overwrite` or
    holding files kbert did not write (`kbert.fileio.check_output_folder`).

    Raises:
        ValueError: one line naming `out` and what is wrong.
    """
    known = records_names(out) if os.path.isdir(out) else ()
    check_output_folder(out, WHAT, is_records_folder, overwrite, known)


def num_records(records):
    """How many sequences the records `pretraining-data` wrote in the folder
    `records` hold (its metadata's `num_instances`); None where that is not
    known (a glob, google's records without metadata)."""
    if not (isinstance(records, (str, os.PathLike)) and os.path.isdir(records)):
        return None
    try:
        count = read_records_metadata(records).get("num_instances")
    except (OSError, ValueError):
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) else None
