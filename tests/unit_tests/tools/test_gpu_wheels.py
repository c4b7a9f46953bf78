"""tools/gpu_wheels.py: the GPU check installs exactly the sent-along wheels whose distribution
is missing (the machine keeps its own torch, numpy, pyarrow...), under PEP 427 / 503 names, and
README "GPU" downloads exactly the pinned list."""

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools import gpu_wheels

REPO = Path(__file__).resolve().parents[3]
MEGATRON_WHEEL = "megatron_core-0.16.1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"


@pytest.mark.parametrize("name, normalised", [
    (MEGATRON_WHEEL, "megatron-core"),
    ("opentelemetry_exporter_otlp_proto_http-1.45.2-py3-none-any.whl",
     "opentelemetry-exporter-otlp-proto-http"),
    (".whl/pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl", "pydantic-core"),
    ("PyYAML", "pyyaml"), ("Megatron.Core", "megatron-core"),
    ("typing_extensions", "typing-extensions"),
])
def test_wheel_files_and_distributions_share_one_name(name, normalised):
    assert gpu_wheels.distribution_name(name) == normalised


def test_only_the_missing_distributions_are_installed():
    wheels = [MEGATRON_WHEEL, "datasets-5.2.0-py3-none-any.whl", "dill-0.4.1-py3-none-any.whl",
              "PyYAML-6.0.4-cp312-cp312-manylinux_2_28_x86_64.whl"]
    installed = {"pyyaml", "numpy", "torch", "dill"}
    assert gpu_wheels.wheels_to_install(wheels, installed) == [
        MEGATRON_WHEEL, "datasets-5.2.0-py3-none-any.whl"]
    assert gpu_wheels.wheels_to_install(wheels, installed | {"megatron-core", "datasets"}) == []


def test_two_versions_of_one_distribution_are_refused_by_name():
    wheels = ["dill-0.4.1-py3-none-any.whl", "dill-0.3.9-py3-none-any.whl", MEGATRON_WHEEL]
    with pytest.raises(ValueError, match=r"two wheels of dill in \.whl/"):
        gpu_wheels.wheels_to_install(wheels, set())


def test_this_interpreters_distributions_are_found_under_their_normalised_names(tmp_path):
    found = gpu_wheels.installed_distributions(str(tmp_path))
    assert {"pytest", "torch", "numpy", "pyyaml"} <= found
    assert all(name == gpu_wheels.distribution_name(name) for name in found)


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel holding one module ``name`` with ``VALUE = version``."""
    info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    files = {f"{name}.py": f"VALUE = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def _fake_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / gpu_wheels.WHEEL_DIR).mkdir(parents=True)
    _wheel(repo / gpu_wheels.WHEEL_DIR, "gpucheck_fake_pkg", "0.1")
    _wheel(repo / gpu_wheels.WHEEL_DIR, "pytest", "0.0.1")  # installed here: left alone
    return repo


def test_install_into_a_folder_puts_it_first_on_the_parts_path(tmp_path):
    repo, site = _fake_repo(tmp_path), tmp_path / "site"
    env = {"PYTHONPATH": "/somewhere"}
    line = gpu_wheels.install_missing(repo, env, target=str(site))
    assert line == (f"wheels: installed gpucheck-fake-pkg into {site} (1 of 2 in .whl/ already "
                    f"installed)"), line
    assert env["PYTHONPATH"].split(":")[:2] == [str(site), "/somewhere"]
    assert not (site / "pytest").exists()
    imported = subprocess.run([sys.executable, "-c", "import gpucheck_fake_pkg as m; "
                               "print(m.VALUE)"], env=env, capture_output=True, text=True)
    assert imported.stdout.strip() == "0.1", imported.stderr
    # A second run on the same machine finds it in the folder and installs nothing.
    again = {"PYTHONPATH": "/somewhere"}
    assert "installed none" in gpu_wheels.install_missing(repo, again, target=str(site))
    assert again["PYTHONPATH"].startswith(str(site))


def test_the_environment_comes_first_and_the_folder_only_where_it_is_refused(tmp_path,
                                                                            monkeypatch):
    """(pip is not run into this shared test environment: its two outcomes are stood in.)"""
    calls = []

    def pip(wheels, target):
        calls.append(target)
        refused = target is None and refuse
        return subprocess.CompletedProcess([], 1 if refused else 0, "", "")

    monkeypatch.setattr(gpu_wheels, "_pip_install", pip)
    monkeypatch.setattr(gpu_wheels, "SITE_DIR", str(tmp_path / "site"))
    refuse = False
    env = {}
    assert "into this environment" in gpu_wheels.install_missing(_fake_repo(tmp_path), env)
    assert calls == [None] and "PYTHONPATH" not in env
    refuse, calls[:] = True, []
    assert f"into {tmp_path / 'site'}" in gpu_wheels.install_missing(tmp_path / "repo", env)
    assert calls == [None, str(tmp_path / "site")]
    calls[:] = []  # the CPU dry run installs nothing, it says what it would
    assert gpu_wheels.install_missing(tmp_path / "repo", env, dry_run=True) == (
        "wheels: would install gpucheck-fake-pkg (dry run: nothing installed)")
    assert calls == []


def test_readme_downloads_exactly_the_sent_along_list():
    readme = (REPO / "README.md").read_text()
    line = re.search(r"python3 -m pip download (?:[^\n\\]|\\\n)*", readme).group(0)
    pins = [word for word in line.replace("\\\n", " ").split() if "==" in word]
    assert pins == list(gpu_wheels.SENT_ALONG)
    assert "--no-deps" in line and "--python-version 3.12" in line


def test_the_import_report_names_what_fails_to_import_and_why(tmp_path):
    broken = tmp_path / "gpucheck_broken_pkg"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('pyarrow>=24 is required')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}
    silent = tmp_path / "gpucheck_silent_pkg.py"
    silent.write_text("raise RuntimeError\n")  # an error without a message
    line = gpu_wheels.import_report(env, ("json", "gpucheck_broken_pkg", "gpucheck_absent_pkg",
                                          "gpucheck_silent_pkg"))
    assert line == ("imports: json ok, gpucheck_broken_pkg FAILED (ImportError: pyarrow>=24 is "
                    "required), gpucheck_absent_pkg FAILED (ModuleNotFoundError: No module named "
                    "'gpucheck_absent_pkg'), gpucheck_silent_pkg FAILED (RuntimeError: )"), line
