"""Re-record golden values: run each named case (default: all) and write golden_values.json."""

import sys

from tests.functional_tests.cases import (
    case_names, load_case, run_case_metrics, with_data, write_golden,
)


def main(names: list[str]) -> None:
    for name in names or case_names():
        case, data_sha256 = with_data(load_case(name))
        metrics = run_case_metrics(case.argv, case.nproc, case.entry_point)
        write_golden(case, metrics, data_sha256)
        print(f"{name}: {metrics}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
