"""A facade script's uncaught user error is one line, printed once, exit code 2 (as the entry
points report theirs), and ``save()`` after ``save_interval``'s own save of the same iteration
writes nothing twice.

- one process: a bad config key (ConfigError) -> ``<script>: error: ...``, exit 2, no
  traceback; a bug in the script (ZeroDivisionError) keeps its traceback and exit code 1;
- torchrun, 2 CPU ranks: a bad sample in ``train()`` (an id outside the vocabulary, a field
  the flow does not read) -> one error line over both ranks, each rank exits 2; a resume with
  another ``--sft-prompt-key`` -> the resume check's one line, exit 2;
- ``save_interval: 2``, two steps, then ``save()``: megatron-core's save runs once; after an
  ``evaluate()`` a ``save()`` of the same iteration writes again (its validation position).

The scripts start together, each test checking its own (tests/unit_tests/background_runs.py).
"""

import json
import functools
import os
import sys
import textwrap
from pathlib import Path

import pytest

from megatron.varlen_training import checkpoint
from megatron.varlen_training.resume.run_args_keys import RUN_ARGS_FILENAME, VALID_POSITION_KEY
from megatron.wrap import MegatronWrap
from tests.harness.multirank import run_distributed
from tests.unit_tests.background_runs import BackgroundRuns, started_together

REPO = Path(__file__).resolve().parents[3]
RUN_LIMIT_S = 180
TORCHRUN_FAILED = ("exitcode  : 2", "exitcode: 2")  # torchrun's summary of a rank's exit code
CONFIG = textwrap.dedent("""\
    {"model": {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
               "seq_length": 32, "vocab_size": 64, "make_vocab_size_divisible_by": 32},
     "training": {"micro_batch_size": 1, "global_batch_size": 2, "train_iters": 4,
                  "lr": 1e-3, "seed": 3, "eval_iters": 0},
     "data": {"tokenizer_type": "NullTokenizer"},
     "logging": {"metric_writers": [], "progress_bar": False}}
""")
SCRIPTS = {
    "bad_key.py": """
        from megatron.wrap import MegatronWrap
        MegatronWrap({**CONFIG, "training": {**CONFIG["training"], "train_itres": 3}})
    """,
    "bug.py": """
        from megatron.wrap import MegatronWrap
        wrap = MegatronWrap(CONFIG)
        1 / 0
    """,
    "bad_sample.py": """
        from megatron.wrap import MegatronWrap
        wrap = MegatronWrap(CONFIG).initialize().setup_model_and_optimizer()
        wrap.train([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 99, 5]}])
    """,
    "unread_field.py": """
        from megatron.wrap import MegatronWrap
        wrap = MegatronWrap({**CONFIG, "flow": {"ignored_fields": ["id"]}})
        wrap.initialize().setup_model_and_optimizer()
        wrap.train([{"input_ids": [1, 2, 3], "id": "a"}, {"input_ids": [4, 9, 5], "id": "b"}])
        print("trained with ignored metadata", flush=True)
        wrap.train([{"input_ids": [1, 2, 3], "id": "a"},
                    {"input_ids": [4, 9, 5], "advantages": [1.0, 1.0]}])
    """,
    "other_key.py": """
        import sys
        import torch.distributed as dist
        from megatron.wrap import MegatronWrap
        dist.init_process_group("gloo")  # the script's group: both facades use it
        config = {**CONFIG, "checkpoint": {"save": sys.argv[1]}}
        with MegatronWrap(config) as wrap:
            wrap.initialize().setup_model_and_optimizer()
            wrap.train([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 9, 5]}])
            wrap.save()
        renamed = {**config, "data": {**CONFIG["data"], "sft_prompt_key": "question"}}
        MegatronWrap(renamed).initialize().setup_model_and_optimizer().load()
    """,
}


# Ranks per script: None runs it as `python script.py`, a number under torchrun.
LAUNCHES = {"bad_key.py": None, "bug.py": None, "bad_sample.py": 2, "unread_field.py": 2,
            "other_key.py": 2}
SCRIPT_ARGS = {"other_key.py": ["{folder}/ckpt"]}  # {folder}: the script's own folder


def _start(runs: BackgroundRuns, name: str) -> None:
    folder = runs.root / name
    folder.mkdir()
    script = folder / name
    script.write_text(f"CONFIG = {CONFIG}\n" + textwrap.dedent(SCRIPTS[name]))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    ranks = LAUNCHES[name]
    launcher = [sys.executable] if ranks is None else [
        # --standalone: torchrun holds a rendezvous port of the OS's choosing (no port race)
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
        str(ranks)]
    args = [arg.format(folder=folder) for arg in SCRIPT_ARGS.get(name, ())]
    runs.start(name, [*launcher, str(script), *args], env=env, timeout_s=RUN_LIMIT_S)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """Every script of the module, started together (tests/unit_tests/background_runs.py)."""
    cases = {name: functools.partial(_start, name=name) for name in LAUNCHES}
    with started_together(tmp_path_factory.mktemp("scripts"), cases) as runs:
        yield runs


def _error_lines(proc, name: str) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith(f"{name}: error: ")]


def test_config_error_is_one_line_and_exit_2(scripts):
    proc = scripts["bad_key.py"].result()
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("bad_key.py: error: "), proc.stderr
    assert "train_itres" in lines[0] and "train_iters" in lines[0], lines[0]


def test_a_bug_keeps_its_traceback(scripts):
    proc = scripts["bug.py"].result()
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert not _error_lines(proc, "bug.py")


def _assert_one_line_on_two_ranks(proc, name: str) -> str:
    lines = _error_lines(proc, name)
    assert len(lines) == 1, proc.stderr[-3000:]
    assert sum(proc.stderr.count(text) for text in TORCHRUN_FAILED) >= 2, proc.stderr[-3000:]
    # no frame of the script or the library (torchrun ends with its own summary)
    assert f'{name}", line' not in proc.stderr and "megatron/" not in proc.stderr
    return lines[0]


def test_bad_sample_under_torchrun_is_one_line_exit_2(scripts):
    proc = scripts["bad_sample.py"].result()
    line = _assert_one_line_on_two_ranks(proc, "bad_sample.py")
    assert line == ("bad_sample.py: error: sample 1, field 'input_ids': id 99 at position 1 "
                    "is outside [0, 64) (the vocabulary size, config key 'vocab_size')"), line


def test_unread_sample_field_under_torchrun_is_one_line_exit_2(scripts):
    """A key the flow does not read is refused, not dropped; flow.ignored_fields's metadata
    trains (docs/WRAP.md section 3)."""
    proc = scripts["unread_field.py"].result()
    line = _assert_one_line_on_two_ranks(proc, "unread_field.py")
    assert line == ("unread_field.py: error: sample 1, field 'advantages': flow 'gpt_sft' does "
                    "not read it (it reads input_ids, context_token_length from a sample of this "
                    "form); declare a field in the flow's fields_and_seq_dims() to have it packed "
                    "for the loss, list it in config key 'flow.ignored_fields' if it is metadata "
                    "not to train on, or drop it from the sample"), line
    assert proc.stdout.count("trained with ignored metadata") == 2, proc.stdout[-2000:]


def test_resume_with_another_sft_key_is_one_line_exit_2(scripts):
    proc = scripts["other_key.py"].result()
    line = _assert_one_line_on_two_ranks(proc, "other_key.py")
    assert line == ("other_key.py: error: --load: the checkpoint was trained with "
                    "--sft-prompt-key prompt, this run has question: that would change the "
                    "fields read from the SFT records; use the checkpoint's value"), line


# --- save_interval and save() at the same iteration ------------------------------------------

def rank_save_twice(save_dir: str) -> dict:
    calls = []
    real = checkpoint.save_checkpoint

    def counting(root, iteration, *args, **kwargs):
        calls.append(iteration)
        return real(root, iteration, *args, **kwargs)

    checkpoint.save_checkpoint = counting
    config = {"model": {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
                        "seq_length": 32, "vocab_size": 64},
              "training": {"global_batch_size": 2, "train_iters": 4, "lr": 1e-3,
                           "eval_iters": 0},
              "data": {"tokenizer_type": "NullTokenizer"},
              "checkpoint": {"save": save_dir, "save_interval": 2},
              "logging": {"metric_writers": [], "progress_bar": False}}
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        for _ in range(2):
            wrap.train([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 9, 5, 6]}])
        folder = wrap.save()  # iteration 2: save_interval's save after train() wrote it
        after_interval = list(calls)
        elsewhere = wrap.save(os.path.join(save_dir, "copy"))  # another root: written
        wrap.train([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 9, 5, 6]}])
        third = wrap.save()
        wrap.evaluate([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 9, 5]}])
        wrap.save()  # the evaluation's validation samples change the checkpoint: written
    with open(os.path.join(third, RUN_ARGS_FILENAME), encoding="utf-8") as handle:
        valid = json.load(handle)[VALID_POSITION_KEY]
    return {"after_interval": after_interval, "calls": calls, "folders": [folder, elsewhere,
                                                                          third], "valid": valid}


def test_save_after_the_interval_save_writes_once(tmp_path):
    result = run_distributed(rank_save_twice, 1, args=(str(tmp_path),), timeout_s=180)[0]
    assert result["after_interval"] == [2]
    assert result["calls"] == [2, 2, 3, 3]
    assert result["valid"] == 2  # the samples evaluate() read after the first save of iter 3
    assert result["folders"] == [str(tmp_path / "iter_0000002"),
                                 str(tmp_path / "copy" / "iter_0000002"),
                                 str(tmp_path / "iter_0000003")]
