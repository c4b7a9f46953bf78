"""The attention plan's host work: the same plans, built with fewer operator calls.

The plan is built once per micro-batch on the host (attention_plan.py). Its row indices used to
be built as tensors of every row (two ``repeat_interleave`` each) and then compared with
``arange`` (``torch.equal``) to find the ones that pick every row in order; on the GPU
benchmark this was the step's ``aten::repeat_interleave`` (results/gpu/REPORT.md). Now the
identity is decided on the host ints and an index, when needed, takes one ``repeat_interleave``.

* every plan equals the one the previous construction gives (a loop of ``arange`` runs, then
  the identity test on the tensor), field by field, bitwise, over random packs, CP sizes,
  ranks and masks;
* operator counts: a pack whose every row is a query (no padding) builds no index at all, and
  the count does not depend on the number of sequences in the pack.
"""

import dataclasses
import random

import pytest
import torch

from megatron.varlen.attention import attention_plan
from megatron.varlen.attention.attention_plan import build_attention_plan
from megatron.varlen.platform.host_syncs import count_dispatches

TOKENS = 512


def _loop_ranges(starts, lengths) -> torch.Tensor:
    pieces = [torch.arange(s, s + n, dtype=torch.int64) for s, n in zip(starts, lengths)]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)


def _previous_index_or_none(starts, lengths, size):
    """The construction before: every row as a tensor, then compared with arange."""
    index = _loop_ranges(starts, lengths)
    identity = index.numel() == size and torch.equal(index, torch.arange(size))
    return None if identity else index


def _random_pack(rng: random.Random, cp_size: int):
    divisor = 2 * cp_size if cp_size > 1 else 1
    real, padded = [0], [0]
    for _ in range(rng.randint(1, 6)):
        length = rng.randint(0, 20)
        pad = -(-max(length, 1) // divisor) * divisor + divisor * rng.randint(0, 1)
        real.append(real[-1] + length)
        padded.append(padded[-1] + pad)
    if rng.random() < 0.3:  # no padding at all: the identity case
        lengths = [divisor * rng.randint(1, 5) for _ in range(rng.randint(1, 5))]
        real = padded = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    return real, padded


def _assert_same_plan(got, expected):
    for field in dataclasses.fields(got):
        a, b = getattr(got, field.name), getattr(expected, field.name)
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), \
                field.name
        else:
            assert a == b, field.name


@pytest.mark.parametrize("seed", range(40))
def test_plans_equal_the_previous_construction(seed, monkeypatch):
    rng = random.Random(seed)
    cp_size = rng.choice([1, 2, 4])
    real, padded = _random_pack(rng, cp_size)
    for cp_rank in range(cp_size):
        for causal in (True, False):
            got = build_attention_plan(real, padded, cp_size, cp_rank, causal)
            with monkeypatch.context() as patch:
                patch.setattr(attention_plan, "_index_or_none", _previous_index_or_none)
                expected = build_attention_plan(real, padded, cp_size, cp_rank, causal)
            _assert_same_plan(got, expected)


def test_ranges_equal_a_loop_of_aranges():
    rng = random.Random(5)
    for _ in range(50):
        lengths = [rng.randint(0, 7) for _ in range(rng.randint(0, 6))]
        starts = [rng.randint(0, 100) for _ in lengths]
        got = attention_plan._ranges(starts, lengths)
        assert got.dtype == torch.int64 and torch.equal(got, _loop_ranges(starts, lengths))


def _plan_ops(num_sequences: int, padding: int, cp_size: int = 1):
    length = TOKENS // num_sequences
    real = [i * length for i in range(num_sequences + 1)]
    real_short = [0] + [i * length - padding for i in range(1, num_sequences + 1)]
    with count_dispatches() as counts:
        build_attention_plan(real_short if padding else real, real, cp_size, 0)
    ops = {}
    for (op, _), n in counts.items():
        ops[op] = ops.get(op, 0) + n
    return ops


def test_a_pack_without_padding_builds_no_index():
    for num_sequences in (4, 64):
        ops = _plan_ops(num_sequences, padding=0)
        assert not {"repeat_interleave", "equal", "arange", "index_select"} & set(ops), ops


@pytest.mark.parametrize("padding, cp_size", [(0, 1), (2, 1), (2, 2)])
def test_plan_operator_calls_do_not_grow_with_the_sequences(padding, cp_size):
    few, many = _plan_ops(4, padding, cp_size), _plan_ops(64, padding, cp_size)
    assert few == many
    # With padding: one repeat_interleave per index built (query rows, and with CP the keys).
    assert many.get("repeat_interleave", 0) <= 2
