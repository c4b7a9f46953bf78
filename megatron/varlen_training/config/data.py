"""``DataConfig``: the datasets, the tokenizer and how many samples the run reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataConfig:
    """Fields named as their flags' dests (``data_path`` as a tuple), plus the sample counts
    derived from the training schedule: ``train_samples`` for every iteration (or
    ``--train-samples`` as given) and ``eval_samples`` for every evaluation point."""

    mock_data: bool
    sft: bool
    data_path: tuple[str, ...] | None
    sft_mock_dataset_config_json: str | None
    tokenizer_type: str
    sft_messages_key: str
    sft_prompt_key: str
    sft_response_key: str
    tokenizer_model: str | None
    train_samples: int
    eval_samples: int
