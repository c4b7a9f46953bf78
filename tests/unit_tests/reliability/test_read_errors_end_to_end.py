"""pretrain_gpt.py on 2 ranks: a Parquet row that fails when it is read, lazily, by one rank at
the second iteration, ends both ranks with exit code 2 and the row's line printed once, no
traceback (read_agreement.py). Started without torchrun's agent (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT per process, as under srun) with a row the chat template refuses; under torchrun
with a row the tokenizer refuses (NullTokenizer: text that is not ids below --vocab-size).

Before, the reading rank printed a traceback wall and exited 1; its peer ended with "lost a peer
rank" (exit 1) when gloo saw the closed socket, or waited for --distributed-timeout-minutes where
the dead peer's connection is not seen closed.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run_without_agent(argv: list[str]) -> list[subprocess.CompletedProcess]:
    port = _free_port()
    procs = []
    for rank in range(WORLD):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore",
               "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "HF_DATASETS_OFFLINE": "1"}
        procs.append(subprocess.Popen([sys.executable, "pretrain_gpt.py", *argv], cwd=REPO,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    try:
        outputs = [proc.communicate(timeout=RUN_DEADLINE_S) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()  # a rank still waiting for its peer (the failure this test catches)
            proc.wait()
    return [subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
            for proc, (out, err) in zip(procs, outputs)]


@pytest.mark.parametrize("packing", [[], ["--sequence-packing"]], ids=["unpacked", "packed"])
def test_a_row_refused_mid_run_ends_both_ranks_in_one_line(tmp_path, packing):
    tokenizer = _refusing_tokenizer(tmp_path / "tokenizer")
    data = tmp_path / "chats.parquet"
    bad_row = _chats(data, {"prompt": "what is {i} plus one", "response": "it is {i}"},
                     {"prompt": f"say {REFUSED}", "response": "no"})
    ranks = _run_without_agent([*MODEL_ARGS, "--sft", "--data-path", str(data),
                                "--tokenizer-type", "HuggingFaceTokenizer",
                                "--tokenizer-model", tokenizer,
                                "--distributed-timeout-minutes", PEER_TIMEOUT_MINUTES, *packing])
    stderrs = [rank.stderr for rank in ranks]
    assert [rank.returncode for rank in ranks] == [2] * WORLD, stderrs
    line = (f"pretrain_gpt.py: error: {data} row {bad_row}: the tokenizer's chat template "
            f"refuses this conversation (content {REFUSED} is not allowed); fix the "
            f"conversation or the template (--tokenizer-model)")
    assert [stderr.splitlines() for stderr in stderrs] == [[], [line]], stderrs
    assert "iteration        1/       3" in ranks[1].stdout  # mid-run: the first step trained
    assert "iteration        2/" not in "".join(rank.stdout for rank in ranks)


def test_a_row_the_tokenizer_refuses_under_torchrun_is_one_line(tmp_path):
    """Packed with dynamic CP; torchrun's agent stops the other rank once one exits and adds
    its own failure summary (its exit code is 1), as for a bad flag."""
    data = tmp_path / "ids.parquet"
    bad_row = _chats(data, {"prompt": "1 2 {i}", "response": "4 5 6"},
                     {"prompt": "1 2 3", "response": f"4 {NULL_VOCAB}"})
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
         "--master-port", str(_free_port()), "pretrain_gpt.py", *MODEL_ARGS, "--sft",
         "--data-path", str(data), "--tokenizer-type", "NullTokenizer", "--vocab-size",
         str(NULL_VOCAB), "--sequence-packing", "--dynamic-context-parallel",
         "--max-seqlen-per-dp-cp-rank", "32", "--distributed-timeout-minutes",
         PEER_TIMEOUT_MINUTES],
        cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                       "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
                       "CUDA_VISIBLE_DEVICES": "", "HF_DATASETS_OFFLINE": "1"},
        capture_output=True, text=True, timeout=RUN_DEADLINE_S)
    line = (f"pretrain_gpt.py: error: {data} row {bad_row}: NullTokenizer: '{NULL_VOCAB}' is "
            f"not an id in [0, {NULL_VOCAB}) (--vocab-size)")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert output.count(line) == 1, output[-3000:]
    assert "failed (exitcode: 2)" in proc.stderr, proc.stderr[-3000:]
    assert "]: Traceback" not in output  # no rank's traceback ([rank1]: Traceback ...)
    assert "iteration        1/       3" in output and "iteration        2/" not in output
