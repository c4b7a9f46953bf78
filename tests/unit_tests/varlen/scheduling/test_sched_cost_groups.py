"""Cost model and group layout."""

import pytest

from megatron.varlen.scheduling import CostModel, build_group_layout, build_static_layout
from megatron.varlen.scheduling.cost_model import H100_NVLINK


def test_time_matches_formula():
    cost = CostModel(a=2.0, b=3.0, g=5.0, d=7.0)
    assert cost.time(10, 1) == 2 * 100 + 3 * 10
    assert cost.time(12, 4) == pytest.approx((2 * 144 + 3 * 12) / 4 + 5 * 12 * 3 / 4)
    assert cost.group_latency(1) == 0.0
    assert cost.group_latency(4) == 21.0


def test_for_model_defaults_and_overrides():
    cost = CostModel.for_model(8192)
    assert cost.a == 1.0 and cost.b == 6 * 8192
    assert cost.g == pytest.approx(H100_NVLINK.attention_flops_per_s / H100_NVLINK.p2p_bytes_per_s)
    assert CostModel.for_model(8192, b=5.0, g=None).b == 5.0
    gqa = CostModel.for_model(8192, kv_fraction=0.125)
    assert gqa.g == pytest.approx(cost.g / 8)
    assert CostModel().b == 6 * 4096


@pytest.mark.parametrize("kwargs, match", [
    ({"a": -1.0}, "cost coefficient a=-1.0 must be >= 0"),
    ({"a": 0.0, "b": 0.0}, "both 0"),
    ({"g": float("nan")}, "cost coefficient g=nan"),
])
def test_cost_model_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CostModel(**kwargs)


def test_for_model_rejects_unknown_profile_and_override():
    with pytest.raises(ValueError, match="unknown hardware profile"):
        CostModel.for_model(1024, profile="tpu")
    with pytest.raises(ValueError, match="unknown cost overrides"):
        CostModel.for_model(1024, e=1.0)


@pytest.mark.parametrize("num_ranks", list(range(1, 33)) + [48, 96, 1024])
@pytest.mark.parametrize("cp_size", [1, 2, 3])
def test_layout_is_a_divisor_chain_of_aligned_blocks(num_ranks, cp_size):
    if num_ranks % cp_size:
        return
    layout = build_group_layout(num_ranks, 1, cp_size)
    assert layout.sizes[0] == 1 and layout.sizes[-1] == num_ranks
    assert cp_size in layout.sizes
    for smaller, larger in zip(layout.sizes, layout.sizes[1:]):
        assert larger % smaller == 0
    for group in layout.groups:
        assert list(group) == list(range(group[0], group[0] + len(group)))
        assert group[0] % len(group) == 0 and len(group) > 1
    assert len(layout.groups) == sum(num_ranks // size for size in layout.sizes if size > 1)
    assert layout.groups_per_rank() == len(layout.sizes) - 1
    for size in layout.sizes:
        for rank in range(num_ranks):
            assert rank in layout.group_of(size, rank)


def test_power_of_two_chain_and_min_size():
    assert build_group_layout(16).sizes == (1, 2, 4, 8, 16)
    assert build_group_layout(12).sizes == (1, 2, 4, 12)
    assert build_group_layout(12, cp_size=3).sizes == (1, 3, 6, 12)
    layout = build_group_layout(8, min_cp_size=3)
    assert layout.min_size == 4 and layout.sequence_sizes == (4, 8)
    layout = build_group_layout(12, min_cp_size=5, cp_size=2)
    assert layout.min_size in layout.sizes and layout.min_size >= 5


def test_layout_errors_name_the_flag():
    with pytest.raises(ValueError, match="--min-dynamic-context-parallel-size"):
        build_group_layout(8, min_cp_size=9)
    with pytest.raises(ValueError, match="--context-parallel-size"):
        build_group_layout(8, cp_size=3)


def test_static_layout():
    layout = build_static_layout(dp_size=3, cp_size=2)
    assert layout.sequence_sizes == (2,)
    assert layout.group_of(2, 5) == (4, 5)


def test_package_imports_without_torch():
    import subprocess
    import sys

    code = ("import sys; import megatron.varlen.scheduling, "
            "tools.scheduling.simulate; print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "False"
