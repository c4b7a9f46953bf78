"""The per-layer GPU path reads nothing back from the device: local attention and Mamba (CP).

Checked on CPU by counting calls (see host_reads.py), forward and backward, and by marking the
micro-batch's device-side boundaries ``device_only`` (any read of them raises) while the host
copies that the data path attaches (``attach_host_boundaries``) stay readable:

* local attention (``--attention-backend local``, what ``auto`` falls back to on a GPU when
  attention dropout > 0), one process: THD with dropout and SBHD read nothing in the layers
  after the micro-batch's first (which builds the index layout from the host copies only);
* the whole hybrid model (M*M-: Mamba, local attention with RoPE, Mamba, MLP) through
  pretrain_mamba.py's path with dynamic CP on 2 ranks: micro-batches on 1 rank and split over
  2, every forward and backward counted; the per-micro-batch builds (attention layout, Mamba
  CP reorder and ``seq_idx``) happen once per micro-batch.

That the numbers stay right is proven by the equivalence tests (attention/, mamba/,
training/test_hybrid_equivalence.py), which run the same code.
"""

import torch
from megatron.core.tensor_parallel import random as tp_random

from megatron.varlen.attention.attention_plan import attach_host_boundaries
from megatron.varlen.testing.multirank import run_distributed
from tests.unit_tests.training import test_hybrid_equivalence as hybrid_case
from tests.unit_tests.varlen.attention._reference import build, make_config, packed_inputs
from tests.unit_tests.varlen.host_reads import CountHostReads, device_only

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


# --- the whole hybrid model (M*M-) through pretrain_mamba.py's path, dynamic CP --------------

def _hybrid_dynamic_cp_argv():
    argv = list(hybrid_case.DYNAMIC) + ["--context-parallel-size", "2",
                                        "--max-seqlen-per-dp-cp-rank", "32"]
    argv[argv.index("--train-iters") + 1] = "1"
    return argv


def _patch(owner, name, make):
    setattr(owner, name, make(getattr(owner, name)))


def _poisoned_boundaries(params):
    """Swaps ``params``' device-side boundaries for device_only ones; returns the originals."""
    fields = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")
    originals = {name: getattr(params, name) for name in fields}
    for name, value in originals.items():
        if value is not None:
            setattr(params, name, device_only(value))
    return originals


def rank_hybrid_model_reads(argv):
    """One training iteration of the hybrid model on the real data path (build_model_inputs
    attaches the host copies); every model forward and backward is counted. Not counted: the
    per-micro-batch builds, megatron-core's RoPE reading the boundaries it is handed (the host
    copies: the device ones are poisoned, so a read of them raises anyway) and RoPE's one-time
    move of its frequency table to the device."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer import attention as mcore_attention
    from megatron.training.testing import train_hybrid_on_this_rank
    from megatron.varlen.attention.attention_plan import HostBoundaries
    from megatron.varlen.mamba.model import VarlenMambaModel

    counter = CountHostReads()
    calls = {"forward": [], "built": []}  # forward: the CP size of every micro-batch  # built: (kind, CP size) of every per-micro-batch build

    def uncounted(original, key=None):
        def run(*args, **kwargs):
            if key:
                calls["built"].append(key[:2])
            with counter.exempt():
                return original(*args, **kwargs)
        return run

    _patch(HostBoundaries, "cached", lambda original: lambda self, key, build: original(
        self, key, uncounted(build, key)))
    _patch(mcore_attention, "apply_rotary_pos_emb", uncounted)
    _patch(RotaryEmbedding, "get_emb", uncounted)

    def counted_forward(original):
        def forward(self, *args, packed_seq_params=None, **kwargs):
            calls["forward"].append(packed_seq_params.local_cp_size)
            originals = _poisoned_boundaries(packed_seq_params)
            try:
                with counter:
                    return original(self, *args, packed_seq_params=packed_seq_params, **kwargs)
            finally:
                for name, value in originals.items():
                    setattr(packed_seq_params, name, value)
        return forward

    _patch(VarlenMambaModel, "forward", counted_forward)

    def counted_backward(original):
        def backward_step(*args, **kwargs):
            with counter:
                return original(*args, **kwargs)
        return backward_step

    _patch(schedules, "backward_step", counted_backward)
    train_hybrid_on_this_rank(argv)
    return {"reads": counter.reads, **calls}


def test_hybrid_model_dynamic_cp_step_reads_nothing_back():
    ranks = run_distributed(rank_hybrid_model_reads, world_size=CP,
                            args=(_hybrid_dynamic_cp_argv(),), timeout_s=240)
    for rank in ranks:
        assert rank["reads"] == [], rank
        # Once per micro-batch (2 Mamba layers, 1 attention layer each): one seq_idx, one
        # attention layout for its CP size, one Mamba reorder when it is split.
        sizes, built = rank["forward"], rank["built"]
        assert sum(kind == "mamba-seq-idx" for kind, _ in built) == len(sizes), rank
        for size in (1, CP):
            assert built.count(("local-attention-layout", size)) == sizes.count(size), rank
        assert built.count(("mamba-cp-reorder", CP)) == sizes.count(CP), rank
    # Both kinds of micro-batch ran: whole sequences on one rank and sequences split over 2.
    assert {size for rank in ranks for size in rank["forward"]} == {1, CP}
