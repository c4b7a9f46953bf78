"""pretrain_mamba.py's flags build the model megatron-core's MambaModel describes.

The parameters of the model pretrain_mamba.py builds are counted against a count written from
Mamba-2's and megatron-core's layer definitions (MambaMixer: in-projection to z, x, B, C, dt of
``2 d_inner + 2 g n + heads`` rows without bias, depthwise conv of width 4 with bias over x, B,
C, per-head dt_bias, A_log and D, the gated RMSNorm over d_inner, the out-projection without
bias; d_inner = heads x head dim, heads = 2 h / head dim unless --mamba-num-heads; attention,
MLP and norms as in a GPT layer), and the layer types against megatron-core's own allocation
for the same ratios. Megatron-LM's flags: --mamba-state-dim n, --mamba-head-dim,
--mamba-num-groups g, --mamba-num-heads.
"""

import pytest

from megatron.varlen.mamba import triton_stand_in
from megatron.varlen_training.config.from_flags import parse_hybrid_run_config
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS

H, VOCAB = 32, 128  # TINY_GPT_ARGS: hidden 32, vocab 128 (padded 128)
# Megatron-LM's default --ffn-hidden-size: 4h; with --swiglu 8h/3 rounded down to 64s
FFN, SWIGLU_FFN = 4 * H, 64
CONV_WIDTH = 4  # MambaMixer's d_conv
BASE = TINY_GPT_ARGS + ["--train-iters", "1", "--position-embedding-type", "rope",
                        "--mamba-head-dim", "8", "--mamba-num-groups", "2",
                        "--mamba-state-dim", "16"]
CASES = {
    "default heads": (["--num-layers", "3", "--hybrid-override-pattern", "M*-"],
                      dict(heads=8, swiglu=False, bias=True, norm=2, kv=H, tied=True, ffn=FFN)),
    "explicit heads, gqa, swiglu, rmsnorm, untied": (
        ["--num-layers", "4", "--hybrid-override-pattern", "MM*-", "--mamba-num-heads", "6",
         "--swiglu", "--group-query-attention", "--num-query-groups", "2",
         "--normalization", "RMSNorm", "--disable-bias-linear",
         "--untie-embeddings-and-output-weights"],
        dict(heads=6, swiglu=True, bias=False, norm=1, kv=H // 2, tied=False,
             ffn=SWIGLU_FFN)),
    "ratios": (["--num-layers", "5", "--hybrid-attention-ratio", "0.2",
                "--hybrid-mlp-ratio", "0.4"],
               dict(heads=8, swiglu=False, bias=True, norm=2, kv=H, tied=True, ffn=FFN)),
}


def _expected_parameters(pattern: str, heads: int, swiglu: bool, bias: bool, norm: int,
                         kv: int, tied: bool, ffn: int, n: int = 16, g: int = 2,
                         head_dim: int = 8) -> int:
    d_inner = heads * head_dim
    conv_channels = d_inner + 2 * g * n
    mamba = (norm * H + H * (2 * d_inner + 2 * g * n + heads)
             + conv_channels * CONV_WIDTH + conv_channels + 3 * heads  # conv, dt_bias, A_log, D
             + d_inner + d_inner * H)  # gated RMSNorm, out-projection
    attention = norm * H + H * (H + 2 * kv) + H * H + (H + 2 * kv + H if bias else 0)
    fc1 = ffn * (2 if swiglu else 1)
    mlp = norm * H + H * fc1 + ffn * H + (fc1 + H if bias else 0)
    per_layer = {"M": mamba, "*": attention, "-": mlp}
    embeddings = VOCAB * H * (1 if tied else 2)
    return embeddings + sum(per_layer[s] for s in pattern) + norm * H  # + final norm


def _built(argv):
    """(the resolved pattern, parameters of the model pretrain_mamba.py builds)."""
    from megatron.core import parallel_state
    from megatron.varlen_training.hybrid_model import HYBRID
    from megatron.varlen_training.initialize import initialize_model_parallel, set_random_seeds

    run = parse_hybrid_run_config(argv, world_size=1)
    initialize_model_parallel(run.parallel)
    set_random_seeds(run.training.seed)
    try:
        _, chunks = HYBRID.model_provider(run)
        return (run.model.hybrid.hybrid_layer_pattern,
                sum(p.numel() for p in chunks[0].parameters()))
    finally:
        parallel_state.destroy_model_parallel()


def _all_built():
    return {name: _built(BASE + argv) for name, (argv, _) in CASES.items()}


@pytest.fixture(scope="module")
def built():
    return run_distributed(_all_built, 1, timeout_s=180)[0]


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_equal_megatron_cores_layer_definitions(built, name):
    pattern, counted = built[name]
    assert counted == _expected_parameters(pattern, **CASES[name][1]), (name, pattern)


def test_ratios_allocate_layers_as_megatron_core():
    triton_stand_in.install()
    from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers

    for layers, attention, mlp in ((5, 0.2, 0.4), (8, 0.25, 0.0), (12, 0.08, 0.5),
                                   (7, 0.0, 0.3)):
        argv = BASE + ["--num-layers", str(layers), "--hybrid-attention-ratio", str(attention),
                       "--hybrid-mlp-ratio", str(mlp)]
        pattern = parse_hybrid_run_config(argv, world_size=1).model.hybrid.hybrid_layer_pattern
        assert pattern == "".join(allocate_layers(layers, attention, mlp)), (layers, pattern)
