"""Bad input given to the facade that used to escape as a plain ValueError/TypeError with a
traceback is one line through a script's real entry (the facade's ``sys.excepthook``):
``<script>: error: <message>`` printed once, exit code 2. A ValueError the user's own flow
raises is the user's bug and keeps its traceback.

- a token id beyond int64 (torch's bare "Overflow when unpacking long long");
- a config that is neither a path nor a mapping (pathlib's TypeError);
- ``save_pretrained()`` of a model Hugging Face has no form for (HFConfigError);
- ``save_pretrained()`` into a directory that cannot be created (rank 0's OSError, which left
  the other ranks at the exporter's barrier): one line on every rank, also on 2 ranks.

The scripts start together, each test checking its own (tests/unit_tests/background_runs.py).
"""

from __future__ import annotations

import functools
import os
import sys
import textwrap
from pathlib import Path

import pytest

from megatron.varlen_training.errors import UserInputError
from tests.harness.multirank import run_distributed
from tests.unit_tests.background_runs import BackgroundRuns, started_together

REPO = Path(__file__).resolve().parents[3]
RUN_LIMIT_S = 180
TWO_RANK_LIMIT_S = 120
MODEL = {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 32,
         "vocab_size": 64, "make_vocab_size_divisible_by": 32}
# What a Hugging Face (Llama) export needs of the model.
EXPORTABLE = {"normalization": "RMSNorm", "swiglu": True, "ffn_hidden_size": 32,
              "disable_bias_linear": True,
              "position_embedding_type": "rope", "untie_embeddings_and_output_weights": True}
CONFIG = {"model": MODEL,
          "training": {"micro_batch_size": 1, "global_batch_size": 2, "train_iters": 4,
                       "lr": 1e-3, "seed": 3, "eval_iters": 0},
          "data": {"tokenizer_type": "NullTokenizer"},
          "logging": {"metric_writers": [], "progress_bar": False}}
NOT_CREATABLE = "/proc/no_such_dir"  # /proc takes no new directories, even for root
SCRIPTS = {
    "huge_id.py": """
        wrap = MegatronWrap(CONFIG).initialize().setup_model_and_optimizer()
        wrap.train([{"input_ids": [1, 2**70]}, {"input_ids": [4, 9, 5]}])
    """,
    "config_int.py": """
        MegatronWrap(3)
    """,
    "layernorm_export.py": """
        wrap = MegatronWrap(CONFIG).initialize().setup_model_and_optimizer()
        wrap.save_pretrained(sys.argv[1])
    """,
    "unwritable_export.py": """
        config = {**CONFIG, "model": {**CONFIG["model"], **EXPORTABLE}}
        wrap = MegatronWrap(config).initialize().setup_model_and_optimizer()
        wrap.save_pretrained(NOT_CREATABLE)
    """,
    "flow_bug.py": """
        from megatron.wrap import register_flow
        from megatron.wrap.flows.gpt import GPTFlow

        @register_flow("picky")
        class PickyFlow(GPTFlow):
            def build_samples(self, batch):
                raise ValueError("my flow cannot read this batch")

        config = {**CONFIG, "flow": {"flow_name": "picky"}}
        MegatronWrap(config).initialize().setup_model_and_optimizer().train([{"x": 1}] * 2)
    """,
}
SCRIPT_ARGS = {"layernorm_export.py": ["{folder}/hf"]}  # {folder}: the script's own folder


def _start(runs: BackgroundRuns, name: str) -> None:
    """Starts script ``name`` in its own folder (``runs[name].folder``)."""
    folder = runs.root / name
    folder.mkdir()
    script = folder / name
    script.write_text(f"import sys\nfrom megatron.wrap import MegatronWrap\nCONFIG = {CONFIG}\n"
                      f"EXPORTABLE = {EXPORTABLE}\nNOT_CREATABLE = {NOT_CREATABLE!r}\n"
                      f"if __name__ == '__main__':\n"
                      + textwrap.indent(textwrap.dedent(SCRIPTS[name]), "    "))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    args = [arg.format(folder=folder) for arg in SCRIPT_ARGS.get(name, ())]
    runs.start(name, [sys.executable, str(script), *args], env=env, timeout_s=RUN_LIMIT_S)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """Every script of the module, started together (tests/unit_tests/background_runs.py)."""
    cases = {name: functools.partial(_start, name=name) for name in SCRIPTS}
    with started_together(tmp_path_factory.mktemp("scripts"), cases) as runs:
        yield runs


def _one_line(scripts: BackgroundRuns, name: str) -> str:
    """The only stderr line, after checking it is the error line and the exit code is 2."""
    proc = scripts[name].result()
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"{name}: error: "), lines[0]
    return lines[0].removeprefix(f"{name}: error: ")


def test_a_token_id_beyond_int64_is_one_line(scripts):
    assert _one_line(scripts, "huge_id.py") == (
        "sample 0, field 'input_ids': item 1 is 1180591620717411303424, outside the int64 "
        "range [-2**63, 2**63)")


def test_a_config_of_the_wrong_type_is_one_line(scripts):
    assert _one_line(scripts, "config_int.py") == (
        "a config is a YAML file path or a mapping of sections, got int 3")


def test_exporting_a_model_hugging_face_cannot_hold_is_one_line(scripts):
    out = str(scripts["layernorm_export.py"].folder / "hf")
    assert _one_line(scripts, "layernorm_export.py") == (
        f"save_pretrained({out!r}): export to Hugging Face needs --normalization RMSNorm (got "
        f"'LayerNorm'); only Llama/Qwen2/Qwen3/Mistral layers export")
    assert not os.path.exists(out)


def test_exporting_into_a_directory_that_cannot_be_made_is_one_line(scripts):
    line = _one_line(scripts, "unwritable_export.py")
    assert line == (f"cannot write the Hugging Face checkpoint to {NOT_CREATABLE!r}: [Errno 2] "
                    f"No such file or directory: {NOT_CREATABLE!r} (choose a writable "
                    f"directory: --save-hf, or MegatronWrap.save_pretrained's out_dir)")


def test_a_value_error_of_the_users_own_flow_keeps_its_traceback(scripts):
    proc = scripts["flow_bug.py"].result()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback (most recent call last)" in proc.stderr
    assert "in build_samples" in proc.stderr
    assert proc.stderr.rstrip().endswith("ValueError: my flow cannot read this batch")
    assert "flow_bug.py: error" not in proc.stderr


def rank_export_into(out_dir: str):
    """Rank 0 alone creates the export directory: every rank must learn that it failed."""
    from megatron.wrap import MegatronWrap

    config = {**CONFIG, "model": {**MODEL, **EXPORTABLE}}
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        try:
            wrap.save_pretrained(out_dir)
        except UserInputError as err:
            return str(err)
    return "exported"


def test_a_failed_export_directory_stops_both_ranks():
    assert run_distributed(rank_export_into, 2, args=(NOT_CREATABLE,),
                           timeout_s=TWO_RANK_LIMIT_S) == [
        f"cannot write the Hugging Face checkpoint to {NOT_CREATABLE!r}: [Errno 2] No such "
        f"file or directory: {NOT_CREATABLE!r} (choose a writable directory: --save-hf, or "
        f"MegatronWrap.save_pretrained's out_dir)"] * 2


def rank_initialize_with_save(good: str, bad: str):
    """Rank 1's ``save`` directory cannot be made (as a node whose disk differs)."""
    import torch

    from megatron.varlen_training.flag_errors import ArgumentValidationError
    from megatron.wrap import MegatronWrap

    save = bad if torch.distributed.get_rank() == 1 else good
    with MegatronWrap({**CONFIG, "checkpoint": {"save": save}}) as wrap:
        try:
            wrap.initialize()
        except ArgumentValidationError as err:
            return str(err)
    return "initialized"


def test_a_flag_failing_on_one_rank_stops_both_in_the_facade(tmp_path):
    """The facade checks its flags after the process group exists: rank 0 used to go on to
    the tokenizer's agreement and lose rank 1 there (a gloo error, or a hang on NCCL)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")  # a path below a file cannot be created, even by root
    bad = str(blocker / "ckpt")
    assert run_distributed(rank_initialize_with_save, 2, args=(str(tmp_path / "ok"), bad),
                           timeout_s=TWO_RANK_LIMIT_S) == [
        f"--save directory '{bad}' is not writable (Not a directory); checked at start-up so "
        f"no training is lost at the first save"] * 2
