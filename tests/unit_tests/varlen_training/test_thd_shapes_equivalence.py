"""Fixed THD shapes never change the numbers: packed with --pad-packed-seq-alignment,
--thd-max-packed-sequences and either --thd-tail-padding-policy == packed without them ==
the unpacked run, loss and grad norm of iterations 1-5 (fp32, dropout 0, same mock SFT data).

The cap of 2-3 sequences per rank splits micro-batches (more of them than without the cap), the
tails are dummy sequences or padding of the last sequence, and cu_seqlens carry trailing
zero-length entries: none of it may move a number.
"""

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.test_packing_equivalence import (
    NUM_ITERS, PACKED, RTOL, UNPACKED,
)

DYNAMIC_CP = ["--dynamic-context-parallel", "--context-parallel-size", "2",
              "--max-seqlen-per-dp-cp-rank", "32"]
SHAPES = {
    # every rank padded to the 32-token budget, a dummy tail sequence, <= 3 sequences a pack
    "max_dummy_dynamic_cp": (DYNAMIC_CP + ["--pad-packed-seq-alignment", "max",
                                           "--thd-max-packed-sequences", "3"], 4),
    # ranks rounded up to a multiple of 8, the tail as padding of the last sequence, <= 2
    "aligned_extend_last_cp2": (["--context-parallel-size", "2",
                                 "--pad-packed-seq-alignment", "8",
                                 "--thd-tail-padding-policy", "extend_last",
                                 "--thd-max-packed-sequences", "2"], 4),
}


def _history(argv, world):
    return loss_owner_history(run_distributed(train_on_this_rank, world, args=(argv,),
                                              timeout_s=300))


def _assert_close(got, ref, what):
    assert len(got) == len(ref) == NUM_ITERS
    for it, (g, r) in enumerate(zip(got, ref), start=1):
        for key in ("lm_loss", "grad_norm"):
            assert abs(g[key] - r[key]) <= RTOL * abs(r[key]), (
                f"{what} iteration {it} {key}: {g[key]!r} vs {r[key]!r}")


@pytest.fixture(scope="module")
def unpacked():
    return _history(UNPACKED, 2)


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_fixed_shapes_match_packed_and_unpacked(unpacked, case):
    extra, world = SHAPES[case]
    shaped = _history(PACKED + extra, world)
    plain = _history(PACKED + _without_shape_flags(extra), world)
    _assert_close(shaped, plain, f"{case} vs packed without fixed shapes")
    _assert_close(shaped, unpacked, f"{case} vs unpacked")
    assert len({h["lm_loss"] for h in shaped}) == NUM_ITERS  # the run trains


def _without_shape_flags(argv):
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg.startswith(("--pad-packed", "--thd-")):
            skip = True
        else:
            out.append(arg)
    return out
