"""Re-record golden values: run each named case (default: all) and write golden_values.json."""

import sys

from tests.functional_tests.cases import case_names, load_case, run_case_metrics, write_golden


def main(names: list[str]) -> None:
    for name in names or case_names():
        case = load_case(name)
        metrics = run_case_metrics(case.argv, case.nproc, case.entry_point)
        write_golden(case, metrics)
        print(f"{name}: {metrics}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
