"""Megatron-LM's fixed-THD-shape flags and --cp-comm-type: accepted values reach the packing
path, bad ones are one line naming the value, the limit and the flag to change (exit code 2),
and megatron-core's CP exchanges we do not implement are refused, not silently all-gathered."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.data import build_packing_config
from tests.harness.training_runs import TINY_GPT_ARGS

REPO = Path(__file__).resolve().parents[3]
BASE = TINY_GPT_ARGS + ["--train-iters", "1", "--micro-batch-size", "1", "--sft"]
PACKED = BASE + ["--sequence-packing", "--context-parallel-size", "2"]  # budget 16


def _parse(argv, world=4):
    return parse_args(argv, world_size=world)


def test_values_reach_the_packing_config():
    argv = PACKED + ["--pad-packed-seq-alignment", "max", "--thd-max-packed-sequences", "5",
                     "--thd-tail-padding-policy", "extend_last"]
    run = parse_run_config(argv, world_size=4)
    config = build_packing_config(run, pad_id=0)
    shape = config.thd_shape
    assert (shape.tokens_per_rank, shape.alignment) == (16, None)
    assert (shape.max_packed_sequences, shape.tail_policy) == (5, "extend_last")
    assert shape.max_real_sequences() == 5  # extend_last needs no dummy slot
    aligned = build_packing_config(parse_run_config(
        PACKED + ["--pad-packed-seq-alignment", "8", "--thd-max-packed-sequences", "3"],
        world_size=4), pad_id=0).thd_shape
    assert (aligned.alignment, aligned.tokens_per_rank, aligned.tail_policy) == (
        8, None, "append_dummy_seq")
    assert aligned.max_real_sequences() == 2  # one slot kept for the dummy tail sequence
    plain = build_packing_config(parse_run_config(PACKED, world_size=4), pad_id=0).thd_shape
    assert not plain.pads_tail and plain.cu_seqlens_entries is None


def test_cp_comm_type_all_gather_is_accepted():
    assert _parse(PACKED + ["--cp-comm-type", "all_gather"]).cp_comm_type == ["all_gather"]
    assert _parse(BASE + ["--cp-comm-type", "all_gather", "all_gather"]).cp_comm_type


@pytest.mark.parametrize("extra, needle", [
    (["--pad-packed-seq-alignment", "8"], "--pad-packed-seq-alignment needs --sequence-packing"),
    (["--thd-max-packed-sequences", "4"], "--thd-max-packed-sequences needs --sequence-packing"),
    (["--sequence-packing", "--pad-packed-seq-alignment", "bogus"],
     "'bogus' must be 'max' or a positive integer"),
    (["--sequence-packing", "--pad-packed-seq-alignment", "0"],
     "--pad-packed-seq-alignment 0 must be 'max' or a positive integer"),
    (["--sequence-packing", "--pad-packed-seq-alignment", "-8"],
     "--pad-packed-seq-alignment -8 must be 'max' or a positive integer"),
    (["--sequence-packing", "--context-parallel-size", "2", "--pad-packed-seq-alignment", "32"],
     "--pad-packed-seq-alignment 32 exceeds --max-seqlen-per-dp-cp-rank 16"),
    (["--sequence-packing", "--context-parallel-size", "2", "--pad-packed-seq-alignment", "3"],
     "--pad-packed-seq-alignment 3 must be a multiple of 2"),
    (["--dynamic-context-parallel", "--max-seqlen-per-dp-cp-rank", "15",
      "--pad-packed-seq-alignment", "max"],
     "--pad-packed-seq-alignment max pads every rank to --max-seqlen-per-dp-cp-rank 15 tokens, "
     "which must then be a multiple of 2"),
    (["--sequence-packing", "--pad-packed-seq-alignment", "max",
      "--thd-max-packed-sequences", "1"],
     "--thd-max-packed-sequences 1 leaves no slot for a real sequence beside the dummy"),
    (["--sequence-packing", "--context-parallel-size", "2",
      "--thd-max-packed-sequences", "18"],
     "--thd-max-packed-sequences 18 exceeds the sequences a rank's pack can hold "
     "(--max-seqlen-per-dp-cp-rank 16 tokens: at most 17"),
    (["--sequence-packing", "--thd-tail-padding-policy", "extend_last"],
     "--thd-tail-padding-policy needs --pad-packed-seq-alignment"),
    (["--sequence-packing", "--thd-tail-padding-policy", "extend_first"],
     "--thd-tail-padding-policy: invalid choice: 'extend_first'"),
    (["--cp-comm-type", "p2p"], "--cp-comm-type p2p is not implemented: context parallelism "
     "here all-gathers K and V over each micro-batch's CP group (supported: all_gather)"),
    (["--cp-comm-type", "a2a+p2p"], "--cp-comm-type a2a+p2p is not implemented"),
    (["--cp-comm-type", "ring"], "--cp-comm-type ring is unknown"),
    (["--cp-comm-type", "all_gather", "all_gather", "all_gather"],
     "--cp-comm-type has 3 values: give one, or one per layer (--num-layers 2)"),
])
def test_bad_values_are_one_line_errors(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        _parse(BASE + extra)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_virtual_pipeline_packs_already_fill_the_budget():
    vpp = ["--pipeline-model-parallel-size", "2", "--num-layers", "4",
           "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "8"]
    with pytest.raises(ArgumentValidationError, match="which --pad-packed-seq-alignment 6 "
                                                      "must divide"):
        _parse(BASE + vpp + ["--sequence-packing", "--max-seqlen-per-dp-cp-rank", "32",
                             "--pad-packed-seq-alignment", "6"])
    # Without an alignment the VPP fixed shape is itself a tail: the policy may shape it.
    args = _parse(BASE + vpp + ["--sequence-packing", "--max-seqlen-per-dp-cp-rank", "32",
                                "--thd-tail-padding-policy", "extend_last"])
    assert args.thd_tail_padding_policy == "extend_last"


def _refusal(check, args, *extra):
    """The one-line message ``check`` raises for ``args`` (None: accepted)."""
    from megatron.varlen_training.flag_errors import require

    try:
        check(args, require, *extra)
    except ArgumentValidationError as err:
        return str(err)
    return None


def test_transformer_engine_attention_is_refused_where_its_paths_differ():
    """With --attention-backend te (needs TE and CUDA: checked at function level here), TE runs
    its own CP exchange, and MTP's roll would read the fixed-size device cu_seqlens."""
    from types import SimpleNamespace

    from megatron.varlen_training.thd_shape_arguments import (
        validate_cp_comm_type, validate_thd_shape_args,
    )

    comm = SimpleNamespace(cp_comm_type=["all_gather"], num_layers=2)
    assert "Transformer Engine runs its own CP exchange" in _refusal(
        validate_cp_comm_type, comm, "te")
    assert _refusal(validate_cp_comm_type, comm, "flash") is None
    shapes = SimpleNamespace(
        sequence_packing=True, pad_packed_seq_alignment=None, thd_max_packed_sequences=4,
        thd_tail_padding_policy=None, virtual_pipeline_model_parallel_size=None,
        max_seqlen_per_dp_cp_rank=16, mtp_num_layers=1, tensor_model_parallel_size=1,
        sequence_parallel=False)
    message = _refusal(validate_thd_shape_args, shapes, [1, 2], "te")
    assert "with --mtp-num-layers under context parallelism needs --attention-backend local " \
        "or flash" in message and "\n" not in message
    assert _refusal(validate_thd_shape_args, shapes, [1, 2], "local") is None
    assert _refusal(validate_thd_shape_args, shapes, [1], "te") is None  # no CP: no split


def test_core_attention_refuses_exchanges_it_does_not_implement():
    """A TransformerConfig with cp_comm_type="p2p" (the facade, a user spec) reaches our core
    attention through megatron-core's layer: refused in one line, never run as an all-gather."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.varlen.attention.core_attention import VarlenCoreAttention

    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                               use_cpu_initialization=True)
    groups = type("Groups", (), {"tp": None, "cp": None})()
    for value in ("p2p", "a2a", "a2a+p2p"):
        with pytest.raises(ValueError) as err:
            VarlenCoreAttention(config, 1, AttnMaskType.causal, cp_comm_type=value,
                                pg_collection=groups)
        assert f"cp_comm_type '{value}' is not implemented" in str(err.value)
        assert "supported: all_gather" in str(err.value) and "\n" not in str(err.value)
    for value in (None, "all_gather"):
        attention = VarlenCoreAttention(config, 1, AttnMaskType.causal, cp_comm_type=value,
                                        pg_collection=groups)
        assert attention.cp_comm_type == value
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("extra, needle", [
    (["--cp-comm-type", "p2p"], "--cp-comm-type p2p is not implemented"),
    (["--sequence-packing", "--pad-packed-seq-alignment", "3", "--context-parallel-size", "1"],
     "--pad-packed-seq-alignment 3 exceeds --max-seqlen-per-dp-cp-rank"),
])
def test_pretrain_gpt_exits_2_with_one_line(extra, needle):
    env = {"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
           "WORLD_SIZE": "1", "PYTHONPATH": str(REPO)}
    argv = TINY_GPT_ARGS + ["--train-iters", "1", "--micro-batch-size", "1", "--sft",
                            "--seq-length", "2"] + extra
    proc = subprocess.run([sys.executable, str(REPO / "pretrain_gpt.py"), *argv],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("pretrain_gpt.py: error: "), proc.stderr
    assert needle in lines[0], proc.stderr
