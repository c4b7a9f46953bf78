"""tools/stdlib_corpus.py: a deterministic real-text corpus from the running Python's standard
library, runnable from the repository root with nothing but the standard library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from tools.stdlib_corpus import corpus_records, select_evenly, stdlib_modules

REPO = Path(__file__).resolve().parents[3]


def test_selection_is_evenly_spaced_and_sorted():
    paths = [f"m{i:03d}.py" for i in range(100)]
    assert select_evenly(paths, 4) == ["m000.py", "m025.py", "m050.py", "m075.py"]
    assert select_evenly(paths[:3], 10) == paths[:3]
    modules = stdlib_modules()
    assert modules == sorted(modules) and all(m.endswith(".py") for m in modules)


def test_definitions_are_the_modules_own_text():
    records = corpus_records(4)
    assert records == corpus_records(4)  # deterministic
    root = sysconfig.get_paths()["stdlib"]
    for record in records:
        module = record["name"].split(":")[0]
        with open(os.path.join(root, module), encoding="utf-8", errors="replace") as handle:
            assert record["text"] in handle.read()
    lengths = [len(r["text"]) for r in corpus_records(48)]
    assert max(lengths) > 100 * min(lengths)  # very different lengths


def test_runs_from_the_repository_root_without_the_repository_on_the_path(tmp_path):
    out = tmp_path / "corpus.jsonl"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-S", "tools/stdlib_corpus.py", "--output", str(out),
                           "--num-modules", "3", "--unit", "module"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)
    assert done.stdout.startswith("corpus sha256 ")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3 and all(r["name"].endswith(".py") for r in records)
