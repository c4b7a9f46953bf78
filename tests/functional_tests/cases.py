"""Load functional test cases (model_config.yaml + golden_values.json) and run them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from megatron.training.testing import loss_owner_history, train_on_this_rank
from megatron.varlen.testing.multirank import run_distributed

CASES_DIR = Path(__file__).parent / "test_cases" / "gpt"
GOLDEN_FILE = "golden_values.json"
LOSS_KEY = "lm loss"
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Case:
    name: str
    nproc: int
    tolerance: float
    argv: tuple[str, ...]
    unpacked_twin: bool

    @property
    def golden_path(self) -> Path:
        return CASES_DIR / self.name / GOLDEN_FILE


def _to_argv(model_args: dict) -> list[str]:
    argv = []
    for flag, value in model_args.items():
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv


def load_case(name: str) -> Case:
    config = yaml.safe_load((CASES_DIR / name / "model_config.yaml").read_text())
    return Case(name=name, nproc=int(config["NPROC"]), tolerance=float(config["TOLERANCE"]),
                argv=tuple(_to_argv(config["MODEL_ARGS"])),
                unpacked_twin=bool(config.get("UNPACKED_TWIN", False)))


def case_names() -> list[str]:
    return sorted(p.name for p in CASES_DIR.iterdir() if (p / "model_config.yaml").exists())


def run_case(argv, nproc: int) -> list[float]:
    results = run_distributed(train_on_this_rank, nproc, args=(list(argv),),
                              timeout_s=RUN_TIMEOUT_S)
    return [h["lm_loss"] for h in loss_owner_history(results)]


def unpacked_twin_argv(case: Case) -> list[str]:
    """The same run without packing: every sample padded to --seq-length, 2 per micro-batch."""
    argv = [a for a in case.argv if a != "--sequence-packing"]
    index = argv.index("--micro-batch-size")
    argv[index + 1] = "2"
    return argv + ["--calculate-per-token-loss"]


def read_golden(case: Case) -> list[float]:
    values = json.loads(case.golden_path.read_text())[LOSS_KEY]["values"]
    return [values[str(step)] for step in sorted(map(int, values))]


def write_golden(case: Case, losses: list[float]) -> None:
    record = {LOSS_KEY: {"start_step": 1, "end_step": len(losses), "step_interval": 1,
                         "values": {str(i + 1): loss for i, loss in enumerate(losses)}}}
    case.golden_path.write_text(json.dumps(record, indent=2) + "\n")
