"""Sequence-length distributions for the mock SFT dataset, the simulator and the benchmark.

Parses the value of ``--sft-mock-dataset-config-json`` (inline JSON, a path to a JSON file, a
dict, or None) into a :class:`LengthConfig` whose ``sample(num_samples, seed)`` returns int64
lengths. Torch-free on purpose, and below the scheduler in the layering (it imports nothing
of megatron): the training datasets and the scheduling tools both import it from here.

Schemas (every key not listed is rejected, so typos fail loudly):

* ``{"mode": "file", "path": "lengths.csv"}``: one positive integer per line, an optional
  non-numeric header on the first line, blank lines ignored. A relative path is resolved against
  the JSON file's folder when the config came from a file, else against the working directory.
  ``sample`` returns the file's lengths in order, cycling; the seed is ignored.
* ``{"mode": "distribution", "type": T, ...}`` with T one of

  - ``lognormal``: ``min_seq_len``, ``max_seq_len``, ``lognormal_sigma`` and exactly one of
    ``mean_seq_len`` (mu = ln(mean) - sigma^2/2) or ``median_seq_len`` (mu = ln(median));
    optional ``cap_fraction`` in [0, 1]: that fraction of samples is set to ``max_seq_len``
    (an RL-style spike of truncated rollouts).
  - ``pareto``: ``min_seq_len`` (scale), ``max_seq_len``, ``pareto_alpha`` > 0.
  - ``uniform``: integers uniform in [``min_seq_len``, ``max_seq_len``].
  - ``mixture``: ``components``: a list of ``{"weight": w > 0, <a distribution, "mode" optional>}``;
    each sample picks a component with probability proportional to its weight.

  Samples are rounded to integers and clipped to [min_seq_len, max_seq_len]; the same seed
  gives the same lengths (numpy PCG64).

Either mode may also carry Megatron-LM's ``"format"``: ``"thd"`` (packed sequences) or
``"sbhd"`` (each sample padded to --seq-length), kept as :attr:`LengthConfig.format`. Here the
layout follows --sequence-packing (packed: thd, else sbhd); both give the same losses, since
padding is masked. Megatron-LM's ``"mode": "verification"`` (real tokens from an indexed
dataset) is refused in one line: the mock dataset makes random tokens (docs/MIGRATING.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass

import numpy as np

CONFIG_FLAG = "--sft-mock-dataset-config-json"
# A byte order mark (Windows editors, spreadsheet CSV exports) is no part of the text: as
# "utf-8" it would stay glued to the first line, which then read as a header and was skipped.
UTF8_WITH_OPTIONAL_BOM = "utf-8-sig"

# Upstream's default when the flag is unset, as fractions of --seq-length.
DEFAULT_MIN_FRACTION = 0.5
DEFAULT_MEAN_FRACTION = 0.75
DEFAULT_SIGMA = 1.1

_DIST_COMMON_KEYS = frozenset({"mode", "type", "min_seq_len", "max_seq_len"})
_TYPE_KEYS = {
    "lognormal": frozenset({"mean_seq_len", "median_seq_len", "lognormal_sigma", "cap_fraction"}),
    "pareto": frozenset({"pareto_alpha"}),
    "uniform": frozenset(),
    "mixture": frozenset({"components"}),
}
_MIXTURE_KEYS = frozenset({"mode", "type", "components"})
# Megatron-LM's sample layout key (top level, any mode): thd = packed, sbhd = padded.
FORMAT_KEY = "format"
FORMATS = ("thd", "sbhd")
# Megatron-LM's mode whose tokens come from an indexed dataset at "data_path".
VERIFICATION_MODE = "verification"


def _fail(message: str) -> ValueError:
    return ValueError(f"{message} (check {CONFIG_FLAG})")


@dataclass(frozen=True)
class LengthConfig:
    """A parsed length source.

    Attributes:
        mode: "file" or "distribution".
        spec: The validated distribution dict (distribution mode), else None.
        file_lengths: The file's lengths (file mode), else None.
        source: Where the config came from (for messages).
        format: Megatron-LM's ``"format"`` as given ("thd" or "sbhd"), None when not given.
    """

    mode: str
    spec: dict | None = None
    file_lengths: tuple[int, ...] | None = None
    source: str = "<inline>"
    format: str | None = None

    def sample(self, num_samples: int, seed: int) -> np.ndarray:
        """Returns ``num_samples`` lengths (int64); deterministic in ``seed``."""
        if num_samples < 0:
            raise ValueError(f"num_samples={num_samples} must be >= 0")
        if self.mode == "file":
            lengths = np.asarray(self.file_lengths, dtype=np.int64)
            return np.resize(lengths, num_samples).astype(np.int64)
        rng = np.random.default_rng(seed)
        return _sample_distribution(self.spec, num_samples, rng)

    @property
    def max_length(self) -> int:
        """Largest length this config can produce."""
        if self.mode == "file":
            return max(self.file_lengths)
        return _spec_max(self.spec)


def _spec_max(spec: dict) -> int:
    if spec["type"] == "mixture":
        return max(_spec_max(component) for component in spec["components"])
    return int(spec["max_seq_len"])


def default_length_config(seq_length: int) -> LengthConfig:
    """Upstream's default lognormal when the flag is unset."""
    if not isinstance(seq_length, int) or seq_length < 2:
        raise ValueError(f"seq_length={seq_length!r} must be an integer >= 2 (check --seq-length)")
    spec = {
        "mode": "distribution",
        "type": "lognormal",
        "min_seq_len": max(1, seq_length // 2),
        "max_seq_len": seq_length,
        "mean_seq_len": DEFAULT_MEAN_FRACTION * seq_length,
        "lognormal_sigma": DEFAULT_SIGMA,
    }
    return LengthConfig(mode="distribution", spec=_validate_distribution(spec, "default"))


def parse_length_config(value: str | dict | None, seq_length: int) -> LengthConfig:
    """Parses the ``--sft-mock-dataset-config-json`` value.

    Args:
        value: Inline JSON text, a path to a JSON file, an already-parsed dict, or None.
        seq_length: The model's --seq-length; used only for the default (value None).

    Returns:
        The validated LengthConfig.

    Raises:
        ValueError: one line naming the bad value and the flag.
    """
    if value is None:
        return default_length_config(seq_length)
    base_dir, source = os.getcwd(), "<inline>"
    if isinstance(value, dict):
        config = value
    elif isinstance(value, str):
        config, base_dir, source = _load_json_text(value)
    else:
        raise _fail(f"config must be JSON text, a path or a dict, got {type(value).__name__}")
    if not isinstance(config, dict):
        raise _fail(f"config {source} must be a JSON object, got {type(config).__name__}")
    layout = _parse_format(config, source)
    config = {key: value for key, value in config.items() if key != FORMAT_KEY}
    mode = config.get("mode")
    if mode == "file":
        parsed = _parse_file_mode(config, base_dir, source)
    elif mode == "distribution":
        parsed = LengthConfig(mode="distribution", spec=_validate_distribution(config, source),
                              source=source)
    elif mode == VERIFICATION_MODE:
        raise _fail(f"mode {mode!r} in {source} (Megatron-LM's real tokens from 'data_path') "
                    "is not supported: the mock dataset makes random tokens; use mode "
                    "'distribution' with the same lengths, or real data with --data-path")
    else:
        raise _fail(f"unknown mode {mode!r} in {source}; expected 'file' or 'distribution'")
    return dataclasses.replace(parsed, format=layout)


def _parse_format(config: dict, source: str) -> str | None:
    """Megatron-LM's top-level ``"format"`` (None when absent)."""
    layout = config.get(FORMAT_KEY)
    if layout is not None and layout not in FORMATS:
        raise _fail(f"format={layout!r} in {source} must be one of {list(FORMATS)} "
                    "(thd: packed sequences, sbhd: samples padded to --seq-length)")
    return layout


def _load_json_text(value: str) -> tuple[object, str, str]:
    """Returns (parsed JSON, folder for relative paths, source label)."""
    text = value.strip()
    if text.startswith("{"):
        try:
            return json.loads(text), os.getcwd(), "<inline>"
        except json.JSONDecodeError as error:
            raise _fail(f"malformed inline JSON ({error.msg} at char {error.pos})") from None
    if not os.path.isfile(text):
        raise _fail(f"config file {text!r} does not exist and the value is not inline JSON")
    with open(text, encoding=UTF8_WITH_OPTIONAL_BOM) as handle:
        try:
            parsed = json.load(handle)
        except json.JSONDecodeError as error:
            raise _fail(f"malformed JSON in {text!r} ({error.msg}, line {error.lineno})") from None
    return parsed, os.path.dirname(os.path.abspath(text)), text


def _parse_file_mode(config: dict, base_dir: str, source: str) -> LengthConfig:
    unknown = set(config) - {"mode", "path"}
    if unknown:
        raise _fail(f"unknown keys {sorted(unknown)} for mode 'file' in {source}")
    path = config.get("path")
    if not isinstance(path, str) or not path:
        raise _fail(f"mode 'file' needs a 'path' string in {source}, got {path!r}")
    resolved = path if os.path.isabs(path) else os.path.join(base_dir, path)
    if not os.path.isfile(resolved):
        raise _fail(f"lengths file {resolved!r} does not exist")
    lengths = read_lengths_file(resolved)
    return LengthConfig(mode="file", file_lengths=tuple(lengths), source=resolved)


def read_lengths_file(path: str) -> list[int]:
    """Reads one positive integer per line; the first line may be a non-numeric header.

    Raises:
        ValueError: naming the file, line number and bad value.
    """
    lengths: list[int] = []
    with open(path, encoding=UTF8_WITH_OPTIONAL_BOM) as handle:
        for line_number, raw in enumerate(handle, start=1):
            text = raw.strip()
            if not text:
                continue
            if line_number == 1 and not _looks_numeric(text):
                continue  # header line such as "length"
            lengths.append(_parse_length_line(text, path, line_number))
    if not lengths:
        raise _fail(f"lengths file {path!r} contains no lengths")
    return lengths


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _parse_length_line(text: str, path: str, line_number: int) -> int:
    try:
        length = int(text)
    except ValueError:
        raise _fail(f"{path!r} line {line_number}: {text!r} is not an integer length") from None
    if length <= 0:
        raise _fail(f"{path!r} line {line_number}: length {length} must be positive")
    return length


def _require_number(spec: dict, key: str, source: str, minimum: float, integer: bool) -> float:
    value = spec.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(f"{key}={value!r} in {source} must be a finite number")
    if integer and value != int(value):
        raise _fail(f"{key}={value!r} in {source} must be an integer")
    if value < minimum:
        raise _fail(f"{key}={value!r} in {source} must be >= {minimum}")
    return int(value) if integer else float(value)


def _validate_distribution(spec: dict, source: str) -> dict:
    """Checks one distribution spec (recursively for mixtures) and returns a normalised copy."""
    kind = spec.get("type")
    if kind not in _TYPE_KEYS:
        raise _fail(f"unknown distribution type {kind!r} in {source}; "
                    f"expected one of {sorted(_TYPE_KEYS)}")
    if kind == "mixture":
        return _validate_mixture(spec, source)
    unknown = set(spec) - _DIST_COMMON_KEYS - _TYPE_KEYS[kind] - {"weight"}
    if unknown:
        raise _fail(f"unknown keys {sorted(unknown)} for type {kind!r} in {source}")
    out = {"type": kind}
    out["min_seq_len"] = _require_number(spec, "min_seq_len", source, 1, integer=True)
    out["max_seq_len"] = _require_number(spec, "max_seq_len", source, 1, integer=True)
    if out["min_seq_len"] > out["max_seq_len"]:
        raise _fail(f"min_seq_len={out['min_seq_len']} > max_seq_len={out['max_seq_len']} "
                    f"in {source}")
    if kind == "lognormal":
        out.update(_validate_lognormal(spec, source))
    elif kind == "pareto":
        out["pareto_alpha"] = _require_number(spec, "pareto_alpha", source, 1e-6, integer=False)
    return out


def _validate_lognormal(spec: dict, source: str) -> dict:
    has_mean, has_median = "mean_seq_len" in spec, "median_seq_len" in spec
    if has_mean == has_median:
        raise _fail(f"lognormal in {source} needs exactly one of mean_seq_len / median_seq_len")
    sigma = _require_number(spec, "lognormal_sigma", source, 0.0, integer=False)
    center_key = "mean_seq_len" if has_mean else "median_seq_len"
    center = _require_number(spec, center_key, source, 1e-9, integer=False)
    mu = math.log(center) - (sigma * sigma / 2.0 if has_mean else 0.0)
    cap_fraction = 0.0
    if "cap_fraction" in spec:
        cap_fraction = _require_number(spec, "cap_fraction", source, 0.0, integer=False)
        if cap_fraction > 1.0:
            raise _fail(f"cap_fraction={cap_fraction} in {source} must be <= 1")
    return {center_key: center, "lognormal_sigma": sigma, "mu": mu, "cap_fraction": cap_fraction}


def _validate_mixture(spec: dict, source: str) -> dict:
    unknown = set(spec) - _MIXTURE_KEYS - {"weight"}
    if unknown:
        raise _fail(f"unknown keys {sorted(unknown)} for type 'mixture' in {source}")
    components = spec.get("components")
    if not isinstance(components, list) or not components:
        raise _fail(f"mixture in {source} needs a non-empty 'components' list")
    weights, parsed = [], []
    for index, component in enumerate(components):
        label = f"{source} component {index}"
        if not isinstance(component, dict):
            raise _fail(f"{label} must be an object")
        weights.append(_require_number(component, "weight", label, 1e-12, integer=False))
        parsed.append(_validate_distribution(component, label))
    total = sum(weights)
    return {"type": "mixture", "components": parsed,
            "weights": [weight / total for weight in weights]}


def _sample_distribution(spec: dict, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    kind = spec["type"]
    if kind == "mixture":
        return _sample_mixture(spec, num_samples, rng)
    low, high = spec["min_seq_len"], spec["max_seq_len"]
    if kind == "uniform":
        return rng.integers(low, high + 1, size=num_samples, dtype=np.int64)
    if kind == "pareto":
        raw = (rng.pareto(spec["pareto_alpha"], size=num_samples) + 1.0) * low
    else:
        raw = rng.lognormal(spec["mu"], spec["lognormal_sigma"], size=num_samples)
    lengths = np.clip(np.rint(raw), low, high).astype(np.int64)
    if kind == "lognormal" and spec["cap_fraction"] > 0.0:
        lengths[rng.random(num_samples) < spec["cap_fraction"]] = high
    return lengths


def _sample_mixture(spec: dict, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    choice = rng.choice(len(spec["components"]), size=num_samples, p=spec["weights"])
    lengths = np.empty(num_samples, dtype=np.int64)
    for index, component in enumerate(spec["components"]):
        mask = choice == index
        lengths[mask] = _sample_distribution(component, int(mask.sum()), rng)
    return lengths
