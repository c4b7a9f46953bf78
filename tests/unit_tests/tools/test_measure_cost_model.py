"""tools/measure_cost_model.py's arithmetic against synthetic measurements with known answers,
its profile read back by the scheduler's cost model, and a CPU smoke run of the tool."""

import json
import sys

import pytest

from megatron.varlen.scheduling.cost_model import (
    H100_NVLINK, CostModel, load_hardware_profile, resolve_hardware_profile,
)
from tools import measure_cost_model as tool
from tools.benchmark_gpu import SIZES

ALPHA, BETA, GAMMA = 2e-11, 3e-7, 4e-4  # seconds per pair, per token, per micro-batch
TOOL_TIMEOUT_S = 240  # the CPU smoke run's limit


def _synthetic(alpha=ALPHA, beta=BETA, gamma=GAMMA):
    return [(pack, alpha * sum(n * n for n in pack) + beta * sum(pack) + gamma)
            for pack in tool.pack_shapes()]


def test_pack_shapes_separate_the_quadratic_from_the_linear_term():
    shapes = tool.pack_shapes()
    assert all(sum(p) in tool.TOKEN_COUNTS for p in shapes)
    for total in tool.TOKEN_COUNTS:
        squares = [sum(n * n for n in p) for p in shapes if sum(p) == total]
        assert max(squares) / min(squares) >= 32


def test_fit_recovers_known_coefficients():
    result = tool.fit(_synthetic())
    assert result["alpha_s_per_pair"] == pytest.approx(ALPHA, rel=1e-6)
    assert result["beta_s_per_token"] == pytest.approx(BETA, rel=1e-6)
    assert result["gamma_s"] == pytest.approx(GAMMA, rel=1e-4)
    assert result["r2"] == pytest.approx(1.0) and result["max_relative_residual"] < 1e-6


def test_profile_rates_and_the_analytic_comparison():
    shape = SIZES["184m"]
    doc = tool.profile_document(shape, "Test GPU", "2.x", _synthetic())
    h = shape.hidden_size
    assert doc["attention_flops_per_s"] == pytest.approx(12 * h * shape.num_layers / ALPHA,
                                                         rel=1e-6)
    assert doc["linear_to_attention_ratio"] == pytest.approx(BETA / ALPHA / h, rel=1e-6)
    assert doc["p2p_measured"] is False
    # Times made by the analytic model itself: it predicts them exactly.
    analytic = CostModel.for_model(h, H100_NVLINK)
    exact = [(p, 1e-12 * (analytic.a * sum(n * n for n in p) + analytic.b * sum(p)))
             for p in tool.pack_shapes()]
    assert tool.analytic_error(exact, analytic)["max_relative_error"] < 1e-9
    assert tool.analytic_error(_synthetic(), analytic)["max_relative_error"] > 0.05


def test_a_fit_without_a_quadratic_term_is_refused():
    with pytest.raises(ValueError, match="not a cost model"):
        tool.profile_document(SIZES["184m"], "cpu", "2.x", _synthetic(alpha=-1e-12))


def test_profile_file_drives_the_cost_model(tmp_path):
    shape = SIZES["184m"]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(tool.profile_document(shape, "Test GPU", "2.x", _synthetic())))
    profile = load_hardware_profile(str(path))
    assert resolve_hardware_profile(str(path)) == profile
    cost = CostModel.for_model(shape.hidden_size, str(path))
    assert cost.b / cost.a == pytest.approx(BETA / ALPHA, rel=1e-6)  # the measured ratio
    # The ring's bandwidth is h100_nvlink's; in attention units it scales with the rate.
    assert cost.g == pytest.approx(CostModel.for_model(shape.hidden_size, H100_NVLINK).g * (
        profile.attention_flops_per_s / H100_NVLINK.attention_flops_per_s), rel=1e-12)


@pytest.mark.parametrize("content, message", [
    ("not json", "cannot read a JSON profile"),
    ("[1]", "expected a JSON object"),
    ('{"attention_flops_per_s": 1}', "missing p2p_bytes_per_s"),
    ('{"attention_flops_per_s": -1, "p2p_bytes_per_s": 1, "p2p_latency_s": 0, '
     '"linear_to_attention_ratio": 6}', "attention_flops_per_s=-1 must be a positive"),
])
def test_bad_profile_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "profile.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as error:
        load_hardware_profile(str(path))
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_tool_runs_on_cpu(gpu_check_cpu_dry_run):
    """The whole tool on a tiny model: a profile, or (CPU timings are mostly overhead) the
    one-line refusal of a fit that is not a cost model. The run is the cost part of
    tools/gpu_check.py's CPU dry run (the same command; tests/unit_tests/tools/conftest.py)."""
    dry_run = gpu_check_cpu_dry_run
    words = next(line for line in dry_run.proc.stdout.splitlines()
                 if line.startswith("=== cost ")).split(": ", 1)[1].split()
    del words[words.index("--out") + 1]  # gpu_check's scratch file
    assert words == [sys.executable, "tools/measure_cost_model.py", "--device", "cpu", "--out",
                     "--tiny", "--reps", "1"], words
    status, seconds = dry_run.part("cost")
    assert seconds <= TOOL_TIMEOUT_S, (status, seconds)
    log = (dry_run.out / "cost.log").read_text()
    if status == "ok":
        profile = dry_run.out / "hardware_profile.json"
        assert load_hardware_profile(str(profile)).attention_flops_per_s > 0
    else:
        # One line, no traceback (the log holds stdout and stderr together, so the line may
        # share its row with the tool's own progress output).
        errors = [line for line in log.splitlines() if "measure_cost_model.py: error: " in line]
        assert status == "failed (2)", (status, log[-2000:])
        assert len(errors) == 1 and "measure_cost_model.py: error: the fit gave" in errors[0], \
            log[-2000:]
        assert "Traceback" not in log, log[-2000:]
