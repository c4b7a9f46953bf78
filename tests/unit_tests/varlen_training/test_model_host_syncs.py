"""No host sync in the forward and backward of our packed GPT, whatever the layout.

The real training path (tests/harness/training_runs.py) on 2 gloo ranks, under one
:class:`~megatron.varlen.platform.host_syncs.HostSyncGuard` per run, which on CPU treats every
tensor as device memory except the host copies of the boundaries the data path attaches (and
what is computed from them on the host): each ``.item()``, ``.tolist()``, ``nonzero``, boolean
mask, ``repeat_interleave`` without ``output_size``, ``equal``, ... of device memory is recorded
with its ``file:line`` and phase. Phases: megatron-core's ``forward_step`` (data iterator,
model, loss function) and ``backward_step`` make "forward_backward"; the rest of
``train_step`` (loss report, gradient finalisation, grad norm, clipping, Adam) is "step".

* forward and backward: no sync, in every case (packed on 1 rank and on DP2 with SFT loss
  masks, static CP2, dynamic CP2 with MTP, MoE packed and with dynamic CP, documents with
  --reset-position-ids --reset-attention-mask --eod-mask-loss), except megatron-core's MoE
  layer's own (:data:`KNOWN_MOE_SYNCS`, each with its reason);
* the rest of the step: only the syncs in :data:`KNOWN_STEP_SYNCS`, each with its reason (and
  always those in :data:`EVERY_STEP`).

Not guarded: the data path (host work by design; on CPU its samples, some from DataLoader
workers, cannot be told from device memory). That the numbers are right is the equivalence
tests' job (same code paths).
"""

import pytest

from megatron.varlen.platform.host_syncs import HostSyncGuard
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training import test_document_packing_equivalence as documents
from tests.unit_tests.varlen_training import test_moe_equivalence as moe
from tests.unit_tests.varlen_training.test_packing_equivalence import PACKED

WORLD = 2
ITERS = "2"
DYNAMIC_CP = ["--dynamic-context-parallel", "--context-parallel-size", "2",
              "--max-seqlen-per-dp-cp-rank", "32"]


def _iters(argv):
    argv = list(argv)
    argv[argv.index("--train-iters") + 1] = ITERS
    return argv


# name: argv (on 2 ranks but the first; "documents" trains on an indexed corpus of
# EOD-separated documents)
ONE_RANK = "packed_1rank"
CASES = {
    ONE_RANK: _iters(PACKED),
    "packed_dp2": _iters(PACKED),
    "static_cp2": _iters(PACKED + ["--context-parallel-size", "2"]),
    "dynamic_cp2_mtp": _iters(PACKED + DYNAMIC_CP + ["--mtp-num-layers", "1"]),
    "moe_packed_dp2": _iters(moe.GPT + moe.PACKED),
    "moe_dynamic_cp2": _iters(moe.GPT + moe.PACKED + DYNAMIC_CP),
    "documents_dp2": _iters(documents.PACKED),
}

_MEGATRON_CORE = "megatron/core/"
# (op, site): why the rest of the step reads the device. A new one fails the test (move it off
# the step or add it here with its reason).
KNOWN_STEP_SYNCS = {
    # The reported loss (training.reduce_reported_loss, its per-token mean read in
    # _per_token_mean): the iteration line needs it, once.
    ("_local_scalar_dense", "megatron/varlen_training/training.py:_per_token_mean"),
    # megatron-core's get_grad_norm_fp32 returns the total norm as a Python float
    # (total_norm.item()); optimizer_kernels.py keeps everything before it on the device.
    ("_local_scalar_dense", "megatron/core/optimizer/clip_grads.py:133"),
    # --check-for-nan-in-loss-and-grad: the ranks' MAX-reduced flags, read once so that every
    # rank takes the same decision (not with a single process).
    ("tolist", "megatron/varlen_training/nonfinite.py:_agreed"),
}
# The two that every step makes, whatever the layout.
EVERY_STEP = {
    ("_local_scalar_dense", "megatron/varlen_training/training.py:_per_token_mean"),
    ("_local_scalar_dense", "megatron/core/optimizer/clip_grads.py:133"),
}
# megatron-core 0.16.1's MoE layer without Transformer Engine (its all-to-all dispatcher and
# unfused permute), in the MoE cases' forward and backward; none is ours.
KNOWN_MOE_SYNCS = {
    # permute() without TE's fused kernel picks the routed tokens with masked_select: a real
    # sync per MoE layer on CUDA (moe_permute_fusion needs TE).
    ("masked_select", "megatron/core/transformer/moe/moe_utils.py:369"),
    ("masked_select", "megatron/core/transformer/moe/moe_utils.py:372"),
    # Reads of the routing counts. On CUDA the dispatcher first copies them to the host at its
    # D2H point (maybe_move_tensor_to_cpu, one event sync per layer, no ATen op: not seen
    # here); that copy is `tensor.is_cuda`-gated, so on CPU these reads look like device reads.
    ("tolist", "megatron/core/transformer/moe/moe_utils.py:505"),
    ("tolist", "megatron/core/transformer/moe/moe_utils.py:506"),
    ("tolist", "megatron/core/transformer/moe/moe_utils.py:508"),
    ("tolist", "megatron/core/transformer/moe/moe_utils.py:509"),
    ("tolist", "megatron/core/transformer/moe/experts.py:910"),
}


def _patch(owner, name, make):
    setattr(owner, name, make(getattr(owner, name)))


def _guard_the_step(case):
    """Runs train_step under ``case["guard"]``, forward_step/backward_step in phase
    "forward_backward", and marks each micro-batch's host copies as host memory."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.pipeline_parallel import schedules
    from megatron.varlen.model.mtp import VarlenGPTModel
    from megatron.varlen_training import training

    def in_phase(phase):
        def wrap(original):
            def run(*args, **kwargs):
                with case["guard"].phase(phase):
                    return original(*args, **kwargs)
            return run
        return wrap

    def guarded(original):
        def run(*args, **kwargs):
            with case["guard"], case["guard"].phase("step"):
                return original(*args, **kwargs)
        return run

    def marking_forward(original):
        def forward(self, *args, packed_seq_params=None, **kwargs):
            if packed_seq_params is not None:
                case["guard"].mark_host(*(getattr(packed_seq_params, name, None) for name in (
                    "host_cu_seqlens", "host_cu_seqlens_padded", "host_routed_lengths")))
            return original(self, *args, packed_seq_params=packed_seq_params, **kwargs)
        return forward

    def marking_rope(original):
        def get_emb(self, *args, **kwargs):  # its frequency table: a CPU buffer until moved
            case["guard"].mark_host(self.inv_freq)
            return original(self, *args, **kwargs)
        return get_emb

    _patch(training, "train_step", guarded)
    _patch(schedules, "forward_step", in_phase("forward_backward"))
    _patch(schedules, "backward_step", in_phase("forward_backward"))
    _patch(VarlenGPTModel, "forward", marking_forward)
    _patch(RotaryEmbedding, "get_emb", marking_rope)


def _sites(guard, phase) -> list[tuple[str, str]]:
    """[(op, where)] of ``phase``'s syncs, one entry per site: where is file:line for
    megatron-core (a pinned version), file:function for ours (lines move with every edit)."""
    return sorted({(s.op, s.site if s.site.startswith(_MEGATRON_CORE) else s.function)
                   for s in guard.syncs if s.phase == phase})


def rank_syncs(corpus_prefix, names):
    from tests.harness.training_runs import train_on_this_rank

    case, results = {}, {}
    _guard_the_step(case)
    for name in names:
        argv = CASES[name]
        case["guard"] = HostSyncGuard(emulate=True)
        if name.startswith("documents"):
            documents.train_on_corpus(argv, corpus_prefix)
        else:
            train_on_this_rank(argv)
        guard = case["guard"]
        results[name] = {phase: _sites(guard, phase) for phase in ("forward_backward", "step")}
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("corpus") / "docs")
    documents.write_corpus(prefix)
    names = [name for name in CASES if name != ONE_RANK]
    ranks = run_distributed(rank_syncs, WORLD, args=(prefix, names), timeout_s=480)
    alone = run_distributed(rank_syncs, 1, args=(prefix, [ONE_RANK]), timeout_s=240)
    for rank in ranks:
        rank.update(alone[0])  # every test below reads each case from every rank it ran on
    return ranks


@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_backward_make_no_host_sync(ranks, name):
    known = KNOWN_MOE_SYNCS if name.startswith("moe") else set()
    for rank in ranks:
        unknown = [site for site in rank[name]["forward_backward"] if site not in known]
        assert unknown == [], rank[name]["forward_backward"]


def test_the_moe_cases_see_megatron_cores_syncs(ranks):
    # The guard is awake in the forward and backward: megatron-core's unfused MoE permute syncs.
    for rank in ranks:
        for name in ("moe_packed_dp2", "moe_dynamic_cp2"):
            sites = set(rank[name]["forward_backward"])
            assert ("masked_select", "megatron/core/transformer/moe/moe_utils.py:369") in sites


@pytest.mark.parametrize("name", list(CASES))
def test_the_rest_of_the_step_syncs_only_where_known(ranks, name):
    for rank in ranks:
        sites = set(rank[name]["step"])
        assert sites <= KNOWN_STEP_SYNCS, rank[name]["step"]
        assert EVERY_STEP <= sites, rank[name]["step"]  # the guard is installed and sees them
