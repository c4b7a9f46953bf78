"""``DataConfig``: the datasets, the tokenizer and how many samples the run reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataConfig:
    """Fields named as their flags' dests (``data_path`` as a tuple), plus the sample counts
    derived from the training schedule: ``train_samples`` for every iteration and
    ``eval_samples`` for every evaluation point."""

    mock_data: bool
    sft: bool
    data_path: tuple[str, ...] | None
    sft_mock_dataset_config_json: str | None
    tokenizer_type: str
    tokenizer_model: str | None
    train_samples: int
    eval_samples: int
    # Megatron-LM's document flags and how --sequence-packing cuts pretraining data
    # (document_arguments.py); defaults: Megatron-LM's.
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    packing_unit: str = "sample"
