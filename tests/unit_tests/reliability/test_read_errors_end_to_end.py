"""pretrain_gpt.py on 2 ranks: a Parquet row that fails when it is read, lazily, by one rank at
the second iteration, ends both ranks with exit code 2 and the row's line printed once, no
traceback (read_agreement.py). Started without torchrun's agent (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT per process, as under srun) with a row the chat template refuses; under torchrun
with a row the tokenizer refuses (NullTokenizer: text that is not ids below --vocab-size).

Before, the reading rank printed a traceback wall and exited 1; its peer ended with "lost a peer
rank" (exit 1) when gloo saw the closed socket, or waited for --distributed-timeout-minutes where
the dead peer's connection is not seen closed.

The three runs start together, each test checking its own (tests/unit_tests/background_runs.py).
"""

from __future__ import annotations

import contextlib
import functools
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from tests.unit_tests.background_runs import BackgroundRuns, kill_tree
from tests.unit_tests.varlen_training.hf.tiny_models import TOKENIZER_STYLES, save_tokenizer

REPO = Path(__file__).resolve().parents[3]
WORLD = 2
ROWS = 32
SEED = 7
# Train samples are a seeded permutation of the train rows ([seed, epoch], builder.EpochDataset);
# with a global batch of 4 and 2 DP ranks, position 7 is read by rank 1 at the second iteration
# on both paths (unpacked: micro-batches of 1 alternate ranks; packed: rank 1's block is 6, 7).
TRAIN_ROWS = 31  # the last 5% (one row) validate
BAD_POSITION = 7
REFUSED = "REFUSE"
NULL_VOCAB = 128  # NullTokenizer's --vocab-size: the id 128 is refused
PEER_TIMEOUT_MINUTES = "1"  # a rank left waiting would wait this long
RUN_DEADLINE_S = 150  # start-up of 2 ranks on a loaded 2-core machine, then 3 tiny steps
MODEL_ARGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
              "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
              "--train-iters", "3", "--lr", "1e-3", "--make-vocab-size-divisible-by", "32",
              "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "1",
              "--eval-iters", "0", "--seed", str(SEED)]


def _refusing_tokenizer(folder: Path) -> str:
    """A tiny HF tokenizer whose chat template raises on a message holding REFUSED (as
    Llama-2-style templates raise on roles that do not alternate)."""
    path = save_tokenizer(next(iter(TOKENIZER_STYLES)), str(folder))
    template = folder / "chat_template.jinja"
    refuse = (f"{{% for m in messages %}}{{% if '{REFUSED}' in m['content'] %}}"
              f"{{{{ raise_exception('content {REFUSED} is not allowed') }}}}{{% endif %}}"
              f"{{% endfor %}}")
    template.write_text(refuse + template.read_text())
    return path


def _chats(path: Path, good: dict, bad: dict) -> int:
    """Parquet rows ``good`` (``{i}`` formatted with the row) but the row read at BAD_POSITION,
    ``bad``; returns that row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad_row = int(np.random.default_rng([SEED, 0]).permutation(TRAIN_ROWS)[BAD_POSITION])
    rows = [{key: text.format(i=i) for key, text in good.items()} for i in range(ROWS)]
    rows[bad_row] = bad
    pq.write_table(pa.Table.from_pylist(rows), path)
    return bad_row


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free now (probed side by side: the runs start together)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


BASE_ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_DATASETS_OFFLINE": "1"}


def _start_without_agent(runs: BackgroundRuns, case: str, argv: list[str], port: int) -> None:
    """Ranks ``{case}-rank{r}``: plain processes meeting at MASTER_ADDR:MASTER_PORT."""
    for rank in range(WORLD):
        env = {**BASE_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        runs.start(f"{case}-rank{rank}", [sys.executable, "pretrain_gpt.py", *argv], cwd=REPO,
                   env=env, timeout_s=RUN_DEADLINE_S)


def _ranks(runs: BackgroundRuns, case: str) -> list[subprocess.CompletedProcess]:
    try:
        return [runs[f"{case}-rank{rank}"].result() for rank in range(WORLD)]
    finally:
        for rank in range(WORLD):  # a rank still waiting for its peer (what this test catches)
            kill_tree(runs[f"{case}-rank{rank}"].proc)


PACKINGS = {"unpacked": [], "packed": ["--sequence-packing"]}


def _start_refused_template_run(runs: BackgroundRuns, case: str,
                                next_port: Callable[[], int]) -> tuple[Path, int]:
    """The chat-template case with packing ``case`` (its own tokenizer and data files);
    returns the data path and the bad row."""
    folder = runs.root / f"{case}-files"
    tokenizer = _refusing_tokenizer(folder / "tokenizer")
    data = folder / "chats.parquet"
    bad_row = _chats(data, {"prompt": "what is {i} plus one", "response": "it is {i}"},
                     {"prompt": f"say {REFUSED}", "response": "no"})
    _start_without_agent(runs, case, [
        *MODEL_ARGS, "--sft", "--data-path", str(data), "--tokenizer-type",
        "HuggingFaceTokenizer", "--tokenizer-model", tokenizer,
        "--distributed-timeout-minutes", PEER_TIMEOUT_MINUTES, *PACKINGS[case]], next_port())
    return data, bad_row


def _start_torchrun(runs: BackgroundRuns, next_port: Callable[[], int]) -> tuple[Path, int]:
    data = runs.root / "ids.parquet"
    bad_row = _chats(data, {"prompt": "1 2 {i}", "response": "4 5 6"},
                     {"prompt": "1 2 3", "response": f"4 {NULL_VOCAB}"})
    runs.start("torchrun", [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
        "--master-port", str(next_port()), "pretrain_gpt.py", *MODEL_ARGS, "--sft",
        "--data-path", str(data), "--tokenizer-type", "NullTokenizer", "--vocab-size",
        str(NULL_VOCAB), "--sequence-packing", "--dynamic-context-parallel",
        "--max-seqlen-per-dp-cp-rank", "32", "--distributed-timeout-minutes",
        PEER_TIMEOUT_MINUTES], cwd=REPO, env=BASE_ENV, timeout_s=RUN_DEADLINE_S)
    return data, bad_row


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The module's three 2-rank runs, started together (tests/unit_tests/background_runs.py);
    ``launched.begin(case)`` gives the case's (data path, bad row)."""
    runs = BackgroundRuns(tmp_path_factory.mktemp("runs"))
    # Started together, the runs take ports probed side by side; one at a time, when it starts.
    together = iter(_free_ports(len(PACKINGS) + 1)) if runs.together else None
    next_port = functools.partial(next, together) if together else lambda: _free_ports(1)[0]
    try:
        for case in PACKINGS:
            runs.add(case, functools.partial(_start_refused_template_run, case=case,
                                             next_port=next_port))
        runs.add("torchrun", functools.partial(_start_torchrun, next_port=next_port))
        yield runs
    finally:
        runs.kill_all()


@pytest.mark.parametrize("case", list(PACKINGS))
def test_a_row_refused_mid_run_ends_both_ranks_in_one_line(launched, case):
    data, bad_row = launched.begin(case)
    ranks = _ranks(launched, case)
    stderrs = [rank.stderr for rank in ranks]
    assert [rank.returncode for rank in ranks] == [2] * WORLD, stderrs
    line = (f"pretrain_gpt.py: error: {data} row {bad_row}: the tokenizer's chat template "
            f"refuses this conversation (content {REFUSED} is not allowed); fix the "
            f"conversation or the template (--tokenizer-model)")
    assert [stderr.splitlines() for stderr in stderrs] == [[], [line]], stderrs
    assert "iteration        1/       3" in ranks[1].stdout  # mid-run: the first step trained
    assert "iteration        2/" not in "".join(rank.stdout for rank in ranks)


def test_a_row_the_tokenizer_refuses_under_torchrun_is_one_line(launched):
    """Packed with dynamic CP; torchrun's agent stops the other rank once one exits and adds
    its own failure summary (its exit code is 1), as for a bad flag."""
    data, bad_row = launched.begin("torchrun")
    proc = launched["torchrun"].result()
    line = (f"pretrain_gpt.py: error: {data} row {bad_row}: NullTokenizer: '{NULL_VOCAB}' is "
            f"not an id in [0, {NULL_VOCAB}) (--vocab-size)")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert output.count(line) == 1, output[-3000:]
    assert "failed (exitcode: 2)" in proc.stderr, proc.stderr[-3000:]
    assert "]: Traceback" not in output  # no rank's traceback ([rank1]: Traceback ...)
    assert "iteration        1/       3" in output and "iteration        2/" not in output
