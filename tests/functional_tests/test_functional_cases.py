"""Every functional case trains to its golden values (lm loss; an MoE case also its balancing
losses), and packed cases equal their unpacked twin."""

import pytest

from tests.functional_tests.cases import (
    LOSS_KEY, case_names, golden_data_sha256, load_case, read_golden_metrics, run_case,
    run_case_metrics, unpacked_twin_argv, with_data,
)


@pytest.mark.parametrize("name", case_names())
def test_case_matches_golden_values(name):
    case, data_sha256 = with_data(load_case(name))
    golden = read_golden_metrics(case)
    metrics = run_case_metrics(case.argv, case.nproc, case.entry_point)
    assert sorted(metrics) == sorted(golden), f"{name}: metrics {sorted(metrics)}"
    # Goldens hold for the data they were recorded on (a corpus made from this Python's
    # standard library differs on another version); the twin check below needs none.
    for metric, values in golden.items():
        got_values = metrics[metric]
        assert len(got_values) == len(values), f"{name}: {len(got_values)} {metric} values"
        if data_sha256 != golden_data_sha256(case):
            continue
        for step, (got, want) in enumerate(zip(got_values, values), start=1):
            assert abs(got - want) <= case.tolerance * abs(want), (
                f"{name} iteration {step}: {metric} {got!r} vs golden {want!r}")
    losses = metrics[LOSS_KEY]
    if case.unpacked_twin:
        twin = run_case(unpacked_twin_argv(case), case.nproc, case.entry_point)
        for step, (got, want) in enumerate(zip(losses, twin), start=1):
            assert abs(got - want) <= case.tolerance * abs(want), (
                f"{name} iteration {step}: packed {got!r} vs unpacked twin {want!r}")
    if data_sha256 != golden_data_sha256(case):
        pytest.skip(f"{name}: goldens recorded on other data (sha256 "
                    f"{golden_data_sha256(case)}, here {data_sha256}); the twin check ran")
