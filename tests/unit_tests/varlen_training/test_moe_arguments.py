"""Megatron-LM's MoE flags: parsed into the typed MoEConfig, bad combinations one line each."""

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.hybrid_arguments import parse_hybrid_args
from megatron.varlen_training.moe_model import moe_transformer_config
from tests.harness.training_runs import TINY_GPT_ARGS

BASE = TINY_GPT_ARGS + ["--train-iters", "3", "--disable-bias-linear"]
MOE = ["--num-experts", "4"]


def test_flags_reach_the_config_and_megatron_core():
    run = parse_run_config(BASE + MOE + [
        "--moe-router-topk", "1", "--moe-router-pre-softmax", "--moe-ffn-hidden-size", "24",
        "--moe-shared-expert-intermediate-size", "8", "--moe-layer-freq", "[1,0]",
        "--expert-model-parallel-size", "2", "--moe-router-load-balancing-type", "seq_aux_loss",
        "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001",
        "--moe-router-score-function", "sigmoid", "--moe-router-topk-scaling-factor", "2.5",
        "--moe-router-dtype", "fp64", "--sequence-packing", "--micro-batch-size", "1"],
        world_size=2)
    moe = run.model.moe
    assert moe.moe_layer_freq == (1, 0) and moe.is_moe_layer(2) == [True, False]
    assert moe.moe_token_dispatcher_type == "alltoall"  # resolved for packing
    assert moe.expert_tensor_parallel_size == 1  # resolved: --tensor-model-parallel-size
    fields = moe_transformer_config(moe)
    assert fields["num_moe_experts"] == 4 and fields["moe_layer_freq"] == [1, 0]
    assert fields["moe_router_dtype"] == "fp64" and fields["moe_grouped_gemm"] is False


def test_router_options_reach_megatron_core():
    """Expert bias and group-limited routing: megatron-core's own router implements them."""
    run = parse_run_config(BASE + MOE + [
        "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
        "--moe-router-bias-update-rate", "0.01", "--moe-router-num-groups", "2",
        "--moe-router-group-topk", "1"], world_size=1)
    fields = moe_transformer_config(run.model.moe)
    assert fields["moe_router_enable_expert_bias"] is True
    assert fields["moe_router_bias_update_rate"] == 0.01
    assert (fields["moe_router_num_groups"], fields["moe_router_group_topk"]) == (2, 1)
    overlap = parse_run_config(BASE + MOE + [
        "--moe-shared-expert-intermediate-size", "8", "--moe-shared-expert-overlap",
        "--sequence-packing", "--micro-batch-size", "1"], world_size=1)
    assert moe_transformer_config(overlap.model.moe)["moe_shared_expert_overlap"] is True
    capacity = moe_transformer_config(parse_run_config(BASE + MOE + [
        "--moe-expert-capacity-factor", "1.5", "--moe-token-drop-policy", "position",
        "--moe-pad-expert-input-to-capacity"], world_size=1).model.moe)
    assert capacity["moe_token_drop_policy"] == "position"
    assert capacity["moe_pad_expert_input_to_capacity"] is True
    default = moe_transformer_config(parse_run_config(BASE + MOE, world_size=1).model.moe)
    assert default["moe_router_enable_expert_bias"] is False
    assert default["moe_router_bias_update_rate"] == 1e-3  # Megatron-LM's default
    assert default["moe_router_num_groups"] is None


QWEN3 = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--qk-layernorm", "--untie-embeddings-and-output-weights"]


def test_group_limited_routing_has_no_hugging_face_form(tmp_path):
    """Qwen3-MoE routes over all experts: --save-hf refuses groups at start-up."""
    with pytest.raises(ArgumentValidationError) as err:
        parse_run_config(BASE + MOE + QWEN3 + ["--moe-router-num-groups", "2",
                                               "--moe-router-group-topk", "1",
                                               "--save-hf", str(tmp_path)], world_size=1)
    assert "Qwen3-MoE has no --moe-router-num-groups (got 2)" in str(err.value)


@pytest.mark.parametrize("text, layers", [
    ("([0]*1+[1]*3)", [0, 1, 1, 1]),            # first-k-dense: one dense layer, then MoE
    ("([1]*1+[0]*1)*2", [1, 0, 1, 0]),          # Megatron-LM's repeated pattern
    ("[0,0,1,1]", [0, 0, 1, 1]),
    ("([0]+[1]*3)", [0, 1, 1, 1]),
])
def test_layer_freq_patterns(text, layers):
    """Megatron-LM's --moe-layer-freq pattern expressions (DeepSeek-style first-k-dense)."""
    run = parse_run_config(BASE + MOE + ["--num-layers", "4", "--moe-layer-freq", text],
                           world_size=1)
    assert run.model.moe.is_moe_layer(4) == [bool(flag) for flag in layers]


@pytest.mark.parametrize("text", ["__import__('os')", "[2]*4", "([0]*100000)*100000", "[0]*-1",
                                  "[[0]]*4", "[1]*1.5"])
def test_layer_freq_evaluates_nothing_else(text):
    with pytest.raises(ArgumentValidationError, match="--moe-layer-freq"):
        parse_args(BASE + MOE + ["--num-layers", "4", "--moe-layer-freq", text], world_size=1)


def test_global_aux_loss_keeps_the_microbatch_order():
    """The pipeline reorders a step's micro-batches to shrink its bubbles, except with
    global_aux_loss (a running average over the step's micro-batches so far)."""
    from megatron.varlen_training.data import build_packing_config

    packed = BASE + MOE + ["--sequence-packing", "--micro-batch-size", "1",
                           "--pipeline-model-parallel-size", "2"]
    for balancing, stages in (("seq_aux_loss", 2), ("global_aux_loss", 1)):
        run = parse_run_config(packed + ["--moe-router-load-balancing-type", balancing,
                                         "--moe-aux-loss-coeff", "0.1"], world_size=2)
        assert build_packing_config(run, pad_id=0).pipeline_stages == stages, balancing


def test_dense_run_has_no_moe_config():
    run = parse_run_config(BASE, world_size=1)
    assert run.model.moe is None
    assert parse_run_config(BASE + MOE, world_size=1).model.moe.moe_token_dispatcher_type == \
        "allgather"  # Megatron-LM's default without packing


@pytest.mark.parametrize("extra, world, needle", [
    (["--expert-model-parallel-size", "2"], 2,
     "--expert-model-parallel-size 2 needs --num-experts"),
    (["--moe-router-topk", "4"], 1, "--moe-router-topk 4 needs --num-experts"),
    (MOE + ["--moe-router-topk", "5"], 1, "--moe-router-topk 5 must be in [1, --num-experts 4]"),
    (["--num-experts", "3", "--expert-model-parallel-size", "2"], 2,
     "--num-experts 3 is not divisible by --expert-model-parallel-size 2"),
    (MOE + ["--expert-model-parallel-size", "4"], 2, "= 4 does not divide the 2 ranks"),
    (MOE + ["--tensor-model-parallel-size", "2"], 2, "needs --sequence-parallel"),
    (MOE + ["--expert-tensor-parallel-size", "2"], 2,
     "--expert-tensor-parallel-size 2 differs from --tensor-model-parallel-size 1 with "
     "--expert-model-parallel-size 1: megatron-core then reduces the experts' gradients as "
     "dense weights, which is wrong for their split; set --expert-model-parallel-size > 1 or "
     "--expert-tensor-parallel-size 1"),
    (MOE + ["--sequence-packing", "--micro-batch-size", "1", "--moe-token-dispatcher-type",
            "allgather"], 1, "--moe-token-dispatcher-type allgather gathers every rank's tokens"),
    (MOE + ["--sequence-packing", "--micro-batch-size", "1", "--moe-expert-capacity-factor",
            "1.5"], 1, "--moe-expert-capacity-factor 1.5 drops tokens"),
    # Found by tools/probe_combinations.py (moe_capacity/u_tp2_sp, u_cp2: 2.2e-3, 1.4e-3 off).
    (MOE + ["--moe-expert-capacity-factor", "1.0", "--context-parallel-size", "2"], 2,
     "--moe-expert-capacity-factor 1.0 drops tokens by a capacity computed from each rank's "
     "share of the micro-batch, which --tensor-model-parallel-size 1 (sequence parallel) x "
     "--context-parallel-size 2 = 2 splits (the trained model would depend on the layout): "
     "drop the flag or use tensor and context parallel sizes of 1"),
    (MOE + ["--moe-expert-capacity-factor", "1.0", "--tensor-model-parallel-size", "2",
            "--sequence-parallel"], 2, "--tensor-model-parallel-size 2 (sequence parallel) x "
                                       "--context-parallel-size 1 = 2 splits"),
    (MOE + ["--moe-router-topk", "1"], 1, "needs --moe-router-pre-softmax"),
    (MOE + ["--mtp-num-layers", "1", "--context-parallel-size", "2", "--seq-length", "32"], 2,
     "and --context-parallel-size 2 needs --sequence-packing"),
    (MOE + ["--moe-layer-freq", "[1,0,1]"], 1, "--moe-layer-freq has 3 entries for --num-layers 2"),
    (MOE + ["--moe-layer-freq", "2+1"], 1, "--moe-layer-freq '2+1'"),
    (MOE + ["--moe-aux-loss-coeff", "-1"], 1, "--moe-aux-loss-coeff must be"),
    (["--num-experts", "0"], 1, "--num-experts must be >= 1"),
    (["--moe-router-enable-expert-bias"], 1, "--moe-router-enable-expert-bias True needs "
                                              "--num-experts"),
    (MOE + ["--moe-router-enable-expert-bias"], 1, "--moe-router-enable-expert-bias needs "
     "--moe-router-score-function sigmoid (megatron-core's expert bias; got softmax)"),
    (MOE + ["--moe-router-bias-update-rate", "-0.1"], 1, "--moe-router-bias-update-rate must be"),
    (MOE + ["--moe-router-num-groups", "2"], 1, "--moe-router-num-groups 2 and "
     "--moe-router-group-topk None: give both (group-limited routing) or neither"),
    (MOE + ["--moe-router-num-groups", "3", "--moe-router-group-topk", "1"], 1,
     "--num-experts 4 is not divisible by --moe-router-num-groups 3"),
    (MOE + ["--moe-router-num-groups", "2", "--moe-router-group-topk", "3"], 1,
     "--moe-router-group-topk 3 exceeds --moe-router-num-groups 2"),
    (MOE + ["--moe-router-num-groups", "4", "--moe-router-group-topk", "1"], 1,
     "--moe-router-topk 2 must be a multiple of --moe-router-group-topk 1 and at most 1 x 1"),
    (MOE + ["--moe-router-num-groups", "2", "--moe-router-group-topk", "2", "--moe-router-topk",
            "3"], 1, "--moe-router-topk 3 must be a multiple of --moe-router-group-topk 2"),
    (MOE + ["--moe-shared-expert-overlap", "--moe-token-dispatcher-type", "alltoall"], 1,
     "--moe-shared-expert-overlap needs a shared expert (--moe-shared-expert-intermediate-size)"),
    (MOE + ["--moe-shared-expert-overlap", "--moe-shared-expert-intermediate-size", "8"], 1,
     "--moe-shared-expert-overlap works with --moe-token-dispatcher-type alltoall only "
     "(megatron-core's; got allgather)"),
    (["--moe-shared-expert-overlap"], 1, "--moe-shared-expert-overlap True needs --num-experts"),
    (MOE + ["--moe-token-drop-policy", "position"], 1, "--moe-token-drop-policy applies to "
     "dropped tokens only: it needs --moe-expert-capacity-factor"),
    (MOE + ["--moe-pad-expert-input-to-capacity"], 1, "--moe-pad-expert-input-to-capacity "
     "applies to dropped tokens only: it needs --moe-expert-capacity-factor"),
])
def test_bad_moe_flags_are_one_line(extra, world, needle):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(BASE + extra, world_size=world)
    message = str(err.value)
    assert needle in message and "\n" not in message, message


def test_moe_needs_bias_free_linears():
    with pytest.raises(ArgumentValidationError, match="--disable-bias-linear"):
        parse_args(TINY_GPT_ARGS + ["--train-iters", "3"] + MOE, world_size=1)


HYBRID = ["--num-layers", "4", "--hidden-size", "24", "--num-attention-heads", "4",
          "--mamba-head-dim", "4", "--mamba-num-groups", "2", "--mamba-state-dim", "8",
          "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
          "--train-iters", "2", "--lr", "1e-3", "--mock-data", "--tokenizer-type",
          "NullTokenizer", "--vocab-size", "128", "--disable-bias-linear"]


def test_hybrid_moe_layers_need_experts():
    with pytest.raises(ArgumentValidationError, match="has MoE layers \\(E\\): set --num-experts"):
        parse_hybrid_args(HYBRID + ["--hybrid-override-pattern", "M*E*"], world_size=1)
    args = parse_hybrid_args(HYBRID + ["--hybrid-override-pattern", "M*E*"] + MOE, world_size=1)
    assert args.hybrid_layer_pattern == "M*E*"
