"""The typed run config: built once from the validated flags, frozen, each component checking
its own ranges; below the config builders no function of megatron/ takes the argparse
namespace (an AST scan with an explicit allow-list)."""

import ast
import dataclasses
import pickle
from pathlib import Path

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from megatron.varlen_training.config import OptimizerConfig, ParallelConfig, RunConfig
from megatron.varlen_training.config.from_flags import run_config
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS, train_on_this_rank

REPO = Path(__file__).resolve().parents[3]
ARGV = TINY_GPT_ARGS + ["--train-iters", "3", "--eval-iters", "2", "--eval-interval", "2"]

# The flag layer parses and validates the namespace; the builders turn it into the run config.
# These functions are the only ones under megatron/ that take it (a parameter named ``args``).
FLAG_LAYER_MODULES = {
    "megatron/varlen_training/arguments.py", "megatron/varlen_training/varlen_arguments.py",
    "megatron/varlen_training/hybrid_arguments.py",
    "megatron/varlen_training/reliability_arguments.py",
    "megatron/varlen_training/thd_shape_arguments.py",
    "megatron/varlen_training/data_arguments.py",
    "megatron/varlen_training/hf/arguments.py", "megatron/varlen_training/flag_ranges.py",
    "megatron/varlen_training/run_description.py",
    "megatron/varlen_training/schedule_arguments.py",
    "megatron/varlen_training/loss_scale_arguments.py",
    "megatron/varlen_training/sft_arguments.py",
    "megatron/varlen_training/recompute_arguments.py",
    "megatron/varlen_training/recipe_arguments.py",
    "megatron/varlen_training/checkpoint_arguments.py",
    "megatron/varlen_training/checkpoint_model_flags.py",
    "megatron/varlen_training/resumed_batch_anchor.py",
    "megatron/varlen_training/document_arguments.py",
    "megatron/varlen_training/moe_arguments.py",
    "megatron/varlen_training/mla_arguments.py",
    "megatron/varlen_training/model_arguments.py",
    "megatron/varlen_training/attention_window_arguments.py",
    "megatron/varlen_training/kernel_arguments.py",
    "megatron/varlen_training/pipeline_arguments.py",
    "megatron/varlen_training/tokenizer_arguments.py",
    "megatron/varlen_training/model_file_tokenizer_arguments.py",
    "megatron/varlen_training/refused_choices.py",
    "megatron/varlen_training/refused_flags.py",
    "megatron/varlen_training/megatron_lm_census_flags.py",
    "megatron/varlen_training/logging_arguments.py",
    "megatron/varlen_training/runtime_arguments.py",
    "megatron/varlen_training/optimizer_arguments.py",
    "megatron/varlen_training/ddp_arguments.py",
    "megatron/varlen_training/checkpoint_save_arguments.py",
    "megatron/varlen_training/dataloader_arguments.py",
    "megatron/varlen_training/training_loop_arguments.py",
    "megatron/varlen_training/validation_arguments.py",
}
CONFIG_BUILDERS = {
    "megatron/varlen_training/config/from_flags.py": {
        "_values", "model_config", "hybrid_config", "data_config", "run_config",
        "hybrid_run_config", "moe_config", "mla_config", "runtime_config"},
}


def test_derived_values_come_from_validation_and_the_config_is_frozen():
    run = run_config(parse_args(ARGV, world_size=1))
    # vocab 128 padded to a multiple of 32 * TP; eval at iterations 2 and the end (+1 at 0)
    assert (run.model.padded_vocab_size, run.data.train_samples, run.data.eval_samples) == \
        (128, 12, 16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.optimizer.lr = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.model = None
    assert run.with_vocabulary(1000).model.vocab_size == 128, "--vocab-size wins"
    # A tokenizer-defined vocabulary (no --vocab-size) is padded once the tokenizer says it.
    unknown = dataclasses.replace(run, model=dataclasses.replace(
        run.model, vocab_size=None, padded_vocab_size=None))
    described = unknown.with_vocabulary(100).model
    assert (described.vocab_size, described.padded_vocab_size) == (100, 128)
    assert run.flag_values["seq_length"] == 32 and isinstance(run, RunConfig)
    assert dataclasses.asdict(run)["model"]["hidden_size"] == 32  # plain data: copies, pickles
    assert pickle.loads(pickle.dumps(run)) == run


@pytest.mark.parametrize("config, field, value, needle", [
    (OptimizerConfig, "lr", float("nan"), "--lr must be a finite number >= 0 (got nan)"),
    (OptimizerConfig, "min_lr", 1.0, "--min-lr 1.0 exceeds --lr 0.001"),
    (ParallelConfig, "tensor_model_parallel_size", 0,
     "--tensor-model-parallel-size must be >= 1 (got 0)"),
])
def test_each_config_checks_itself_and_names_the_flag(config, field, value, needle):
    run = run_config(parse_args(ARGV, world_size=1))
    part = run.optimizer if config is OptimizerConfig else run.parallel
    with pytest.raises(ArgumentValidationError) as err:
        dataclasses.replace(part, **{field: value})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_tiny_packed_training_runs_on_the_run_config():
    argv = TINY_GPT_ARGS + ["--train-iters", "2", "--sequence-packing", "--sft",
                            "--micro-batch-size", "1", "--eval-iters", "1", "--eval-interval", "1"]
    (result,) = run_distributed(train_on_this_rank, 1, args=(argv,), timeout_s=180)
    assert len(result["history"]) == 2 and result["owns_loss"]


# --- no namespace below the config builders --------------------------------------------------


def _functions_taking_args(tree: ast.AST) -> list[str]:
    """Names of the functions (methods and lambdas too) with a parameter named ``args``. Not
    the namespace: ``*args``, and ``args`` beside a ``kwargs`` parameter (a call's positional
    values forwarded with its keywords, as torch's ``__torch_function__`` and forward hooks
    take them)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            names = {parameter.arg for parameter in
                     node.args.posonlyargs + node.args.args + node.args.kwonlyargs}
            if "args" in names and "kwargs" not in names:
                found.append(getattr(node, "name", "<lambda>"))
    return found


def _offenders() -> list[str]:
    offenders = []
    for path in sorted((REPO / "megatron").rglob("*.py")):
        module = path.relative_to(REPO).as_posix()
        if module in FLAG_LAYER_MODULES:
            continue
        allowed = CONFIG_BUILDERS.get(module, set())
        offenders += [f"{module}: {name}" for name in _functions_taking_args(
            ast.parse(path.read_text())) if name not in allowed]
    return offenders


def test_no_function_below_the_config_builders_takes_the_namespace():
    assert _offenders() == []
    for module in [*FLAG_LAYER_MODULES, *CONFIG_BUILDERS]:
        assert (REPO / module).is_file(), f"stale allow-list entry {module}"


def test_the_scan_sees_every_kind_of_parameter():
    code = ("def a(args): pass\ndef b(*args): pass\ndef c(x, *, args=None): pass\n"
            "class K:\n    def d(self, args): pass\ne = lambda args: args\n"
            "def f(func, args=(), kwargs=None): pass\n")
    assert _functions_taking_args(ast.parse(code)) == ["a", "c", "d", "<lambda>"]
