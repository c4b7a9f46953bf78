"""The packing data path on real gloo ranks: every sample once, contents intact, budget held.

Each DP replica loads a contiguous block of the global batch; after scheduling and rerouting,
the pieces the DP x CP ranks hold must reassemble into exactly the original samples.
"""

import pytest
import torch

from tests.harness.multirank import run_distributed

PAD = 0
# Odd lengths, length 1, lengths not divisible by 2*cp, one near the CP capacity.
LENGTHS = [1, 7, 33, 16, 5, 60, 2, 11, 3, 24, 9, 1, 17, 40, 8, 6]
CP_CAPACITY = 64


def _sample(sid: int, length: int) -> dict:
    tokens = 1000 * (sid + 1) + torch.arange(length)
    return {"tokens": tokens, "labels": tokens + 1, "loss_mask": torch.ones(length),
            "length": length, "padded_length": length}


def _rank_fn(dp: int, cp: int, budget: int, scheduler: str, fixed: bool = False):
    from megatron.core import parallel_state as ps
    from megatron.varlen.packing.data_schedule import GlobalBatchPacker, PackingConfig

    ps.initialize_model_parallel(context_parallel_size=cp)
    try:
        per_replica = len(LENGTHS) // dp
        first = ps.get_data_parallel_rank() * per_replica
        samples = [_sample(first + i, LENGTHS[first + i]) for i in range(per_replica)]
        before = [{k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                  for s in samples]
        config = PackingConfig(scheduler=scheduler, max_seqlen_per_rank=budget, pad_id=PAD,
                               fixed_tokens_per_rank=budget if fixed else None)
        step = GlobalBatchPacker(config).pack_global_batch(samples)
        for s, b in zip(samples, before):
            assert all(torch.equal(s[k], b[k]) if torch.is_tensor(b[k]) else s[k] == b[k]
                       for k in b), "samples must not be modified"
        rank = torch.distributed.get_rank(ps.get_data_parallel_group(with_context_parallel=True))
        return {"rank": rank, "num_microbatches": step.num_microbatches,
                "seqlen_sum": step.seqlen_sum,
                "microbatches": [
                    {"ids": mb["sample_ids"], "tokens": mb["tokens"][0].tolist(),
                     "cu_padded": mb["packed_seq_params"].cu_seqlens_q_padded.tolist(),
                     "cp": mb["packed_seq_params"].local_cp_size,
                     "positions": mb["position_ids"][0].tolist()}
                    for mb in step.microbatches]}
    finally:
        ps.destroy_model_parallel()


def _reassemble(results, cp, field="tokens"):
    """{sample id: its padded span of ``field``}, restored from every rank's CP shard."""
    from megatron.varlen.packing.cp_split import restore_thd_from_cp_shards

    seen = {}
    num_mb = results[0]["num_microbatches"]
    assert all(r["num_microbatches"] == num_mb for r in results)
    for m in range(num_mb):
        holders = {}
        for r in sorted(results, key=lambda r: r["rank"]):
            mb = r["microbatches"][m]
            if mb["ids"]:
                holders.setdefault(mb["ids"], []).append(mb)
        for ids, shards in holders.items():
            size = shards[0]["cp"]
            assert len(shards) == size, f"ids {ids}: {len(shards)} holders, local_cp_size {size}"
            cu = torch.tensor(shards[0]["cu_padded"])
            full = restore_thd_from_cp_shards([torch.tensor(s[field]) for s in shards], cu, 0) \
                if size > 1 else torch.tensor(shards[0][field])
            for k, sid in enumerate(ids):
                assert sid not in seen, f"sample {sid} scheduled twice"
                seen[sid] = full[cu[k]: cu[k + 1]]
    return seen


@pytest.mark.parametrize("dp, cp, scheduler, fixed", [
    (2, 1, "dp_balanced", False), (2, 2, "dp_balanced", False), (1, 4, "dp_balanced", False),
    (2, 2, "empty", False),
    (2, 2, "dp_balanced", True),  # VPP's fixed shapes: every pack topped up by a filler
])
def test_every_sample_once_with_intact_tokens(dp, cp, scheduler, fixed):
    budget = CP_CAPACITY // cp  # a CP group of cp ranks can hold the 60-token sample
    results = run_distributed(_rank_fn, dp * cp, args=(dp, cp, budget, scheduler, fixed),
                              timeout_s=120)
    seen = _reassemble(results, cp)
    assert sorted(seen) == list(range(len(LENGTHS))), "every sample exactly once"
    for sid, tokens in seen.items():
        length = LENGTHS[sid]
        assert tokens[:length].tolist() == _sample(sid, length)["tokens"].tolist()
        assert (tokens[length:] == PAD).all()
    _check_positions(results, cp)
    for r in results:
        assert r["seqlen_sum"] == sum(LENGTHS)
        for mb in r["microbatches"]:
            assert len(mb["tokens"]) <= budget, f"rank {r['rank']} holds {len(mb['tokens'])}"
            assert not fixed or len(mb["tokens"]) == budget


def _check_positions(results, cp):
    """Real tokens count 0..L-1; no position id (padding, fillers, idle ranks) exceeds the real
    length - 1 (a learned position table of --seq-length rows is never overrun)."""
    for sid, positions in _reassemble(results, cp, "positions").items():
        length = LENGTHS[sid]
        assert positions[:length].tolist() == list(range(length)), sid
        assert int(positions.max()) <= length - 1, (sid, positions.tolist())
    for r in results:
        for mb in r["microbatches"]:
            if not mb["ids"]:
                assert set(mb["positions"]) == {0}, "an idle rank's filler counts no positions"


def test_sequence_longer_than_capacity_is_a_one_line_error():
    from tests.harness.multirank import DistributedTestError

    with pytest.raises(DistributedTestError) as err:
        run_distributed(_rank_fn, 2, args=(1, 2, 16, "dp_balanced"), timeout_s=120)
    message = str(err.value)
    assert "--max-seqlen-per-dp-cp-rank" in message and "60" in message, message


def _dynamic_rank_fn(dp: int, cp: int, budget: int, min_size: int):
    from megatron.core import parallel_state as ps
    from megatron.varlen.packing.data_schedule import GlobalBatchPacker, PackingConfig
    from megatron.varlen.platform.dynamic_cp_groups import (
        destroy_dynamic_cp_groups, initialize_dynamic_cp_groups,
    )
    from megatron.varlen.scheduling.groups import build_group_layout

    ps.initialize_model_parallel(context_parallel_size=cp)
    try:
        registry = initialize_dynamic_cp_groups(build_group_layout(dp * cp, min_size, cp))
        per_replica = len(LENGTHS) // dp
        first = ps.get_data_parallel_rank() * per_replica
        samples = [_sample(first + i, LENGTHS[first + i]) for i in range(per_replica)]
        config = PackingConfig(scheduler="default_dynamic_cp", max_seqlen_per_rank=budget,
                               pad_id=PAD, min_cp_size=min_size)
        step = GlobalBatchPacker(config, group_lookup=registry.lookup).pack_global_batch(samples)
        dp_cp = ps.get_data_parallel_group(with_context_parallel=True)
        dp_cp_global = torch.distributed.get_process_group_ranks(dp_cp)
        out = []
        for mb in step.microbatches:
            params = mb["packed_seq_params"]
            group = params.cp_group
            members = (torch.distributed.get_process_group_ranks(group) if group is not None
                       else [torch.distributed.get_rank()])
            out.append({"ids": mb["sample_ids"], "tokens": mb["tokens"][0].tolist(),
                        "positions": mb["position_ids"][0].tolist(),
                        "cu_padded": params.cu_seqlens_q_padded.tolist(),
                        "cp": params.local_cp_size,
                        "members": [dp_cp_global.index(g) for g in members],
                        "groups_per_rank": registry.groups_per_rank()})
        return {"rank": torch.distributed.get_rank(dp_cp), "microbatches": out,
                "num_microbatches": step.num_microbatches, "seqlen_sum": step.seqlen_sum}
    finally:
        destroy_dynamic_cp_groups()
        ps.destroy_model_parallel()


@pytest.mark.parametrize("dp, cp, min_size", [(2, 2, 1), (1, 4, 1), (3, 2, 1), (6, 1, 2)])
def test_dynamic_groups_are_created_groups_of_the_right_size(dp, cp, min_size):
    budget = 16
    results = run_distributed(_dynamic_rank_fn, dp * cp, args=(dp, cp, budget, min_size),
                              timeout_s=120)
    seen = _reassemble(results, cp)
    _check_positions(results, cp)
    loaded = (len(LENGTHS) // dp) * dp  # each replica loads an equal block
    assert sorted(seen) == list(range(loaded)), "every sample exactly once"
    for sid, tokens in seen.items():
        assert tokens[:LENGTHS[sid]].tolist() == _sample(sid, LENGTHS[sid])["tokens"].tolist()
    for r in results:
        for m, mb in enumerate(r["microbatches"]):
            assert len(mb["tokens"]) <= budget, f"rank {r['rank']} mb {m}: {len(mb['tokens'])}"
            # The ranks holding this pack form exactly the process group it carries.
            holders = sorted(o["rank"] for o in results
                             if o["microbatches"][m]["ids"] == mb["ids"])
            if mb["ids"]:
                assert holders == sorted(mb["members"]), (m, mb["ids"], holders, mb["members"])
                assert mb["cp"] == len(holders)
                assert mb["cp"] == 1 or mb["cp"] >= min_size
    used = {mb["cp"] for r in results for mb in r["microbatches"]}
    assert max(used) > 1, f"no sequence needed CP (sizes used {used}): test would be vacuous"


def _step_methods_rank_fn():
    """Each step of GlobalBatchPacker on its own, on DP=2 x CP=1."""
    from megatron.core import parallel_state as ps
    from megatron.varlen.packing.data_schedule import GlobalBatchPacker, PackingConfig

    ps.initialize_model_parallel()
    try:
        dp_rank = ps.get_data_parallel_rank()
        # Uneven replicas: rank 0 holds 3 samples, rank 1 holds 2 (runtime batches may be).
        mine = [0, 1, 2] if dp_rank == 0 else [3, 4]
        samples = [_sample(i, LENGTHS[i]) for i in mine]
        config = PackingConfig(scheduler="dp_balanced", max_seqlen_per_rank=64, pad_id=PAD)
        packer = GlobalBatchPacker(config)
        gathered = packer.gather_lengths(samples)
        _, schedule = packer.schedule(gathered)
        routed = packer.reroute(samples, schedule, gathered)
        assigned = {sid for mb in schedule.microbatches for sid in mb[packer.rank]}
        return {"lengths": gathered.lengths, "routed": sorted(routed),
                "routed_tokens": {k: v["tokens"].tolist() for k, v in routed.items()},
                "assigned": sorted(assigned), "owners": gathered.owners,
                "first_id": gathered.first_id, "dp_rank": dp_rank,
                "steps": packer.pack_global_batch(samples).num_microbatches}
    finally:
        ps.destroy_model_parallel()


def test_packer_step_methods():
    results = run_distributed(_step_methods_rank_fn, 2, timeout_s=120)
    for r in results:
        assert r["lengths"] == tuple(LENGTHS[:5])
        assert r["routed"] == r["assigned"], "a rank receives exactly what it was scheduled"
        for sid, tokens in r["routed_tokens"].items():
            assert tokens == _sample(sid, LENGTHS[sid])["tokens"].tolist()
        assert r["owners"] == (0, 0, 0, 1, 1) and r["first_id"] == 3 * r["dp_rank"]
        assert r["steps"] >= 1
    assert sorted(results[0]["routed"] + results[1]["routed"]) == list(range(5))


def _extra_field_rank_fn(declare: bool, per_sample_value: bool):
    """A per-token ``custom_weights`` field (and, optionally, a per-sample number) through the
    packer on DP=2 x CP=1: carried when declared, refused in one line when not."""
    from megatron.core import parallel_state as ps
    from megatron.varlen.packing.data_schedule import GlobalBatchPacker, PackingConfig

    ps.initialize_model_parallel()
    try:
        first = 4 * ps.get_data_parallel_rank()
        samples = []
        for sid in range(first, first + 4):
            sample = _sample(sid, LENGTHS[sid])
            sample["custom_weights"] = torch.full((LENGTHS[sid],), float(sid))
            if per_sample_value:
                sample["reward"] = 0.5  # per-sample: the caller keeps it, looked up by id
            samples.append(sample)
        config = PackingConfig(scheduler="dp_balanced", max_seqlen_per_rank=64, pad_id=PAD,
                               extra_token_fields=("custom_weights",) if declare else ())
        step = GlobalBatchPacker(config).pack_global_batch(samples)
        return [{"ids": mb["sample_ids"], "weights": mb["custom_weights"][0].tolist(),
                 "cu_padded": mb["packed_seq_params"].cu_seqlens_q_padded.tolist()}
                for mb in step.microbatches]
    finally:
        ps.destroy_model_parallel()


def test_declared_per_token_field_is_carried():
    for micro_batches in run_distributed(_extra_field_rank_fn, 2, args=(True, True)):
        for mb in micro_batches:
            for k, sid in enumerate(mb["ids"]):
                span = mb["weights"][mb["cu_padded"][k]: mb["cu_padded"][k + 1]]
                assert span[:LENGTHS[sid]] == [float(sid)] * LENGTHS[sid]
                assert set(span[LENGTHS[sid]:]) <= {0.0}, "padding carries 0"


def test_undeclared_per_token_field_is_a_one_line_error():
    from tests.harness.multirank import DistributedTestError

    with pytest.raises(DistributedTestError) as err:
        run_distributed(_extra_field_rank_fn, 2, args=(False, False), timeout_s=60)
    line = next(line for line in str(err.value).splitlines() if line.startswith("ValueError"))
    assert "'custom_weights'" in line and "PackingConfig.extra_token_fields" in line, line


def test_field_check_names_the_key_and_the_declaration():
    from megatron.varlen.packing.reroute import check_sample_fields

    sample = {**_sample(0, 3), "custom_weights": torch.ones(3), "reward": 1.0,
              "position_ids": torch.arange(4), "sample_id": 0}
    with pytest.raises(ValueError, match="sample 7 has per-token field 'custom_weights'") as err:
        check_sample_fields({7: sample}, ())
    assert "\n" not in str(err.value)
    check_sample_fields({7: sample}, ("custom_weights",))  # declared: carried
    with pytest.raises(ValueError, match=r"lacks the declared per-token field\(s\) \['adv'\]"):
        check_sample_fields({7: sample}, ("custom_weights", "adv"))


def _disagreeing_schedules_rank_fn(disagree: bool):
    from megatron.core import parallel_state as ps
    from megatron.varlen.packing.data_schedule import _verify_model_parallel_agreement
    from megatron.varlen.scheduling.problem import Schedule

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    try:
        rank = torch.distributed.get_rank()
        last_id = 1 if (disagree and rank == 1) else 0
        schedule = Schedule(microbatches=(((last_id,),),), cp_sizes=(1, 1), padded_lengths=(4, 4))
        _verify_model_parallel_agreement(schedule, ps.get_model_parallel_group())
        return "agreed"
    finally:
        ps.destroy_model_parallel()


def test_model_parallel_ranks_must_agree_on_the_schedule():
    from tests.harness.multirank import DistributedTestError

    assert run_distributed(_disagreeing_schedules_rank_fn, 2, args=(False,)) == ["agreed"] * 2
    with pytest.raises(DistributedTestError, match="computed different packing schedules"):
        run_distributed(_disagreeing_schedules_rank_fn, 2, args=(True,), timeout_s=60)
