"""The loop steps both entry points share (megatron/varlen_training/loop_steps.py)."""


import pytest
import torch

from megatron.varlen_training.config import CheckpointConfig
from megatron.varlen_training.loop_steps import eval_mode, final_save_due, periodic_save_due


def test_eval_mode_restores_train_mode_even_when_evaluation_raises():
    chunks = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    with eval_mode(chunks):
        assert not any(chunk.training for chunk in chunks)
    assert all(chunk.training for chunk in chunks)
    with pytest.raises(RuntimeError, match="boom"):
        with eval_mode(chunks):
            raise RuntimeError("boom")
    assert all(chunk.training for chunk in chunks), "an evaluation error left eval mode on"


@pytest.mark.parametrize("save, interval, iteration, periodic, final", [
    (None, 2, 2, False, False),      # no --save: never
    ("ckpt", 2, 2, True, False),     # interval hit: the periodic save already covers the end
    ("ckpt", 2, 3, False, True),     # end between intervals: one final save
    ("ckpt", None, 3, False, True),  # no interval: only the final save
])
def test_save_rules(save, interval, iteration, periodic, final):
    checkpoint = CheckpointConfig(save=save, load=None, save_interval=interval,
                                  hf_checkpoint=None, save_hf=None,
                                  override_data_fingerprint=False)
    assert periodic_save_due(checkpoint, iteration) is periodic
    assert final_save_due(checkpoint, iteration) is final
