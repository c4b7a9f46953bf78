"""tools/sync_probe.py's site attribution (pure parts; the CUDA instruments run in tests/gpu)."""

import traceback

from tools import sync_probe


def _frame(path, line, name="f"):
    return traceback.FrameSummary(path, line, name)


CALLER = _frame("/repo/tools/benchmark_gpu.py", 347, "_sync_counts")
PROBE = _frame("/repo/tools/sync_probe.py", 90, "sync_sites")
TORCH = _frame("/venv/lib/python3.12/site-packages/torch/cuda/__init__.py", 1333, "set_mode")
OURS = _frame("/repo/megatron/varlen/packing/thd_microbatch.py", 136, "build_model_inputs")
MCORE = _frame("/tmp/site/megatron/core/optimizer/clip_grads.py", 133, "get_grad_norm_fp32")


def test_a_sync_is_attributed_to_the_innermost_frame_of_the_region_outside_torch():
    own = sync_probe._own_frames(sync_probe._region_frames([CALLER, PROBE, OURS, TORCH]))
    assert [sync_probe._site(f) for f in own] == ["megatron/varlen/packing/thd_microbatch.py:136"]
    own = sync_probe._own_frames(sync_probe._region_frames([CALLER, PROBE, MCORE, TORCH]))
    assert sync_probe._site(own[-1]) == "megatron/core/optimizer/clip_grads.py:133"


def test_a_warning_with_no_region_frame_is_the_instruments_own():
    # Raised inside sync_sites itself (only torch below it): nothing to attribute.
    assert sync_probe._own_frames(sync_probe._region_frames([CALLER, PROBE, TORCH])) == []
