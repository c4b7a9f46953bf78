"""Every functional case trains to its golden lm loss (and packed cases equal their twin)."""

import pytest

from tests.functional_tests.cases import (
    case_names, golden_data_sha256, load_case, read_golden, run_case, unpacked_twin_argv,
    with_data,
)


@pytest.mark.parametrize("name", case_names())
def test_case_matches_golden_values(name):
    case, data_sha256 = with_data(load_case(name))
    golden = read_golden(case)
    losses = run_case(case.argv, case.nproc, case.entry_point)
    assert len(losses) == len(golden), f"{name}: {len(losses)} iterations, golden {len(golden)}"
    # Goldens hold for the data they were recorded on (a corpus made from this Python's
    # standard library differs on another version); the twin check below needs none.
    if data_sha256 == golden_data_sha256(case):
        for step, (got, want) in enumerate(zip(losses, golden), start=1):
            assert abs(got - want) <= case.tolerance * abs(want), (
                f"{name} iteration {step}: lm loss {got!r} vs golden {want!r}")
    if case.unpacked_twin:
        twin = run_case(unpacked_twin_argv(case), case.nproc, case.entry_point)
        for step, (got, want) in enumerate(zip(losses, twin), start=1):
            assert abs(got - want) <= case.tolerance * abs(want), (
                f"{name} iteration {step}: packed {got!r} vs unpacked twin {want!r}")
    if data_sha256 != golden_data_sha256(case):
        pytest.skip(f"{name}: goldens recorded on other data (sha256 "
                    f"{golden_data_sha256(case)}, here {data_sha256}); the twin check ran")
