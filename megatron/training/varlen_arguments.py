"""This fork's own flags (sequence packing, SFT data): one small group, mapped 1:1 to fields.

Kept apart from :mod:`megatron.training.arguments` so that every flag the fork adds to
Megatron-LM's CLI is visible in one place.
"""

from __future__ import annotations


def add_varlen_args(parser) -> None:
    """Registers the fork's flags on ``parser``."""
    group = parser.add_argument_group("variable-length data (this fork)")
    group.add_argument("--sequence-packing", action="store_true",
                       help="Pack variable-length samples into THD micro-batches balanced across "
                            "DP x CP ranks (implies per-token loss).")
    group.add_argument("--sft", action="store_true",
                       help="Supervised fine-tuning data: one variable-length sample per sequence "
                            "(--mock-data --sft gives the mock SFT dataset).")
    group.add_argument("--sft-mock-dataset-config-json", default=None,
                       help="Lengths of the mock SFT dataset: inline JSON or a path to a JSON "
                            "file, e.g. '{\"mode\":\"file\",\"path\":\"lengths.csv\"}'.")


def validate_varlen_args(args, require) -> None:
    """Checks the fork's flags; ``require(cond, message)`` raises the one-line error."""
    require(args.sft_mock_dataset_config_json is None or args.sft,
            "--sft-mock-dataset-config-json needs --sft (with --mock-data)")
