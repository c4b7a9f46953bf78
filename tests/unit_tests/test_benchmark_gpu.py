"""The GPU benchmark's pure parts on CPU: flags, arithmetic, sync counting, report, reference.

The measurements themselves need a GPU (`python tools/benchmark_gpu.py`); a CPU smoke run of
the whole tool is `python tools/benchmark_gpu.py --device cpu --tiny --iters 2 --warmup 1`.
"""

import json

import pytest
import torch

from megatron.varlen_training.arguments import parse_args
from tools import benchmark_gpu as bench
from tools.sync_probe import count_sync_events


@pytest.mark.parametrize("config", ["packed", "padded"])
def test_megatron_flags_are_accepted_for_the_issue_shape(config):
    args = parse_args(bench.megatron_argv(bench.Shape(), config, 10, "cuda"), world_size=1)
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (12, 1024, 16)
    assert args.bf16 and args.vocab_size == 32000 and args.global_batch_size == 32
    if config == "packed":
        assert args.sequence_packing and args.max_seqlen_per_dp_cp_rank == 8192
    else:  # the same token budget per micro-batch: 2 samples padded to 4096
        assert not args.sequence_packing and args.micro_batch_size * args.seq_length == 8192


def test_peak_table_and_mfu_arithmetic():
    assert bench.bf16_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert bench.bf16_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert bench.bf16_peak_tflops("NVIDIA H200") == 989.0
    assert bench.bf16_peak_tflops("Some Future GPU") is None
    summary = bench.summarise([2.0, 2.0], [1000, 3000], [4e15, 6e15], peak_tflops=1000.0)
    assert summary["tokens_per_s"] == 1000.0  # totals over totals
    assert summary["tflops_per_gpu"] == pytest.approx(2500.0)
    assert summary["mfu"] == pytest.approx(2.5)
    assert bench.summarise([1.0], [1], [1e12], None)["mfu"] is None


def test_sync_events_are_device_to_host_copies_and_synchronize_calls():
    names = ["Memcpy DtoH (Device -> Pageable)", "Memcpy HtoD (Pinned -> Device)",
             "cudaStreamSynchronize", "aten::mm", "cudaMemcpyAsync", "cudaDeviceSynchronize"]
    assert count_sync_events(names) == 3


def test_report_has_rows_ratios_sites_and_errors():
    ok = {"tokens_per_s": 200000.0, "tflops_per_gpu": 250.0, "mfu": 0.25,
          "syncs_forward_backward": 0, "syncs_step": 4, "peak_memory_gib": 30.0,
          "sync_sites": [["megatron/core/optimizer/clip_grads.py:133", 1]]}
    results = {"packed": ok, "padded": {**ok, "tokens_per_s": 40000.0},
               "reference": {"error": "timed out after 900 s"}}
    meta = {"device": "NVIDIA H100", "torch": "2.11.0+cu130", "date": "2026-11-26"}
    report = bench.render_report(meta, {"184m": (bench.Shape(), results),
                                        "1.3b": (bench.SIZES["1.3b"], {"packed": ok})},
                                 "python tools/x.py")
    assert "torch 2.11.0+cu130" in report and "## 184m" in report and "## 1.3b" in report
    assert "| packed | 200,000 | 250.0 | 25.0% | 0 / 4 | 30.0 | ok |" in report
    assert "| packed / padded | 5.00x |" in report
    assert "timed out after 900 s" in report and "reference |" in report
    assert "packed / plain-PyTorch reference" not in report  # no ratio against a failed run
    assert "`megatron/core/optimizer/clip_grads.py:133` x1" in report


def test_sizes_are_the_issue_classes():
    billions = {name: shape.params / 1e9 for name, shape in bench.SIZES.items()}
    assert billions["184m"] == pytest.approx(0.184, abs=0.01)
    assert billions["1.3b"] == pytest.approx(1.27, abs=0.03)
    assert 2.5 <= billions["2.8b"] <= 2.9


def test_greedy_packs_respect_the_budget_and_keep_order():
    assert bench.greedy_packs([5, 4, 3, 9, 1], budget=9) == [[5, 4], [3], [9], [1]]


def test_reference_gpt_trains_on_cpu_with_the_kernel_twin():
    shape = bench.TINY
    torch.manual_seed(0)
    model = bench.build_reference_gpt(shape, "cpu")
    lengths = [5, 1, 9]
    tokens = torch.randint(0, shape.vocab_size, (sum(lengths),))
    positions = torch.cat([torch.arange(n) for n in lengths])
    cu = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    loss = model(tokens, positions, cu, 9, tokens)
    loss.backward()
    assert torch.isfinite(loss) and model.embed.weight.grad.abs().sum() > 0
    # Causal and per-sequence: a token of sequence 2 does not change sequence 0's loss.
    def per_token(t):
        x = model.embed(t)
        for block in model.blocks:
            x = block(x, positions, cu, 9)
        return x
    changed = tokens.clone()
    changed[10] = (changed[10] + 1) % shape.vocab_size
    assert torch.allclose(per_token(tokens)[:6], per_token(changed)[:6])


def test_missing_dependencies_are_named():
    assert bench.missing_modules() == []
    assert bench.missing_modules(("numpy", "no_such_module_xyz", "no_such_pkg.sub")) == [
        "no_such_module_xyz", "no_such_pkg.sub"]


def test_configurations_run_packed_then_reference_then_padded_each_with_its_timeout(
        tmp_path, monkeypatch):
    """Whatever order --configs names them; results.json already holds the packed / reference
    ratio while padded runs (a run cut there keeps it)."""
    launched = []

    def fake_launch(config, size, cli, result_path):
        if config == "padded":
            saved = json.loads((tmp_path / "results.json").read_text())
            assert set(saved["sizes"]["tiny"]["results"]) == {"packed", "reference"}
        launched.append((config, cli.timeouts[config]))
        return {"tokens_per_s": 1.0, "tflops_per_gpu": 1.0, "mfu": None, "peak_memory_gib": 1.0,
                "syncs_forward_backward": 0, "syncs_step": 2}

    monkeypatch.setattr(bench, "_launch", fake_launch)
    assert bench.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--configs",
                       "padded,packed,reference,packed", "--timeout", "padded=91,packed=55"]) == 0
    assert launched == [("packed", 55), ("reference", bench.WORKER_TIMEOUT_S), ("padded", 91)]
    assert "| packed / plain-PyTorch reference | 1.00x |" in (tmp_path / "REPORT.md").read_text()


def test_timeouts_are_one_number_or_one_per_configuration():
    assert bench.parse_timeouts("90") == dict.fromkeys(bench.CONFIGS, 90)
    assert bench.parse_timeouts("reference=41")["reference"] == 41
    for bad in ("packd=3", "packed=0", "packed=1.5", "-4"):
        with pytest.raises(ValueError, match=f"--timeout {bad}: give whole seconds"):
            bench.parse_timeouts(bad)
