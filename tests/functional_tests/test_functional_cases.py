"""Every functional case trains to its golden lm loss (and packed cases equal their twin)."""

import pytest

from tests.functional_tests.cases import (
    case_names, load_case, read_golden, run_case, unpacked_twin_argv,
)


@pytest.mark.parametrize("name", case_names())
def test_case_matches_golden_values(name):
    case = load_case(name)
    golden = read_golden(case)
    losses = run_case(case.argv, case.nproc, case.entry_point)
    assert len(losses) == len(golden), f"{name}: {len(losses)} iterations, golden {len(golden)}"
    for step, (got, want) in enumerate(zip(losses, golden), start=1):
        assert abs(got - want) <= case.tolerance * abs(want), (
            f"{name} iteration {step}: lm loss {got!r} vs golden {want!r}")
    if case.unpacked_twin:
        twin = run_case(unpacked_twin_argv(case), case.nproc, case.entry_point)
        for step, (got, want) in enumerate(zip(losses, twin), start=1):
            assert abs(got - want) <= case.tolerance * abs(want), (
                f"{name} iteration {step}: packed {got!r} vs unpacked twin {want!r}")
