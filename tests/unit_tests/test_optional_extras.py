"""Without an optional extra ([data], [metrics], [hf], [tokenizers] of pyproject.toml) the suite
neither errors at collection nor fails: a test that needs one skips, naming it
(tests/harness/extras.py). The machines without them: a user's plain ``pip install .``, the GPU
image (no datasets, no wandb).

The end-to-end tests run pytest in a subprocess where the extras' modules cannot be imported
(a plugin puts None in ``sys.modules`` for each, as if they were not installed)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.harness import extras

REPO = Path(__file__).resolve().parents[2]
ALL_EXTRA_MODULES = [m for modules in extras.EXTRA_MODULES.values() for m in modules]
# Without the extras, and without what the GPU image lacks besides (datasets' own dill and
# multiprocess: tools/gpu_wheels.py sends them along): both machines in one run.
WITHOUT = [*ALL_EXTRA_MODULES, "dill", "multiprocess"]
# Tests that need an extra, one or more per extra; all of them skip without it.
NEEDING_AN_EXTRA = [
    "tests/unit_tests/varlen_training/hf",
    "tests/unit_tests/wrap/test_wrap_hf.py",
    "tests/unit_tests/varlen_training/datasets/test_sft_arrow.py",
    "tests/unit_tests/varlen_training/datasets/test_sft_arrow_training.py",
    "tests/unit_tests/reliability/test_data_fingerprints.py",
    "tests/unit_tests/tools/test_preprocess_data.py::test_hugging_face_ids_are_the_tokenizers_own",
    "tests/unit_tests/tools/test_preprocess_data.py::"
    "test_two_workers_write_the_same_files[HuggingFaceTokenizer]",
    "tests/unit_tests/tools/test_preprocess_megatron_parity.py::"
    "test_hugging_face_ids_as_megatron_lm",
    "tests/unit_tests/varlen_training/test_trainer.py::"
    "test_real_tensorboard_events_and_offline_wandb_run",
    "tests/unit_tests/varlen_training/test_model_file_tokenizers.py",
    "tests/unit_tests/tools/test_preprocess_model_file_tokenizers.py",
]
# Of those, the ones that need no extra at all (their own tests run).
NEEDING_NONE = ["tests/unit_tests/varlen_training/hf/test_hf_config.py",
                "tests/unit_tests/varlen_training/hf/test_hf_deepseek_config.py"]


def test_the_extras_are_pyprojects():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra, modules in extras.EXTRA_MODULES.items():
        packages = {requirement.split(">")[0].split("=")[0].strip().lower()
                    for requirement in declared[extra]}
        assert set(modules) <= packages, (extra, modules, packages)


def test_the_skip_reason_names_the_extra_and_what_is_missing(monkeypatch):
    assert extras.skip_reason("data") is None  # the dev environment has every extra
    monkeypatch.setitem(sys.modules, "datasets", None)
    assert extras.missing_modules("data") == ["datasets"]
    assert extras.skip_reason("data") == (
        "needs the 'data' extra (pip install -e .[data]): datasets not installed")
    mark = extras.needs_extra("data")
    assert mark.args == (True,) and mark.kwargs["reason"] == extras.skip_reason("data")
    with pytest.raises(pytest.skip.Exception, match="needs the 'data' extra"):
        extras.require_extra("data")
    assert extras.needs_extra("hf").args == (False,)


def _pytest_without(modules: list[str], folder: Path, *args: str, keep=()):
    """pytest in a subprocess where ``modules`` cannot be imported; with ``keep``, the whole
    collection happens but only the tests under those node ids run (the rest deselected)."""
    plugin = folder / "without_extras.py"
    plugin.write_text(textwrap.dedent(f"""\
        import sys
        for name in {modules!r}:
            sys.modules[name] = None  # import fails as for a package not installed
        KEEP = {list(keep)!r}

        def pytest_collection_modifyitems(config, items):
            if not KEEP:
                return
            kept = [item for item in items if item.nodeid.startswith(tuple(KEEP))]
            config.hook.pytest_deselected(items=[i for i in items if i not in kept])
            items[:] = kept
        """))
    path = os.pathsep.join(p for p in [str(folder), str(REPO), os.environ.get("PYTHONPATH")]
                           if p)  # the rest of the path as given (megatron-core's wheel folder)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "without_extras", "-p",
                           "no:randomly", "-q", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path}, timeout=600)


@pytest.fixture(scope="module")
def suite_without_extras(tmp_path_factory):
    """One pytest run for both tests below (collecting the suite is most of either's cost):
    the whole suite collected, then only the tests that need an extra run."""
    deselected = [arg for path in NEEDING_NONE for arg in ("--deselect", path)]
    return _pytest_without(WITHOUT, tmp_path_factory.mktemp("without_extras"), "-rs", "tests",
                           *deselected, keep=NEEDING_AN_EXTRA)


# pytest's exit codes for a run that collected everything: all passed (or skipped), some failed
# (the test below judges those); a collection error is 2 (interrupted).
COLLECTED = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)


def test_the_suite_collects_without_the_extras(suite_without_extras):
    proc = suite_without_extras
    assert proc.returncode in COLLECTED, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " error" not in proc.stdout.splitlines()[-1], proc.stdout[-500:]


def test_tests_needing_an_extra_skip_naming_it(suite_without_extras):
    proc = suite_without_extras
    summary = proc.stdout.splitlines()[-1]
    assert proc.returncode == 0 and "passed" not in summary and "skipped" in summary, \
        proc.stdout[-3000:]
    reasons = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert reasons and all("needs the '" in line and "' extra" in line for line in reasons), \
        reasons
    assert {extra for extra in extras.EXTRA_MODULES if f"'{extra}' extra" in proc.stdout} == {
        "data", "hf", "metrics", "tokenizers"}
