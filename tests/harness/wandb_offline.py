"""Reads back what an offline wandb run logged: its history rows, from the run's ``.wandb``
file. wandb (0.31) ships no Python reader for that file; its layout is LevelDB's log format
behind a 7-byte header (``:W&B``, a magic number, a version): 32 KiB blocks of records, each a
7-byte header (CRC-32, length, kind) and a piece of one serialised ``wandb_internal_pb2.Record``
(a record too long for its block continues in the next; a block's last bytes, too few for a
header, are padding)."""

from __future__ import annotations

import glob
import json
import time

_FILE_HEADER = b":W&B"
_FILE_HEADER_LEN = 7
_BLOCK_LEN = 32 * 1024
_RECORD_HEADER_LEN = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4  # a record whole, or its pieces
# wandb's service process writes the file behind the run: ``finish()`` can return before the
# records are on disk (measured: sometimes none yet). A finished run's file ends in its "exit"
# record, so readers wait for that, this long at most.
_FINISHED_RECORD, _WAIT_S, _POLL_S = "exit", 30.0, 0.05


def _records(path: str) -> list:
    from wandb.proto.wandb_internal_pb2 import Record

    with open(path, "rb") as handle:
        data = handle.read()
    assert data.startswith(_FILE_HEADER), f"{path} is not a wandb run file"
    position, records, pending = _FILE_HEADER_LEN, [], b""
    while position + _RECORD_HEADER_LEN <= len(data):
        left_in_block = _BLOCK_LEN - position % _BLOCK_LEN
        if left_in_block < _RECORD_HEADER_LEN:
            position += left_in_block  # the block's padding
            continue
        length = int.from_bytes(data[position + 4:position + 6], "little")
        kind = data[position + 6]
        start = position + _RECORD_HEADER_LEN
        pending += data[start:start + length]
        position = start + length
        if kind in (_FULL, _LAST):
            records.append(Record.FromString(pending))
            pending = b""
    return records


def _finished_run_records(save_dir: str) -> list:
    """The records of the one offline run under ``save_dir``, once its file is complete."""
    (path,) = glob.glob(f"{save_dir}/wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + _WAIT_S
    from google.protobuf.message import DecodeError

    while True:
        try:
            records = _records(path)
        except DecodeError:  # a record wandb is still writing
            records = []
        if records and records[-1].WhichOneof("record_type") == _FINISHED_RECORD:
            return records
        assert time.monotonic() < deadline, f"{path}: no '{_FINISHED_RECORD}' record yet"
        time.sleep(_POLL_S)


def offline_history(save_dir: str) -> dict[int, dict]:
    """``{step: {key: value}}`` of the one offline run under ``save_dir`` (wandb's ``dir``);
    wandb merges what was logged at one step into one row."""
    rows: dict[int, dict] = {}
    for record in _finished_run_records(save_dir):
        if record.WhichOneof("record_type") == "history":
            row = rows.setdefault(record.history.step.num, {})
            row.update({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item})
    return rows


def offline_run_entity(save_dir: str) -> str:
    """The entity (team) the one offline run under ``save_dir`` was started with."""
    runs = [record.run for record in _finished_run_records(save_dir)
            if record.WhichOneof("record_type") == "run"]
    assert runs, f"{save_dir}: no run record"
    return runs[0].entity
