"""JSONL text -> Megatron indexed datasets (.bin/.idx) for ``--data-path``, with Megatron-LM's
flags; the work is in megatron/varlen_training/datasets/preprocess.py.

    python tools/preprocess_data.py --input docs.jsonl --json-keys text \\
        --tokenizer-type ByteLevelTokenizer --append-eod --output-prefix data/docs --workers 4

Imports only the installed package (no ``tools.*``); the bootstrap below is the rule every tool
follows (tools/_repo_root.py), so it stays runnable if it ever imports ``tools.*``.
"""

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import sys

from megatron.varlen_training.datasets.preprocess_cli import main

if __name__ == "__main__":
    sys.exit(main())
