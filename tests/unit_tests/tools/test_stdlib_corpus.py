"""tools/stdlib_corpus.py: a deterministic real-text corpus from the running Python's standard
library, runnable from the repository root with nothing but the standard library."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from tools import stdlib_corpus
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


# Line ends the parser counts (\r\n, \r, \n) and breaks it does not (\f, \v, \x1c, \x85,
# \u2028: str.splitlines splits on them), multi-byte characters before an end column, a
# one-line definition, a decorated one and a last line without its end.
TRICKY_SOURCE = ('def one(): return "ü"\n'
                 "def crlf(a):\r\n    return a\r\n"
                 "class Cr:\r    '''\f\v\x1c\x85\u2028'''\r    y = 'ß'\r\n"
                 "@staticmethod\n"
                 "async def last(b):  # é\n    return 'é' + b")


def _segments(name: str, source: str) -> list[dict]:
    """A module's records by the standard library's ast.get_source_segment."""
    return [{"name": f"{name}:{node.name}", "text": ast.get_source_segment(source, node)}
            for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:  # as the tool reads
        return handle.read()


def test_definitions_are_what_ast_get_source_segment_gives(tmp_path):
    """The tool's one split per module against get_source_segment (a split per definition):
    on source with every kind of line end (as given, and as the tool reads a file: universal
    newlines), and on the corpus's own modules at 4."""
    want = _segments("tricky.py", TRICKY_SOURCE)
    assert [r["name"] for r in want] == [f"tricky.py:{n}" for n in ("one", "crlf", "Cr", "last")]
    assert stdlib_corpus._definitions("tricky.py", TRICKY_SOURCE) == want
    with open(tmp_path / "tricky.py", "w", encoding="utf-8", newline="") as handle:
        handle.write(TRICKY_SOURCE)
    read = _read(str(tmp_path / "tricky.py"))
    assert corpus_records(1, stdlib_dir=str(tmp_path)) == _segments("tricky.py", read)
    assert corpus_records(4) == [record for path in select_evenly(stdlib_modules(), 4)
                                 for record in _segments(os.path.basename(path), _read(path))]


def test_runs_from_the_repository_root_without_the_repository_on_the_path(tmp_path):
    out = tmp_path / "corpus.jsonl"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-S", "tools/stdlib_corpus.py", "--output", str(out),
                           "--num-modules", "3", "--unit", "module"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)
    assert done.stdout.startswith("corpus sha256 ")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3 and all(r["name"].endswith(".py") for r in records)
