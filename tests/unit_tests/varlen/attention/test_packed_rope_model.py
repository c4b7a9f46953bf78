"""Whole model and host work of RoPE from one table per micro-batch (packed_rope.py).

1. A tiny packed GPT with RoPE (lengths {7, 16, 33, 1}, padded) gives the SAME per-token losses
   and parameter gradients (torch.equal) with the one-table path as with megatron-core's own
   RoPE (``rope_from_one_table = False`` on every attention layer), on 1 rank and on a 2-rank
   dynamic CP run; once plainly and once with rotary_percent 0.5, interleaved rotation, YaRN's
   mscale, q/k layernorm, a layer without RoPE (``no_rope_freq``) and selective recomputation of
   the core attention. Which path ran is counted on megatron-core's ``apply_rotary_pos_emb``.
2. Host work: the aten ops one attention layer dispatches in its forward and backward do not
   grow with the number of sequences in the pack (4 vs 64 sequences, same tokens) on the
   one-table path, and none of them reads a device value (``aten._local_scalar_dense``);
   megatron-core's path grows with the number of sequences (shown, as the reason for this).
   The core attention is the flash backend with a fixed-cost stand-in for its ONE kernel call
   (the CPU twin of the kernel loops over sequences; the GPU kernel does not).
"""

import pytest
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer import attention as mcore_attention

from megatron.varlen.packing.packed_seq import varlen_packed_seq_params
from tests.harness.multirank import run_distributed
from tests.harness.rope_paths import (
    SCALAR_READ,
    build_gpt,
    equal_pack,
    layer_ops,
    use_fixed_cost_kernel,
    use_one_table,
)
from tests.unit_tests.varlen.attention import test_varlen_gpt as gpt

CP = 2
VARIANTS = {
    "plain": {},
    "features": dict(rotary_percent=0.5, rotary_interleaved=True, yarn=True, qk_layernorm=True,
                     no_rope_freq=[0, 1], recompute_granularity="selective",
                     recompute_modules=["core_attn"]),
}
FEW, MANY, TOKENS = 4, 64, 256  # sequences in the two packs, tokens in each


def _build(layers=gpt.LAYERS, **overrides):
    return build_gpt(layers, gpt.HIDDEN, gpt.HEADS, gpt.KV_GROUPS, gpt.VOCAB, TOKENS,
                     gpt.MODEL_SEED, **overrides)


class _CountMcoreRope:
    """Counts calls of megatron-core's apply_rotary_pos_emb made by its Attention.forward."""

    def __init__(self):
        self.calls = 0
        self._original = mcore_attention.apply_rotary_pos_emb

    def __enter__(self):
        def counted(*args, **kwargs):
            self.calls += 1
            return self._original(*args, **kwargs)
        mcore_attention.apply_rotary_pos_emb = counted
        return self

    def __exit__(self, *exc):
        mcore_attention.apply_rotary_pos_emb = self._original


def _varlen(params, **fields):
    """The packing layer's params (host boundaries, micro-batch cache) for ``params``."""
    return varlen_packed_seq_params(
        params.cu_seqlens_q, params.cu_seqlens_q_padded, params.cu_seqlens_q,
        params.cu_seqlens_q_padded, params.max_seqlen_q, **fields)


def _both_paths(model, run):
    """(losses and grads, megatron-core RoPE calls) with the one-table path, then without."""
    results = []
    for on in (True, False):
        use_one_table(model, on)
        with _CountMcoreRope() as counter:
            results.append((run(), counter.calls))
    use_one_table(model, True)
    return results


def _bitwise(new, old):
    """Per-token losses and every parameter gradient EQUAL."""
    (new_loss, new_grads), (old_loss, old_grads) = new, old
    return torch.equal(new_loss, old_loss) and all(
        torch.equal(new_grads[name], old_grads[name]) for name in old_grads)


def rank_compare_paths(variant):
    batch, params, rows = gpt._make_batch()
    real_mask = torch.zeros_like(batch["tokens"], dtype=torch.float32)
    real_mask[0, rows] = 1.0
    parallel_state.initialize_model_parallel()  # static CP 1; the CP run brings its own group
    try:
        model = _build(**VARIANTS[variant])
        runs = {
            "one_rank": lambda: gpt._forward_backward(
                model, batch, _varlen(params, local_cp_size=None), real_mask),
            "dynamic_cp2": lambda: gpt._cp_run(
                model, batch, _varlen(params, local_cp_size=CP, cp_group=dist.group.WORLD),
                real_mask, dist.group.WORLD),
        }
        results = {}
        for name, run in runs.items():
            (new, new_calls), (old, old_calls) = _both_paths(model, run)
            results[name] = dict(equal=_bitwise(new, old), new_calls=new_calls,
                                 old_calls=old_calls)
        return results
    finally:
        parallel_state.destroy_model_parallel()


@pytest.fixture(scope="module", params=list(VARIANTS))
def compared(request):
    return request.param, run_distributed(rank_compare_paths, world_size=CP,
                                          args=(request.param,), timeout_s=180)


@pytest.mark.parametrize("run", ["one_rank", "dynamic_cp2"])
def test_losses_and_grads_equal_megatron_cores_rope(compared, run):
    variant, per_rank = compared
    for rank, results in enumerate(per_rank):
        result = results[run]
        assert result["equal"], f"{variant}, {run}, rank {rank}: losses or grads differ"
        rope_layers = gpt.LAYERS - sum(VARIANTS[variant].get("no_rope_freq", []))
        # megatron-core rotates q and k in every RoPE layer, forward only; the new path never.
        assert result["old_calls"] == 2 * rope_layers, result
        assert result["new_calls"] == 0, result


# ---- host work of one attention layer ----------------------------------------------------------

def rank_count_ops():
    parallel_state.initialize_model_parallel()
    try:
        model = _build(layers=1, attention_backend="flash")
        use_fixed_cost_kernel(model)
        layer = model.decoder.layers[0].self_attention
        results = {}
        for cp, group in ((1, None), (CP, dist.group.WORLD)):
            freqs = model.rotary_pos_emb(TOKENS, packed_seq=True)
            for on in (True, False):
                layer.rope_from_one_table = on
                for sequences in (FEW, MANY):
                    pack = equal_pack(sequences, TOKENS, cp, group)
                    results[(cp, "new" if on else "old", sequences)] = layer_ops(
                        layer, freqs, pack, TOKENS // cp, gpt.HIDDEN)
        return results
    finally:
        parallel_state.destroy_model_parallel()


@pytest.fixture(scope="module")
def op_counts():
    return run_distributed(rank_count_ops, world_size=CP, timeout_s=180)


@pytest.mark.parametrize("cp", [1, CP])
def test_one_table_layer_ops_do_not_grow_with_the_number_of_sequences(op_counts, cp):
    for counts in op_counts:
        few, many = counts[(cp, "new", FEW)], counts[(cp, "new", MANY)]
        assert few == many, f"cp {cp}: {sum(few.values())} ops for {FEW} sequences, " \
                            f"{sum(many.values())} for {MANY}: {many - few}"
        assert SCALAR_READ not in many, "a device value is read back in the layer"


@pytest.mark.parametrize("cp", [1, CP])
def test_megatron_cores_rope_ops_grow_with_the_number_of_sequences(op_counts, cp):
    """Why the one-table path exists: per layer, O(sequences) ops (slices, cat) and reads."""
    for counts in op_counts:
        few, many = counts[(cp, "old", FEW)], counts[(cp, "old", MANY)]
        grown = sum(many.values()) - sum(few.values())
        assert grown >= 2 * (MANY - FEW), (sum(few.values()), sum(many.values()))
        assert sum(counts[(cp, "new", MANY)].values()) < sum(many.values())
