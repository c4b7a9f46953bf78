"""A small real-text corpus that is on every machine: the Python standard library's own modules.

Writes one JSONL line ``{"text": ..., "name": ...}`` per module, for ``tools/preprocess_data.py``:

    python tools/stdlib_corpus.py --output build/corpus/stdlib.jsonl
    python tools/preprocess_data.py --input build/corpus/stdlib.jsonl --json-keys text \\
        --tokenizer-type ByteLevelTokenizer --append-eod --output-prefix build/corpus/stdlib

The documents are real text of very different lengths: from the top-level ``*.py`` files of
``sysconfig.get_paths()["stdlib"]``, sorted by name, ``--num-modules`` taken at evenly spaced
positions of that list, either each module whole (``--unit module``: a few hundred bytes to a
few hundred kilobytes) or each of their top-level functions and classes as a document of its
own (``--unit definition``, the default: tens of bytes to over a hundred kilobytes, median about
half a kilobyte, a long tail like real pretraining corpora). Nothing is downloaded. The
selection is deterministic for one Python version; another version's standard library gives
other text (the first line printed names the corpus's SHA-256, which the functional test
compares before it trusts its golden values).

Imports only the standard library: runs from the repository root in any environment.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import ast
import hashlib
import json
import os
import re
import sys
import sysconfig

DEFAULT_NUM_MODULES = 48
MODULE, DEFINITION = "module", "definition"
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# A line as the parser counts them (ast.get_source_segment's split): ended by \r\n, \r or \n
# only (not by the form feeds and other breaks str.splitlines also splits on), its end kept.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def stdlib_modules(stdlib_dir: str | None = None) -> list[str]:
    """Paths of the standard library's top-level ``*.py`` files, sorted by name."""
    root = stdlib_dir or sysconfig.get_paths()["stdlib"]
    names = sorted(name for name in os.listdir(root) if name.endswith(".py"))
    return [os.path.join(root, name) for name in names]


def select_evenly(paths: list[str], count: int) -> list[str]:
    """``count`` paths at evenly spaced positions (all of them when there are fewer)."""
    if count >= len(paths):
        return list(paths)
    return [paths[i * len(paths) // count] for i in range(count)]


def _segment(lines: list[str], node: ast.AST) -> str:
    """``ast.get_source_segment(source, node)`` given ``source``'s lines: that function splits
    the whole source again for every node, which made a module's definitions quadratic in its
    length (5 s for the default corpus, now 0.3 s). Columns are UTF-8 byte offsets."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    return "".join([lines[first].encode()[node.col_offset:].decode(), *lines[first + 1:last],
                    lines[last].encode()[:node.end_col_offset].decode()])


def _definitions(name: str, source: str) -> list[dict]:
    """Each top-level function and class of a module, in file order (none if it does not
    parse with this Python)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = _LINE.findall(source)
    return [{"name": f"{name}:{node.name}", "text": _segment(lines, node)}
            for node in tree.body if isinstance(node, _DEFINITIONS)]


def corpus_records(num_modules: int, unit: str = DEFINITION,
                   stdlib_dir: str | None = None) -> list[dict]:
    """The corpus's JSONL records, in order."""
    records = []
    for path in select_evenly(stdlib_modules(stdlib_dir), num_modules):
        with open(path, encoding="utf-8", errors="replace") as handle:
            source = handle.read()
        name = os.path.basename(path)
        records += ([{"name": name, "text": source}] if unit == MODULE
                    else _definitions(name, source))
    return records


def write_corpus(output: str, num_modules: int, unit: str = DEFINITION,
                 stdlib_dir: str | None = None) -> tuple[str, list[dict]]:
    """Writes the JSONL file; returns its SHA-256 and the records."""
    records = corpus_records(num_modules, unit, stdlib_dir)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    payload = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    with open(output, "w", encoding="utf-8") as handle:
        handle.write(payload)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest(), records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="JSONL file to write.")
    parser.add_argument("--num-modules", type=int, default=DEFAULT_NUM_MODULES,
                        help="Modules to take (evenly spaced in name order).")
    parser.add_argument("--unit", choices=(DEFINITION, MODULE), default=DEFINITION,
                        help="One document per top-level function/class, or per module.")
    parser.add_argument("--stdlib-dir", default=None,
                        help="Read this directory instead of the running Python's stdlib.")
    args = parser.parse_args(argv)
    if args.num_modules < 1:
        parser.error(f"--num-modules must be >= 1 (got {args.num_modules})")
    digest, records = write_corpus(args.output, args.num_modules, args.unit, args.stdlib_dir)
    lengths = [len(r["text"].encode("utf-8")) for r in records]
    print(f"corpus sha256 {digest}: {len(lengths)} documents from Python "
          f"{sys.version_info.major}.{sys.version_info.minor}'s standard library, "
          f"{min(lengths)} to {max(lengths)} bytes, {sum(lengths)} in all -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
