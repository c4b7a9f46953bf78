"""The recomputation, fine-tuning and overlap flags: Megatron-LM's rules as one-line errors, the
values the configs receive, and what a load restores from where (no ranks needed)."""

import pytest

from megatron.varlen_training.config.checkpoint import CheckpointConfig
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.load_options import (
    FINETUNE, RESUME, LoadParts, TRACKER_FILENAME, checkpoint_source, load_parts,
)
from megatron.varlen.mamba.layer_recompute import recomputed_groups
from megatron.varlen_training.recompute_arguments import RECOMPUTE_MODULES

BASE = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "128"]
FULL = ["--recompute-granularity", "full"]
SELECTIVE = ["--recompute-granularity", "selective", "--recompute-modules"]
MOE = ["--num-experts", "4", "--disable-bias-linear"]
SHARED_EXPERTS = MOE + ["--moe-shared-expert-intermediate-size", "16"]
MLA = ["--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "8",
       "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6"]


def _run(extra, world=1):
    return parse_run_config(BASE + extra, world_size=world)


def test_values_reach_the_configs(tmp_path):
    run = _run(FULL + ["--recompute-method", "block", "--recompute-num-layers", "3",
                       "--use-distributed-optimizer", "--overlap-grad-reduce",
                       "--overlap-param-gather", "--finetune", "--no-load-rng",
                       "--pretrained-checkpoint", str(tmp_path)])
    assert (run.model.recompute_granularity, run.model.recompute_method,
            run.model.recompute_num_layers) == ("full", "block", 3)
    assert run.parallel.overlap_grad_reduce and run.parallel.overlap_param_gather
    assert run.checkpoint.finetune and run.checkpoint.no_load_rng
    assert run.checkpoint.pretrained_checkpoint == str(tmp_path)


def test_recompute_activations_means_selective():
    run = _run(["--recompute-activations"])
    assert run.model.recompute_granularity == "selective"
    assert run.model.recompute_modules == ("core_attn",)
    assert _run(["--recompute-granularity", "selective", "--recompute-modules", "mlp",
                 "core_attn", "mlp", "--disable-bias-linear"]).model.recompute_modules == (
        "mlp", "core_attn")


def test_every_megatron_core_module_is_a_choice():
    # megatron-core 0.16.1's own list (TransformerConfig.__post_init__'s allowed modules)
    assert set(RECOMPUTE_MODULES) == {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp",
                                      "moe", "shared_experts"}
    modules = ["core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
    # layers 0 and 2 MoE, 1 and 3 dense: every module has layers to recompute
    run = _run(SHARED_EXPERTS + MLA + ["--moe-layer-freq", "2"] + SELECTIVE + modules)
    assert run.model.recompute_modules == tuple(modules)


def test_moe_layer_recompute_means_selective_moe():
    # megatron-core 0.16.1: selective, "moe" appended to the modules (default core_attn)
    run = _run(MOE + ["--moe-layer-recompute"])
    assert run.model.recompute_granularity == "selective"
    assert run.model.recompute_modules == ("core_attn", "moe")
    assert _run(MOE + SELECTIVE + ["moe", "--moe-layer-recompute"]).model.recompute_modules == (
        "moe",)


@pytest.mark.parametrize("extra,needle", [
    (FULL, "--recompute-granularity full needs --recompute-method"),
    (FULL + ["--recompute-method", "uniform"], "needs --recompute-num-layers"),
    (FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "3"],
     "--recompute-num-layers 3 does not divide the 4 layers"),
    (FULL + ["--recompute-method", "block", "--recompute-num-layers", "5"],
     "--recompute-num-layers 5 exceeds the 4 layers"),
    (FULL + ["--recompute-method", "block", "--recompute-num-layers", "0"],
     "--recompute-num-layers"),
    (["--recompute-granularity", "selective", "--recompute-method", "block"],
     "--recompute-method block is for --recompute-granularity full"),
    (["--recompute-granularity", "selective", "--recompute-num-layers", "1"],
     "--recompute-num-layers 1 is for --recompute-granularity full"),
    (["--recompute-method", "uniform"], "--recompute-method needs --recompute-granularity"),
    (["--recompute-modules", "mlp"], "--recompute-modules needs --recompute-granularity"),
    (["--recompute-activations"] + FULL, "--recompute-activations means"),
    (["--recompute-granularity", "selective", "--recompute-modules", "mlp"],
     "--recompute-modules mlp needs --disable-bias-linear"),
    (FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "1",
             "--mtp-num-layers", "1", "--sequence-packing"], "MTP recomputation"),
    (FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "2",
             "--mtp-num-layers", "1"], "needs --recompute-num-layers 1"),
    (FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "1",
             "--mtp-num-layers", "1", "--num-experts", "4", "--disable-bias-linear"],
     "--mtp-num-layers and --num-experts 4 without --sequence-packing"),
    (SELECTIVE + ["moe"], "--recompute-modules moe recomputes MoE layers and this model has "
     "none (--num-experts)"),
    (MOE + SELECTIVE + ["shared_experts"], "--recompute-modules shared_experts recomputes the "
     "MoE layers' shared experts and this model has none"),
    (SHARED_EXPERTS + ["--moe-shared-expert-overlap", "--moe-token-dispatcher-type", "alltoall"]
     + SELECTIVE + ["shared_experts"], "cannot work with --moe-shared-expert-overlap"),
    (MOE + ["--moe-grouped-gemm"] + SELECTIVE + ["moe_act"],
     "--recompute-modules moe_act recomputes the activation of grouped-GEMM experts only"),
    # megatron-core would recompute nothing: no dense MLP, or no MoE layer, in the model
    (MOE + SELECTIVE + ["core_attn", "mlp"], "--recompute-modules mlp recomputes dense MLP "
     "layers and --moe-layer-freq 1 gives this model none; use moe"),
    (MOE + ["--moe-layer-freq", "[1,1,1,1]"] + SELECTIVE + ["mlp"],
     "--moe-layer-freq [1,1,1,1] gives this model none; use moe"),
    (MOE + ["--moe-layer-freq", "[0,0,0,0]"] + SELECTIVE + ["moe"], "--recompute-modules moe "
     "recomputes MoE layers and --moe-layer-freq [0,0,0,0] gives this model none; use mlp"),
    (SELECTIVE + ["mla_up_proj"],
     "--recompute-modules mla_up_proj is only supported with --multi-latent-attention"),
    (MOE + FULL + ["--recompute-method", "block", "--recompute-num-layers", "1",
                   "--moe-layer-recompute"], "Do not set --moe-layer-recompute with full"),
    (["--moe-layer-recompute"], "--moe-layer-recompute recomputes MoE layers and this model has "
     "none (--num-experts)"),
    (["--finetune"], "--finetune says what to load"),
    (["--no-load-optim"], "--no-load-optim says what to load"),
    (["--pretrained-checkpoint", "/no/such/dir"], "--pretrained-checkpoint directory"),
    (["--load", "/no/such/dir"], "--load directory '/no/such/dir' does not exist"),
    (["--overlap-param-gather", "--overlap-grad-reduce"], "needs --use-distributed-optimizer"),
    (["--overlap-param-gather", "--use-distributed-optimizer"], "needs --overlap-grad-reduce"),
])
def test_bad_combinations_are_one_line(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        _run(extra)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_layers_per_chunk_follow_pipeline_stages():
    # 4 layers on 2 stages: 2 per chunk, so 2 divides and 3 exceeds.
    _run(FULL + ["--recompute-method", "uniform", "--recompute-num-layers", "2",
                 "--pipeline-model-parallel-size", "2"], world=2)
    with pytest.raises(ArgumentValidationError, match="exceeds the 2 layers"):
        _run(FULL + ["--recompute-method", "block", "--recompute-num-layers", "3",
                     "--pipeline-model-parallel-size", "2"], world=2)


def test_pretrained_checkpoint_allows_an_empty_or_missing_load(tmp_path):
    _run(["--load", str(tmp_path / "not_yet"), "--pretrained-checkpoint", str(tmp_path)])


def _checkpoint(load=None, pretrained=None, **flags) -> CheckpointConfig:
    return CheckpointConfig(save=None, load=load, save_interval=None, hf_checkpoint=None,
                            save_hf=None, override_data_fingerprint=False,
                            pretrained_checkpoint=pretrained, **flags)


def test_load_parts():
    assert load_parts(_checkpoint("x")) == RESUME
    assert load_parts(_checkpoint("x", finetune=True, no_load_optim=False)) == FINETUNE
    assert load_parts(_checkpoint("x", no_load_optim=True)) == LoadParts(optimizer=False)
    assert load_parts(_checkpoint("x", no_load_rng=True)) == LoadParts(rng=False)
    assert FINETUNE.finetune and not RESUME.finetune


def test_checkpoint_source(tmp_path):
    pretrained, run_dir = tmp_path / "base", tmp_path / "run"
    pretrained.mkdir()
    assert checkpoint_source(_checkpoint()) is None
    assert checkpoint_source(_checkpoint(str(run_dir), no_load_rng=True)) == (
        str(run_dir), LoadParts(rng=False))  # no fallback: a missing checkpoint is an error
    assert checkpoint_source(_checkpoint(None, str(pretrained))) == (str(pretrained), FINETUNE)
    assert checkpoint_source(_checkpoint(str(run_dir), str(pretrained))) == (
        str(pretrained), FINETUNE)
    run_dir.mkdir()
    (run_dir / TRACKER_FILENAME).write_text("3")
    assert checkpoint_source(_checkpoint(str(run_dir), str(pretrained))) == (str(run_dir),
                                                                               RESUME)


def test_recomputed_groups():
    assert recomputed_groups(4, "uniform", 2) == [(0, 2, True), (2, 4, True)]
    assert recomputed_groups(3, "block", 2) == [(0, 1, True), (1, 2, True), (2, 3, False)]
    with pytest.raises(ValueError):
        recomputed_groups(3, "sometimes", 1)
