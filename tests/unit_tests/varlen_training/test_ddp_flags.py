"""Megatron-LM's DDP, gradient-reduction and pipeline-communication flags (ddp_arguments.py,
ddp_settings.py).

Reference: :func:`_megatron_lm_ddp_fields` and :func:`_megatron_lm_p2p`, written from Megatron-LM
core_v0.16.1's ``get_model`` / ``validate_args`` / ``core_transformer_config_from_args`` (the
bucket size is ``--ddp-num-buckets``' share of the rank's parameters, else
``--ddp-bucket-size``, and None without ``--overlap-grad-reduce``; aligned gathers under VPP
only; ``batch_p2p_comm = not overlap_p2p_comm``, overlap off without VPP; bf16 reduces in fp32
unless ``--grad-reduce-in-bf16``). The config megatron-core's DDP is built with must equal it
field by field. A 2-rank gloo run with ``--overlap-grad-reduce`` and ``--ddp-num-buckets``
really has that many buckets and trains as the run without overlap; so does
``--no-align-grad-reduce``. Refusals are one line (one through pretrain_gpt.py: exit code 2).
"""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.ddp_settings import core_ddp_config
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, stepping_trainer

REPO = Path(__file__).resolve().parents[3]
BASE = TINY_GPT_ARGS + ["--train-iters", "2"]
VPP = ["--num-layers", "4", "--pipeline-model-parallel-size", "2",
       "--num-layers-per-virtual-pipeline-stage", "1"]
NUM_PARAMETERS = 10_000
# megatron-core's default bucket size when none is given (its DDP fills it in): None here.
DEFAULT_BUCKET = None


def _flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _megatron_lm_ddp_fields(argv: list[str], num_parameters: int) -> dict:
    """The DistributedDataParallelConfig fields Megatron-LM's get_model sets from ``argv``."""
    overlap_grad = "--overlap-grad-reduce" in argv
    buckets, size = _flag_value(argv, "--ddp-num-buckets"), _flag_value(argv, "--ddp-bucket-size")
    bucket = num_parameters // int(buckets) if buckets else int(size) if size else DEFAULT_BUCKET
    vpp = "--num-layers-per-virtual-pipeline-stage" in argv
    return {
        "grad_reduce_in_fp32": ("--bf16" in argv and "--grad-reduce-in-bf16" not in argv)
        or ("--accumulate-allreduce-grads-in-fp32" in argv
            and "--grad-reduce-in-bf16" not in argv),
        "overlap_grad_reduce": overlap_grad,
        "overlap_param_gather": "--overlap-param-gather" in argv,
        "align_param_gather": vpp and "--no-align-param-gather" not in argv,
        "use_distributed_optimizer": "--use-distributed-optimizer" in argv,
        "bucket_size": bucket if overlap_grad else None,
        "average_in_collective": False,
        "pad_buckets_for_high_nccl_busbw": "--ddp-pad-buckets-for-high-nccl-busbw" in argv,
    }


DDP_COMMAND_LINES = [
    [],
    ["--overlap-grad-reduce"],
    ["--overlap-grad-reduce", "--ddp-bucket-size", "1234"],
    ["--ddp-bucket-size", "1234"],  # no overlap: one bucket per buffer, as Megatron-LM
    ["--overlap-grad-reduce", "--ddp-num-buckets", "7"],
    ["--overlap-grad-reduce", "--ddp-pad-buckets-for-high-nccl-busbw"],
    ["--bf16"],
    ["--bf16", "--grad-reduce-in-bf16"],
    ["--bf16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"],
    ["--grad-reduce-in-bf16"],  # fp32 parameters: nothing to change
    ["--accumulate-allreduce-grads-in-fp32"],
    ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", *VPP],
    ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", *VPP,
     "--no-align-param-gather"],
    ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"],
]


@pytest.mark.parametrize("extra", DDP_COMMAND_LINES, ids=" ".join)
def test_ddp_config_is_megatron_lms(extra):
    world = 2 if "--pipeline-model-parallel-size" in extra else 1
    run = parse_run_config(BASE + extra, world_size=world)
    config = core_ddp_config(run, NUM_PARAMETERS)
    expected = _megatron_lm_ddp_fields(BASE + extra, NUM_PARAMETERS)
    assert {name: getattr(config, name) for name in expected} == expected


def test_average_in_collective_reaches_the_config():
    """Refused on CPU (gloo has no AVG): the field's way to megatron-core, shown directly."""
    run = parse_run_config(BASE, world_size=1)
    run = dataclasses.replace(run, parallel=dataclasses.replace(
        run.parallel, ddp_average_in_collective=True))
    assert core_ddp_config(run, NUM_PARAMETERS).average_in_collective is True


def _megatron_lm_p2p(argv: list[str], cpu: bool) -> tuple[bool, bool]:
    """(overlap_p2p_comm, batch_p2p_comm) Megatron-LM sets; on CPU (gloo) never batched."""
    vpp = "--num-layers-per-virtual-pipeline-stage" in argv
    overlap = vpp and "--no-overlap-p2p-communication" not in argv
    return overlap, not overlap and not cpu


@pytest.mark.parametrize("extra", [
    [], ["--pipeline-model-parallel-size", "2"], VPP, VPP + ["--overlap-p2p-communication"],
    ["--num-layers", "6", "--pipeline-model-parallel-size", "3",
     "--num-layers-per-virtual-pipeline-stage", "1", "--no-overlap-p2p-communication"],
], ids=" ".join)
def test_pipeline_p2p_is_megatron_lms(extra):
    from megatron.varlen_training.model import build_transformer_config

    world = int(_flag_value(extra, "--pipeline-model-parallel-size") or 1)
    config = build_transformer_config(parse_run_config(BASE + extra, world_size=world))
    cpu = not torch.cuda.is_available()
    assert (config.overlap_p2p_comm, config.batch_p2p_comm) == _megatron_lm_p2p(BASE + extra, cpu)


@pytest.mark.parametrize("extra, world, needle", [
    (["--use-torch-fsdp2"], 1, "--use-torch-fsdp2 is not supported"),
    (["--use-megatron-fsdp"], 1, "--use-megatron-fsdp is not supported"),
    (["--num-distributed-optimizer-instances", "2"], 1,
     "--num-distributed-optimizer-instances 2 is not supported"),
    (["--overlap-param-gather-with-optimizer-step"], 1,
     "--overlap-param-gather-with-optimizer-step is not supported: Megatron-LM refuses it"),
    (["--ddp-reduce-scatter-with-fp32-accumulation"], 1,
     "--ddp-reduce-scatter-with-fp32-accumulation is not supported"),
    (["--use-tp-pp-dp-mapping"], 1, "--use-tp-pp-dp-mapping is not supported"),
    (["--ddp-bucket-size", "100", "--ddp-num-buckets", "2"], 1,
     "--ddp-bucket-size 100 and --ddp-num-buckets 2 both set the gradient bucket size"),
    (["--ddp-num-buckets", "0"], 1, "--ddp-num-buckets"),
    (["--ddp-average-in-collective", "--calculate-per-token-loss"], 1,
     "--ddp-average-in-collective cannot be used with --calculate-per-token-loss"),
    (["--local-rank", "3"], 1, "--local-rank 3 disagrees with $LOCAL_RANK 0"),
    (VPP + ["--num-virtual-stages-per-pipeline-rank", "2"], 2,
     "--num-layers-per-virtual-pipeline-stage 1 and --num-virtual-stages-per-pipeline-rank 2 "
     "both set the virtual pipeline size"),
    (["--num-layers", "4", "--pipeline-model-parallel-size", "2",
      "--num-virtual-stages-per-pipeline-rank", "3"], 2,
     "the 2 layers of each pipeline stage (--num-layers 4) are not divisible by "
     "--num-virtual-stages-per-pipeline-rank 3"),
    (["--lazy-mpu-init", "True"], 1, "--lazy-mpu-init is not supported"),
    (["--distributed-timeout-seconds-after-init", "60"], 1,
     "--distributed-timeout-seconds-after-init 60 is not supported"),
    (VPP + ["--no-overlap-p2p-communication"], 2,
     "--no-overlap-p2p-communication with virtual pipeline stages needs "
     "--pipeline-model-parallel-size > 2 (got 2)"),
])
def test_refusals_are_one_line(extra, world, needle):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(BASE + extra, world_size=world)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is gloo's (CPU)")
def test_average_in_collective_is_refused_on_cpu():
    with pytest.raises(ArgumentValidationError, match="needs NCCL: gloo"):
        parse_args(BASE + ["--ddp-average-in-collective"], world_size=1)


def test_neutral_and_fsdp_only_values_are_accepted():
    args = parse_args(BASE + ["--num-distributed-optimizer-instances", "1",
                              "--data-parallel-sharding-strategy", "optim_grads_params",
                              "--no-gradient-reduce-div-fusion", "--megatron-fsdp-version", "2"],
                      world_size=1)
    assert args.num_distributed_optimizer_instances == 1


@pytest.mark.parametrize("stages, per_stage, vpp", [("2", None, 2), ("1", None, None)])
def test_virtual_stages_per_rank_is_the_same_split(stages, per_stage, vpp):
    """Megatron-LM: N virtual stages per rank (the layers-per-stage flag stays unset); 1 means
    no virtual pipeline."""
    args = parse_args(BASE + ["--num-layers", "4", "--pipeline-model-parallel-size", "2",
                              "--num-virtual-stages-per-pipeline-rank", stages], world_size=2)
    assert (args.num_layers_per_virtual_pipeline_stage,
            args.virtual_pipeline_model_parallel_size) == (per_stage, vpp)


def test_launcher_flags_are_accepted():
    args = parse_args(BASE + ["--local-rank", "0", "--no-scatter-gather-tensors-in-pipeline"],
                      world_size=1)
    assert args.local_rank == 0


def test_entry_point_refusal_exits_2():
    env = {"WORLD_SIZE": "1", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(REPO / "pretrain_gpt.py"), *BASE,
                           "--use-megatron-fsdp"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=REPO)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--use-megatron-fsdp is not supported" in lines[0]


def _losses_and_buckets(argv: list[str]) -> dict:
    with stepping_trainer(argv) as (trainer, state, provider):
        reports = [trainer.step(provider.step_batches(i)) for i in range(2)]
        losses = [value for report in reports for value in (report.loss, report.grad_norm)]
        buckets = [len(buffer.buckets) for chunk in state.model for buffer in chunk.buffers]
        # Megatron-LM's aligned reduction: the schedule starts it (grad_sync_func).
        return {"losses": losses, "buckets": buckets,
                "schedule_starts_reduction": state.config.grad_sync_func is not None,
                "grad_dtypes": {str(buffer.grad_dtype) for chunk in state.model
                                for buffer in chunk.buffers}}


def _bucket_runs() -> dict:
    overlap = ["--overlap-grad-reduce"]
    return {"plain": _losses_and_buckets(BASE),
            "buckets": _losses_and_buckets(BASE + overlap + ["--ddp-num-buckets", "3"]),
            "unaligned": _losses_and_buckets(BASE + overlap + ["--ddp-num-buckets", "3",
                                                               "--no-align-grad-reduce"]),
            "bf16": _losses_and_buckets(BASE + ["--bf16"]),
            "bf16_reduce": _losses_and_buckets(BASE + ["--bf16", "--grad-reduce-in-bf16"])}


@pytest.fixture(scope="module")
def bucket_runs() -> dict:
    return run_distributed(_bucket_runs, 2, timeout_s=240)[0]


def test_num_buckets_splits_the_gradient_buffer(bucket_runs):
    assert bucket_runs["plain"]["buckets"] == [1]  # no overlap: one bucket per buffer
    # num_parameters // 3 per bucket; megatron-core closes a bucket at a parameter boundary
    # once it holds that many, so the buffer has about 3 (not fewer than 2, not more than 4).
    assert 2 <= bucket_runs["buckets"]["buckets"][0] <= 4, bucket_runs["buckets"]


def test_grad_reduce_in_bf16_keeps_bf16_gradient_buffers(bucket_runs):
    """Megatron-LM: bf16 accumulates and reduces gradients in fp32, unless this flag."""
    assert bucket_runs["bf16"]["grad_dtypes"] == {"torch.float32"}
    assert bucket_runs["bf16_reduce"]["grad_dtypes"] == {"torch.bfloat16"}
    assert all(value == value for value in bucket_runs["bf16_reduce"]["losses"])  # trains


def test_no_align_grad_reduce_leaves_the_reduction_to_ddp(bucket_runs):
    assert bucket_runs["buckets"]["schedule_starts_reduction"]
    assert not bucket_runs["unaligned"]["schedule_starts_reduction"]
    assert not bucket_runs["plain"]["schedule_starts_reduction"]  # no overlap: finalize does


@pytest.mark.parametrize("case", ["buckets", "unaligned"])
def test_buckets_and_unaligned_reduction_train_the_same(bucket_runs, case):
    """Losses and grad norms of both steps."""
    for got, ref in zip(bucket_runs[case]["losses"], bucket_runs["plain"]["losses"]):
        assert abs(got - ref) <= 1e-6 * abs(ref), (case, bucket_runs)
