"""Bad flags and bad data are one line (exit code 2), never a traceback wall, a ZeroDivisionError,
or a failure found only after training. The subprocess runs start together, each test
checking its own (tests/unit_tests/background_runs.py)."""

import functools
import sys
from pathlib import Path

import pytest

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.errors import UserInputError, agree_on_errors
from megatron.varlen_training.tokenizer import build_tokenizer
from tests.harness.training_runs import TINY_GPT_ARGS
from tests.unit_tests.background_runs import BackgroundRuns, started_together

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("extra, needle", [
    (["--tensor-model-parallel-size", "0"], "--tensor-model-parallel-size must be >= 1 (got 0)"),
    (["--micro-batch-size", "0"], "--micro-batch-size must be >= 1 (got 0)"),
    (["--log-interval", "0"], "--log-interval must be >= 1 (got 0)"),
    (["--eval-interval", "0"], "--eval-interval must be >= 1 (got 0)"),
    (["--num-layers", "0"], "--num-layers must be >= 1 (got 0)"),
    (["--train-iters", "0"], "--train-iters must be >= 1 (got 0)"),
    (["--context-parallel-size", "-1"], "--context-parallel-size must be >= 1 (got -1)"),
])
def test_non_positive_sizes_are_one_line(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(TINY_GPT_ARGS + ["--train-iters", "3"] + extra, world_size=1)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_unwritable_save_is_refused_at_start_up(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")  # a path below a file cannot be created, even by root
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(TINY_GPT_ARGS + ["--train-iters", "3", "--save", str(blocker / "ckpt")],
                   world_size=1)
    assert f"--save directory '{blocker / 'ckpt'}' is not writable" in str(err.value)


def _sft_args(path):
    run = parse_run_config(["--num-layers", "1", "--hidden-size", "16",
                            "--num-attention-heads", "2", "--seq-length", "32", "--lr", "1e-3",
                            "--train-iters", "2", "--eval-iters", "0", "--sft", "--data-path",
                            str(path), "--tokenizer-type", "ByteLevelTokenizer"], world_size=1)
    # train_samples / eval_samples: derived during validation (run_description.py)
    return run


GOOD = b'{"prompt": "hi", "response": "there"}\n'
DEEP = 100_000  # json recursed until RecursionError, a traceback on every rank


@pytest.mark.parametrize("content, needle", [
    (GOOD + b'{"prompt": oops\n', "bad.jsonl:2: invalid JSON"),
    (b"\n\n", "has no samples"),
    (GOOD + GOOD + b'{"prompt": "caf\xe9", "response": "x"}\n',
     "bad.jsonl:3: not valid UTF-8 (byte 0xe9"),
    (None, "is a directory"),
    (GOOD + b'{"prompt": ' + b"[" * DEEP + b"]" * DEEP + b', "response": "x"}\n',
     "bad.jsonl:2: JSON nested too deeply to read"),
    # json raises a plain ValueError (not JSONDecodeError) for an integer over Python's limit
    (GOOD + b'{"prompt": ' + b"7" * 5000 + b', "response": "x"}\n',
     "bad.jsonl:2: invalid JSON: Exceeds the limit (4300 digits)"),
])
def test_bad_sft_data_is_one_line(tmp_path, content, needle):
    path = tmp_path / "bad.jsonl"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    run = _sft_args(path)
    tokenizer = build_tokenizer(run.data.tokenizer_type)
    with pytest.raises(UserInputError) as err:
        agree_on_errors(build_datasets, run, tokenizer)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node",
            "2"]
RUN_ENV = {"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
RUN_LIMIT_S = 120
RANKS = {"0": 1, "1": 0}  # RANK: error lines it prints (rank 0 only)
FLAG_ERROR_CODE = ("from megatron.varlen_training.arguments import parse_args_or_exit; "
                   "parse_args_or_exit(['--num-layers', '0'])")


def _metrics_dir_argv(folder: Path) -> list[str]:
    """pretrain_gpt.py with --log-metrics-jsonl naming a directory (``folder``)."""
    return ["pretrain_gpt.py", *TINY_GPT_ARGS, "--train-iters", "2",
            "--log-metrics-jsonl", str(folder)]


def _start_data_error(runs: BackgroundRuns) -> None:
    path = runs.root / "bad.jsonl"
    path.write_bytes(GOOD + b'{"prompt": oops\n')
    runs.start("data_error", [
        *TORCHRUN, "pretrain_gpt.py", "--num-layers", "1", "--hidden-size", "16",
        "--num-attention-heads", "2", "--seq-length", "32", "--lr", "1e-3", "--train-iters",
        "2", "--eval-iters", "0", "--sft", "--data-path", str(path),
        "--tokenizer-type", "ByteLevelTokenizer"], cwd=REPO, env=RUN_ENV, timeout_s=RUN_LIMIT_S)


def _start_metrics_dir(runs: BackgroundRuns) -> None:
    runs.start("metrics_dir", [*TORCHRUN, *_metrics_dir_argv(runs.root / "metrics_dir")],
               cwd=REPO, env=RUN_ENV, timeout_s=RUN_LIMIT_S)


def _start_flag_error(runs: BackgroundRuns, rank: str) -> None:
    runs.start(f"flag_error_rank{rank}", [sys.executable, "-c", FLAG_ERROR_CODE], cwd=REPO,
               env={"PATH": "/usr/bin:/bin", "RANK": rank, "WORLD_SIZE": "2"},
               timeout_s=RUN_LIMIT_S)


def _start_metrics_dir_as(runs: BackgroundRuns, rank: str) -> None:
    runs.start(f"metrics_dir_rank{rank}", [
        sys.executable, *_metrics_dir_argv(runs.root / f"metrics_dir_rank{rank}")],
        cwd=REPO, env={**RUN_ENV, "RANK": rank, "WORLD_SIZE": "2"}, timeout_s=RUN_LIMIT_S)


def _cases() -> dict:
    """The module's subprocess runs, each a case of its own name: the data error and the
    metrics directory under torchrun, the flag error and the metrics directory as each of 2
    ranks."""
    cases = {"data_error": _start_data_error, "metrics_dir": _start_metrics_dir}
    for rank in RANKS:
        cases[f"flag_error_rank{rank}"] = functools.partial(_start_flag_error, rank=rank)
        cases[f"metrics_dir_rank{rank}"] = functools.partial(_start_metrics_dir_as, rank=rank)
    return cases


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every subprocess run of the module, started together
    (tests/unit_tests/background_runs.py)."""
    with started_together(tmp_path_factory.mktemp("runs"), _cases()) as runs:
        yield runs


def test_data_error_under_torchrun_prints_once_and_every_rank_exits_2(launched):
    proc = launched["data_error"].result()
    path = launched.root / "bad.jsonl"
    ours = [line for line in proc.stderr.splitlines() if line.startswith("pretrain_gpt.py: error")]
    assert ours == [f"pretrain_gpt.py: error: {path}:2: invalid JSON: Expecting value "
                    "(column 12)"], proc.stderr
    # torchrun's own failure summary lists each rank's exit code (2 = our usage error).
    assert proc.returncode != 0 and proc.stderr.count("exitcode  : 2") + \
        proc.stderr.count("exitcode: 2") >= 2, proc.stderr
    # No frame of ours (torchrun itself ends with its own ChildFailedError summary).
    assert 'pretrain_gpt.py", line' not in proc.stderr and "megatron/" not in proc.stderr


@pytest.mark.parametrize("rank, printed", RANKS.items())
def test_flag_error_is_printed_by_rank_0_only(launched, rank, printed):
    """Under torchrun every rank parses the same flags: one line in all, exit 2 on each."""
    proc = launched[f"flag_error_rank{rank}"].result()
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == printed, proc.stderr


def test_metrics_path_naming_a_directory_is_one_line_under_torchrun(launched):
    """--log-metrics-jsonl naming a directory failed on the last rank only, when it
    opened the file after the first step (a traceback, and the other rank blamed "a lost
    peer"). Now it is refused while parsing: one line, exit code 2."""
    folder = launched.root / "metrics_dir"
    proc = launched["metrics_dir"].result()
    ours = [line for line in proc.stderr.splitlines() if line.startswith("pretrain_gpt.py: error")]
    assert ours == [f"pretrain_gpt.py: error: --log-metrics-jsonl {str(folder)!r} is a "
                    "directory; name a file in it"], proc.stderr
    assert "exitcode  : 2" in proc.stderr or "exitcode: 2" in proc.stderr, proc.stderr
    assert "lost a peer" not in proc.stderr and "megatron/" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("rank, printed", RANKS.items())
def test_metrics_path_is_checked_on_every_rank(launched, rank, printed):
    """Not only the rank that writes the file: each rank exits 2 before any collective."""
    proc = launched[f"metrics_dir_rank{rank}"].result()
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == printed, proc.stderr
