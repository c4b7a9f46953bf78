"""``CheckpointConfig``: where checkpoints go and come from, Megatron's and Hugging Face's."""

from __future__ import annotations

from dataclasses import dataclass

from megatron.varlen_training.config.validation import check_ranges


@dataclass(frozen=True)
class CheckpointConfig:
    """Fields named as their flags' dests: ``--save``/``--load``/``--save-interval``, the
    Hugging Face checkpoint to start from and to export to, and whether a resume may train on
    data files whose content changed."""

    save: str | None
    load: str | None
    save_interval: int | None
    hf_checkpoint: str | None
    save_hf: str | None
    override_data_fingerprint: bool
    # What a load restores (recipe_arguments.py; load_options.py reads them).
    finetune: bool = False
    no_load_optim: bool = False
    no_load_rng: bool = False
    pretrained_checkpoint: str | None = None
    # Which saved iteration a load reads (checkpoint_arguments.py): None, the latest.
    ckpt_step: int | None = None
    # --save == --load holding nothing yet: stop instead of starting from scratch.
    exit_on_missing_checkpoint: bool = False
    # What a save writes and how saves and loads run (checkpoint_save_arguments.py).
    no_save_optim: bool = False
    no_save_rng: bool = False
    ckpt_fully_parallel_save: bool = True
    ckpt_fully_parallel_load: bool = False
    dist_ckpt_strictness: str = "assume_ok_unexpected"
    # The distributed optimizer's checkpoint format (checkpoint/sharding.py): fully_reshardable
    # instead of dp_reshardable, and gathered over gloo to one rank.
    dist_ckpt_optim_fully_reshardable: bool = False
    distrib_optim_fully_reshardable_mem_efficient: bool = False

    def __post_init__(self):
        check_ranges(self)
