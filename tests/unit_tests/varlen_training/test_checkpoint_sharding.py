"""The optimizer-state format a checkpoint is saved in (``--dist-ckpt-optim-fully-reshardable``,
``--distrib-optim-fully-reshardable-mem-efficient``), the metadata a load builds its template
with, and which layout changes the resume check lets through for each format. Single process;
the resumes themselves run in test_fully_reshardable_resume.py."""

import json

import pytest

from megatron.varlen_training.checkpoint.sharding import load_metadata, save_metadata
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.resume.consistency import check_run_args
from megatron.varlen_training.resume.run_args_keys import RUN_ARGS_FILENAME
from megatron.varlen_training.resume.run_args_record import save_run_args
from tests.harness.training_runs import TINY_GPT_ARGS

WORLD = 4
DISTRIBUTED = ["--use-distributed-optimizer"]
RESHARDABLE = ["--dist-ckpt-optim-fully-reshardable"]
MEM_EFFICIENT = ["--distrib-optim-fully-reshardable-mem-efficient"]
# Four layers: two virtual stages per PP 2 rank; a global batch every layout here divides.
FOUR_LAYERS = ["--num-layers", "4"] + TINY_GPT_ARGS[2:] + ["--global-batch-size", "8",
                                                           "--train-iters", "4"]
TP2 = ["--tensor-model-parallel-size", "2"]
PP2 = ["--pipeline-model-parallel-size", "2"]
VPP2 = PP2 + ["--num-layers-per-virtual-pipeline-stage", "1"]


def _run(*extra: str):
    return parse_run_config(FOUR_LAYERS + list(extra), world_size=WORLD)


# Megatron-LM's _build_sharded_state_dict_metadata for the same flags (its dp_cp_group, a
# process group, is not part of what is stored).
@pytest.mark.parametrize("extra, want", [
    ([], {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}),
    (DISTRIBUTED, {"singleton_local_shards": False, "chained_optim_avoid_prefix": True,
                   "distrib_optim_sharding_type": "dp_reshardable"}),
    (DISTRIBUTED + RESHARDABLE, {
        "singleton_local_shards": False, "chained_optim_avoid_prefix": True,
        "distrib_optim_sharding_type": "fully_reshardable",
        "distrib_optim_fully_reshardable_mem_efficient": False}),
    (DISTRIBUTED + RESHARDABLE + MEM_EFFICIENT, {
        "singleton_local_shards": False, "chained_optim_avoid_prefix": True,
        "distrib_optim_sharding_type": "fully_reshardable",
        "distrib_optim_fully_reshardable_mem_efficient": True}),
    # As in Megatron-LM, the format flags do nothing without the distributed optimizer.
    (RESHARDABLE + MEM_EFFICIENT, {"singleton_local_shards": False,
                                   "chained_optim_avoid_prefix": True}),
])
def test_saves_build_megatron_lm_metadata(extra, want):
    assert save_metadata(_run(*extra)) == want


def test_checkpoints_without_stored_metadata_load_as_they_were_saved():
    """Before the metadata was stored every save passed the dp_reshardable type (to the plain
    optimizer too, so its chained EP > 1 keys carry the chained_<i>. prefix)."""
    assert load_metadata(None) == {"distrib_optim_sharding_type": "dp_reshardable"}
    stored = {"distrib_optim_sharding_type": "fully_reshardable"}
    assert load_metadata(stored) == stored


def _saved(folder, *extra: str, drop_format: bool = False) -> str:
    save_run_args(str(folder), _run(*extra), iteration=2)
    if drop_format:  # a checkpoint saved before the format was recorded
        path = folder / RUN_ARGS_FILENAME
        recorded = json.loads(path.read_text())
        del recorded["distrib_optim_sharding_type"]
        path.write_text(json.dumps(recorded))
    return str(folder)


@pytest.mark.parametrize("resumed", [TP2, PP2, VPP2], ids=["tp2", "pp2", "vpp2"])
def test_fully_reshardable_state_follows_a_model_parallel_change(tmp_path, resumed):
    folder = _saved(tmp_path, *DISTRIBUTED, *RESHARDABLE)
    assert json.loads((tmp_path / RUN_ARGS_FILENAME).read_text())[
        "distrib_optim_sharding_type"] == "fully_reshardable"
    # The format is the checkpoint's: this run saves dp_reshardable next, and still loads it.
    assert check_run_args(folder, _run(*DISTRIBUTED, *resumed), check_data=False) is None


@pytest.mark.parametrize("drop_format", [False, True], ids=["dp_reshardable", "unrecorded"])
def test_dp_reshardable_state_refuses_it_naming_the_flag(tmp_path, drop_format):
    folder = _saved(tmp_path, *DISTRIBUTED, drop_format=drop_format)
    with pytest.raises(CheckpointError) as err:
        check_run_args(folder, _run(*DISTRIBUTED, *RESHARDABLE, *TP2), check_data=False)
    assert str(err.value) == (
        "--load: the checkpoint's distributed optimizer state was saved with "
        "--tensor-model-parallel-size 1, this run has 2: its format (megatron-core's "
        "dp_reshardable) reshards over data-parallel ranks only (resume with "
        "--tensor-model-parallel-size 1, or add --no-load-optim to load the weights only; a "
        "save with --dist-ckpt-optim-fully-reshardable is resumable at another layout)")


def test_plain_optimizer_records_no_format(tmp_path):
    _saved(tmp_path)
    assert json.loads((tmp_path / RUN_ARGS_FILENAME).read_text())[
        "distrib_optim_sharding_type"] is None


MOE = ["--disable-bias-linear", "--num-experts", "4", "--moe-ffn-hidden-size", "16"]


@pytest.mark.parametrize("saved_ep, resumed_ep", [("1", "2"), ("2", "1")])
def test_ep_1_to_more_passes_the_check_where_the_state_converts(tmp_path, saved_ep, resumed_ep):
    """EP 1 <-> > 1 with the plain optimizer or the fully reshardable format: the tensors match
    by parameter and the load converts the common state (checkpoint/optimizer_nesting.py)."""
    for extra in ([], DISTRIBUTED + RESHARDABLE):
        (tmp_path / str(len(extra))).mkdir()
        folder = _saved(tmp_path / str(len(extra)), *MOE, *extra,
                        "--expert-model-parallel-size", saved_ep)
        resumed = _run(*MOE, *extra, "--expert-model-parallel-size", resumed_ep)
        assert check_run_args(folder, resumed, check_data=False) is None, extra


@pytest.mark.parametrize("saved_ep, resumed_ep", [("1", "2"), ("2", "1")])
def test_dp_reshardable_state_still_refuses_ep_1_to_more(tmp_path, saved_ep, resumed_ep):
    """The dp_reshardable format cannot follow any EP change: its refusal comes first."""
    folder = _saved(tmp_path, *MOE, *DISTRIBUTED, "--expert-model-parallel-size", saved_ep)
    with pytest.raises(CheckpointError) as err:
        check_run_args(folder, _run(*MOE, *DISTRIBUTED,
                                    "--expert-model-parallel-size", resumed_ep),
                       check_data=False)
    assert str(err.value) == (
        f"--load: the checkpoint's distributed optimizer state was saved with "
        f"--expert-model-parallel-size {saved_ep}, this run has {resumed_ep}: its format "
        f"(megatron-core's dp_reshardable) reshards over data-parallel ranks only (resume with "
        f"--expert-model-parallel-size {saved_ep}, or add --no-load-optim to load the weights "
        f"only; a save with --dist-ckpt-optim-fully-reshardable is resumable at another layout)")


def test_fully_reshardable_state_follows_ep_and_etp_between_sizes_above_1(tmp_path):
    folder = _saved(tmp_path, *MOE, *DISTRIBUTED, *RESHARDABLE,
                    "--expert-model-parallel-size", "4")
    resumed = _run(*MOE, *DISTRIBUTED, "--expert-model-parallel-size", "2",
                   "--expert-tensor-parallel-size", "2")
    assert check_run_args(folder, resumed, check_data=False) is None
