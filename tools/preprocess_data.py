"""JSONL text -> Megatron indexed datasets (.bin/.idx) for ``--data-path``, with Megatron-LM's
flags; the work is in megatron/varlen_training/datasets/preprocess.py.

    python tools/preprocess_data.py --input docs.jsonl --json-keys text \\
        --tokenizer-type ByteLevelTokenizer --append-eod --output-prefix data/docs --workers 4

Imports only the installed package (no ``tools.*``), so it runs from the repository root in
any environment where the package is installed.
"""

import sys

from megatron.varlen_training.datasets.preprocess_cli import main

if __name__ == "__main__":
    sys.exit(main())
