"""--multi-latent-attention: megatron-core's MLASelfAttention with this fork's THD core attention.

* One MLA layer (packed THD input, four sequences, padded) equals a float64 re-computation from
  its own weights (tests/unit_tests/varlen/attention/mla_reference.py: down/up projections,
  latent norms, the plain/rotated split, YaRN or RoPE, the mscale'd softmax scale), with and
  without query compression.
* Tiny MLA GPTs train the same losses and grad norms packed as unpacked (float32 rounding, DP 2):
  RoPE with query compression and latent norms; MoE + MLA with YaRN and no query compression;
  MTP with MLA. The flash backend (its kernel takes one head width: the values are zero-padded)
  trains like the local one; TP 2 (sequence parallel), PP 2, static CP 2 and dynamic CP like
  DP 2.
* An MLA checkpoint (dist_checkpointing) resumes the straight run; run_args.json refuses a
  resume with another MLA shape.
* The flags: Megatron-LM's refusals in one line.

One two-rank launch runs the layer checks and the trainings (data parallel 2 throughout).
"""

import pytest
import torch

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, loss_owner_history
from tests.unit_tests.varlen.attention import mla_reference
from tools.probe_combinations import cell_argv

RTOL = 1e-5  # packed vs unpacked, float32 training
LAYER_RTOL = 1e-6  # float64 layer vs float64 reference (megatron-core's RoPE table is float32)
LAUNCH_TIMEOUT_S = 300
SAVED_AT = 1  # the resume check saves after this iteration of the three
REAL_LENGTHS, PAD_MULTIPLE = [7, 16, 33, 1], 4
HIDDEN, HEADS = 32, 4
# Small, all different: a mix-up of any two widths breaks a shape or the numbers.
SHAPE = dict(kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=6)
YARN_FACTOR, MSCALE, MSCALE_ALL_DIM = 4.0, 1.0, 0.5
MLA = ["--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "8",
       "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6"]
YARN = ["--rotary-scaling-factor", str(YARN_FACTOR), "--mscale-all-dim", str(MSCALE_ALL_DIM)]
Q_LORA = ["--q-lora-rank", "12", "--rope-type", "rope", "--qk-layernorm",
          "--normalization", "RMSNorm"]
FLASH = ["--attention-backend", "flash"]
SGD = ["--optimizer", "sgd", "--lr", "0.5"]
WORLD = 2  # data parallel 2 everywhere, tensor parallel 2 for the TP check
# name: (feature of tools/probe_combinations.py, extra flags); each trained unpacked and packed
RUNS = {
    "q_lora": ("dense", MLA + Q_LORA),
    "moe": ("moe", MLA + YARN),  # YaRN (no query compression) with MoE layers
    "mtp": ("mtp1", MLA + Q_LORA),  # the MTP depth's layer is an MLA layer too
}


# ---------------------------------------------------------------- the layer vs float64


def _layer_config(q_lora_rank, rope_type):
    from megatron.core.transformer import MLATransformerConfig

    return MLATransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, q_lora_rank=q_lora_rank,
        rope_type=rope_type, rotary_scaling_factor=YARN_FACTOR, mscale=MSCALE,
        mscale_all_dim=MSCALE_ALL_DIM, params_dtype=torch.float64, use_cpu_initialization=True,
        normalization="RMSNorm", attention_dropout=0.0, hidden_dropout=0.0,
        add_bias_linear=False, **SHAPE)


def _weights(attention) -> dict:
    weights = {"kv_down": attention.linear_kv_down_proj.weight,
               "kv_norm": attention.kv_layernorm.weight,
               "kv_up": attention.linear_kv_up_proj.weight,
               "proj": attention.linear_proj.weight}
    if attention.config.q_lora_rank is None:
        weights["q"] = attention.linear_q_proj.weight
    else:
        weights.update(q_down=attention.linear_q_down_proj.weight,
                       q_up=attention.linear_q_up_proj.weight,
                       q_norm=attention.q_layernorm.weight)
    return {name: weight.detach() for name, weight in weights.items()}


def _reference_shape(config) -> dict:
    dim = config.qk_pos_emb_head_dim
    if config.rope_type == "yarn":
        inv_freq = mla_reference.yarn_inverse_frequencies(
            dim, config.rotary_base, YARN_FACTOR, config.original_max_position_embeddings,
            config.beta_fast, config.beta_slow)
        rope_scale = (mla_reference.yarn_get_mscale(YARN_FACTOR, MSCALE)
                      / mla_reference.yarn_get_mscale(YARN_FACTOR, MSCALE_ALL_DIM))
    else:
        inv_freq, rope_scale = mla_reference.rope_inverse_frequencies(dim, config.rotary_base), 1.0
    # megatron-core's MLA scales the softmax by YaRN's mscale(factor, mscale_all_dim)^2 with
    # either rope type (DeepSeek's code does where its config has rope scaling)
    attention_scale = mla_reference.yarn_get_mscale(YARN_FACTOR, MSCALE_ALL_DIM) ** 2
    return dict(heads=HEADS, eps=config.layernorm_epsilon, inv_freq=inv_freq,
                rope_scale=rope_scale,
                softmax_scale=attention_scale / (config.qk_head_dim + dim) ** 0.5, **SHAPE)


def _packed_params():
    from megatron.core.packed_seq_params import PackedSeqParams

    padded = [-(-length // PAD_MULTIPLE) * PAD_MULTIPLE for length in REAL_LENGTHS]
    bounds = lambda lengths: torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()],
                                          dtype=torch.int32)
    # local_cp_size 1, as the packing layer sets it: MLA must take it (megatron-core asserts
    # None, its refusal of dynamic CP).
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=bounds(REAL_LENGTHS),
                           cu_seqlens_kv=bounds(REAL_LENGTHS), cu_seqlens_q_padded=bounds(padded),
                           cu_seqlens_kv_padded=bounds(padded), max_seqlen_q=max(padded),
                           max_seqlen_kv=max(padded), local_cp_size=1), padded


def _layer_error(q_lora_rank, rope_type) -> float:
    """Max relative error of the packed layer's real rows against the float64 reference."""
    from megatron.core.transformer.spec_utils import build_module
    from megatron.varlen.model.spec import get_varlen_gpt_layer_spec

    config = _layer_config(q_lora_rank, rope_type)
    spec = get_varlen_gpt_layer_spec(normalization="RMSNorm", attention_backend="local",
                                     qk_layernorm=True, multi_latent_attention=True)
    torch.manual_seed(3)
    attention = build_module(spec.submodules.self_attention, config=config,
                             layer_number=1).double()
    for name, param in attention.named_parameters():  # latent norms off 1: they count too
        if "layernorm" in name:
            torch.nn.init.uniform_(param, 0.5, 1.5)
    params, padded = _packed_params()
    hidden = torch.randn(sum(padded), 1, HIDDEN, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out, _ = attention(hidden, attention_mask=None, packed_seq_params=params)
    real_rows = torch.cat([torch.arange(start, start + real) for start, real in
                           zip(params.cu_seqlens_q_padded[:-1].tolist(), REAL_LENGTHS)])
    want = mla_reference.mla_layer_reference(hidden[:, 0], _weights(attention),
                                             _reference_shape(config), REAL_LENGTHS, padded)
    got = out[real_rows, 0]
    return float(((got - want).abs().max() / want.abs().max()))


def _layer_errors() -> dict:
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel()
    try:
        return {"yarn": _layer_error(None, "yarn"), "q_lora": _layer_error(12, "rope")}
    finally:
        parallel_state.destroy_model_parallel()


# ---------------------------------------------------------------- trainings


def _train(argv: list[str]) -> dict:
    from tests.harness.training_runs import train_on_this_rank

    result = train_on_this_rank(argv)
    history = [{key: step[key] for key in ("lm_loss", "grad_norm")}
               for step in result["history"]]
    return {**result, "history": history}


def _launch(plan: dict) -> dict:
    return {"layer": _layer_errors(), **{name: _train(argv) for name, argv in plan.items()}}


def _resume_plan(folder: str) -> dict:
    """The packed "q_lora" run's three iterations as SAVED_AT + a dist_checkpointing save +
    load + the rest (the plan's order is the launch's: after the straight run)."""
    argv = _argv("dense", "p_dp2") + MLA + Q_LORA + ["--lr-decay-iters", "3"]  # not by the stop
    return {"resume first": argv + ["--train-iters", str(SAVED_AT), "--save", folder],
            "resume rest": argv + ["--load", folder]}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    plan = {}
    for name, (feature, extra) in RUNS.items():
        for layout in ("u_dp2", "p_dp2"):
            plan[f"{name} {layout}"] = _argv(feature, layout) + extra
    plan["flash p_dp2"] = _argv("dense", "p_dp2") + MLA + Q_LORA + FLASH
    plan["q_lora p_pp2"] = _argv("dense", "p_pp2") + MLA + Q_LORA
    for layout in ("p_cp2", "d_dp2"):  # static CP 2; dynamic CP (groups of 1 and 2 ranks)
        plan[f"q_lora {layout}"] = _argv("dense", layout) + MLA + Q_LORA
    for layout in ("p_dp2", "p_tp2_sp"):
        plan[f"tp {layout}"] = _argv("dense", layout) + MLA + Q_LORA + SGD
    plan.update(_resume_plan(str(tmp_path_factory.mktemp("mla_checkpoint"))))
    ranks = run_distributed(_launch, WORLD, args=(plan,), timeout_s=LAUNCH_TIMEOUT_S)
    return {"layer": ranks[0]["layer"],
            **{name: loss_owner_history([rank[name] for rank in ranks]) for name in plan}}


def _argv(feature: str, layout: str) -> list[str]:
    argv, world, _ = cell_argv(feature, layout, "none")
    assert world == WORLD
    return argv


@pytest.mark.parametrize("case", ["yarn", "q_lora"])
def test_mla_layer_equals_a_float64_recomputation(results, case):
    assert results["layer"][case] < LAYER_RTOL, results["layer"]


def _assert_same_history(got: list[dict], want: list[dict], what: str) -> None:
    assert len(got) == len(want) == 3
    for it, (mine, theirs) in enumerate(zip(got, want), start=1):
        for key in ("lm_loss", "grad_norm"):
            assert mine[key] == pytest.approx(theirs[key], rel=RTOL), (what, it, key)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_packed_mla_trains_like_unpacked(results, name):
    _assert_same_history(results[f"{name} p_dp2"], results[f"{name} u_dp2"], name)


@pytest.mark.parametrize("layout", ["p_pp2", "p_cp2", "d_dp2"])
def test_pipeline_and_context_parallel_mla_train_like_data_parallel(results, layout):
    """PP 2, static CP 2 and dynamic CP (each long sequence split in 2 x 2 chunks over its
    micro-batch's group, MLA's RoPE at the chunks' global positions on that group, keys and
    values all-gathered over it) == DP 2."""
    _assert_same_history(results[f"q_lora {layout}"], results["q_lora p_dp2"], layout)


def test_flash_backend_trains_mla_like_the_local_one(results):
    """The flash backend's kernel takes one head width: MLA's narrower values are zero-padded
    to the query/key width and the output sliced (flash_attention.py)."""
    _assert_same_history(results["flash p_dp2"], results["q_lora p_dp2"], "flash")


def test_tensor_parallel_mla_trains_like_data_parallel(results):
    """TP 2 with sequence parallelism (MLA's down-projections column-parallel, gathered, the
    latents re-scattered) == TP 1, on the query-compressed model with latent norms. SGD: Adam's
    first steps turn float32 noise in near-zero gradients (the first layer's norm weight here)
    into steps of the full learning rate, which would test Adam, not the layout."""
    _assert_same_history(results["tp p_tp2_sp"], results["tp p_dp2"], "TP 2")


def test_mla_checkpoint_resumes_the_same_training(results):
    """An MLA model (its latent projections and norms) saved with dist_checkpointing after
    iteration 1 and loaded trains iterations 2 and 3 as the straight run does."""
    first, rest = results["resume first"], results["resume rest"]
    assert (len(first), len(rest)) == (SAVED_AT, 3 - SAVED_AT)
    _assert_same_history(first + rest, results["q_lora p_dp2"], "resumed")


def test_resume_with_another_mla_shape_is_refused(tmp_path):
    """run_args.json records the MLA shape: a resume that changes it (or turns MLA off) is one
    line; a checkpoint from before the keys were recorded had no MLA."""
    import json

    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_keys import RUN_ARGS_FILENAME
    from megatron.varlen_training.resume.run_args_record import save_run_args

    run = lambda extra: parse_run_config(BASE + extra, world_size=1)
    save_run_args(str(tmp_path), run(MLA))
    assert check_run_args(str(tmp_path), run(MLA), check_data=False) is None
    for extra, needle in ((MLA + ["--v-head-dim", "8"], "--v-head-dim 6, this run has 8"),
                          (MLA + ["--q-lora-rank", "4"], "--q-lora-rank None, this run has 4"),
                          ([], "--multi-latent-attention True, this run has False")):
        with pytest.raises(CheckpointError, match=needle) as err:
            check_run_args(str(tmp_path), run(extra), check_data=False)
        assert "\n" not in str(err.value)
    path = tmp_path / RUN_ARGS_FILENAME
    recorded = {key: value for key, value in json.loads(path.read_text()).items()
                if key not in ("multi_latent_attention", "q_lora_rank", "kv_lora_rank",
                               "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "rope_type",
                               "rotary_scaling_factor", "mscale", "mscale_all_dim")}
    path.write_text(json.dumps(recorded))
    assert check_run_args(str(tmp_path), run([]), check_data=False) is None


def test_the_mla_runs_differ_from_one_another(results):
    """Each flag set builds another model (a flag that changed nothing would pass the
    equivalence above vacuously)."""
    first = {name: tuple(results[f"{name} u_dp2"][0].values()) for name in RUNS}
    assert len(set(first.values())) == len(first), first


# ---------------------------------------------------------------- flags

BASE = TINY_GPT_ARGS + ["--train-iters", "2"]


@pytest.mark.parametrize("extra, needle", [
    (MLA + ["--group-query-attention"], "mutually exclusive"),
    (MLA + ["--qk-pos-emb-head-dim", "3"], "--qk-pos-emb-head-dim 3 must be even"),
    (["--q-lora-rank", "8"], "--q-lora-rank 8 needs --multi-latent-attention"),
    (["--rope-type", "yarn"], "--rope-type yarn is not supported"),
    (MLA + ["--cache-mla-latents"], "--cache-mla-latents is not supported"),
    (MLA + ["--mla-down-proj-fusion"], "--mla-down-proj-fusion is not supported"),
    (["--yarn-beta-fast", "16"], "--yarn-beta-fast 16.0 is not supported"),
    (["--no-yarn-correction-range-round-to-int"],
     "--no-yarn-correction-range-round-to-int is not supported"),
])
def test_mla_flag_refusals_are_one_line(extra, needle):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(BASE + extra, world_size=2)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_rope_type_defaults_to_yarn_with_mla():
    """Megatron-LM leaves an unset --rope-type to MLATransformerConfig: yarn."""
    assert parse_args(BASE + MLA, world_size=1).rope_type == "yarn"
    assert parse_args(BASE + MLA + ["--rope-type", "rope"], world_size=1).rope_type == "rope"
    assert parse_args(BASE, world_size=1).rope_type is None


# ---------------------------------------------------------------- the scheduler's cost model


def test_scheduler_cost_model_weighs_mla_widths():
    """The packing scheduler's quadratic coefficient follows MLA's core attention (per pair:
    n (d + r) for QK^T plus n e for AV, against a standard layer's 2 h), its linear one MLA's
    projections against a standard layer's 4 h^2 (+ the same MLP), counted here by hand for
    the shape of :data:`MLA` (h 32, n 4, d 8, r 4, e 6, c 16, MLP 4h, no q compression)."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.data import build_packing_config

    packed = ["--micro-batch-size", "1", "--sequence-packing"]
    costs = {name: build_packing_config(parse_run_config(BASE + packed + extra,
                                                         world_size=1), pad_id=0).cost
             for name, extra in (("standard", []), ("mla", MLA))}
    assert costs["standard"].a == 1.0
    assert costs["mla"].a == pytest.approx((4 * (8 + 4) + 4 * 6) / (2 * 32))
    h, mlp = 32, 2 * 32 * 128
    mla_projections = h * 4 * 12 + 16 * (h + 4 * (8 + 6) + 1) + h * 4 + 4 * 6 * h
    assert costs["mla"].b / costs["standard"].b == pytest.approx(
        (mla_projections + mlp) / (4 * h * h + mlp))


def test_dynamic_cp_with_transformer_engine_attention_is_refused(monkeypatch):
    """TE's attention takes its CP group from the micro-batch's params, which MLA must not
    carry: with TE (resolved as the backend, stood in for here: no TE on CPU) dynamic CP is
    one line, static CP runs."""
    from megatron.varlen_training import mla_arguments

    monkeypatch.setattr(mla_arguments, "attention_backend", lambda args: "te")
    dynamic = BASE + MLA + ["--micro-batch-size", "1", "--sequence-packing",
                            "--dynamic-context-parallel", "--max-seqlen-per-dp-cp-rank", "32",
                            "--calculate-per-token-loss"]
    with pytest.raises(ArgumentValidationError, match="needs --attention-backend local or flash"):
        mla_arguments.validate_mla_args(parse_args(dynamic, world_size=2),
                                        _raise_argument_error)
    static = parse_args(BASE + MLA + ["--context-parallel-size", "2"], world_size=2)
    mla_arguments.validate_mla_args(static, _raise_argument_error)


def _raise_argument_error(condition: bool, message: str) -> None:
    if not condition:
        raise ArgumentValidationError(message)


def test_mla_is_refused_where_it_is_not_built():
    """pretrain_mamba.py's attention layers are standard attention, and the Hugging Face export
    writes MLA only as DeepSeek-V3 (MoE layers needed): one line, never a silently standard
    model."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.hybrid_arguments import parse_hybrid_args

    hybrid = BASE + ["--num-layers", "3", "--hybrid-override-pattern", "M*-",
                     "--mamba-head-dim", "8", "--mamba-num-groups", "2",
                     "--mamba-state-dim", "8"]
    with pytest.raises(ArgumentValidationError, match="not supported by pretrain_mamba.py"):
        parse_hybrid_args(hybrid + MLA, world_size=1)
    llama = ["--position-embedding-type", "rope", "--swiglu", "--normalization", "RMSNorm",
             "--disable-bias-linear", "--save-hf", "/nonexistent/out"]
    with pytest.raises(ArgumentValidationError,
                       match=r"--multi-latent-attention to Hugging Face \(DeepSeek-V3\) needs MoE"):
        parse_run_config(BASE + llama + MLA, world_size=1)
