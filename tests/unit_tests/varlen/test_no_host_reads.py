"""The per-layer GPU path reads nothing back from the device: local attention and Mamba (CP).

Checked on CPU by counting calls (see host_reads.py), for every layer after the micro-batch's
first (which builds the per-micro-batch index tensors from the HOST boundaries), forward and
backward; and, for the first layer too, by marking the micro-batch's device boundaries
``device_only`` (any read of them raises) while the host copies that the data path attaches
(``attach_host_boundaries``) stay readable. The index tensors are built once per micro-batch.

* local attention (``--attention-backend local``, what ``auto`` falls back to on a GPU when
  attention dropout > 0): THD with dropout, SBHD, and dynamic CP 2 over gloo;
* the Mamba mixer on a micro-batch's CP group (dynamic CP 2 over gloo; static CP 1): the
  all-to-all reorder and megatron-core's ``seq_idx``.

That the numbers stay right is proven by the equivalence tests (attention/, mamba/,
training/test_hybrid_equivalence.py), which run the same code.
"""

import dataclasses

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import random as tp_random
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

from megatron.varlen.attention.attention_plan import attach_host_boundaries
from megatron.varlen.cp_split import split_thd_for_cp
from megatron.varlen.mamba import packed_indices
from megatron.varlen.testing.multirank import run_distributed
from tests.unit_tests.varlen.attention._reference import build, make_config, packed_inputs
from tests.unit_tests.varlen.host_reads import CountHostReads, device_only
from tests.unit_tests.varlen.mamba import test_mixer as mamba_case

LAYERS = 3  # layers run after the micro-batch's first
CP = 2


def _with_host_boundaries(params, poison=False):
    """``params`` with host copies attached, as the data path makes them; ``poison``: its own
    (device-side) boundaries raise on any host read."""
    attach_host_boundaries(params, params.cu_seqlens_q, params.cu_seqlens_q_padded)
    if poison:
        fields = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")
        for name in fields:
            setattr(params, name, device_only(getattr(params, name)))
    return params


def _layer_step(layer, inputs, params, weight):
    """One layer's forward and backward (``inputs`` are leaves that require grad)."""
    out = layer(*inputs, packed_seq_params=params)
    out = out[0] if isinstance(out, tuple) else out
    (out * weight.reshape(out.shape)).sum().backward()
    return out.detach()


def reads_after_first_layer(layer, inputs, params, weight):
    """Host reads of LAYERS forward+backward passes after a first one on the same micro-batch;
    also the first pass's output (for the poisoned comparison)."""
    first = _layer_step(layer, inputs, params, weight)
    counter = CountHostReads()
    with counter:
        for _layer in range(LAYERS):
            _layer_step(layer, inputs, params, weight)
    return counter.reads, first


def _attention_inputs(seed=0):
    q, k, v, params, _ = packed_inputs(seed)
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1),
                         dtype=q.dtype)
    return [x.requires_grad_() for x in (q, k, v)], params, weight


def _local_attention(dropout=0.0):
    """The local core attention in training mode, called as ``layer(q, k, v, packed_seq_params=)``
    (no attention mask: the boundaries give it)."""
    core = build(make_config(attention_dropout=dropout)).train()
    return lambda q, k, v, packed_seq_params: core(q, k, v, None,
                                                   packed_seq_params=packed_seq_params)


class _PlainRngTracker:
    """Stands in for megatron's TP RNG tracker where no TP group is initialised."""

    def fork(self):
        return torch.random.fork_rng()


# --- local attention, one process -------------------------------------------------------------

def test_local_attention_thd_with_dropout_reads_nothing_per_layer(monkeypatch):
    monkeypatch.setattr(tp_random, "get_cuda_rng_tracker", lambda *a, **k: _PlainRngTracker())
    inputs, params, weight = _attention_inputs()
    reads, _ = reads_after_first_layer(_local_attention(dropout=0.1), inputs,
                                       _with_host_boundaries(params), weight)
    assert reads == [], reads


def test_local_attention_sbhd_reads_nothing_per_layer():
    gen = torch.Generator().manual_seed(3)
    q, k, v, weight = (torch.randn(8, 2, 4, 8, generator=gen, dtype=torch.float64)
                       for _ in range(4))
    k, v = k[:, :, :2], v[:, :, :2]  # GQA: 2 kv groups for 4 heads
    layer = _local_attention()
    inputs = [x.requires_grad_() for x in (q, k, v)]
    reads, _ = reads_after_first_layer(layer, inputs, None, weight)
    assert reads == [], reads


def test_local_attention_first_layer_reads_only_the_host_copies():
    inputs, params, weight = _attention_inputs(seed=2)
    layer = _local_attention()
    expected = _layer_step(layer, inputs, _with_host_boundaries(params), weight)
    _, params, _ = _attention_inputs(seed=2)
    got = _layer_step(layer, inputs, _with_host_boundaries(params, poison=True), weight)
    assert torch.equal(got, expected)


def test_counter_sees_a_read_back():
    """The checks above can fail: without host copies the boundaries are read back (once)."""
    inputs, params, weight = _attention_inputs()
    counter = CountHostReads()
    with counter:
        _layer_step(_local_attention(), inputs, params, weight)
    assert "cpu" in counter.reads and "equal" in counter.reads, counter.reads


# --- dynamic CP 2 over gloo: local attention and the Mamba mixer -----------------------------

def _count_builds(monkeypatch_targets):
    """Wraps builder functions to count their calls; returns the counts dict."""
    counts = {}
    for module, name in monkeypatch_targets:
        original = getattr(module, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _original(*args, **kwargs)

        setattr(module, name, counted)
    return counts


def _rank_attention(group):
    cp, rank = group.size(), group.rank()
    inputs, params, weight = _attention_inputs(seed=4)
    padded = params.cu_seqlens_q_padded
    split = lambda x: split_thd_for_cp(x, padded, cp, rank, seq_dim=0)  # noqa: E731
    inputs = [split(x.detach()).requires_grad_() for x in inputs]
    params = _with_host_boundaries(dataclasses.replace(params, cp_group=group,
                                                       local_cp_size=cp), poison=True)
    model_parallel_cuda_manual_seed(7)  # the dropout's TP-region RNG stream
    reads, _ = reads_after_first_layer(_local_attention(dropout=0.1), inputs, params,
                                       split(weight))
    return reads


def _rank_mamba(group):
    cp, rank = group.size(), group.rank()
    counts = _count_builds([(packed_indices, "_build_reorder"), (packed_indices, "_build_seq_idx")])
    mixer = mamba_case.build_mixer()  # static CP 1: the micro-batch brings the group
    hidden, params, weight = mamba_case.packed_inputs()
    padded = params.cu_seqlens_q_padded
    split = lambda x: split_thd_for_cp(x, padded, cp, rank, 0)  # noqa: E731
    params.cp_group, params.local_cp_size = group, cp
    params = _with_host_boundaries(params, poison=True)
    reads, _ = reads_after_first_layer(mixer, [split(hidden).requires_grad_()], params,
                                       split(weight))
    # Static CP 1 path (seq_idx only) on the whole pack, a new micro-batch.
    hidden, params, weight = mamba_case.packed_inputs()
    params = _with_host_boundaries(params, poison=True)
    static_reads, _ = reads_after_first_layer(mixer, [hidden.requires_grad_()], params, weight)
    return {"reads": reads, "static_reads": static_reads, "builds": counts}


def rank_host_reads():
    parallel_state.initialize_model_parallel()  # static CP 1
    try:
        group = dist.group.WORLD
        return {"attention": _rank_attention(group), **_rank_mamba(group)}
    finally:
        parallel_state.destroy_model_parallel()


def test_dynamic_cp_local_attention_and_mamba_read_nothing_per_layer():
    for rank in run_distributed(rank_host_reads, world_size=CP, timeout_s=120):
        assert rank["attention"] == [], rank
        assert rank["reads"] == [] and rank["static_reads"] == [], rank
        # Once per micro-batch: one reorder (CP 2 micro-batch), one seq_idx per micro-batch.
        assert rank["builds"] == {"_build_reorder": 1, "_build_seq_idx": 2}, rank
