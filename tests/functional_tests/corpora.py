"""Data a functional case names with ``DATA:``, built once per machine under build/.

``stdlib``: tools/stdlib_corpus.py (the Python standard library's top-level functions and
classes, real text of very different lengths, no download) preprocessed by
tools/preprocess_data.py with the byte-level tokenizer and --append-eod. The corpus is the
running Python's standard library, so its SHA-256 is part of a case's golden values: another
Python version gives other text, and then only the checks that need no goldens run.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "functional_data"
PLACEHOLDER = "{DATA}"  # in MODEL_ARGS: replaced by the prefix of the case's data


def _run(*argv: str) -> None:
    subprocess.run([sys.executable, *argv], cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def stdlib_corpus() -> tuple[str, str]:
    """``(prefix for --data-path, SHA-256 of the corpus text)``, built if missing."""
    folder = CACHE / "stdlib"
    folder.mkdir(parents=True, exist_ok=True)
    jsonl, prefix = folder / "stdlib.jsonl", folder / "stdlib"
    _run("tools/stdlib_corpus.py", "--output", str(jsonl))
    digest = hashlib.sha256(jsonl.read_bytes()).hexdigest()
    stamp = folder / "sha256"
    indexed = Path(str(prefix) + "_text_document")
    if not (stamp.exists() and stamp.read_text() == digest
            and indexed.with_suffix(".bin").exists() and indexed.with_suffix(".idx").exists()):
        _run("tools/preprocess_data.py", "--input", str(jsonl), "--json-keys", "text",
             "--tokenizer-type", "ByteLevelTokenizer", "--append-eod", "--output-prefix",
             str(prefix), "--workers", "1")
        stamp.write_text(digest)
    return str(indexed), digest


CORPORA = {"stdlib": stdlib_corpus}
