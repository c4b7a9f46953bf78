"""The same SFT conversations written as JSONL, one Parquet file, Parquet shards and a
``datasets.save_to_disk`` folder (the four forms ``--sft --data-path`` reads)."""

from __future__ import annotations

import json
import random
from pathlib import Path

NUM_SHARDS = 3
ROW_GROUP_ROWS = 4  # several row groups per shard


def conversations(num: int, seed: int = 0) -> list[dict]:
    """``num`` chats of very different lengths (a system turn now and then, 1-3 exchanges,
    some longer than a 64-token --seq-length)."""
    rng = random.Random(seed)

    def text() -> str:
        return "".join(rng.choice("abcdefgh ijklmn") for _ in range(rng.randint(1, 40)))

    chats = []
    for _ in range(num):
        turns = [{"role": "system", "content": text()}] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 3)):
            turns += [{"role": "user", "content": text()},
                      {"role": "assistant", "content": text()}]
        chats.append({"messages": turns})
    return chats


def write_jsonl(records: list[dict], path: Path) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def write_parquet(records: list[dict], path: Path) -> str:
    import pyarrow as pa  # the data extra: imported here so that importers can skip without it
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=ROW_GROUP_ROWS)
    return str(path)


def write_shards(records: list[dict], folder: Path) -> str:
    """Shards named so that name order is record order (shard 10 after shard 9 would not be)."""
    folder.mkdir()
    size = -(-len(records) // NUM_SHARDS)
    for shard in range(NUM_SHARDS):
        write_parquet(records[shard * size:(shard + 1) * size],
                      folder / f"part-{shard:05d}.parquet")
    return str(folder)


def write_saved_dataset(records: list[dict], folder: Path) -> str:
    import datasets

    datasets.Dataset.from_list(records).save_to_disk(str(folder))
    return str(folder)


def write_all_forms(records: list[dict], root: Path) -> dict[str, str]:
    """{form: --data-path} for the four forms of the same records."""
    return {"jsonl": write_jsonl(records, root / "chats.jsonl"),
            "parquet": write_parquet(records, root / "chats.parquet"),
            "shards": write_shards(records, root / "shards"),
            "save_to_disk": write_saved_dataset(records, root / "saved")}
