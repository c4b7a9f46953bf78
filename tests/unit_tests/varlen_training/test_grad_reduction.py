"""Gradient reduction changes no number: the device-side token division (grad_finalize.py) and
the one-collective-per-bucket reduction for CUDA ranks over gloo (gloo_cuda.py).

Both are checked on 2 CPU gloo ranks (DP2, packed, per-token loss) against megatron-core's own
path: its ``finalize_model_grads`` on the same gradients, and its coalesced all-reduce. On a GPU,
tests/gpu/test_gpu_training.py runs the uncoalesced path for real (ranks sharing one GPU).
"""

import pytest
import torch

from megatron.varlen.platform import gloo_cuda
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.test_packing_equivalence import PACKED

WORLD = 2


def _main_grads(model):
    return [p.main_grad.clone() for chunk in model for p in chunk.parameters()]


def _set_main_grads(model, grads):
    for p, g in zip((p for chunk in model for p in chunk.parameters()), grads):
        p.main_grad.copy_(g)


def rank_finalize_results(argv):
    """One step's finalisation run by both implementations from the same unreduced gradients,
    with the real token count and with none."""
    from megatron.core.distributed import finalize_model_grads

    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.grad_finalize import finalize_model_grads_on_device
    from megatron.varlen_training.pretrain import build_data_providers
    from megatron.varlen_training.trainer import Trainer
    from megatron.varlen_training.training import run_forward_backward

    trainer = Trainer(parse_run_config(argv, world_size=torch.distributed.get_world_size()))
    try:
        run = trainer.start().run
        provider = build_data_providers(trainer).train
        state = trainer.setup_model_and_optimizer()
        captured = {}

        def capture(model, num_tokens=None, **kwargs):
            captured.update(model=model, grads=_main_grads(model), tokens=num_tokens.clone(),
                            kwargs=kwargs)

        state.config.finalize_model_grads_func = capture
        run_forward_backward(run, state, provider.step_batches(0), False)
        results = {}
        for tokens in (captured["tokens"], torch.zeros_like(captured["tokens"])):
            for name, finalize in (("ours", finalize_model_grads_on_device),
                                   ("stock", finalize_model_grads)):
                _set_main_grads(captured["model"], captured["grads"])
                finalize(captured["model"], tokens.clone(), **captured["kwargs"])
                results[(name, int(tokens))] = _main_grads(captured["model"])
        return {"tokens": int(captured["tokens"]), "results": results}
    finally:
        trainer.close()


def test_device_side_token_division_equals_megatron_core():
    for rank in run_distributed(rank_finalize_results, WORLD, args=(PACKED,), timeout_s=240):
        assert rank["tokens"] > 0
        for tokens in (rank["tokens"], 0):
            ours, stock = rank["results"][("ours", tokens)], rank["results"][("stock", tokens)]
            assert all(torch.equal(a, b) for a, b in zip(ours, stock)), tokens
        # The division happened: the unscaled (0-token) gradients differ from the scaled ones.
        assert not torch.equal(rank["results"][("ours", 0)][0],
                               rank["results"][("ours", rank["tokens"])][0])


def train_uncoalesced(argv):
    """train_on_this_rank with the reduction CUDA ranks over gloo use, counted."""
    calls = []
    gloo_cuda.runs_uncoalesced = lambda group: True  # this process exits after the run
    original = gloo_cuda._EachCollectiveOnItsOwn

    class Counted(original):
        def __init__(self):
            calls.append(1)

    gloo_cuda._EachCollectiveOnItsOwn = Counted
    result = train_on_this_rank(argv)
    result["uncoalesced_calls"] = len(calls)
    return result


def test_one_collective_per_bucket_trains_exactly_like_coalesced():
    coalesced = run_distributed(train_on_this_rank, WORLD, args=(PACKED,), timeout_s=240)
    uncoalesced = run_distributed(train_uncoalesced, WORLD, args=(PACKED,), timeout_s=240)
    assert all(rank["uncoalesced_calls"] >= 5 for rank in uncoalesced)  # once per step at least
    assert loss_owner_history(uncoalesced) == loss_owner_history(coalesced)


def test_uncoalesced_manager_refuses_overlapped_reduction(monkeypatch):
    monkeypatch.setattr(gloo_cuda, "runs_uncoalesced", lambda group: True)
    with pytest.raises(RuntimeError, match="overlapped gradient reduction"):
        with gloo_cuda.grad_reduce_coalescing(None, async_ops=True):
            pass
    with gloo_cuda.grad_reduce_coalescing(None) as manager:
        pass
    manager.wait()  # megatron-core may wait on it: nothing to wait for
