"""Log state for tests of megatron/varlen_training/log.py and the facade's writers: a clean slate
per test (no rank from the environment, INFO level, the default coordinates provider afterwards) and
a way to pose as any rank without a process group."""

import pytest

from megatron.varlen_training.log import set_coordinates_provider, set_log_level

RANK_ENV_VARS = ("RANK", "WORLD_SIZE", "WANDB_API_KEY")


@pytest.fixture
def clean_log_state(monkeypatch):
    for name in RANK_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    set_log_level("INFO")
    yield
    set_coordinates_provider(None)
    set_log_level("INFO")


def use_rank(rank: int, **coordinates: int) -> None:
    """Log lines from here on carry this rank and these coordinates."""
    set_coordinates_provider(lambda: {"rank": rank, **coordinates})
