"""Activation recomputation never changes the numbers: recompute on == off, bit for bit.

Losses, grad norms and every rank's gradient buffers of the last step are compared with
``torch.equal`` (fp32), with dropout on (hidden and attention: the recomputed forward must draw
the same masks), through packing and dynamic CP -- where each micro-batch carries its own CP
group -- and through PP2 with several micro-batches in flight (1F1B runs the backward, so the
recomputation, of micro-batch k after the forward of micro-batch k+1 has switched groups), and
with MTP.
GPT (megatron-core's TransformerBlock recomputation; selective = core attention and MLP) and
the hybrid Mamba-Transformer stack (our full recomputation, layer_recompute.py). Every "on" run
must actually call ``tensor_parallel.checkpoint`` and every "off" run must not.

The rest of megatron-core's ``--recompute-modules`` (moe, shared_experts, layernorm,
mla_up_proj) on an MoE model with shared experts and multi-latent attention, under dynamic CP
(every micro-batch's router and MLA RoPE need its own boundaries and CP group when backward
recomputes them): the same numbers, and exactly the named modules run their forward twice per
micro-batch, every other module once (counted against the run without recomputation). ``moe``
also where the recomputed routing could see another micro-batch or lose its own: PP2 x VPP2
with MTP (backward of micro-batch k after later forwards; the MTP layer's shifted sequences),
unpacked PP2 with MTP (the padding masks), the hybrid stack's MoE layer (with ``layernorm``),
and the router state a second routing could count twice: the expert bias's token counts per
step and global_aux_loss's running counts (its reported loss), equal to the run without
recomputation. All in one launch of two ranks.
"""

import json

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import (
    train_runs_with_grads_on_this_rank, train_with_grads_on_this_rank,
)

LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                      "max_seq_len": 64, "mean_seq_len": 20, "lognormal_sigma": 1.0})
SHARED = [
    "--seq-length", "64", "--global-batch-size", "8", "--train-iters", "2", "--lr", "2e-3",
    "--mock-data", "--sft", "--sft-mock-dataset-config-json", LENGTHS,
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0.1",
    "--attention-dropout", "0.1", "--position-embedding-type", "rope", "--log-interval", "1",
    "--eval-iters", "0", "--seed", "13", "--micro-batch-size", "1", "--sequence-packing",
]
GPT = SHARED + ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4"]
HYBRID = SHARED + [
    "--num-layers", "4", "--hybrid-override-pattern", "M*M-", "--hidden-size", "24",
    "--num-attention-heads", "4", "--mamba-head-dim", "4", "--mamba-num-groups", "2",
    "--mamba-state-dim", "8",
]
DYNAMIC_CP2 = ["--dynamic-context-parallel", "--context-parallel-size", "2",
               "--max-seqlen-per-dp-cp-rank", "16"]
DYNAMIC_PP2 = ["--dynamic-context-parallel", "--pipeline-model-parallel-size", "2",
               "--max-seqlen-per-dp-cp-rank", "32"]


def full(method: str, layers: int) -> list[str]:
    return ["--recompute-granularity", "full", "--recompute-method", method,
            "--recompute-num-layers", str(layers)]


SELECTIVE = ["--recompute-granularity", "selective"]
SELECTIVE_MLP = SELECTIVE + ["--recompute-modules", "core_attn", "mlp"]
# megatron-core checkpoints the MLP's bias output too, which only works without biases.
GPT_NO_BIAS = GPT + ["--disable-bias-linear"]
# name: (model flags, layout flags, world size, hybrid, {variant name: recompute flags})
CASES = {
    "gpt_dynamic_dp2_cp2": (GPT, DYNAMIC_CP2, 4, False, {"full_uniform2": full("uniform", 2)}),
    "gpt_no_bias_dynamic_dp2_cp2": (GPT_NO_BIAS, DYNAMIC_CP2, 4, False,
                                    {"selective_mlp": SELECTIVE_MLP}),
    # MTP's layer recomputes its core attention (selective); "block" leaves MTP layers alone
    # (megatron-core), and "uniform" with packing is refused (recompute_arguments.py).
    "gpt_mtp_dynamic_dp2_cp2": (GPT + ["--mtp-num-layers", "1"], DYNAMIC_CP2, 4, False,
                                {"full_block": full("block", 2), "selective": SELECTIVE}),
    "gpt_dynamic_pp2_dp2": (GPT, DYNAMIC_PP2, 4, False,
                            {"full_block": full("block", 1), "selective": SELECTIVE}),
    "hybrid_dynamic_dp2_cp2": (HYBRID, DYNAMIC_CP2, 4, True,
                               {"full_uniform2": full("uniform", 2), "selective": SELECTIVE}),
    "hybrid_dynamic_pp2_dp2": (HYBRID, DYNAMIC_PP2, 4, True, {"full_block": full("block", 1)}),
}
MOE_MLA = SHARED + [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--disable-bias-linear", "--num-experts", "4", "--moe-router-topk", "2",
    "--moe-ffn-hidden-size", "16", "--moe-shared-expert-intermediate-size", "16",
    "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.1",
    "--moe-z-loss-coeff", "0.01", "--multi-latent-attention", "--kv-lora-rank", "16",
    "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6", "--rope-type", "rope",
]
# One DP rank, CP groups of 1 and 2: sequences over 32 tokens run on both ranks.
DYNAMIC_CP2_ONLY = ["--dynamic-context-parallel", "--context-parallel-size", "2",
                    "--max-seqlen-per-dp-cp-rank", "32"]
# Two stages, two virtual stages each: 1F1B recomputes micro-batch k after later forwards.
PP2_VPP2 = ["--num-layers", "4", "--pipeline-model-parallel-size", "2",
            "--num-layers-per-virtual-pipeline-stage", "1"]
MTP = ["--mtp-num-layers", "1"]
# The router's state that recomputation must not count twice: the expert bias's token counts
# (sigmoid scores, megatron-core's condition) and global_aux_loss's running counts. The count
# is a torch.compile'd function in megatron-core: eager here, a cold compile costs ~8 s on a
# busy CPU (without the flag, compiled, the case passes too). The flag turns dynamo off for
# the rest of the rank process, so the case runs last.
EXPERT_BIAS = ["--moe-router-enable-expert-bias", "--moe-router-score-function", "sigmoid",
               "--moe-router-bias-update-rate", "0.1", "--disable-jit-fuser"]
GLOBAL_AUX = ["--moe-router-load-balancing-type", "global_aux_loss"]
# Unpacked: the routers balance over the padding mask; the MTP layer's comes from the model.
# Per-token loss: an unpacked micro-batch of a one-token sample has no MTP loss token.
UNPACKED_PP2 = ["--pipeline-model-parallel-size", "2", "--calculate-per-token-loss"]
HYBRID_MOE = SHARED + [
    "--num-layers", "4", "--hybrid-override-pattern", "M*ME", "--hidden-size", "24",
    "--num-attention-heads", "4", "--mamba-head-dim", "4", "--mamba-num-groups", "2",
    "--mamba-state-dim", "8", "--disable-bias-linear", "--num-experts", "4",
    "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16",
    "--moe-shared-expert-intermediate-size", "16", "--moe-router-load-balancing-type",
    "seq_aux_loss", "--moe-aux-loss-coeff", "0.1", "--moe-z-loss-coeff", "0.01",
]
# variant: (--recompute-modules, the modules they recompute: forwards of these and everything
# under them run twice; a name ending in "." is only what is under it: megatron-core re-runs the
# MoE layer's forward directly, not through the module call). Without --q-lora-rank MLA's query
# projection is linear_q_proj.
MODULE_VARIANTS = {
    "moe_mla_up_proj": (["moe", "mla_up_proj"],
                        (".mlp.", ".self_attention.linear_q_proj",
                         ".self_attention.linear_kv_up_proj")),
    "shared_experts_layernorm": (["shared_experts", "layernorm"],
                                 (".mlp.shared_experts", ".input_layernorm",
                                  ".pre_mlp_layernorm")),
}
MOE_ONLY = {"moe": (["moe"], (".mlp.",))}  # every MoE layer, the MTP layer's included
# case: (flags, hybrid, variants), all trained in one launch of MODULES_WORLD ranks. Hybrid
# "M*ME": layer 1 is attention (its input norm), layer 3 MoE (its pre-MLP norm); the Mamba
# layers have no selective recomputation.
MODULE_CASES = {
    "moe_mla_dynamic_cp2": (MOE_MLA + DYNAMIC_CP2_ONLY, False, MODULE_VARIANTS),
    "moe_unpacked_pp2_mtp": ([flag for flag in MOE_MLA if flag != "--sequence-packing"]
                             + UNPACKED_PP2 + MTP, False, MOE_ONLY),
    "hybrid_moe_dynamic_cp2": (HYBRID_MOE + DYNAMIC_CP2_ONLY, True, {
        "moe_layernorm": (["moe", "layernorm"], (".layers.3.mlp.", ".layers.1.input_layernorm",
                                                 ".layers.3.pre_mlp_layernorm"))}),
    "moe_pp2_vpp2_mtp_bias_global": (MOE_MLA + PP2_VPP2 + MTP + EXPERT_BIAS + GLOBAL_AUX,
                                     False, MOE_ONLY),
}
MODULES_WORLD = 2
# The machine running the suite may be busy: a launch of 4 ranks gets this long.
TIMEOUT_S = 600
_RUNS = {}


def _run(argv: list[str], world: int, hybrid: bool) -> list[dict]:
    key = (tuple(argv), world, hybrid)
    if key not in _RUNS:
        _RUNS[key] = run_distributed(train_with_grads_on_this_rank, world, args=(argv, hybrid),
                                     timeout_s=TIMEOUT_S)
    return _RUNS[key]


def _assert_identical(case: str, off: list[dict], on: list[dict]) -> None:
    for rank_off, rank_on in zip(off, on):
        assert rank_on["history"] == rank_off["history"], (
            f"{case}: rank {rank_off['rank']} losses/grad norms differ with recomputation:\n"
            f"off {rank_off['history']}\non  {rank_on['history']}")
        assert len(rank_on["grads"]) == len(rank_off["grads"])
        for index, (g_off, g_on) in enumerate(zip(rank_off["grads"], rank_on["grads"])):
            assert torch.equal(g_off, g_on), (
                f"{case}: rank {rank_off['rank']} gradient buffer {index} differs with "
                f"recomputation (max |diff| {(g_off - g_on).abs().max().item():.3e})")
        tokens_off, tokens_on = rank_off["expert_bias_tokens"], rank_on["expert_bias_tokens"]
        assert len(tokens_on) == len(tokens_off) and all(
            torch.equal(t_off, t_on) for t_off, t_on in zip(tokens_off, tokens_on)), (
            f"{case}: rank {rank_off['rank']} expert bias token counts per step differ with "
            f"recomputation:\noff {tokens_off}\non  {tokens_on}")


@pytest.mark.parametrize("case,variant", [(case, variant) for case, spec in CASES.items()
                                          for variant in spec[4]])
def test_recompute_matches_no_recompute(case, variant):
    model, layout, world, hybrid, variants = CASES[case]
    off = _run(model + layout, world, hybrid)
    on = _run(model + layout + variants[variant], world, hybrid)
    assert all(rank["checkpoint_calls"] == 0 for rank in off)
    assert all(rank["checkpoint_calls"] > 0 for rank in on), "recomputation never ran"
    assert any(rank["owns_loss"] for rank in off)
    losses = [h["lm_loss"] for rank in off if rank["owns_loss"] for h in rank["history"]]
    assert len(set(losses)) > 1, "the losses must move for the comparison to mean something"
    _assert_identical(f"{case}/{variant}", off, on)


def _module_argv(case: str, variant: str | None) -> list[str]:
    flags, _, variants = MODULE_CASES[case]
    modules = [] if variant is None else SELECTIVE + ["--recompute-modules", *variants[variant][0]]
    return flags + modules


def _module_key(case: str, variant: str | None) -> tuple:
    return tuple(_module_argv(case, variant)), MODULES_WORLD, MODULE_CASES[case][1]


def _run_module_cases() -> None:
    """Every module case without recomputation and with each variant, in one launch (cached)."""
    keys = [_module_key(case, variant) for case, (_, _, variants) in MODULE_CASES.items()
            for variant in (None, *variants)]
    if keys[0] in _RUNS:
        return
    ranks = run_distributed(train_runs_with_grads_on_this_rank, MODULES_WORLD,
                            args=([list(argv) for argv, _, _ in keys],
                                  [hybrid for _, _, hybrid in keys]), timeout_s=TIMEOUT_S)
    for index, key in enumerate(keys):
        _RUNS[key] = [runs[index] for runs in ranks]


def _is_under(name: str, roots: tuple[str, ...]) -> bool:
    return any(root in name if root.endswith(".") else
               name.endswith(root) or f"{root}." in name for root in roots)


def _assert_recomputed(variant: str, roots: tuple[str, ...], off: list[dict],
                       on: list[dict]) -> None:
    """Exactly the modules under ``roots`` run their forward twice as often, all others as
    often as without recomputation."""
    for rank_off, rank_on in zip(off, on):
        calls_off, calls_on = rank_off["forward_calls"], rank_on["forward_calls"]
        assert calls_on.keys() == calls_off.keys()
        for root in roots:
            assert any(_is_under(name, (root,)) and calls_off[name]
                       for rank in off for name in rank["forward_calls"]), (
                f"{variant}: no module {root} ran")
        wrong = {name: (calls_off[name], calls_on[name]) for name in calls_off
                 if calls_on[name] != calls_off[name] * (2 if _is_under(name, roots) else 1)}
        assert not wrong, f"{variant}: forward calls (off, on) not as recomputed: {wrong}"


def _assert_router_state_checked(flags: list[str], off: list[dict]) -> None:
    """The expert bias was updated every step on every rank, and global_aux_loss reported:
    what _assert_identical then compares (counted once per micro-batch, as without
    recomputation) is there."""
    if "--moe-router-enable-expert-bias" in flags:
        steps = int(flags[flags.index("--train-iters") + 1])
        assert all(len(rank["expert_bias_tokens"]) == steps for rank in off)
    if "global_aux_loss" in flags:
        owner = next(rank for rank in off if rank["owns_loss"])
        assert all("global_load_balancing_loss" in step for step in owner["history"])


@pytest.mark.parametrize("case,variant", [(case, variant) for case, spec in MODULE_CASES.items()
                                          for variant in spec[2]])
def test_recompute_modules_match_no_recompute(case, variant):
    _run_module_cases()
    flags, _, variants = MODULE_CASES[case]
    off, on = _RUNS[_module_key(case, None)], _RUNS[_module_key(case, variant)]
    _assert_recomputed(f"{case}/{variant}", variants[variant][1], off, on)
    _assert_router_state_checked(flags, off)
    _assert_identical(f"{case}/{variant}", off, on)
