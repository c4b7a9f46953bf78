"""Load functional test cases (model_config.yaml + golden_values.json) and run them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.functional_tests import corpora
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import (
    loss_owner_history, train_hybrid_on_this_rank, train_on_this_rank,
)

CASES_ROOT = Path(__file__).parent / "test_cases"  # one folder per model family (gpt, hybrid)
ENTRY_POINTS = {"pretrain_gpt.py": train_on_this_rank,
                "pretrain_mamba.py": train_hybrid_on_this_rank}
# Flags (and how many values follow) that only a packed run has: dropped for the unpacked twin.
PACKING_ONLY_FLAGS = {"--sequence-packing": 0, "--dynamic-context-parallel": 0,
                      "--max-seqlen-per-dp-cp-rank": 1}
DATA_SHA256_KEY = "data_sha256"  # golden_values.json: the corpus the goldens were recorded on
GOLDEN_FILE = "golden_values.json"
LOSS_KEY = "lm loss"
# Golden metric name (Megatron-LM's) -> the key in a run's history.
METRIC_KEYS = {LOSS_KEY: "lm_loss", "load_balancing_loss": "load_balancing_loss",
               "seq_load_balancing_loss": "seq_load_balancing_loss",
               "global_load_balancing_loss": "global_load_balancing_loss", "z_loss": "z_loss"}
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Case:
    name: str
    nproc: int
    tolerance: float
    argv: tuple[str, ...]
    unpacked_twin: bool
    entry_point: str = "pretrain_gpt.py"
    data: str | None = None  # a corpus of corpora.py, its prefix replacing "{DATA}" in argv

    @property
    def golden_path(self) -> Path:
        return _case_dir(self.name) / GOLDEN_FILE


def _to_argv(model_args: dict) -> list[str]:
    argv = []
    for flag, value in model_args.items():
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv


def _case_dir(name: str) -> Path:
    (folder,) = [p for p in CASES_ROOT.glob(f"*/{name}") if (p / "model_config.yaml").exists()]
    return folder


def load_case(name: str) -> Case:
    config = yaml.safe_load((_case_dir(name) / "model_config.yaml").read_text())
    entry_point = config.get("ENTRY_POINT", "pretrain_gpt.py")
    assert entry_point in ENTRY_POINTS, f"{name}: unknown ENTRY_POINT {entry_point}"
    return Case(name=name, nproc=int(config["NPROC"]), tolerance=float(config["TOLERANCE"]),
                argv=tuple(_to_argv(config["MODEL_ARGS"])),
                unpacked_twin=bool(config.get("UNPACKED_TWIN", False)),
                entry_point=entry_point, data=config.get("DATA"))


def with_data(case: Case) -> tuple[Case, str | None]:
    """The case with its data built and ``{DATA}`` filled in, and the data's SHA-256 (None
    for cases without ``DATA``)."""
    if case.data is None:
        return case, None
    prefix, digest = corpora.CORPORA[case.data]()
    argv = tuple(arg.replace(corpora.PLACEHOLDER, prefix) for arg in case.argv)
    return dataclasses.replace(case, argv=argv), digest


def case_names() -> list[str]:
    return sorted(p.parent.name for p in CASES_ROOT.glob("*/*/model_config.yaml"))


def run_case_metrics(argv, nproc: int, entry_point: str = "pretrain_gpt.py"
                     ) -> dict[str, list[float]]:
    """Every golden metric the run reports, per iteration (lm loss; MoE balancing losses)."""
    results = run_distributed(ENTRY_POINTS[entry_point], nproc, args=(list(argv),),
                              timeout_s=RUN_TIMEOUT_S)
    history = loss_owner_history(results)
    return {name: [h[key] for h in history] for name, key in METRIC_KEYS.items()
            if history and history[0].get(key) is not None}


def run_case(argv, nproc: int, entry_point: str = "pretrain_gpt.py") -> list[float]:
    return run_case_metrics(argv, nproc, entry_point)[LOSS_KEY]


def unpacked_twin_argv(case: Case) -> list[str]:
    """The same run without packing: every sample padded to --seq-length, 2 per micro-batch."""
    argv, skip = [], 0
    for arg in case.argv:
        if skip:
            skip -= 1
        elif arg in PACKING_ONLY_FLAGS:
            skip = PACKING_ONLY_FLAGS[arg]
        else:
            argv.append(arg)
    index = argv.index("--micro-batch-size")
    argv[index + 1] = "2"
    return argv + ["--calculate-per-token-loss"]


def read_golden_metrics(case: Case) -> dict[str, list[float]]:
    """Every metric of the golden file, per iteration."""
    record = json.loads(case.golden_path.read_text())
    return {name: [entry["values"][str(step)] for step in sorted(map(int, entry["values"]))]
            for name, entry in record.items() if name != DATA_SHA256_KEY}


def read_golden(case: Case) -> list[float]:
    return read_golden_metrics(case)[LOSS_KEY]


def golden_data_sha256(case: Case) -> str | None:
    """The SHA-256 of the data the goldens were recorded on (None: no ``DATA``)."""
    return json.loads(case.golden_path.read_text()).get(DATA_SHA256_KEY)


def write_golden(case: Case, metrics: dict[str, list[float]] | list[float],
                 data_sha256: str | None = None) -> None:
    """``metrics``: metric name -> values per iteration (a list: the lm loss alone);
    ``data_sha256``: the ``DATA`` corpus's hash the values hold for."""
    if not isinstance(metrics, dict):
        metrics = {LOSS_KEY: metrics}
    record = {name: {"start_step": 1, "end_step": len(values), "step_interval": 1,
                     "values": {str(i + 1): value for i, value in enumerate(values)}}
              for name, values in metrics.items()}
    if data_sha256 is not None:
        record[DATA_SHA256_KEY] = data_sha256
    case.golden_path.write_text(json.dumps(record, indent=2) + "\n")
