"""Writes docs/FLAGS.md from pretrain_gpt.py's parser (the one source of truth).

    python tools/flag_reference.py            # rewrite docs/FLAGS.md
    python tools/flag_reference.py --check    # exit 1 if docs/FLAGS.md is stale (used by a test)
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import sys
from pathlib import Path

from megatron.varlen_training.arguments import build_parser
from megatron.varlen_training.hybrid_arguments import build_hybrid_parser

REPO = Path(__file__).resolve().parents[1]

OUTPUT = REPO / "docs" / "FLAGS.md"
HEADER = """# pretrain_gpt.py flag reference

Generated from `megatron/varlen_training/arguments.py` by `python tools/flag_reference.py`; a test
fails when this file is stale. Flag names follow Megatron-LM; the group
"variable-length data (this fork)" holds the flags this fork adds. `pretrain_mamba.py` takes
every flag below plus the group "hybrid Mamba model" at the end.
"""


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if action.required:
        return "required"
    return "" if action.default is None else f"`{action.default}`"


def _row(action: argparse.Action) -> str:
    flag = ", ".join(f"`{opt}`" for opt in action.option_strings)
    if action.nargs not in (None, 0):
        flag += f" {' '.join(action.metavar) if isinstance(action.metavar, tuple) else '…'}"
    choices = f" Choices: {', '.join(map(str, action.choices))}." if action.choices else ""
    text = (action.help or "").replace("|", "\\|") + choices
    return f"| {flag} | {_default(action)} | {text.strip()} |"


def _groups(parser: argparse.ArgumentParser, skip_titles=()) -> list[str]:
    lines = []
    for group in parser._action_groups:  # argparse has no public API for its groups
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not actions or group.title in skip_titles:
            continue
        lines += [f"\n## {group.title}\n", "| flag | default | meaning |", "|---|---|---|"]
        lines += [_row(action) for action in actions]
    return lines


def render() -> str:
    parser = build_parser()
    gpt_titles = {group.title for group in parser._action_groups}
    lines = [HEADER] + _groups(parser)
    lines += _groups(build_hybrid_parser(), skip_titles=gpt_titles)  # pretrain_mamba.py only
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/FLAGS.md is stale instead of rewriting it")
    check = parser.parse_args(argv).check
    text = render()
    if check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python tools/flag_reference.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
