"""Megatron-LM's seed API (megatron-core 0.16.1's HybridCPDataLoaderWrapper) on gloo CPU ranks:
its signatures and return values, our default_dynamic_cp scheduler behind them.

Each DP replica holds packed samples (THD, ``cu_seqlens``; one padded per sequence with
``cu_seqlens_padded``, one with an empty sub-sample); both CP ranks of a replica hold the same.
"""

from types import SimpleNamespace

import pytest
import torch

from megatron.varlen.packing.data_schedule import (
    DynamicCPScheduler,
    PackingConfig,
    packing_config_from,
)
from megatron.varlen.packing.reroute import subsample_fields
from megatron.varlen.scheduling.problem import padded_length
from tests.harness.multirank import DistributedTestError, run_distributed

DP, CP = 2, 2
BUDGET = 32
# Per replica, per packed sample: the sub-samples' real lengths (0: an empty sub-sample).
REPLICA_LENGTHS = [[[5, 17], [0, 30, 2]], [[9], [1, 40, 3, 11]]]
PADDED_SAMPLE = (1, 1)  # (replica, packed sample) laid out padded per sequence
PAD_TO = 4              # ... each sub-sample rounded up to this


def _sub_lengths(replica: int) -> list[int]:
    return [n for packed in REPLICA_LENGTHS[replica] for n in packed if n]


ALL_LENGTHS = _sub_lengths(0) + _sub_lengths(1)
FIRST_IDS = [0, len(_sub_lengths(0))]


def _owner(gid: int) -> int:
    return 0 if gid < FIRST_IDS[1] else 1


def _packed_sample(replica: int, index: int, extra: dict) -> dict:
    """One packed THD sample; sub-sample k's tokens are 1000*(global id + 1) + position."""
    lengths = REPLICA_LENGTHS[replica][index]
    padded = index == PADDED_SAMPLE[1] and replica == PADDED_SAMPLE[0]
    spans = [-(-n // PAD_TO) * PAD_TO if padded else n for n in lengths]
    gid = FIRST_IDS[replica] + sum(
        1 for previous in REPLICA_LENGTHS[replica][:index] for n in previous if n)
    tokens, positions = [], []
    for n, span in zip(lengths, spans):
        tokens += [1000 * (gid + 1) + p for p in range(n)] + [-1] * (span - n)
        positions += list(range(n)) + [0] * (span - n)
        gid += 1 if n else 0
    tokens = torch.tensor(tokens, dtype=torch.int64)
    sample = {"tokens": tokens, "labels": tokens + 1, "loss_mask": (tokens >= 0).float(),
              "position_ids": torch.tensor(positions, dtype=torch.int64),
              "cu_seqlens": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()],
                                         dtype=torch.int32),
              "max_seqlen": torch.tensor([max(spans)], dtype=torch.int32)}
    if padded:
        sample["cu_seqlens_padded"] = torch.tensor([0, *torch.tensor(spans).cumsum(0).tolist()],
                                                   dtype=torch.int32)
    return {**sample, **{key: make(tokens) for key, make in extra.items()}}


def _expected_subsample(gid: int) -> dict:
    n = ALL_LENGTHS[gid]
    tokens = [1000 * (gid + 1) + p for p in range(n)]
    return {"tokens": tokens, "labels": [t + 1 for t in tokens], "loss_mask": [1.0] * n,
            "position_ids": list(range(n))}


def _as_lists(samples: dict) -> dict:
    return {gid: {key: (value.tolist(), str(value.dtype)) for key, value in fields.items()}
            for gid, fields in samples.items()}


def _seed_rank_fn(config, extra: dict):
    """Every method of the seed API on its own, then ``next()``, on DP x CP ranks."""
    from megatron.core import parallel_state as ps
    from megatron.varlen.packing.data_schedule import HybridCPDataLoaderWrapper

    ps.initialize_model_parallel(context_parallel_size=CP)
    try:
        replica = ps.get_data_parallel_rank()
        batch = [_packed_sample(replica, i, extra) for i in range(len(REPLICA_LENGTHS[replica]))]
        wrapper = HybridCPDataLoaderWrapper(iter([batch]), config)
        subsamples = wrapper.unpack_batch(batch)
        local = torch.tensor([len(s["tokens"]) for s in subsamples], dtype=torch.int32)
        lengths, offsets = wrapper.get_global_seqlens(local)
        id_seqlens, ids = wrapper.get_global_id_seqlens(len(local), offsets, lengths)
        groups, sample_id_groups = wrapper.cp_balancing_scheduler.get_groups_and_subsamples(
            id_seqlens, config)
        routed = wrapper.reroute_samples_to_hdp_ranks(subsamples, ids, id_seqlens,
                                                      sample_id_groups, offsets)
        by_next, groups_by_next = next(wrapper)
        idle = HybridCPDataLoaderWrapper(None, config)
        return {"rank": torch.distributed.get_rank(wrapper.dp_cp_group),
                "unpacked": [s["tokens"].tolist() for s in subsamples],
                "unpacked_keys": sorted(subsamples[0]),
                "lengths": lengths, "offsets": offsets.tolist(),
                "offsets_dtype": str(offsets.dtype), "id_seqlens": id_seqlens,
                "ids": ids.tolist(), "ids_dtype": str(ids.dtype),
                "sources": [wrapper._gid_to_src_rank(g, offsets) for g in range(len(lengths))],
                "groups": groups, "sample_id_groups": sample_id_groups,
                "routed": _as_lists(routed), "routed_order": list(routed),
                "next": _as_lists(by_next), "next_groups": groups_by_next,
                "idle": next(idle), "total_hdp_gpus": wrapper.total_hdp_gpus}
    finally:
        ps.destroy_model_parallel()


def _check_groups(results, groups, sample_id_groups):
    """Every sub-sample in exactly one group, on an aligned block of c ranks (its CP group),
    every rank's padded tokens within the budget, token sums conserved."""
    seen = {}
    for g, group in enumerate(sample_id_groups):
        assert len(group) == DP * CP
        for rank, ids in enumerate(group):
            assert groups[g][rank] == [ALL_LENGTHS[gid] for gid in ids]
            for gid in ids:
                seen.setdefault(gid, set()).add((g, rank))
        for rank, ids in enumerate(group):
            tokens = 0
            for gid in ids:
                holders = sorted(r for gg, r in seen[gid] if gg == g)
                size = len(holders)
                assert holders == list(range(holders[0], holders[0] + size))
                assert holders[0] % size == 0 and size & (size - 1) == 0, holders
                tokens += padded_length(ALL_LENGTHS[gid], size) // size
            assert tokens <= BUDGET, (g, rank, ids)
    assert sorted(seen) == list(range(len(ALL_LENGTHS)))
    assert all(len({gg for gg, _ in places}) == 1 for places in seen.values()), "one group each"
    assert sum(ALL_LENGTHS[gid] for gid in seen) == sum(ALL_LENGTHS)


def _check_routed(rank: int, routed: dict, order: list, sample_id_groups, extra_keys=()):
    assigned = sorted({gid for group in sample_id_groups for gid in group[rank]})
    assert order == assigned, "this rank receives exactly its sub-samples, in id order"
    for gid in assigned:
        expected = _expected_subsample(gid)
        got = routed[gid]
        assert sorted(got) == sorted([*expected, *extra_keys])
        for key, values in expected.items():
            assert got[key][0] == values, (gid, key)
        assert got["tokens"][1] == got["labels"][1] == "torch.int64"
        assert got["position_ids"][1] == "torch.int64" and got["loss_mask"][1] == "torch.float32"


def test_seed_api_return_values_on_dp2_cp2():
    config = SimpleNamespace(max_seqlen_per_dp_cp_rank=BUDGET)
    results = run_distributed(_seed_rank_fn, DP * CP, args=(config, {}), timeout_s=180)
    for r in results:
        replica, rank = r["rank"] // CP, r["rank"]
        assert r["total_hdp_gpus"] == DP * CP
        # unpack_batch: non-empty sub-samples, real tokens only, boundary fields dropped.
        assert [len(t) for t in r["unpacked"]] == _sub_lengths(replica)
        assert r["unpacked"][0] == _expected_subsample(FIRST_IDS[replica])["tokens"]
        assert r["unpacked_keys"] == ["labels", "loss_mask", "position_ids", "tokens"]
        # get_global_seqlens: DP-rank-major lengths; offsets = each replica's first id (int32).
        assert r["lengths"] == ALL_LENGTHS
        assert r["offsets"] == FIRST_IDS and r["offsets_dtype"] == "torch.int32"
        assert r["id_seqlens"] == list(enumerate(ALL_LENGTHS))
        first = FIRST_IDS[replica]
        assert r["ids"] == list(range(first, first + len(_sub_lengths(replica))))
        assert r["ids_dtype"] == "torch.int32"
        # _gid_to_src_rank: the owning replica's rank in this rank's CP lane.
        assert r["sources"] == [_owner(g) * CP + rank % CP for g in range(len(ALL_LENGTHS))]
        _check_groups(results, r["groups"], r["sample_id_groups"])
        assert r["sample_id_groups"] == results[0]["sample_id_groups"], "same on every rank"
        _check_routed(rank, r["routed"], r["routed_order"], r["sample_id_groups"])
        # next(): the same, in one call; a rank without an iterator gets (None, None).
        assert r["next"] == r["routed"] and r["next_groups"] == r["sample_id_groups"]
        assert r["idle"] == (None, None)
    assert max(len({rank for rank, ids in enumerate(group) if gid in ids})
               for group in results[0]["sample_id_groups"] for ids in group for gid in ids) > 1, \
        "no sub-sample needed CP: the test would not exercise CP groups"


def _weights(tokens):
    return tokens.float() * 2  # exact in float32


def test_declared_extra_field_is_rerouted():
    config = SimpleNamespace(max_seqlen_per_dp_cp_rank=BUDGET,
                             extra_token_fields=("custom_weights",))
    results = run_distributed(_seed_rank_fn, DP * CP,
                              args=(config, {"custom_weights": _weights}), timeout_s=180)
    for r in results:
        _check_routed(r["rank"], r["routed"], r["routed_order"], r["sample_id_groups"],
                      extra_keys=("custom_weights",))
        for gid, fields in r["routed"].items():
            assert fields["custom_weights"][0] == [2.0 * t for t in fields["tokens"][0]]


def test_undeclared_field_is_a_one_line_error_naming_it():
    config = SimpleNamespace(max_seqlen_per_dp_cp_rank=BUDGET)
    with pytest.raises(DistributedTestError) as err:
        run_distributed(_seed_rank_fn, DP * CP, args=(config, {"custom_weights": _weights}),
                        timeout_s=60)
    line = next(line for line in str(err.value).splitlines() if line.startswith("ValueError"))
    assert "unsupported sample keys ['custom_weights']" in line
    assert "extra_token_fields" in line


def test_reroute_field_rules():
    token = {"tokens": torch.tensor([1]), "original_seq_len": torch.tensor([1])}
    assert subsample_fields([token], ()) == (["tokens"], ["original_seq_len"])
    with pytest.raises(ValueError, match=r"unsupported sample keys \['custom_weights'\]") as err:
        subsample_fields([{**token, "custom_weights": torch.ones(1)}], ())
    assert "\n" not in str(err.value)
    assert subsample_fields([{**token, "custom_weights": torch.ones(1)}], ("custom_weights",)) \
        == (["tokens", "custom_weights"], ["original_seq_len"])
    with pytest.raises(ValueError, match="sample 1 keys"):
        subsample_fields([token, {"tokens": torch.tensor([2])}], ())


def test_config_needs_only_the_budget():
    config = packing_config_from(SimpleNamespace(max_seqlen_per_dp_cp_rank=4096))
    assert config.scheduler == "default_dynamic_cp" and config.max_seqlen_per_rank == 4096
    assert config.pad_id == 0 and config.min_cp_size == 1 and config.extra_token_fields == ()
    ours = packing_config_from(SimpleNamespace(max_seqlen_per_dp_cp_rank=64, min_cp_size=2,
                                               scheduler="dp_balanced", unrelated=1))
    assert (ours.min_cp_size, ours.scheduler) == (2, "dp_balanced")
    native = PackingConfig(scheduler="empty", max_seqlen_per_rank=8, pad_id=3)
    assert packing_config_from(native) is native
    with pytest.raises(ValueError, match="has no max_seqlen_per_dp_cp_rank") as err:
        packing_config_from(SimpleNamespace(max_seqlen_per_rank=4096))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("dp, cp, id_seqlens, expected", [
    # Megatron-LM's packing-aware grouping: a short sequence shares a larger group's ranks.
    (1, 2, [(0, 6144), (1, 2048)], [[[0, 1], [0, 1]]]),
    (2, 1, [(0, 6144), (1, 2048)], [[[0, 1], [0, 1]]]),
    # Ids need not start at 0 (they are passed through).
    (1, 2, [(7, 6144), (9, 2048)], [[[7, 9], [7, 9]]]),
])
def test_scheduler_groups(dp, cp, id_seqlens, expected):
    config = packing_config_from(SimpleNamespace(max_seqlen_per_dp_cp_rank=4096))
    groups, sample_id_groups = DynamicCPScheduler(config, dp, cp).get_groups_and_subsamples(
        id_seqlens, config)
    assert sample_id_groups == expected
    lengths = dict(id_seqlens)
    assert groups == [[[lengths[g] for g in ids] for ids in group] for group in expected]


def test_scheduler_leaves_ranks_idle_rather_than_over_splitting():
    # Megatron-LM grows groups until all 14 ranks hold both sequences; ours keeps each
    # 50-token sequence on the group the cost model prefers and idles the rest (docs/MIGRATING.md).
    config = packing_config_from(SimpleNamespace(max_seqlen_per_dp_cp_rank=100))
    _, sample_id_groups = DynamicCPScheduler(config, 14, 1).get_groups_and_subsamples(
        [(0, 50), (1, 50)])
    (group,) = sample_id_groups
    assert sorted({gid for ids in group for gid in ids}) == [0, 1]
    assert any(not ids for ids in group)
