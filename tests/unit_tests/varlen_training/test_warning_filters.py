"""The known-noise filter silences exactly the warnings it names, checked against the real
warnings the installed torch raises (not a copy of their text)."""

import os
import tempfile
import warnings

import pytest
import torch
import torch.distributed as dist

from megatron.varlen_training.warning_filters import silence_known_warnings


@pytest.fixture
def one_rank_gloo():
    with tempfile.TemporaryDirectory() as folder:
        store = dist.FileStore(os.path.join(folder, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _warnings_of(action, silenced: bool) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if silenced:
            silence_known_warnings()
        action()
    return [str(w.message) for w in caught]


def _gather():
    out = torch.zeros(2)
    dist.all_gather_into_tensor(out, torch.ones(2))


def test_megatron_core_gather_deprecation_is_silenced(one_rank_gloo):
    raised = _warnings_of(_gather, silenced=False)
    if not any("all_gather_into_tensor" in text for text in raised):
        pytest.skip(f"torch {torch.__version__} does not deprecate all_gather_into_tensor")
    assert _warnings_of(_gather, silenced=True) == []


def test_other_warnings_still_show():
    def unrelated():
        warnings.warn("something the user must see", UserWarning)

    assert _warnings_of(unrelated, silenced=True) == ["something the user must see"]
