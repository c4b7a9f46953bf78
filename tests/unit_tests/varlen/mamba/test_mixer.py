"""megatron-core's MambaMixer through our subclass, on gloo ranks, in float64.

* A sequence's output (and input gradient) does not change when other sequences are packed
  beside it: length-1, odd lengths, CP padding and a trailing pad segment included.
* Context parallelism (static group, and the group a micro-batch brings, CP 2 and 4, THD and
  SBHD) gives the single-rank outputs on each rank's slice, the single-rank input gradients,
  and -- summed over the group -- the single-rank parameter gradients. This also checks the
  zigzag reorder: the scan sees each sequence in token order after the all-to-all.
* An exception inside the forward leaves the static CP helper in place; a size-1 group makes
  no collective call.
"""

import pytest
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.varlen.packing.cp_split import split_sbhd_for_cp, split_thd_for_cp
from megatron.varlen.mamba.mixer import MambaMixerSubmodules, VarlenMambaMixer
from tests.harness.collectives import forbid_collectives
from tests.harness.multirank import run_distributed

HIDDEN, HEAD_DIM, STATE, GROUPS, CHUNK = 16, 4, 3, 2, 4  # d_inner 32 -> 8 heads
REAL_LENGTHS = [1, 7, 4, 3]
PAD_MULTIPLE = 8  # 2 * cp for cp 4
TRAILING_PAD = 8  # a pad-only segment after the last sequence (as packs filled to a budget)
TOLERANCE = 1e-10


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def build_mixer():
    """A mixer over megatron's current groups with explicit float64 weights (same on all ranks)."""
    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=1, mamba_state_dim=STATE,
        mamba_head_dim=HEAD_DIM, mamba_num_groups=GROUPS, use_cpu_initialization=True,
        params_dtype=torch.float64, hidden_dropout=0.0,
        context_parallel_size=parallel_state.get_context_parallel_world_size(),
    )
    model_parallel_cuda_manual_seed(3)
    mixer = VarlenMambaMixer(
        config, MambaMixerSubmodules(in_proj=ColumnParallelLinear, out_proj=RowParallelLinear),
        d_model=HIDDEN, chunk_size=CHUNK, layer_number=1,
        pg_collection=ProcessGroupCollection.use_mpu_process_groups(),
    )
    gen = torch.Generator().manual_seed(17)
    with torch.no_grad():
        for _, param in sorted(mixer.named_parameters()):
            param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float64) * 0.5)
    return mixer


def packed_inputs():
    """[T, 1, HIDDEN] stream of sequences padded to PAD_MULTIPLE + a trailing pad segment."""
    padded = [-(-n // PAD_MULTIPLE) * PAD_MULTIPLE for n in REAL_LENGTHS] + [TRAILING_PAD]
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(sum(padded), 1, HIDDEN, generator=gen, dtype=torch.float64)
    params = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=_cu(REAL_LENGTHS + [0]), cu_seqlens_kv=_cu(REAL_LENGTHS),
        cu_seqlens_q_padded=_cu(padded), cu_seqlens_kv_padded=_cu(padded),
        max_seqlen_q=max(padded), max_seqlen_kv=max(padded))
    weight = torch.randn(sum(padded), 1, HIDDEN, generator=gen, dtype=torch.float64)
    real = torch.zeros(sum(padded), 1, 1, dtype=torch.float64)  # pad outputs do not count
    for start, n in zip(params.cu_seqlens_q_padded.tolist(), REAL_LENGTHS):
        real[start:start + n] = 1.0
    return hidden, params, weight * real


def run(mixer, hidden, params, weight):
    """Output, input grad and parameter grads of sum(mixer(hidden) * weight)."""
    mixer.zero_grad(set_to_none=True)
    hidden = hidden.detach().clone().requires_grad_()
    out, _ = mixer(hidden, packed_seq_params=params)
    (out * weight).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in mixer.named_parameters()}
    return out.detach(), hidden.grad, grads


def _error(a, b):
    return float((a - b).abs().max())


def packing_errors(mixer):
    """Per sequence: max difference of packed vs alone (output and input grad, real tokens)."""
    hidden, params, weight = packed_inputs()
    out, grad, _ = run(mixer, hidden, params, weight)
    errors = []
    for start, real in zip(params.cu_seqlens_q_padded.tolist(), REAL_LENGTHS):
        rows = slice(start, start + real)
        alone_out, alone_grad, _ = run(mixer, hidden[rows], None, weight[rows])
        errors.append(max(_error(out[rows], alone_out), _error(grad[rows], alone_grad)))
    return errors


def _compare_cp(mixer, group, params, full, hidden, weight, split):
    out, grad, grads = run(mixer, split(hidden), params, split(weight))
    for g in grads.values():
        dist.all_reduce(g, group=group)
    full_out, full_grad, full_grads = full
    return max(_error(out, split(full_out)), _error(grad, split(full_grad)),
               max(_error(grads[n], full_grads[n]) for n in full_grads))


def rank_mixer_checks():
    """One launch: packing invariance and the single-rank reference at CP 1, micro-batch groups
    of 2 and 4, static CP = world, then the switching guarantees (collectives forbidden last)."""
    hidden, params, weight = packed_inputs()
    sbhd_hidden, sbhd_weight = hidden[:16].repeat(1, 2, 1), weight[:16].repeat(1, 2, 1)
    parallel_state.initialize_model_parallel()  # CP 1: the reference and the dynamic cases
    pair, _ = dist.new_subgroups(group_size=2)
    errors = {}
    try:
        mixer = build_mixer()
        errors["packing"] = packing_errors(mixer)
        full = run(mixer, hidden, params, weight)
        full_sbhd = run(mixer, sbhd_hidden, None, sbhd_weight)
        for group in (pair, dist.group.WORLD):
            cp, rank = group.size(), group.rank()
            split = lambda x: split_thd_for_cp(x, params.cu_seqlens_q_padded, cp, rank, 0)  # noqa
            params.cp_group, params.local_cp_size = group, cp
            errors[f"thd-dynamic-cp{cp}"] = _compare_cp(mixer, group, params, full, hidden,
                                                        weight, split)
            assert mixer.cp.cp_size == 1, "the static CP helper was not restored"
            params.cp_group = params.local_cp_size = None
            sbhd_params = PackedSeqParams(qkv_format="sbhd", cp_group=group, local_cp_size=cp)
            split = lambda x: split_sbhd_for_cp(x, cp, rank, 0)  # noqa: E731
            errors[f"sbhd-dynamic-cp{cp}"] = _compare_cp(mixer, group, sbhd_params, full_sbhd,
                                                         sbhd_hidden, sbhd_weight, split)
    finally:
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(context_parallel_size=dist.get_world_size())
    try:
        mixer, group = build_mixer(), parallel_state.get_context_parallel_group()
        cp, rank = group.size(), group.rank()
        split = lambda x: split_thd_for_cp(x, params.cu_seqlens_q_padded, cp, rank, 0)  # noqa
        errors[f"thd-static-cp{cp}"] = _compare_cp(mixer, group, params, full, hidden, weight,
                                                   split)
        split = lambda x: split_sbhd_for_cp(x, cp, rank, 0)  # noqa: E731
        errors[f"sbhd-static-cp{cp}"] = _compare_cp(mixer, group, None, full_sbhd, sbhd_hidden,
                                                    sbhd_weight, split)
        errors["switching"] = switching_guarantees(mixer, cp)
    finally:
        parallel_state.destroy_model_parallel()
    return errors


@pytest.fixture(scope="module")
def cp_errors():
    return run_distributed(rank_mixer_checks, world_size=4, timeout_s=120)


def test_packed_sequence_output_is_independent_of_its_neighbours(cp_errors):
    errors = cp_errors[0]["packing"]
    assert len(errors) == len(REAL_LENGTHS)
    assert max(errors) < TOLERANCE, errors


@pytest.mark.parametrize("case", ["thd-dynamic-cp2", "thd-dynamic-cp4", "sbhd-dynamic-cp2",
                                  "sbhd-dynamic-cp4", "thd-static-cp4", "sbhd-static-cp4"])
def test_cp_matches_single_rank(cp_errors, case):
    for rank_errors in cp_errors:
        assert rank_errors[case] < TOLERANCE, (case, rank_errors[case])


def switching_guarantees(mixer, static_size):
    """Static CP = ``static_size``; micro-batches bring local_cp_size 1 or an exception."""
    static = mixer.cp
    hidden, params, weight = packed_inputs()
    params.local_cp_size = 1  # CP off for this micro-batch: the whole pack on this rank

    def boom(*args, **kwargs):
        assert mixer.cp is not static and mixer.cp.cp_size == 1
        raise RuntimeError("boom")
    mixer._ssm_training = boom
    try:
        mixer(hidden, packed_seq_params=params)
        raised = False
    except RuntimeError:
        raised = True
    restored = mixer.cp is static and mixer.cp.cp_size == static_size
    del mixer._ssm_training
    calls = []
    forbid_collectives(calls)
    out, _, _ = run(mixer, hidden, params, weight)
    return raised, restored, calls, bool(torch.isfinite(out).all())


def test_exception_restores_static_group_and_size_one_group_is_silent(cp_errors):
    for rank_errors in cp_errors:
        raised, restored, calls, finite = rank_errors["switching"]
        assert raised and restored
        assert calls == [] and finite
