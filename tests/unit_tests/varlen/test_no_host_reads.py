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

from megatron.varlen.packing.packed_seq import as_varlen
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training import test_dynamic_cp_equivalence as gpt_case
from tests.unit_tests.varlen_training import test_hybrid_equivalence as hybrid_case
from tests.unit_tests.varlen.attention._reference import build, make_config, packed_inputs
from tests.unit_tests.varlen.host_reads import CountHostReads, device_only

LAYERS = 3  # layers run after the micro-batch's first
CP = 2


def _with_host_boundaries(params, poison=False):
    """``params`` with host copies, as the data path makes them; ``poison``: its own
    (device-side) boundaries raise on any host read."""
    params = as_varlen(params)
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
    """Host reads of LAYERS forward+backward passes after a first one on the same micro-batch."""
    _layer_step(layer, inputs, params, weight)
    counter = CountHostReads()
    with counter:
        for _layer in range(LAYERS):
            _layer_step(layer, inputs, params, weight)
    return counter.reads


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
        return torch.random.fork_rng(devices=[])  # the CPU generator only, whatever device_count says


# --- local attention, one process -------------------------------------------------------------

def test_local_attention_thd_with_dropout_reads_nothing_per_layer(monkeypatch):
    monkeypatch.setattr(tp_random, "get_cuda_rng_tracker", lambda *a, **k: _PlainRngTracker())
    inputs, params, weight = _attention_inputs()
    reads = reads_after_first_layer(_local_attention(dropout=0.1), inputs,
                                    _with_host_boundaries(params), weight)
    assert reads == [], reads


def test_local_attention_sbhd_reads_nothing_per_layer():
    gen = torch.Generator().manual_seed(3)
    q, k, v, weight = (torch.randn(8, 2, 4, 8, generator=gen, dtype=torch.float64)
                       for _ in range(4))
    k, v = k[:, :, :2], v[:, :, :2]  # GQA: 2 kv groups for 4 heads
    layer = _local_attention()
    inputs = [x.requires_grad_() for x in (q, k, v)]
    reads = reads_after_first_layer(layer, inputs, None, weight)
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


# --- whole models through the training path, dynamic CP on 2 ranks --------------------------

def _dynamic_cp_argv(base, extra=()):
    argv = list(base) + list(extra) + ["--context-parallel-size", str(CP),
                                       "--max-seqlen-per-dp-cp-rank", "32"]
    argv[argv.index("--train-iters") + 1] = "1"
    return argv


# name: (entry point's training function in tests.harness.training_runs, argv, attention layouts
# per micro-batch: the MTP layer attends with the padded boundaries as real ones, a second one)
MODEL_CASES = {
    "hybrid": ("train_hybrid_on_this_rank", _dynamic_cp_argv(hybrid_case.DYNAMIC), 1),
    "gpt_mtp": ("train_on_this_rank", _dynamic_cp_argv(gpt_case.DYNAMIC, gpt_case.MTP), 2),
}


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


def _count_model_steps(case):
    """Counts every model forward (device boundaries poisoned) and backward into
    ``case["counter"]``; records the per-micro-batch builds, which are not counted, as
    (kind, CP size) in ``case["built"]``, and each micro-batch's CP size in ``case["forward"]``.
    ``case`` is read at call time: patch once, then swap its entries per run."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer import attention as mcore_attention
    from megatron.varlen.mamba.model import VarlenMambaModel
    from megatron.varlen.model.mtp import VarlenGPTModel
    from megatron.varlen.packing.packed_seq import MicroBatchCache

    def uncounted(original, key=None):
        def run(*args, **kwargs):
            if key:
                case["built"].append(key[:2])
            with case["counter"].exempt():
                return original(*args, **kwargs)
        return run

    def counted(original):
        def run(*args, **kwargs):
            with case["counter"]:
                return original(*args, **kwargs)
        return run

    def counted_forward(original):
        def forward(self, *args, packed_seq_params=None, **kwargs):
            case["forward"].append(packed_seq_params.local_cp_size)
            originals = _poisoned_boundaries(packed_seq_params)
            try:
                with case["counter"]:
                    return original(self, *args, packed_seq_params=packed_seq_params, **kwargs)
            finally:
                for name, value in originals.items():
                    setattr(packed_seq_params, name, value)
        return forward

    _patch(MicroBatchCache, "get", lambda original: lambda self, key, build: original(
        self, key, uncounted(build, key)))
    _patch(mcore_attention, "apply_rotary_pos_emb", uncounted)
    _patch(RotaryEmbedding, "get_emb", uncounted)
    _patch(VarlenMambaModel, "forward", counted_forward)
    _patch(VarlenGPTModel, "forward", counted_forward)
    _patch(schedules, "backward_step", counted)


def rank_model_reads():
    """One training iteration per case on the real data path (build_model_inputs attaches the
    host copies). Not counted: the per-micro-batch builds, megatron-core's RoPE reading the
    boundaries it is handed (the host copies: the device ones are poisoned, so a read of them
    raises anyway) and RoPE's one-time move of its frequency table to the device."""
    from tests.harness import training_runs as testing

    case, results = {}, {}
    _count_model_steps(case)
    for name, (train, argv, _) in MODEL_CASES.items():
        case.update(counter=CountHostReads(), forward=[], built=[])
        getattr(testing, train)(argv)
        results[name] = {"reads": case["counter"].reads, "forward": case["forward"],
                         "built": case["built"]}
    return results


def test_models_with_dynamic_cp_read_nothing_back():
    ranks = run_distributed(rank_model_reads, world_size=CP, timeout_s=300)
    for name, (_, _, layouts) in MODEL_CASES.items():
        for rank in ranks:
            result = rank[name]
            assert result["reads"] == [], (name, result)
            # Once per micro-batch: the attention layouts for its CP size, and in the hybrid
            # model one seq_idx and, when the micro-batch is split, one Mamba reorder.
            sizes, built = result["forward"], result["built"]
            for size in (1, CP):
                assert built.count(("local-attention-layout", size)) == \
                    layouts * sizes.count(size), result
            if name == "hybrid":
                assert sum(kind == "mamba-seq-idx" for kind, _ in built) == len(sizes), result
                assert built.count(("mamba-cp-reorder", CP)) == sizes.count(CP), result
        # Both kinds of micro-batch ran: whole sequences on one rank and sequences split over 2.
        assert {size for rank in ranks for size in rank[name]["forward"]} == {1, CP}, name
