"""A megatron-wrap-style script WITHOUT `if __name__ == "__main__":` saves
under torchrun (2 CPU ranks) instead of hanging in megatron-core's checkpoint writer, whose
'spawn' helper process would re-run the script. Like megatron-wrap's example it captures print
and never calls close()."""

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[3]
SAVE_LIMIT_S = 30  # the bound for save() (start-up on a busy 2-core machine is extra)
RUN_LIMIT_S = 150  # the whole torchrun, start-up of 2 interpreters included
KILL_WAIT_S = 30

SCRIPT = textwrap.dedent("""\
    import sys, time
    from megatron.wrap import MegatronWrap, logger

    wrap = MegatronWrap("megatron/wrap/configs/sft_tiny_cpu.yaml", overrides=[
        "training.train_iters=4", "training.global_batch_size=2", "logging.progress_bar=false",
        "logging.capture_print=true", "checkpoint.save=" + sys.argv[1]])
    wrap.initialize()
    wrap.setup_model_and_optimizer()
    wrap.train([{"input_ids": [1, 2, 3, 4, 5]}, {"input_ids": [6, 7, 8]}])
    wrap.log_last_metrics()
    start = time.perf_counter()
    folder = wrap.save()
    logger.info_rank_0("SAVED", folder, "in", round(time.perf_counter() - start, 2), "s")
""")


def test_script_without_main_guard_saves_under_torchrun(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1"}
    # --standalone: torchrun binds its store on a port of the OS's choosing and holds it (a port
    # picked first and bound later can be taken in between, by a neighbouring test)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               "2", str(script), str(tmp_path / "ckpt")]
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        output, _ = proc.communicate(timeout=KILL_WAIT_S)
        raise AssertionError(f"torchrun hung for {RUN_LIMIT_S} s; tail:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-3000:]
    line = next(line for line in output.splitlines() if "SAVED" in line)
    seconds = float(line.split(" in | ")[1].split(" | s")[0])
    assert seconds < SAVE_LIMIT_S, line
    assert (tmp_path / "ckpt" / "iter_0000001").is_dir()
    # like megatron-wrap's example the script never calls close(): print is restored at exit,
    # not torn down with the interpreter
    assert "Exception ignored" not in output, output[-3000:]
    print(f"torchrun total {time.perf_counter() - started:.1f} s; {line}")


def _kill_tree(pid: int) -> None:
    """Kills torchrun, its workers (each in its own session) and what they started (a hung
    run's 'spawn' helper): all descendants, collected before any of them dies."""
    import psutil  # a dependency of this package (megatron-core's checkpoint writer needs it)

    root = psutil.Process(pid)
    victims = [*root.children(recursive=True), root]
    for process in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(victims, timeout=KILL_WAIT_S)
