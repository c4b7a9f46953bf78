"""What Megatron-LM writes, where and when, against its facts (core_v0.16.1, read as facts):

- TensorBoard / wandb: ``training_log`` writes its own scalars every
  ``--tensorboard-log-interval`` iterations, but calls megatron-core's ``track_moe_metrics`` and
  ``MTPLossLoggingHelper.track_mtp_metrics`` with its writers EVERY iteration: the MoE losses
  (per layer too) and the MTP losses are written at each step. Read back from the event files
  and wandb's offline run.
- The theoretical memory footprint (``theoretical_memory_usage.py``): the bytes are counted here
  by hand, term by term, for tiny configs (dense, MoE with a shared expert and MTP, TP with
  sequence parallel and selective recompute, PP with fewer micro-batches than stages, VPP),
  never taken from the module under test; and it is printed with the first memory reports, on
  Megatron-LM's ``report_memory_flag`` schedule.
"""

import pytest

from tests.harness.training_runs import TINY_GPT_ARGS
from tests.harness.wandb_offline import offline_history
from megatron.varlen_training import device_memory, theoretical_memory
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.iteration_metrics import IterationMetrics, to_json_record
from megatron.varlen_training.metric_writers import TensorBoardMetricWriter, WandbMetricWriter

ITERATIONS = (1, 2, 3, 4)
TB_INTERVAL = 2
EVERY_ITERATION = ("load_balancing_loss", "z_loss", "mtp_1 loss", "moe/z_loss_layer_1")


def _record(iteration: int) -> dict:
    metrics = IterationMetrics(
        iteration=iteration, train_iters=len(ITERATIONS), consumed_samples=4 * iteration,
        step_time_s=0.5, learning_rate=1e-3, global_batch_size=4, lm_loss=4.0 - iteration / 8,
        grad_norm=0.5, num_microbatches=1, tokens=64, seqlen_sum=64, seqlen_squared_sum=2048,
        flops=10**9, world_size=1,
        losses={"load_balancing_loss": 1.0 + iteration, "z_loss": 0.1 * iteration,
                "mtp_1 loss": 3.0 + iteration},
        scalars={"moe/z_loss_layer_1": 0.2 * iteration})
    return to_json_record(metrics)


def _tensorboard_scalars(log_dir) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [event.step for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_moe_and_mtp_losses_are_written_every_iteration(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    writers = [TensorBoardMetricWriter(tmp_path / "tb", interval=TB_INTERVAL),
               WandbMetricWriter("p", save_dir=str(tmp_path / "wandb"), interval=TB_INTERVAL)]
    for writer in writers:
        for iteration in ITERATIONS:
            writer.write(iteration, _record(iteration))
        writer.close()
    due = [i for i in ITERATIONS if i % TB_INTERVAL == 0]  # Megatron-LM's own scalars
    tb = _tensorboard_scalars(tmp_path / "tb")
    wandb_rows = offline_history(str(tmp_path / "wandb"))
    for name in EVERY_ITERATION:
        assert tb[name] == list(ITERATIONS), name
        assert [i for i in ITERATIONS if name in wandb_rows.get(i, {})] == list(ITERATIONS)
    for name in ("lm loss", "learning-rate", "grad-norm", "lm_loss"):
        assert tb[name] == due, name
        assert [i for i in ITERATIONS if name in wandb_rows.get(i, {})] == due, name
    assert wandb_rows[3]["mtp_1 loss"] == 6.0 and wandb_rows[1]["z_loss"] == 0.1


# --- theoretical memory ----------------------------------------------------------------------

H, FFN, SEQ, MBS, VOCAB, LAYERS = 32, 128, 32, 2, 128, 2  # TINY_GPT_ARGS' model
TOKENS = SEQ * MBS
ATTENTION = 2 * H * H * (1 + 4 / 4) * 1  # q, k, v, o: 4 h^2 with one group per head
LAYER_NORM = 2  # LayerNorm's weight and bias, per norm (Megatron-LM's count)
DENSE_LAYER = 2 * H * (FFN + LAYER_NORM) + ATTENTION
BLOCK = LAYERS * DENSE_LAYER + LAYER_NORM * H  # + the final norm
EMBEDDING = H * VOCAB


def _run(extra: list[str], world: int = 1):
    return parse_run_config(TINY_GPT_ARGS + ["--train-iters", "2"] + extra, world_size=world)


def _no_sp_activations(layers: int, tp: int, pp: int, in_flight: float) -> float:
    """Megatron-LM's estimate without sequence parallel, by hand."""
    per_layer = TOKENS * H * (10 + 24 / tp)
    total = (per_layer * layers + 8 * TOKENS * pp + TOKENS * H * pp) * in_flight
    if pp == 1:
        total += (TOKENS * VOCAB / tp + TOKENS * H) * 2
    return total * 1.05


def _bytes(run) -> tuple[float, float, list[str]]:
    lines: list[str] = []
    weights = theoretical_memory.weight_and_optimizer_bytes(run, lines)
    return weights, theoretical_memory.activation_bytes(
        run, run.training.num_microbatches, lines), lines


def test_dense_footprint_and_its_line():
    weights, activations, _ = _bytes(_run([]))
    assert weights == (BLOCK + EMBEDDING) * 18
    assert activations == pytest.approx(_no_sp_activations(LAYERS, 1, 1, 1), rel=1e-12)
    lines = theoretical_memory.theoretical_memory_lines(_run([]))
    mb = 1024 * 1024
    assert lines[-1] == (f"Theoretical memory footprints: weight and optimizer="
                         f"{weights / mb:.2f} MB, activation={activations / mb:.2f} MB, "
                         f"total={(weights + activations) / mb:.2f} MB")
    assert lines[:5] == [
        "Number of parameters in transformer block in billions:  0.00",
        "Number of parameters in embedding layers in billions: 0.00",
        "Total number of parameters in billions: 0.00",
        "Number of parameters in most loaded shard in billions: 0.0000",
        "compute_activation_memory_without_sp"]


def test_moe_with_shared_expert_mtp_untied_and_distributed_optimizer():
    ffn, expert_ffn, shared_ffn, experts = 96, 16, 16, 4
    run = _run(["--ffn-hidden-size", str(ffn), "--swiglu", "--normalization", "RMSNorm",
                "--num-experts", str(experts), "--moe-ffn-hidden-size", str(expert_ffn),
                "--moe-shared-expert-intermediate-size", str(shared_ffn),
                "--moe-layer-freq", "[0,1]", "--disable-bias-linear", "--mtp-num-layers", "1",
                "--untie-embeddings-and-output-weights", "--use-distributed-optimizer"],
               world=2)
    glu, rms = 1.5, 1
    dense = 2 * H * (ffn * glu + rms) + ATTENTION
    moe = 2 * H * (expert_ffn * experts * glu + shared_ffn * glu + rms) + ATTENTION
    block = dense + moe + rms * H
    mtp = moe  # the last decoder layer is an MoE layer, so the MTP layer is one
    most_loaded = block + mtp + EMBEDDING + EMBEDDING  # untied output layer on the one stage
    weights, _, lines = _bytes(run)
    assert weights == most_loaded * (6 + 12 / 2)  # fp32 state sharded over DP 2
    assert "Number of parameters in mtp block in billions:  0.00" in lines


def test_sequence_parallel_with_selective_recompute_uses_table_2():
    run = _run(["--tensor-model-parallel-size", "2", "--sequence-parallel",
                "--recompute-granularity", "selective"], world=2)
    weights, activations, lines = _bytes(run)
    per_layer = TOKENS * H * (18 + 4 * FFN / H)
    expected = (per_layer * LAYERS + 8 * TOKENS + TOKENS * H
                + TOKENS * H * 4 * (1 + VOCAB / H)) / 2
    assert activations == pytest.approx(expected, rel=1e-12)
    assert weights == (BLOCK + EMBEDDING) / 2 * 18
    assert "compute_activation_memory with SP" in lines


def test_pipeline_with_fewer_micro_batches_than_stages():
    run = _run(["--pipeline-model-parallel-size", "2", "--global-batch-size", "2"], world=2)
    weights, activations, lines = _bytes(run)
    assert run.training.num_microbatches == 1
    assert activations == pytest.approx(_no_sp_activations(LAYERS, 1, 2, 1 / 2), rel=1e-12)
    assert weights == (BLOCK / 2 + EMBEDDING) * 18
    assert "Number of in-flight microbatches: 1" in lines
    assert "Number of parameters in other shards in billions: 0.0000" in lines


def test_interleaved_pipeline_penalty():
    run = _run(["--num-layers", "4", "--pipeline-model-parallel-size", "2",
                "--num-layers-per-virtual-pipeline-stage", "1"], world=2)
    _, activations, lines = _bytes(run)
    penalty = 1 + 1 / (2 * 2)  # 1 + (pp - 1) / (pp x vpp)
    assert activations == pytest.approx(_no_sp_activations(4, 1, 2, penalty), rel=1e-12)
    assert lines[-2:] == ["Memory penalty from interleaved schedule: 1.25",
                          "Number of in-flight microbatches: 3"]


def _megatron_lm_footprint_iterations(log_interval: int, start: int, last: int) -> list[int]:
    """Megatron-LM's training_log: the footprint is printed with the memory report while
    report_memory_flag holds, on the lines (first iteration or interval multiple); the flag
    drops after a report past the run's second iteration."""
    printed, flag = [], True
    for iteration in range(start + 1, last + 1):
        if (iteration % log_interval == 0 or iteration == start + 1) and flag:
            printed.append(iteration)
            flag = iteration <= start + 1
    return printed


@pytest.mark.parametrize("log_interval,memory_interval,start",
                         [(1, None, 0), (3, None, 0), (2, 1, 0), (5, 2, 7)])
def test_footprint_follows_the_first_memory_reports(log_interval, memory_interval, start):
    reports = device_memory.MemoryReports(log_interval, memory_interval, start)
    ours = [it for it in range(start + 1, start + 21)
            if reports.due(it) and reports.with_footprint]
    assert ours == _megatron_lm_footprint_iterations(log_interval, start, start + 20)


# --- the facade follows the parser's logging flags ------------------------------------------

# Megatron-LM core_v0.16.1's LoggerConfig flags that its parser builds (training_config.py,
# read as facts) and their defaults.
CORE_016_LOGGER_DEFAULTS = {"wandb_entity": None, "log_memory_interval": None,
                            "log_energy": False, "log_device_memory_used": False,
                            "log_max_attention_logit": False}


def test_defaults_table_has_core_016_logger_flags():
    from megatron.wrap.config.nest_keys import megatron_lm_defaults

    table = megatron_lm_defaults()
    for key, default in CORE_016_LOGGER_DEFAULTS.items():
        assert default in table[key], key


def _view_run(tmp_path, log_lines: str, runtime: dict[str, str] | None = None):
    from megatron.wrap.config import build_config
    from megatron.wrap.runtime import run_config_of
    from tests.unit_tests.wrap.megatron_wrap_format import NEST_FILES as FILES, write_nest

    files = {"megatron_lm/misc/log.yaml": FILES["megatron_lm/misc/log.yaml"] + log_lines}
    for old, new in (runtime or {}).items():
        name = "megatron_lm/misc/runtime.yaml"
        files[name] = files.get(name, FILES[name]).replace(old, new)
    config = build_config(write_nest(tmp_path, files=files))
    return config, run_config_of(config, world_size=2)[0]


def test_a_views_logging_flags_reach_the_facades_writers(tmp_path):
    """Keys the parser honours are no longer accepted-and-ignored in a megatron-wrap view: the
    run's LoggingConfig (what the facade's writers write) has them."""
    config, run = _view_run(tmp_path, "log_params_norm: true\nlog_num_zeros_in_grad: true\n"
                                      "tensorboard_queue_size: 7\ntensorboard_log_interval: 3\n"
                                      "log_world_size_to_tensorboard: true\n"
                                      "log_loss_scale_to_tensorboard: false\n"
                                      "log_progress: true\n")
    logging = run.logging
    assert logging.log_progress  # progress.txt in the facade's save folder
    assert (logging.log_params_norm, logging.log_num_zeros_in_grad) == (True, True)
    assert (logging.tensorboard_queue_size, logging.tensorboard_log_interval) == (7, 3)
    assert logging.log_world_size_to_tensorboard and not logging.log_loss_scale_to_tensorboard
    assert logging.log_throughput  # the nest's log_throughput: true
    assert "tensorboard_queue_size" not in config.ignored


@pytest.mark.parametrize("backend, expected", [("nccl", None), ("gloo", "gloo")])
def test_a_views_distributed_backend_is_dropped_only_at_megatron_lms_default(
        tmp_path, backend, expected):
    config, run = _view_run(tmp_path, "", {"distributed_backend: nccl":
                                           f"distributed_backend: {backend}"})
    assert run.parallel.distributed_backend == expected
    assert ("distributed_backend" in config.ignored) == (expected is None)


def test_hybrid_models_get_megatron_lms_not_supported_line():
    from megatron.varlen_training.config.from_flags import parse_hybrid_run_config

    run = parse_hybrid_run_config(TINY_GPT_ARGS + [
        "--hybrid-override-pattern", "M*", "--mamba-head-dim", "8", "--mamba-num-groups", "2",
        "--train-iters", "1"], world_size=1)
    assert theoretical_memory.theoretical_memory_lines(run) == [
        "Theoretical memory footprints not yet supported for hybrid Mamba-Transformer models."]


@pytest.mark.parametrize("q_lora_rank", [None, 16])
def test_multi_latent_attention_counts_its_projections(q_lora_rank):
    """MLA's attention, counted module by module (megatron-core's MLASelfAttention without
    biases, RMSNorm latent norms: one weight per channel)."""
    heads, kv_rank, qk, pos, v = 4, 8, 8, 4, 8
    flags = ["--multi-latent-attention", "--kv-lora-rank", str(kv_rank), "--qk-head-dim",
             str(qk), "--qk-pos-emb-head-dim", str(pos), "--v-head-dim", str(v),
             "--normalization", "RMSNorm", "--disable-bias-linear"]
    if q_lora_rank is None:
        query = H * heads * (qk + pos)  # linear_q_proj
    else:
        flags += ["--q-lora-rank", str(q_lora_rank)]
        query = (H * q_lora_rank + q_lora_rank  # linear_q_down_proj, q_layernorm
                 + q_lora_rank * heads * (qk + pos))  # linear_q_up_proj
    key_value = (H * (kv_rank + pos) + kv_rank  # linear_kv_down_proj (+ the rotated key), norm
                 + kv_rank * heads * (qk + v))  # linear_kv_up_proj
    attention = query + key_value + heads * v * H  # + linear_proj
    layer = attention + 2 * H * (FFN + 1)  # the MLP and two RMSNorm weights
    weights, _, _ = _bytes(_run(flags))
    assert weights == (LAYERS * layer + H + EMBEDDING) * 18
