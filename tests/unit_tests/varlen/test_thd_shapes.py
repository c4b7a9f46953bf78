"""Fixed THD shapes: Megatron-LM's --pad-packed-seq-alignment,
--thd-max-packed-sequences and --thd-tail-padding-policy on our packs, and the padding mask.

Everything here is checked by counting: tokens per rank, cu_seqlens entries, padding slots,
real tokens; on the pure pieces (one process) and through the whole data path on gloo ranks
(dynamic and static CP) over several steps.
"""

import random

import pytest
import torch

from megatron.varlen.packing.sequence_cap import cap_sequences_per_rank
from megatron.varlen.packing.thd_microbatch import build_model_inputs, pack_sequences
from megatron.varlen.packing.thd_shapes import (
    APPEND_DUMMY_SEQ, EXTEND_LAST, ThdShape, pad_cu_seqlens,
)
from megatron.varlen.scheduling.problem import ScheduleProblem
from megatron.varlen.scheduling.registry import get_scheduler
from megatron.varlen.scheduling.validate import validate_schedule
from tests.harness.multirank import run_distributed

PAD = 0


def _seq(length: int, start: int = 1) -> dict:
    tokens = torch.arange(start, start + length)
    return {"tokens": tokens, "labels": tokens + 1, "loss_mask": torch.ones(length)}


# --- the shape rules ----------------------------------------------------------------------


def test_rank_tokens_follow_the_alignment():
    assert [ThdShape(tokens_per_rank=32).rank_tokens(n) for n in (1, 17, 32)] == [32] * 3
    assert [ThdShape(alignment=8).rank_tokens(n) for n in (1, 8, 9, 17)] == [8, 8, 16, 24]
    assert [ThdShape().rank_tokens(n) for n in (1, 9)] == [1, 9]


def test_the_cap_reserves_the_dummy_sequence_slot():
    assert ThdShape(max_packed_sequences=4).max_real_sequences() == 4  # no tail padding
    assert ThdShape(alignment=8, max_packed_sequences=4).max_real_sequences() == 3
    assert ThdShape(alignment=8, max_packed_sequences=4,
                    tail_policy=EXTEND_LAST).max_real_sequences() == 4
    assert ThdShape().max_real_sequences() is None
    with pytest.raises(ValueError, match="no slot for a real sequence"):
        ThdShape(tokens_per_rank=8, max_packed_sequences=1)
    with pytest.raises(ValueError, match="policy"):
        ThdShape(tail_policy="extend_first")


def test_cu_seqlens_padded_to_a_fixed_entry_count_repeat_the_last_boundary():
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    assert pad_cu_seqlens(cu, 5).tolist() == [0, 3, 8, 8, 8]
    assert pad_cu_seqlens(cu, None) is cu and pad_cu_seqlens(cu, 3) is cu
    with pytest.raises(AssertionError, match="exceed --thd-max-packed-sequences 1"):
        pad_cu_seqlens(cu, 2)


# --- one pack -------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [APPEND_DUMMY_SEQ, EXTEND_LAST])
def test_tail_padding_layout_and_padding_mask(policy):
    """Sequences of 3 and 5 tokens padded for CP 2 (to 4 and 8), the pack to 2 x 16 tokens."""
    pack = pack_sequences([_seq(3), _seq(5, 10)], [4, 8], local_cp_size=2, pad_id=PAD,
                          sample_ids=(0, 1), total_tokens=32, tail_policy=policy)
    assert pack.tokens.numel() == 32 and pack.real_tokens == 8
    if policy == APPEND_DUMMY_SEQ:
        assert pack.cu_seqlens.tolist() == [0, 3, 8, 28]  # the dummy counts as attended
        assert pack.cu_seqlens_padded.tolist() == [0, 4, 12, 32]
    else:
        assert pack.cu_seqlens.tolist() == [0, 3, 8]
        assert pack.cu_seqlens_padded.tolist() == [0, 4, 32]
    expected = torch.ones(32, dtype=torch.bool)
    expected[0:3] = False
    expected[4:9] = False
    assert torch.equal(pack.padding_mask, expected)
    assert torch.equal(pack.loss_mask.bool(), ~expected)
    assert (pack.tokens[expected] == PAD).all() and (pack.position_ids[expected] == 0).all()
    shards = [build_model_inputs(pack, r, None, "cpu", cu_seqlens_entries=5) for r in range(2)]
    for inputs in shards:
        assert inputs["tokens"].shape == inputs["padding_mask"].shape == (1, 16)
        params = inputs["packed_seq_params"]
        assert params.cu_seqlens_q.numel() == params.cu_seqlens_q_padded.numel() == 5
        assert params.max_seqlen_q == 32  # fixed with a fixed cu_seqlens size, as upstream
        assert params.host_cu_seqlens.tolist() == pack.cu_seqlens.tolist()
    real = sum(int((~s["padding_mask"]).sum()) for s in shards)
    assert real == 8 == sum(int(s["loss_mask"].sum()) for s in shards)


def test_without_shape_flags_nothing_changes():
    pack = pack_sequences([_seq(3), _seq(5)], [4, 6], local_cp_size=1, pad_id=PAD,
                          sample_ids=(0, 1))
    inputs = build_model_inputs(pack, 0, None, "cpu")
    params = inputs["packed_seq_params"]
    assert inputs["tokens"].shape == (1, 10) and params.cu_seqlens_q.tolist() == [0, 3, 8]
    assert params.max_seqlen_q == 6
    assert inputs["padding_mask"][0].tolist() == [False] * 3 + [True] + [False] * 5 + [True]


# --- Megatron-LM's own expectations (tests/unit_tests/test_sequence_packing.py), reproduced ---


def test_upstream_cap_reserves_one_slot_only_for_a_dummy_tail():
    assert ThdShape(tokens_per_rank=8, max_packed_sequences=32).max_real_sequences() == 31
    assert ThdShape(tokens_per_rank=8, max_packed_sequences=32,
                    tail_policy=EXTEND_LAST).max_real_sequences() == 32
    assert ThdShape(max_packed_sequences=32).max_real_sequences() == 32


def test_upstream_padding_mask_from_cu_seqlens():
    """Real [0, 3, 5], padded [0, 4, 8] -> [F, F, F, T, F, F, T, T]."""
    pack = pack_sequences([_seq(3), _seq(2)], [4, 4], local_cp_size=1, pad_id=PAD,
                          sample_ids=(0, 1))
    assert pack.cu_seqlens.tolist() == [0, 3, 5]
    assert pack.padding_mask.tolist() == [False] * 3 + [True] + [False] * 2 + [True] * 2


def test_upstream_extend_last_zigzag_layout():
    """CP 2, alignment 4, sequences of 4 and 8 tokens (1..12): the tail extends the last
    sequence to [0, 4, 16] before the zigzag split; rank 0 holds [1, 4, 5, 6, 7, 0, 0, 0]."""
    shape = ThdShape(alignment=4, tail_policy=EXTEND_LAST)
    tokens = torch.arange(1, 13)
    seqs = [{"tokens": t, "labels": t + 100, "loss_mask": torch.ones(len(t))}
            for t in (tokens[:4], tokens[4:])]
    pack = pack_sequences(seqs, [4, 8], local_cp_size=2, pad_id=PAD, sample_ids=(0, 1),
                          total_tokens=shape.rank_tokens(12 // 2) * 2, tail_policy=EXTEND_LAST)
    inputs = build_model_inputs(pack, 0, None, "cpu")
    assert inputs["tokens"][0].tolist() == [1, 4, 5, 6, 7, 0, 0, 0]
    assert inputs["padding_mask"][0].tolist() == [False] * 5 + [True] * 3
    params = inputs["packed_seq_params"]
    assert params.cu_seqlens_q.tolist() == [0, 4, 12]
    assert params.cu_seqlens_q_padded.tolist() == [0, 4, 16]
    assert params.max_seqlen_q == 12


# --- the cap on every scheduler's schedule ----------------------------------------------------


def _problems():
    rng = random.Random(5)
    for dp, cp, vpp in ((2, 1, 1), (2, 2, 1), (1, 4, 2), (4, 1, 4)):
        for _ in range(6):
            lengths = [rng.choice([1, 2, 3, 5, 8, 13, 40]) for _ in range(rng.randint(4, 40))]
            yield ScheduleProblem(lengths=lengths, dp_size=dp, cp_size=cp,
                                  max_seqlen_per_rank=64, vpp_group_size=vpp,
                                  min_num_microbatches=vpp, owners=None)


@pytest.mark.parametrize("scheduler", ["dp_balanced", "default_dynamic_cp"])
@pytest.mark.parametrize("cap", [1, 2, 3])
def test_cap_holds_on_every_rank_and_keeps_the_schedule_valid(scheduler, cap):
    for problem in _problems():
        schedule = get_scheduler(scheduler)(problem)
        capped = cap_sequences_per_rank(schedule, problem, cap)
        validate_schedule(problem, capped)  # every id once, groups, budget, VPP multiple
        assert max(len(ids) for mb in capped.microbatches for ids in mb) <= cap
        assert capped.cp_sizes == schedule.cp_sizes  # each sequence keeps its CP group
        if max(len(ids) for mb in schedule.microbatches for ids in mb) <= cap:
            assert capped is schedule
        assert cap_sequences_per_rank(schedule, problem, None) is schedule


def test_padding_ratio_counts_the_tail_padding():
    """With alignment max every rank of every micro-batch runs exactly budget token slots."""
    from megatron.varlen.packing.data_schedule import PackingConfig, plan_batch
    from megatron.varlen.packing.data_schedule import GatheredLengths

    lengths = (1, 2, 3, 5, 8, 13, 21, 34, 3, 3)
    config = PackingConfig(scheduler="dp_balanced", max_seqlen_per_rank=64, pad_id=PAD,
                           pad_packed_seq_alignment="max", thd_max_packed_sequences=3)
    planned = plan_batch(GatheredLengths(lengths, (0,) * 5 + (1,) * 5, 0), 2, 1, config)
    slots = planned.schedule.num_microbatches() * 2 * 64
    assert planned.stats["padding_ratio"] == pytest.approx(1 - sum(lengths) / slots)
    assert max(len(ids) for mb in planned.schedule.microbatches for ids in mb) <= 2


def test_seed_api_scheduler_holds_a_cap_its_config_carries():
    """Megatron-LM's config objects carry thd_max_packed_sequences: the seed API's scheduler
    (get_groups_and_subsamples) then holds it too, with the dummy slot kept."""
    from types import SimpleNamespace

    from megatron.varlen.packing.data_schedule import DynamicCPScheduler, packing_config_from

    config = packing_config_from(SimpleNamespace(
        max_seqlen_per_dp_cp_rank=64, thd_max_packed_sequences=3,
        pad_packed_seq_alignment="max"))
    lengths = [(sid, n) for sid, n in enumerate([1, 2, 3, 4, 5, 6, 7, 8] * 4)]
    uncapped = DynamicCPScheduler(packing_config_from(SimpleNamespace(
        max_seqlen_per_dp_cp_rank=64)), 2, 1).get_groups_and_subsamples(lengths)[1]
    capped = DynamicCPScheduler(config, 2, 1).get_groups_and_subsamples(lengths)[1]
    assert max(len(ids) for mb in uncapped for ids in mb) > 2  # the cap has work to do
    assert max(len(ids) for mb in capped for ids in mb) <= 2
    assert sorted(sid for mb in capped for ids in mb for sid in ids) == list(range(32))
    with pytest.raises(ValueError, match="no slot for a real sequence"):
        packing_config_from(SimpleNamespace(max_seqlen_per_dp_cp_rank=64,
                                            thd_max_packed_sequences=1,
                                            pad_packed_seq_alignment=8))


# --- the whole data path on gloo ranks ------------------------------------------------------

BUDGET = 16
STEPS = 3


def _step_lengths(step: int) -> list[int]:
    rng = random.Random(100 + step)
    return [rng.choice([1, 2, 3, 5, 7, 9, 15, 30]) for _ in range(8)]


def _shape_rank_fn(dynamic: bool, alignment, cap, policy):
    from megatron.core import parallel_state as ps
    from megatron.varlen.packing.data_schedule import GlobalBatchPacker, PackingConfig
    from megatron.varlen.platform.dynamic_cp_groups import (
        destroy_dynamic_cp_groups, initialize_dynamic_cp_groups,
    )
    from megatron.varlen.scheduling.groups import build_group_layout

    ps.initialize_model_parallel(context_parallel_size=2)
    lookup = initialize_dynamic_cp_groups(build_group_layout(4, 1, 2)).lookup if dynamic else None
    try:
        config = PackingConfig(
            scheduler="default_dynamic_cp" if dynamic else "dp_balanced",
            max_seqlen_per_rank=BUDGET, pad_id=PAD, pad_packed_seq_alignment=alignment,
            thd_max_packed_sequences=cap, thd_tail_padding_policy=policy)
        packer = GlobalBatchPacker(config, group_lookup=lookup)
        dp_rank, out = ps.get_data_parallel_rank(), []
        for step in range(STEPS):
            lengths = _step_lengths(step)
            mine = range(dp_rank * 4, dp_rank * 4 + 4)
            batch = packer.pack_global_batch([{**_seq(lengths[i], 100 * i), "length": lengths[i]}
                                              for i in mine])
            out.append([{"tokens": mb["tokens"].shape, "mask": mb["padding_mask"][0].tolist(),
                         "loss": mb["loss_mask"][0].tolist(), "ids": mb["sample_ids"],
                         "cu": mb["packed_seq_params"].cu_seqlens_q.numel(),
                         "cu_padded": mb["packed_seq_params"].cu_seqlens_q_padded.numel(),
                         "host_cu": mb["packed_seq_params"].host_cu_seqlens.numel()}
                        for mb in batch.microbatches])
        return out
    finally:
        if dynamic:
            destroy_dynamic_cp_groups()
        ps.destroy_model_parallel()


@pytest.mark.parametrize("dynamic, alignment, cap, policy", [
    (True, "max", 3, APPEND_DUMMY_SEQ),
    (False, "max", 2, EXTEND_LAST),
    (True, 4, None, EXTEND_LAST),
])
def test_fixed_shapes_across_microbatches_and_steps(dynamic, alignment, cap, policy):
    results = run_distributed(_shape_rank_fn, 4, args=(dynamic, alignment, cap, policy),
                              timeout_s=180)
    for step in range(STEPS):
        real = 0
        for rank_steps in results:
            for mb in rank_steps[step]:
                tokens = mb["tokens"][1]
                if alignment == "max":
                    assert tokens == BUDGET, "every rank, micro-batch and step: the budget"
                else:
                    assert tokens % alignment == 0
                if cap is not None:
                    assert mb["cu"] == mb["cu_padded"] == cap + 1
                    assert mb["host_cu"] - 1 <= cap
                    assert len(mb["ids"]) <= (cap - 1 if policy == APPEND_DUMMY_SEQ else cap)
                assert len(mb["mask"]) == tokens
                # Real slots are exactly the loss tokens (all loss_mask 1 in these samples).
                assert [not m for m in mb["mask"]] == [bool(v) for v in mb["loss"]]
                real += mb["mask"].count(False)
        assert real == sum(_step_lengths(step)), "every real token once over all CP shards"
