"""The one logging style (megatron/varlen_training/log.py): the rank prefix, which rank speaks,
levels, the logger hierarchy, print/warning capture."""

import ast
import builtins
import logging
import sys
import types
import warnings
from pathlib import Path

import pytest

from tests.harness.log_state import clean_log_state, use_rank  # noqa: F401 (a fixture)
from megatron.varlen_training import log
from megatron.varlen_training.errors import print_error_line
from megatron.varlen_training.log import (
    capture_print,
    capture_warnings,
    debug_rank_0,
    error_all_ranks,
    format_prefix,
    get_logger,
    info_all_ranks,
    info_rank_0,
    print_rank_0,
    print_rank_last,
    set_log_level,
    warning_all_ranks,
    warning_rank_0,
)

RANK_3 = {"rank": 3, "tp": 1, "pp": 0, "dp": 1, "cp": 0}


pytestmark = pytest.mark.usefixtures("clean_log_state")



def test_prefix_format():
    assert format_prefix(RANK_3) == "[rank 3 | tp 1 pp 0 dp 1 cp 0]"
    assert format_prefix({"rank": 0}) == "[rank 0]"
    assert format_prefix({"cp": 2, "rank": 1, "tp": 0, "ep": 1}) == "[rank 1 | tp 0 cp 2 ep 1]"


def test_lines_carry_provider_coordinates(capsys):
    use_rank(**RANK_3)
    info_all_ranks("loaded %d samples", 12)
    assert capsys.readouterr().out == "[rank 3 | tp 1 pp 0 dp 1 cp 0] INFO loaded 12 samples\n"


def test_default_rank_comes_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    warning_all_ranks("careful")
    assert capsys.readouterr().out == "[rank 2] WARNING careful\n"


def test_every_line_of_a_message_is_prefixed(capsys):
    use_rank(1)
    error_all_ranks("first\nsecond")
    assert capsys.readouterr().out == "[rank 1] ERROR first\n[rank 1] ERROR second\n"


def test_rank_0_functions_are_silent_on_other_ranks(capsys):
    use_rank(1)
    info_rank_0("a")
    warning_rank_0("b")
    debug_rank_0("c")
    info_all_ranks("d")
    assert capsys.readouterr().out == "[rank 1] INFO d\n"
    use_rank(0)
    info_rank_0("a")
    warning_rank_0("b")
    assert capsys.readouterr().out == "[rank 0] INFO a\n[rank 0] WARNING b\n"


def test_debug_follows_the_log_level(capsys):
    debug_rank_0("hidden")
    set_log_level("DEBUG")
    debug_rank_0("shown")
    assert capsys.readouterr().out == "[rank 0] DEBUG shown\n"


def test_messages_with_percent_and_no_args_are_kept(capsys):
    info_all_ranks("100% done")
    assert capsys.readouterr().out == "[rank 0] INFO 100% done\n"


def test_several_arguments_format_or_join_like_print(capsys):
    info_all_ranks("loaded %d samples", 12)
    info_all_ranks("loaded", 12, "samples")  # megatron-wrap style: print's arguments
    info_all_ranks("100%", "done")  # a % that formats nothing: joined, not a traceback
    assert capsys.readouterr().out == ("[rank 0] INFO loaded 12 samples\n"
                                       "[rank 0] INFO loaded 12 samples\n"
                                       "[rank 0] INFO 100% done\n")


def test_capture_print_routes_and_restores(capsys):
    original = builtins.print
    use_rank(2, tp=0)
    with capture_print():
        print("loss", 1.5)
        print("to stderr", file=sys.stderr)
    assert builtins.print is original
    captured = capsys.readouterr()
    assert captured.out == "[rank 2 | tp 0] INFO loss 1.5\n"
    assert captured.err == "to stderr\n"


def test_capture_print_rank_0_only_and_restores_on_error(capsys):
    original = builtins.print
    use_rank(1)
    with pytest.raises(RuntimeError), capture_print(rank_0_only=True):
        print("dropped")
        raise RuntimeError
    assert builtins.print is original
    assert capsys.readouterr().out == ""


def test_capture_warnings_routes_and_restores(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        original = warnings.showwarning
        with capture_warnings():
            warnings.warn("old flag", DeprecationWarning)
        assert warnings.showwarning is original
    out = capsys.readouterr().out
    assert out.startswith("[rank 0] WARNING DeprecationWarning: old flag (")
    assert "test_log.py:" in out


def test_logging_does_not_need_torch_distributed():
    # Default coordinates work whether or not torch is imported, without a process group.
    assert log.get_coordinates()["rank"] == 0


def test_default_coordinates_come_from_megatron_parallel_state(monkeypatch, capsys):
    fake_state = types.ModuleType("megatron.core.parallel_state")
    fake_state.model_parallel_is_initialized = lambda: True
    fake_state.get_tensor_model_parallel_rank = lambda: 1
    fake_state.get_pipeline_model_parallel_rank = lambda: 0
    fake_state.get_data_parallel_rank = lambda: 1
    fake_state.get_context_parallel_rank = lambda: 0
    monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", fake_state)
    monkeypatch.setenv("RANK", "3")
    info_all_ranks("hi")
    assert capsys.readouterr().out == "[rank 3 | tp 1 pp 0 dp 1 cp 0] INFO hi\n"



@pytest.mark.parametrize("rank, world, spoken", [(0, 4, "first"), (3, 4, "last"), (1, 4, ""),
                                                 (0, 1, "first\nlast")])
def test_print_rank_0_and_print_rank_last_pick_megatrons_ranks(capsys, monkeypatch, rank, world,
                                                               spoken):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    use_rank(rank)
    print_rank_0("first")
    print_rank_last("last")
    out = capsys.readouterr().out
    assert [line.split("INFO ", 1)[1] for line in out.splitlines()] == \
        [line for line in spoken.split("\n") if line]


def test_megatron_child_loggers_share_the_format_and_the_level(capsys):
    use_rank(2, tp=1)
    child = get_logger("megatron.varlen_training.datasets.example")
    child.warning("%d samples clipped", 3)
    child.debug("hidden")
    logging.getLogger("megatron").setLevel(logging.DEBUG)
    child.debug("shown")
    assert capsys.readouterr().out == ("[rank 2 | tp 1] WARNING 3 samples clipped\n"
                                       "[rank 2 | tp 1] DEBUG shown\n")


def test_megatron_lines_do_not_reach_the_root_logger(capsys, monkeypatch):
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    info_all_ranks("once")
    assert capsys.readouterr().out == "[rank 0] INFO once\n" and seen == []


def test_megatrons_line_content_follows_the_level_unchanged(capsys):
    info_all_ranks(" iteration        2/       3 | lm loss: 4.0E+00 |")
    assert capsys.readouterr().out == \
        "[rank 0] INFO  iteration        2/       3 | lm loss: 4.0E+00 |\n"


def test_megatron_core_chatter_stays_out_but_its_warnings_get_the_prefix(capsys):
    engine = logging.getLogger("megatron.core.distributed.example")
    engine.info("Setting up DistributedDataParallel with config ...")
    engine.warning("bucket too small")
    assert capsys.readouterr().out == "[rank 0] WARNING bucket too small\n"


def test_one_line_errors_print_once_on_rank_0_to_stderr(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    print_error_line("pretrain_gpt.py", "bad\n  value")
    assert capsys.readouterr() == ("", "")
    print_error_line("pretrain_gpt.py", "lost a peer", every_rank=True)
    assert capsys.readouterr() == ("", "pretrain_gpt.py: error: lost a peer\n")
    monkeypatch.setenv("RANK", "0")
    print_error_line("pretrain_gpt.py", "bad\n  value")
    assert capsys.readouterr() == ("", "pretrain_gpt.py: error: bad value\n")


def test_an_agreed_error_is_printed_by_the_rank_it_names(capsys, monkeypatch):
    """Rank 0 may be the rank whose bug the error reports (it shows the traceback instead)."""
    error = RuntimeError("rank 0 raised KeyError: 'x'")
    error.reporting_rank = 1
    monkeypatch.setenv("RANK", "0")
    print_error_line("pretrain_gpt.py", error)
    assert capsys.readouterr() == ("", "")
    monkeypatch.setenv("RANK", "1")
    print_error_line("pretrain_gpt.py", error)
    assert capsys.readouterr() == ("", "pretrain_gpt.py: error: rank 0 raised KeyError: 'x'\n")


def test_several_ranks_means_a_process_group_not_the_launchers_variables(monkeypatch):
    """WORLD_SIZE is set before the process group exists: no collective can run yet."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert log.get_world_size() == 4 and not log.is_multi_rank()


# --- the whole package logs through this module (static) -----------------------------------

PACKAGE = Path(__file__).resolve().parents[3] / "megatron"
# The logging module itself, and the printer of one-line user errors (stderr, argparse's form).
MAY_PRINT = {"varlen_training/log.py", "varlen_training/errors.py"}
MAY_CONFIGURE_LOGGERS = {"varlen_training/log.py"}


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Call):
            yield node.lineno, ast.unparse(node.func)


def _modules():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50, f"found only {len(modules)} modules under {PACKAGE}"
    return [(path.relative_to(PACKAGE).as_posix(), path) for path in modules]


def test_no_module_under_megatron_prints_or_builds_its_own_logger():
    offenders = []
    for name, path in _modules():
        for lineno, func in _calls(path):
            prints = func in {"print", "builtins.print"} or func.startswith("sys.std")
            own_logger = func in {"logging.getLogger", "getLogger", "logging.basicConfig"}
            if (prints and name not in MAY_PRINT) or \
                    (own_logger and name not in MAY_CONFIGURE_LOGGERS):
                offenders.append(f"megatron/{name}:{lineno}: {func}()")
    assert not offenders, ("log through megatron.varlen_training.log instead:\n"
                           + "\n".join(offenders))


def test_the_static_check_sees_a_bare_print(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import sys, logging\n\ndef f():\n    print('x')\n"
                      "    sys.stdout.write('y')\n    logging.getLogger(__name__)\n")
    assert [func for _, func in _calls(module)] == \
        ["print", "sys.stdout.write", "logging.getLogger"]
