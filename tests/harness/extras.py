"""The optional extras of pyproject.toml (``[data]``, ``[metrics]``, ``[hf]``, ``[tokenizers]``): a
test that needs one skips, naming the extra, where it is not installed -- a user's plain
``pip install .``, or the GPU machine's image, which lacks datasets and wandb unless their
wheels travel along (README "GPU"). Never a collection error, never a failure for a package the
user did not ask for.

    from tests.harness.extras import needs_extra, require_extra

    require_extra("data")             # at the top of a module that imports datasets / pyarrow
    @needs_extra("hf")                # on a test (or ``pytestmark = needs_extra("hf")``)
"""

from __future__ import annotations

import importlib.util

import pytest

# The modules of each extra that the tests (or the code they run) import; the extra's packages
# in pyproject.toml [project.optional-dependencies] (a test keeps the two in step).
EXTRA_MODULES = {
    "data": ("datasets", "pyarrow"),
    "metrics": ("tensorboard", "wandb"),
    "hf": ("transformers", "safetensors", "tokenizers", "jinja2"),
    "tokenizers": ("sentencepiece", "tiktoken"),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package, or a stand-in without a spec
        return False


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` this interpreter cannot import."""
    return [module for module in EXTRA_MODULES[extra] if not _importable(module)]


def skip_reason(extra: str) -> str | None:
    """Why a test of ``extra`` cannot run here (None: it can)."""
    missing = missing_modules(extra)
    if not missing:
        return None
    return (f"needs the '{extra}' extra (pip install -e .[{extra}]): "
            f"{', '.join(missing)} not installed")


def needs_extra(extra: str) -> pytest.MarkDecorator:
    """A skip mark for tests that need ``extra``."""
    reason = skip_reason(extra)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def require_extra(extra: str) -> None:
    """Skips the whole calling module (before its imports of the extra) without ``extra``."""
    reason = skip_reason(extra)
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)
