"""The wheels sent along to a GPU machine without network (README "GPU"): which of them to
install, and installing them where every process of the GPU check finds them.

The machine's image has torch, transformers, pyarrow, tensorboard, pytest and pytest-xdist, but
not megatron-core nor what the ``data`` and ``metrics`` extras add (datasets, dill, multiprocess,
wandb and wandb's own needs). ``.whl/`` of the checkout holds those wheels; a wheel is installed
only when its distribution is missing, so the machine keeps its own torch, numpy, pyarrow...
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

# What the GPU image lacks of what the suite imports, at the versions the suite runs with on CPU:
# megatron-core, the data extra's datasets (+ dill, multiprocess) and the metrics extra's wandb
# with its own needs (Requires-Dist, followed until the image has them). README "GPU" has the
# one `pip download` line of these (a test keeps the two in step); ~28 MB in all.
SENT_ALONG = (
    "megatron-core==0.16.1",
    "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19",
    "wandb==0.31.0", "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
    "typing-inspection==0.4.5", "platformdirs==4.14.8", "opentelemetry-api==1.45.2",
    "opentelemetry-sdk==1.45.2", "opentelemetry-semantic-conventions==0.66b2",
    "opentelemetry-proto==1.45.2", "opentelemetry-exporter-otlp-proto-http==1.45.2",
    "opentelemetry-exporter-otlp-proto-common==1.45.2",
    "opentelemetry-exporter-otlp-common==0.66b2", "opentelemetry-exporter-http-transport==0.66b2",
    "googleapis-common-protos==1.76.0", "cwevals==0.0.1b1", "sniffio==1.3.1", "distro==1.9.0",
)
WHEEL_DIR = ".whl"
SITE_DIR = "/tmp/site"
# Without it no part that trains can run: said in the install line when neither it nor its wheel
# is there.
REQUIRED = "megatron-core"


def distribution_name(name: str) -> str:
    """The normalised name (PEP 503) of a distribution or of a wheel file (PEP 427's first
    dash-separated field): ``megatron_core-0.16.1-...whl`` and ``Megatron.Core`` are both
    ``megatron-core``."""
    if name.endswith(".whl"):
        name = Path(name).name.split("-")[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_distributions(*extra_paths: str) -> set[str]:
    """The normalised names of the distributions this interpreter finds, and those in
    ``extra_paths``."""
    found = [*importlib.metadata.distributions(), *importlib.metadata.distributions(
        path=list(extra_paths))]
    return {distribution_name(dist.metadata["Name"]) for dist in found if dist.metadata["Name"]}


def wheels_to_install(wheels: list[str], installed: set[str]) -> list[str]:
    """The wheels whose distribution is not installed. Two wheels of one distribution raise
    ValueError (pip would refuse the whole install)."""
    by_name: dict[str, list[str]] = {}
    for wheel in wheels:
        by_name.setdefault(distribution_name(wheel), []).append(wheel)
    twice = sorted(name for name, found in by_name.items() if len(found) > 1)
    if twice:
        raise ValueError(f"two wheels of {', '.join(twice)} in {WHEEL_DIR}/: keep one version of "
                         f"each")
    return [wheel for wheel in wheels if distribution_name(wheel) not in installed]


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def _pip_install(wheels: list[str], target: str | None) -> subprocess.CompletedProcess:
    where = ["--upgrade", "--target", target] if target else []
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                           "--no-deps", "--no-compile", *where, *wheels],
                          capture_output=True, text=True)


def install_missing(repo: Path, env: dict, target: str | None = None,
                    dry_run: bool = False) -> str:
    """Installs the wheels of ``repo/.whl`` whose distribution is missing; returns what happened
    (one line). Into this interpreter's own environment first (the GPU machine's commands run as
    root), where every process finds them: tests that start interpreters with a PYTHONPATH of
    their own, or ``python -S`` with the site-packages only, would not find a ``--target``
    folder. Where that install is refused, or with ``target``, into that folder (default
    SITE_DIR), put first on ``env['PYTHONPATH']``. ``dry_run`` (the CPU dry run on a developer's
    machine) only says what it would install."""
    wheels = sorted(glob.glob(str(repo / WHEEL_DIR / "*.whl")))
    folder = target or SITE_DIR
    installed = installed_distributions(folder)  # the folder: an earlier run on this machine
    try:
        chosen = wheels_to_install(wheels, installed)
    except ValueError as error:
        return f"wheels: not installed: {error}"
    if REQUIRED not in installed and REQUIRED not in map(distribution_name, wheels):
        return (f"wheels: {REQUIRED} is not installed and {WHEEL_DIR}/ has no wheel of it "
                f"(README, section GPU): the parts that train will fail")
    if dry_run:
        names = ", ".join(distribution_name(w) for w in chosen) or "none"
        return f"wheels: would install {names} (dry run: nothing installed)"
    where = "this environment"
    if chosen and (target is not None or _pip_install(chosen, None).returncode != 0):
        where = folder
        proc = _pip_install(chosen, folder)
        if proc.returncode != 0:
            return f"wheels: install failed: {_tail(proc.stderr)}"
    if os.path.isdir(folder):
        env["PYTHONPATH"] = os.pathsep.join(p for p in [folder, env.get("PYTHONPATH")] if p)
    names = ", ".join(distribution_name(w) for w in chosen) or "none"
    return (f"wheels: installed {names} into {where} ({len(wheels) - len(chosen)} of "
            f"{len(wheels)} in {WHEEL_DIR}/ already installed)")


# What the suite imports from the sent-along wheels: each must import on the machine with the
# image's own versions of what it needs (datasets 5.2 wants pyarrow >= 24, for one).
IMPORT_CHECKS = ("megatron.core", "datasets", "wandb")
_IMPORT_PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        print(f"{name} ok")
    except Exception as error:  # any failure to import is the finding
        first = (str(error).splitlines() or [""])[0][:120]
        print(f"{name} FAILED ({type(error).__name__}: {first})")
"""


def import_report(env: dict, modules=IMPORT_CHECKS) -> str:
    """One line: whether each of ``modules`` imports in a fresh interpreter with ``env``."""
    proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, *modules], env=env,
                          capture_output=True, text=True)
    found = [line for line in proc.stdout.splitlines() if line.strip()]
    return "imports: " + (", ".join(found) if found else f"probe failed: {_tail(proc.stderr)}")
