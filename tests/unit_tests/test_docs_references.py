"""The references a reader of README.md, docs/*.md and examples/*/README.md would follow lead
somewhere.

Checked, each failure named as ``doc:line: reference: why``:

- repository paths (in code spans, links and prose): ``megatron/...``, ``tools/...``,
  ``tests/...``, ``docs/...``, ``results/...``, ``examples/...``, ``scripts/...`` exist (globs
  match something); a file name or partial path ending in ``.py`` (``flops.py``,
  ``varlen/model/mtp.py``, ``../wrap/test_x.py``) is the tail of a tracked file, a bare
  ``X.md`` the name of one (notes outside the repository are no reference);
  ``path::test_name`` names a function of that file (a following ``::other`` refers to the same
  file); a bare ``test_name`` is a function or module under tests/;
- relative links resolve, and their ``#anchor`` is a heading of the target (GitHub's slugs);
- every ``make TARGET`` is a target of the Makefile, a ``VAR=`` given to it read there or by
  scripts/*.sh;
- every ``--flag``: on a command line it belongs to the program run there (pretrain_gpt.py,
  pretrain_mamba.py, a tool's or example's own parser, or a launcher's allow-listed flags); in
  prose it is a flag of either entry point, of a script named in the same section, or in
  ``PROSE_FLAGS`` below with the reason it is named (upstream-only, refused, another program's);
- a ``--flag {a,b,c}`` span lists exactly the choices of the entry points' parser;
- docs/WRAP_CONFIG.md's table of the shipped YAML library names exactly megatron/wrap/configs;
- a section named in quotes after its doc (``[X.md](X.md), "One Trainer"``) is a heading there,
  a numbered one (``WRAP.md section 3``, ``§2``, or the doc's own ``section 6``) a ``N.`` heading;
- an issue number names its public tracker (``Megatron-LM issue 7452``): a bare ``issue 12``
  points to a tracker the reader does not have (name the capability, section or test instead).

No tool is run: the entry points' parsers are built in-process, a script's flags are its
literal ``add_argument`` calls, else (tools) its parser captured from its ``main``
(``parse_args`` raises before anything runs). The one subprocess is ``git ls-files``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import fnmatch
import functools
import importlib
import importlib.util
import inspect
import re
import subprocess
from collections.abc import Collection
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "examples").glob("*/README.md"))]
ROOTS = ("megatron", "tools", "tests", "docs", "results", "examples", "scripts")

# Paths that are not in this repository (nor megatron-core's package), with why docs name them.
FOREIGN_PATHS = {
    "tools/X.py": "a placeholder for any tool",
    "example.py": "megatron-wrap's example script",
    "megatron/core/datasets/lpt_dynamic_cp/": "the folder tools/upstream_patch.py adds to a "
                                              "Megatron-LM checkout",
}

# Flags of other programs that run the commands in the docs.
LAUNCHER_FLAGS = {
    "torchrun": {"--nproc-per-node", "--standalone"},
    "pip": {"--no-deps", "--only-binary", "--python-version", "--implementation", "--platform",
            "--target", "--no-index", "--no-compile"},
    "pytest": {"--ignore"},
}

# Flags named in prose that are neither ours nor a tool's named in the same section.
PROSE_FLAGS = {
    "--standalone": "torchrun's flag (how the torchrun tests start)",
    "--fp8": "no flag of Megatron-LM either (README: unrecognized there too)",
    "--target": "pip's flag (a folder on PYTHONPATH the GPU tests miss)",
    "--fim-*": "Megatron-LM's FIM flags, listed as not supported (docs/DATA.md)",
    "--split-sentences": "Megatron-LM's preprocess_data.py flag, listed as not supported",
    "--data-args-path": "Megatron-LM's data flag, listed as not supported (docs/DATA.md)",
    "--per-split-data-args-path": "Megatron-LM's data flag, listed as not supported",
    "--per-dataset-sequences-path": "Megatron-LM's data flag, listed as not supported",
    "--dataloader-fast-cache-load": "Megatron-LM's data flag, listed as not supported",
    "--dataloader-defer-npy-index-mmap": "Megatron-LM's data flag, listed as not supported",
    "--mid-level-dataset-surplus": "Megatron-LM's data flag, listed as not supported",
    "--multiple-validation-sets": "Megatron-LM's evaluation flag, listed as not supported",
    "--full-validation": "Megatron-LM's evaluation flag, listed as not supported",
    "--distribute-saved-activations": "Megatron-LM's recompute flag, listed as not supported",
    "--moe-input-jitter-eps": "Megatron-LM's MoE flag, listed as not supported (docs/MOE.md)",
    "--log-batch-size-to-tensorboard": "Megatron-LM's logging flag removed before core 0.9, "
                                       "listed as not accepted",
    "--no-log-learnig-rate-to-tensorboard": "Megatron-LM's (misspelt) logging flag removed "
                                            "before core 0.9, listed as not accepted",
    "--capture-range": "nsys's flag (how --profile's capture range is opened, README.md)",
    "--inprocess-*": "Megatron-LM's in-process restart flags, each refused in one line",
    "--x": "placeholder flag in docs/WRAP_CONFIG.md's table of how config values become argv",
    "--no-x": "placeholder flag in docs/WRAP_CONFIG.md's table of how config values become argv",
}

CODE_SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
# docs/ holds only Markdown: `docs/s` in "D docs/s" is a unit, not a path
ROOTED_PATH = re.compile(r"(?<![\w/.-])(?:\.\./)*(?:docs/[\w-]+\.md|(?:%s)/[\w.*/-]*)"
                         % "|".join(r for r in ROOTS if r != "docs"))
FLAG = re.compile(r"(?<![\w/-])--[a-zA-Z][\w-]*\*?(?:/-?[a-z]+)*")
MAKE = re.compile(r"\bmake\s+(?:[A-Z_]+=\S+\s+)*([a-z][\w-]*)")
HEADING = re.compile(r"^#{1,6}\s+(.*)$")


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__()
        self.parser = parser


# --------------------------------------------------------------------------- repository facts


@functools.lru_cache(maxsize=None)
def tracked_files() -> tuple[str, ...]:
    """The repository's files on disk, untracked ones included, ignored ones (.venv) not."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, text=True)
    files = out.stdout.split() if out.returncode == 0 else []
    if not files:  # not a git checkout: the files under the roots docs name, and the top's
        found = [p for root in ROOTS for p in (REPO / root).rglob("*")] + list(REPO.glob("*"))
        files = [str(p.relative_to(REPO)) for p in found if "__pycache__" not in p.parts]
    return tuple(f for f in files if (REPO / f).is_file())


@functools.lru_cache(maxsize=None)
def defined_test_names() -> frozenset[str]:
    """Function and module names defined under tests/."""
    names = set()
    for path in (REPO / "tests").rglob("*.py"):
        names.add(path.stem)
        names.update(re.findall(r"^\s*(?:async )?def (\w+)", path.read_text(), re.M))
    return frozenset(names)


def _option_strings(parser: argparse.ArgumentParser) -> frozenset[str]:
    return frozenset(opt for action in parser._actions for opt in action.option_strings)


@functools.lru_cache(maxsize=None)
def entry_point_flags(script: str) -> frozenset[str]:
    from megatron.varlen_training.arguments import build_parser
    from megatron.varlen_training.hybrid_arguments import build_hybrid_parser

    build = build_hybrid_parser if script == "pretrain_mamba.py" else build_parser
    return _option_strings(build())


@functools.lru_cache(maxsize=None)
def our_flags() -> frozenset[str]:
    return entry_point_flags("pretrain_gpt.py") | entry_point_flags("pretrain_mamba.py")


class ScriptFlags:
    """A script's flags: the literal ``add_argument("--x", ...)`` of its file first (importing a
    tool can cost seconds of megatron-core), else, for a tool, its parser captured from ``main``
    (flags made in a loop, a shared argument group)."""

    def __init__(self, path: str):
        self.path = path

    @functools.cached_property
    def literal(self) -> frozenset[str]:
        tree = ast.parse((REPO / self.path).read_text())
        return frozenset(arg.value for node in ast.walk(tree)
                         if isinstance(node, ast.Call)
                         and getattr(node.func, "attr", "") == "add_argument"
                         for arg in node.args
                         if isinstance(arg, ast.Constant) and str(arg.value).startswith("-"))

    @functools.cached_property
    def parsed(self) -> frozenset[str]:
        if not self.path.startswith("tools/"):  # examples are not a package: literal flags only
            return frozenset()
        module = importlib.import_module(self.path.removesuffix(".py").replace("/", "."))
        main = getattr(module, "main", None)
        if main is None:
            return frozenset()
        original = argparse.ArgumentParser.parse_args

        def capture(parser, *args, **kwargs):
            raise _Captured(parser)

        argparse.ArgumentParser.parse_args = capture
        try:
            main(["--help"]) if inspect.signature(main).parameters else main()
        except _Captured as captured:
            return _option_strings(captured.parser)
        finally:
            argparse.ArgumentParser.parse_args = original
        return frozenset()

    def __contains__(self, flag: str) -> bool:
        return flag in self.literal or flag in self.parsed

    def __iter__(self):
        return iter(self.literal | self.parsed)


# Tools whose parser is pretrain_gpt.py's (importing them to see it costs seconds).
TOOLS_WITH_GPT_FLAGS = {"tools/export_hf.py": "megatron/varlen_training/hf/export_tool.py "
                                              "parses pretrain_gpt.py's flags"}


@functools.lru_cache(maxsize=None)
def script_flags(path: str) -> Collection[str] | None:
    """The flags of a tool or example script (its repository path); None: no such script."""
    if path in TOOLS_WITH_GPT_FLAGS:
        return entry_point_flags("pretrain_gpt.py")
    return ScriptFlags(path) if path in scripts() else None


@functools.lru_cache(maxsize=None)
def scripts() -> frozenset[str]:
    """Every tool and example script, by repository path."""
    return frozenset(f for f in tracked_files() if f.startswith(("tools/", "examples/"))
                     and f.endswith(".py") and not Path(f).name.startswith("_"))


@functools.lru_cache(maxsize=None)
def tools_of_make_target(target: str) -> tuple[str, ...]:
    recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)*)", makefile(), re.M)
    return tuple(re.findall(r"tools/\w+\.py", recipe.group(1))) if recipe else ()


@functools.lru_cache(maxsize=None)
def makefile() -> str:
    return (REPO / "Makefile").read_text()


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", makefile(), re.M))


# --------------------------------------------------------------------------- reading the docs


def github_slug(heading: str) -> str:
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(doc: Path) -> frozenset[str]:
    return frozenset(github_slug(text) for _, text in headings(read(doc).lines))


def code_blocks(lines: list[str]) -> set[int]:
    """0-based indices of lines inside fenced or indented code blocks."""
    inside, fenced, previous_blank = set(), False, True
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            inside.add(i)
        elif fenced or (line.startswith("    ") and (previous_blank or i - 1 in inside)):
            inside.add(i)
        previous_blank = not line.strip()
    return inside


def headings(lines: list[str]) -> list[tuple[int, str]]:
    """(0-based line, text) of each heading; a ``#`` comment in a code block is none."""
    block = code_blocks(lines)
    return [(i, m.group(1)) for i, line in enumerate(lines)
            if i not in block and (m := HEADING.match(line))]


def sections(lines: list[str]) -> list[str]:
    """For each line, the text of its section (heading to heading)."""
    starts = [i for i, _ in headings(lines)] + [len(lines)]
    texts = [""] * len(lines)
    begin = 0
    for end in starts:
        text = "\n".join(lines[begin:end])
        for i in range(begin, end):
            texts[i] = text
        begin = end
    return texts


STARTS_PROGRAM = re.compile(r"(?:\S+=\S+ )*(?:\S*python3?|torchrun|\S*pip|pytest) ")


@dataclasses.dataclass(frozen=True)
class Doc:
    path: Path
    lines: list[str]
    spans: list[tuple[int, str]]  # (0-based line where it starts, text): code spans, any line
    commands: list[tuple[int, str]]  # (0-based line, command): a program's command line
    prose: list[str]  # per line: the text but code blocks that run a program and command spans
    plain: list[str]  # per line: the text outside code blocks, spans and links
    block: frozenset[int]

    @property
    def name(self) -> str:
        return str(self.path.relative_to(REPO))


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))


def _uncommented(line: str) -> str:
    return line.split(" #")[0].strip()


def block_commands(lines: list[str], block: frozenset[int]) -> dict[int, tuple[int, str]]:
    """Code-block lines that run a program: {each line it covers: (first line, command)}."""
    found, i = {}, 0
    while i < len(lines):
        if i in block and not lines[i].lstrip().startswith(("#", "```")):
            start, text = i, _uncommented(lines[i])
            # a line ending in a backslash or inside a quoted argument goes on
            while (text.endswith("\\") or text.count("'") % 2) and i + 1 in block:
                i += 1
                text = text.rstrip("\\") + " " + _uncommented(lines[i])
            if program(text.split())[1] is not None:
                found.update({j: (start, text) for j in range(start, i + 1)})
        i += 1
    return found


@functools.lru_cache(maxsize=None)
def read(path: Path) -> Doc:
    lines = path.read_text().split("\n")
    block = frozenset(code_blocks(lines))
    text = "\n".join("" if i in block else line for i, line in enumerate(lines))
    spans, commands, prose_text = [], [], text
    for match in CODE_SPAN.finditer(text):
        line, span = text.count("\n", 0, match.start()), match.group(1).replace("\n", " ")
        spans.append((line, span))
        if STARTS_PROGRAM.match(span) and program(span.split())[1] is not None:
            commands.append((line, span))
            prose_text = prose_text[:match.start()] + _blank(match) + prose_text[match.end():]
    in_blocks = block_commands(lines, block)
    commands += sorted(set(in_blocks.values()))
    prose = [lines[i] if i in block and i not in in_blocks else line
             for i, line in enumerate(prose_text.split("\n"))]
    plain = LINK.sub(_blank, CODE_SPAN.sub(_blank, text)).split("\n")
    return Doc(path, lines, spans, commands, prose, plain, block)


# --------------------------------------------------------------------------- paths


@functools.lru_cache(maxsize=None)
def megatron_core_dir() -> Path:
    spec = importlib.util.find_spec("megatron.core")
    return Path(list(spec.submodule_search_locations)[0])


def path_problem(token: str) -> str | None:
    """Why a path token leads nowhere, or None."""
    token = token.rstrip(".,;:)")
    if token in FOREIGN_PATHS:
        return None
    if token.startswith("megatron/core"):  # the megatron-core package this fork runs on
        inside = megatron_core_dir() / token[len("megatron/core"):].strip("/")
        return None if inside.exists() else "not in the installed megatron-core"
    files = tracked_files()
    if re.match(r"(?:%s)/" % "|".join(ROOTS), token):
        pattern = token.rstrip("/")
        hits = [f for f in files if fnmatch.fnmatch(f, pattern) or f.startswith(pattern + "/")]
        return None if hits else "no such file or folder"
    tail = re.sub(r"^(?:\.\./)+", "", token)
    if any(f == tail or f.endswith("/" + tail) or fnmatch.fnmatch(f, "*/" + tail) for f in files):
        return None
    return "no tracked file ends with it"


def path_tokens(text: str) -> list[str]:
    """Path-like tokens of a code span or code line: rooted paths and names ending in .py."""
    found = []
    for token in re.split(r"[\s(),`]+", text):
        token = token.split("::")[0].strip("'\"")
        if "<" in token or "=" in token or token.startswith(("/", "~", "$")):
            continue
        if ROOTED_PATH.fullmatch(token) or re.fullmatch(r"(?:\.\./)*[\w*/.-]*\w\.py", token):
            found.append(token)
    return found


def function_ref_problems(span: str, previous: str | None) -> tuple[list[str], str | None]:
    """``path::name`` names a function of that file; ``::name`` means the previous path."""
    problems = []
    for token in re.split(r"[\s(),]+", span):
        if "::" not in token:
            continue
        path, name = token.rsplit("::", 1)
        previous = path or previous
        if previous is None:
            problems.append(f"`{token}`: no file named before it")
            continue
        tail = re.sub(r"^(?:\.\./)+", "", previous)
        files = [f for f in tracked_files() if f == tail or f.endswith("/" + tail)]
        if files and not any(re.search(rf"^\s*def {re.escape(name)}\(", (REPO / f).read_text(),
                                       re.M) for f in files):
            problems.append(f"`{token}`: no function {name} in {previous}")
    return problems, previous


def link_problems(doc: Path, line: str) -> list[str]:
    problems = []
    for target in LINK.findall(line):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            problems.append(f"link ({target}): no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"link ({target}): no heading '#{anchor}' in {file.name}")
    return problems


def path_problems(doc: Doc) -> list[str]:
    problems, previous = [], None
    located = [(i, t) for i, span in doc.spans for t in path_tokens(span)]
    located += [(i, t) for i in sorted(doc.block) for t in path_tokens(doc.lines[i])]
    located += [(i, t) for i, line in enumerate(doc.plain) for t in ROOTED_PATH.findall(line)
                if t.rstrip("/.") not in ROOTS]
    for i, token in sorted(located):
        if (why := path_problem(token)) is not None:
            problems.append(f"{doc.name}:{i + 1}: `{token}`: {why}")
    names = {Path(f).name for f in tracked_files()}  # a bare X.md names a file of the repo
    for i, line in enumerate(doc.lines):
        for name in re.findall(r"(?<![\w/.-])([\w-]+\.md)\b", line):
            if name not in names:
                problems.append(f"{doc.name}:{i + 1}: {name}: no file of the repository so named")
    for i, span in doc.spans:
        found, previous = function_ref_problems(span, previous)
        problems += [f"{doc.name}:{i + 1}: {p}" for p in found]
        if re.fullmatch(r"test_\w+", span) and span not in defined_test_names():
            problems.append(f"{doc.name}:{i + 1}: `{span}`: no test function or module so named")
    for i, line in enumerate(doc.lines):
        if i not in doc.block:
            problems += [f"{doc.name}:{i + 1}: {p}" for p in link_problems(doc.path, line)]
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_paths_and_links_exist(doc):
    problems = path_problems(read(doc))
    assert not problems, "references that lead nowhere:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- make targets


# `VAR=x make t` / `make t VAR=x`: the variables a make command is given
MAKE_VARIABLES = re.compile(r"((?:\b[A-Z_]+=\S+\s+)*)make\s+[a-z][\w-]*((?:\s+[A-Z_]+=\S+)*)")


@functools.lru_cache(maxsize=None)
def make_recipes_text() -> str:
    """The Makefile and the scripts its recipes run: where a make variable can be read."""
    return makefile() + "".join(p.read_text() for p in sorted((REPO / "scripts").glob("*.sh")))


def test_make_targets_exist():
    """Every ``make TARGET`` is a target; every ``VAR=`` given to it is read by the recipes."""
    targets, problems = make_targets(), []
    for path in DOCS:
        doc = read(path)
        texts = [(i, s) for i, s in doc.spans] + [(i, doc.lines[i]) for i in sorted(doc.block)]
        for i, text in texts:
            for target in MAKE.findall(text):
                if target not in targets:
                    problems.append(f"{doc.name}:{i + 1}: `make {target}`: not a Makefile "
                                    f"target (targets: {', '.join(sorted(targets))})")
            for before, after in MAKE_VARIABLES.findall(text):
                for variable in re.findall(r"([A-Z_]+)=", before + after):
                    if not re.search(rf"\b{variable}\b", make_recipes_text()):
                        problems.append(f"{doc.name}:{i + 1}: {variable}=: neither the Makefile "
                                        f"nor scripts/*.sh reads it")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- flags


def expand(flag: str) -> list[str]:
    """``--cost-a/b/g/d`` and ``--lr-warmup-iters/-samples`` name several flags."""
    first, *others = flag.split("/")
    stem = first.rsplit("-", 1)[0]
    return [first] + [f"{stem}-{other.lstrip('-')}" for other in others]


def flags_in(text: str) -> list[str]:
    return [flag for found in FLAG.findall(text) for flag in expand(found)]


def flag_known(flag: str, known: Collection[str]) -> bool:
    if flag.endswith("*"):
        return any(k.startswith(flag[:-1]) for k in known)
    return flag in known


def program(tokens: list[str]) -> tuple[int, str | None]:
    """(index of the token naming the program a command runs, its name; None: no program)."""
    for i, token in enumerate(tokens):
        if token in ("pretrain_gpt.py", "pretrain_mamba.py") or \
                re.fullmatch(r"(?:tools|examples)/[\w/]+\.py", token):
            return i, token
        if token == "-m" and i + 1 < len(tokens) and re.search(r"python3?$", tokens[i - 1]):
            return i + 1, tokens[i + 1]
        if token.endswith("/pip") or token in ("pip", "pytest"):
            return i, token.rsplit("/", 1)[-1]
    return len(tokens), None


def program_flags(name: str) -> Collection[str] | None:
    if name in ("pretrain_gpt.py", "pretrain_mamba.py"):
        return entry_point_flags(name)
    if name.startswith("tools."):  # python -m tools.x
        name = name.replace(".", "/") + ".py"
    if name.startswith(("tools/", "examples/")):
        return script_flags(name)
    return frozenset(LAUNCHER_FLAGS[name]) if name in LAUNCHER_FLAGS else None


def command_flag_problems(doc: Doc) -> list[str]:
    problems = []
    for i, command in doc.commands:
        tokens = command.split()
        at, name = program(tokens)
        where = f"{doc.name}:{i + 1}"
        launcher = LAUNCHER_FLAGS["torchrun"] if "torchrun" in tokens[:at] else frozenset()
        for flag in flags_in(" ".join(tokens[:at])):
            if flag not in launcher:
                problems.append(f"{where}: {flag}: not a flag of what starts {name}")
        flags = program_flags(name)
        for flag in flags_in(" ".join(tokens[at + 1:])):
            if flags is None:
                problems.append(f"{where}: {flag}: {name} has no parser to check it against")
            elif not flag_known(flag, flags):
                problems.append(f"{where}: {flag}: not a flag of {name}")
    return problems


def scripts_named(text: str) -> set[str]:
    """The tools and examples a text names: by path, ``-m tools.x`` or file name."""
    named = {path for path in scripts()
             if path in text or path.removesuffix(".py").replace("/", ".") in text
             or re.search(rf"(?<![\w/]){re.escape(Path(path).name)}", text)}
    for target in MAKE.findall(text):
        named.update(tools_of_make_target(target))
    return named


def prose_flag_problems(doc: Doc) -> list[str]:
    problems, section_of = [], sections(doc.lines)
    for i, line in enumerate(doc.prose):
        for flag in flags_in(line):
            if flag_known(flag, our_flags()) or flag in PROSE_FLAGS:
                continue
            named = scripts_named(section_of[i])
            # literal flags of every named script before importing any of them
            if any(flag in getattr(script_flags(t), "literal", ()) for t in named) or \
                    any(flag_known(flag, script_flags(t)) for t in sorted(named)):
                continue
            problems.append(f"{doc.name}:{i + 1}: {flag}: not a flag of pretrain_gpt.py / "
                            f"pretrain_mamba.py nor of a script named in its section "
                            f"({', '.join(sorted(named)) or 'none'}), and not in PROSE_FLAGS")
    return problems


# docs/FLAGS.md too: a help text that names a renamed flag is caught there
@pytest.mark.parametrize("doc", DOCS,
                         ids=lambda d: str(d.relative_to(REPO)))
def test_flags_exist(doc):
    doc = read(doc)
    problems = command_flag_problems(doc) + prose_flag_problems(doc)
    assert not problems, "flags the docs name that nothing takes:\n" + "\n".join(problems)


def test_allow_lists_are_used():
    """An allow-list entry nobody needs any more is removed, not kept 'just in case'."""
    text = "\n".join(d.read_text() for d in DOCS)
    stale = [flag for flag in PROSE_FLAGS if flag.rstrip("*") not in text]
    stale += [path for path in FOREIGN_PATHS if path not in text]
    assert not stale, f"allow-list entries no doc names: {stale}"


# --------------------------------------------------------------------------- the YAML library


def test_wrap_config_library_table_lists_every_shipped_file():
    """docs/WRAP_CONFIG.md's table of the shipped library names exactly the files there."""
    library = REPO / "megatron" / "wrap" / "configs"
    shipped = {str(p.relative_to(library)) for p in library.rglob("*.yaml")}
    doc = read(REPO / "docs" / "WRAP_CONFIG.md")
    start = next(i for i, line in enumerate(doc.lines)
                 if line.startswith("#") and "shipped library" in line)
    end = next(i for i in range(start + 1, len(doc.lines)) if doc.lines[i].startswith("#"))
    listed = {m.group(1) for line in doc.lines[start:end]
              if (m := re.match(r"\| `([\w/]+\.yaml)` \|", line))}
    assert listed == shipped, (f"docs/WRAP_CONFIG.md:{start + 1}: the library table lists "
                               f"{sorted(listed - shipped)} that megatron/wrap/configs lacks and "
                               f"misses {sorted(shipped - listed)}")


# --------------------------------------------------------------------------- choices


@functools.lru_cache(maxsize=None)
def entry_point_choices() -> dict[str, frozenset[str]]:
    """Each flag's built choices: what its parser accepts but Megatron-LM's values it accepts
    only to refuse them in one line (refused_choices.py)."""
    from megatron.varlen_training.arguments import build_parser
    from megatron.varlen_training.hybrid_arguments import build_hybrid_parser
    from megatron.varlen_training.refused_choices import refused_values

    return {opt: frozenset(map(str, action.choices)) - set(refused_values(opt))
            for parser in (build_parser(), build_hybrid_parser()) for action in parser._actions
            if action.choices for opt in action.option_strings}


def test_listed_choices_are_the_parsers():
    """A ``--flag {a,b,c}`` span lists exactly the choices the parser builds."""
    problems = []
    for path in DOCS:
        doc = read(path)
        for i, span in doc.spans:
            for flag, listed in re.findall(r"(--[\w-]+) \{([^}]*)\}", span):
                accepted = entry_point_choices().get(flag)
                if accepted is not None and set(listed.split(",")) != accepted:
                    problems.append(f"{doc.name}:{i + 1}: `{flag} {{{listed}}}`: the parser "
                                    f"builds {{{','.join(sorted(accepted))}}}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- sections by name

# `[X.md](path), "Section"`, `README, "Section"` or `docs/X.md, "A", "B"`: sections by name.
SECTION_REF = re.compile(r'(?:\[[\w./]+\]\(([\w./-]+)\)|\b(README|(?:docs/)?[A-Z_]+\.md))'
                         r'((?:,\s+"[^"]+")+)')


def section_ref_target(doc: Path, link: str, name: str) -> Path:
    if link:
        return (doc.parent / link).resolve()
    if name == "README":
        return REPO / "README.md"
    beside = doc.parent / name
    return beside if beside.exists() else REPO / "docs" / Path(name).name


def test_sections_named_in_quotes_exist():
    """``([ARCHITECTURE.md](ARCHITECTURE.md), "One Trainer")``: a heading there starts so."""
    problems = []
    for path in DOCS:
        text = path.read_text()
        for match in SECTION_REF.finditer(text):
            target = section_ref_target(path, match.group(1), match.group(2))
            if not target.exists():
                continue  # the path check names it
            titles = [re.sub(r"`", "", title) for _, title in headings(read(target).lines)]
            for name in re.findall(r'"([^"]+)"', match.group(3)):
                name = " ".join(name.split())
                if not any(title.startswith(name) for title in titles):
                    line = text.count("\n", 0, match.start()) + 1
                    problems.append(f"{read(path).name}:{line}: section \"{name}\" of "
                                    f"{target.relative_to(REPO)}: no heading starts so")
    assert not problems, "\n".join(problems)


# `[WRAP.md](WRAP.md) section 3`, `docs/WRAP.md §2`, or `section 6` of the doc itself.
NUMBERED_REF = re.compile(r'(?:(?:\[[\w./]+\]\(([\w./-]+)\)|\b((?:docs/)?[A-Z_]+\.md))\s+)?'
                          r'(?:section\s+|§)(\d+)\b')


def test_numbered_sections_exist():
    """``section 3`` / ``§3`` (of the doc named before it, else of its own): a ``N.`` heading."""
    problems = []
    for path in DOCS:
        text = path.read_text()
        for match in NUMBERED_REF.finditer(text):
            link, name, number = match.groups()
            target = section_ref_target(path, link, name) if link or name else path
            if not target.exists():
                continue  # the path check names it
            if not any(title.startswith(f"{number}.") for _, title in headings(read(target).lines)):
                line = text.count("\n", 0, match.start()) + 1
                problems.append(f"{read(path).name}:{line}: section {number} of "
                                f"{target.relative_to(REPO)}: no heading '{number}. ...'")
    assert not problems, "\n".join(problems)


# -------------------------------------------------------------------------- issue numbers


# The public trackers whose issue numbers a reader can look up.
PUBLIC_TRACKERS = ("Megatron-LM", "megatron-core", "PyTorch", "transformers")
ISSUE_NUMBER = re.compile(r"(?:(" + "|".join(map(re.escape, PUBLIC_TRACKERS)) + r")\s+)?"
                          r"\b[Ii]ssues?\s+#?\d+")


def test_issue_numbers_name_a_public_tracker():
    """``issue 25`` alone pointed to a tracker outside the repository: a doc says what it
    stands for (the capability, the doc section or the test) or whose public issue it is."""
    problems = []
    for path in DOCS:
        text = path.read_text()
        for match in ISSUE_NUMBER.finditer(text):
            if match.group(1) is None:
                line = text.count("\n", 0, match.start()) + 1
                problems.append(f"{read(path).name}:{line}: '{match.group(0)}': whose issue? "
                                f"(name one of {PUBLIC_TRACKERS}, or what it stands for)")
    assert not problems, "\n".join(problems)
