"""MTP's roll within packed sequences (megatron/varlen/model/mtp_roll.py) equals megatron-core's.

The reference is megatron-core 0.16.1's own ``roll_tensor`` (its loop over the sequences), on
the same tensors and boundaries: the rolled tensor and its sum must be bitwise equal, over
random packs with empty sequences, several dtypes and a leading batch dimension. Operator
counts show the point of it: a fixed number of operations whatever the number of sequences.
"""

import random

import pytest
import torch
from megatron.core.transformer import multi_token_prediction as mcore_mtp

from megatron.varlen.model.mtp_roll import packed_roll, rolling_within_sequences
from megatron.varlen.packing.packed_seq import varlen_packed_seq_params
from megatron.varlen.platform.host_syncs import count_dispatches


class _Group:
    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def _params(lengths):
    cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0).to(torch.int32)
    return varlen_packed_seq_params(cu, cu, cu, cu, max(lengths), 1)


def _random_lengths(rng):
    return [rng.choice([0, 1, 2, rng.randint(3, 12)]) for _ in range(rng.randint(1, 8))]


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool])
def test_packed_roll_equals_megatron_cores_loop(seed, dtype):
    rng = random.Random(seed)
    lengths = _random_lengths(rng)
    if sum(lengths) == 0:
        lengths.append(3)
    params = _params(lengths)
    tensor = (torch.randn(2, sum(lengths), generator=torch.Generator().manual_seed(seed)) * 5)
    tensor = tensor > 0 if dtype is torch.bool else tensor.to(dtype)
    got, got_sum = packed_roll(mcore_mtp.roll_tensor, tensor, -1, -1, None, params)
    expected, expected_sum = mcore_mtp.roll_tensor(tensor, -1, -1, None, params)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert torch.equal(got_sum, expected_sum)
    assert torch.equal(tensor, tensor.clone())  # the input is left as it was


def test_where_it_does_not_apply_it_is_megatron_cores():
    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs)
        return "original"

    params, tensor = _params([3, 4]), torch.arange(7)
    assert packed_roll(original, tensor, -1, -1, _Group(2), params) == "original"  # CP
    assert packed_roll(original, tensor, -1, -1, None, None) == "original"  # not packed
    assert packed_roll(original, tensor[:5], -1, -1, None, params) == "original"  # short
    assert len(calls) == 3


def _roll_ops(num_sequences):
    params = _params([512 // num_sequences] * num_sequences)
    tensor = torch.arange(512)[None]
    packed_roll(mcore_mtp.roll_tensor, tensor, -1, -1, None, params)  # per-micro-batch build
    counts = {}
    for fn in ("ours", "megatron-core"):
        roll = (lambda t: packed_roll(mcore_mtp.roll_tensor, t, -1, -1, None, params)) \
            if fn == "ours" else (lambda t: mcore_mtp.roll_tensor(t, -1, -1, None, params))
        with count_dispatches() as table:
            roll(tensor)
        counts[fn] = sum(table.values())
    return counts


def test_operator_calls_do_not_grow_with_the_sequences():
    few, many = _roll_ops(4), _roll_ops(64)
    assert few["ours"] == many["ours"] == 3, (few, many)  # roll, index_fill_, sum
    assert many["megatron-core"] > 10 * few["ours"]  # what it replaces: a loop over sequences


def _rolls():
    from megatron.core.models.gpt import gpt_model

    return mcore_mtp.roll_tensor, gpt_model.roll_tensor


def test_the_block_routes_megatron_cores_callers_and_restores_them():
    from megatron.core.models.gpt import gpt_model

    before = _rolls()
    with rolling_within_sequences():
        inside = _rolls()
        with rolling_within_sequences():  # re-entrant: the outer block holds the swap
            assert _rolls() == inside
        assert _rolls() == inside
        params, tensor = _params([2, 3]), torch.arange(5)
        assert torch.equal(gpt_model.roll_tensor(tensor, -1, -1, None, params)[0],
                           torch.tensor([1, 0, 3, 4, 0]))
    assert all(ours is not theirs for ours, theirs in zip(inside, before))
    assert _rolls() == before


@pytest.mark.parametrize("where", ["outer", "inner"])
def test_the_block_restores_megatron_cores_rolls_when_the_body_raises(where):
    before = _rolls()
    with pytest.raises(ZeroDivisionError):
        with rolling_within_sequences():
            if where == "inner":
                with pytest.raises(ZeroDivisionError), rolling_within_sequences():
                    1 / 0
                assert _rolls() != before  # the inner block left the outer's swap in place
            1 / 0
    assert _rolls() == before


def test_each_caller_falls_back_to_its_own_roll(monkeypatch):
    """Where ours does not apply (here: no packed_seq_params), each module's stand-in calls
    that module's own roll_tensor, not the other's."""
    from megatron.core.models.gpt import gpt_model

    monkeypatch.setattr(gpt_model, "roll_tensor", lambda *args, **kwargs: "gpt_model's own")
    tensor = torch.arange(5)
    with rolling_within_sequences():
        assert gpt_model.roll_tensor(tensor, -1, -1, None, None) == "gpt_model's own"
        rolled, _ = mcore_mtp.roll_tensor(tensor, -1, -1, None, None)
        assert torch.equal(rolled, torch.roll(tensor, -1))


def test_a_caller_without_roll_tensor_is_refused_and_nothing_is_swapped(monkeypatch):
    from megatron.core.models.gpt import gpt_model

    monkeypatch.delattr(gpt_model, "roll_tensor")
    original = mcore_mtp.roll_tensor
    with pytest.raises(RuntimeError, match="megatron.core.models.gpt.gpt_model has no "
                                           "roll_tensor"):
        with rolling_within_sequences():
            pass
    assert mcore_mtp.roll_tensor is original


def test_megatron_cores_mtp_code_calls_roll_tensor_by_its_global_name():
    """The swap reaches megatron-core's MTP rolls only while these functions look
    ``roll_tensor`` up as a module global (megatron-core 0.16.1): a release that calls it
    otherwise (a method, an argument) fails here, before the roll silently stops being ours."""
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer

    for caller in (GPTModel._postprocess, MultiTokenPredictionLayer._get_embeddings):
        assert "roll_tensor" in caller.__code__.co_names, caller.__qualname__


def test_the_models_mtp_postprocess_restores_the_rolls_and_groups_when_it_raises(monkeypatch):
    """VarlenGPTModel._postprocess swaps the rolls and its MTP modules' CP group for megatron-
    core's post-processing only: both are back when that raises (here its output layer would)."""
    from types import SimpleNamespace

    from megatron.core.models.gpt.gpt_model import GPTModel

    from megatron.varlen.model.mtp import VarlenGPTModel

    seen = {}

    def failing_postprocess(self, *args, packed_seq_params=None, **kwargs):
        seen["rolls"], seen["group"] = _rolls(), self.cp_group
        raise ZeroDivisionError("the output layer failed")

    monkeypatch.setattr(GPTModel, "_postprocess", failing_postprocess)
    model = object.__new__(VarlenGPTModel)  # no weights needed: only the post-processing runs
    torch.nn.Module.__init__(model)
    model.config = SimpleNamespace(mtp_num_layers=1)
    model.mtp_process = True  # the pipeline stage that holds the MTP layers
    static_group, micro_batch_group = _Group(1), _Group(1)
    model.cp_group = static_group
    model.mtp = torch.nn.Module()
    model.mtp.layers = torch.nn.ModuleList()
    params = _params([2, 3])
    params.cp_group = micro_batch_group
    before = _rolls()
    with pytest.raises(ZeroDivisionError):
        model._postprocess(packed_seq_params=params)
    assert seen["group"] is micro_batch_group and all(
        ours is not theirs for ours, theirs in zip(seen["rolls"], before))
    assert _rolls() == before and model.cp_group is static_group
