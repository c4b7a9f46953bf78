"""Cost model: estimated per-rank time of a sequence on a context-parallel group.

Per-rank time of one sequence of padded length L on a CP group of size c::

    t(L, c) = (a*L^2 + a_w*m*(2L - m) + b*L) / c  +  [c > 1] * g * L * (c - 1) / c

and, once per micro-batch, every rank of a group of size c > 1 pays ``d * (c - 1)`` (the fixed
latency of the group's ring steps, shared by every sequence packed into that group). The
``a_w`` term prices the layers that attend through a sliding window of ``window`` earlier keys:
m = min(L, window + 1), the squared tokens of attention_area.py (L^2 up to window + 1 tokens,
linear in L beyond); without a window a_w = 0 and the term is absent.

Only :class:`CostModel` knows this formula: everything else asks it for ``time``, ``tokens``,
``group_latency`` and best fit's inverse ``longest_fitting`` (another model: the same methods).

Units (see docs/SCHEDULING.md): one unit is the time of the attention work of one token pair in
one layer, fwd+bwd, i.e. ``12*h`` FLOPs at the attention FLOP rate (the ``b = 6h`` convention
counts attention as 12*h*L^2 and the dense linear layers as 72*h^2*L FLOPs per layer). With that
unit ``a = 1``, ``b = 6*h``, ``g = F_attn / BW`` (FLOP per byte: a ring moves 12*h_kv bytes per
token per layer fwd+bwd) and ``d = latency * F_attn / (12*h)``. Every layer scales all four terms
alike, so the per-layer unit gives the same schedules as a whole-model one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from megatron.varlen.scheduling.attention_area import attention_area

# Attention FLOPs per token pair per layer (fwd+bwd) per unit of hidden size, under the
# convention that makes b/a = 6*h: linear 72*h^2*L FLOPs vs attention 12*h*L^2 FLOPs.
ATTENTION_FLOPS_PER_PAIR_PER_HIDDEN = 12.0
LINEAR_TO_ATTENTION_RATIO = 6.0
# A ring step moves K and V forward, then K, V and dK, dV backward: 3 * 2 tensors of h_kv
# bf16 (2 bytes) values per token per layer.
RING_BYTES_PER_TOKEN_PER_KV_HIDDEN = 12.0
DEFAULT_HIDDEN_SIZE = 4096


@dataclass(frozen=True)
class HardwareProfile:
    """Achieved (not peak) rates of one GPU and its CP interconnect.

    Attributes:
        name: Profile name used by ``CostModel.for_model``.
        attention_flops_per_s: Achieved fwd+bwd attention FLOP rate of one GPU.
        p2p_bytes_per_s: Achieved one-direction point-to-point bandwidth per GPU in a ring.
        p2p_latency_s: Fixed latency of one ring step (fwd and bwd rounds) of one layer.
        source: Where the numbers come from.
        linear_to_attention_ratio: b / (a * hidden_size): how much a token's dense layers cost
            against one token pair's attention. 6 by the FLOP convention above; a measured
            profile (tools/measure_cost_model.py) brings the ratio of achieved times.
    """

    name: str
    attention_flops_per_s: float
    p2p_bytes_per_s: float
    p2p_latency_s: float
    source: str
    linear_to_attention_ratio: float = LINEAR_TO_ATTENTION_RATIO


# H100 SXM5: 989 TFLOP/s dense BF16 peak (NVIDIA H100 datasheet); FlashAttention-3 reports
# 600-750 TFLOP/s forward, backward is slower, so 500 TFLOP/s fwd+bwd is a conservative achieved
# rate. NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction per GPU; NCCL send/recv reaches
# about 350 GB/s. Small-message NCCL p2p latency within a node is about 10 us per round, two
# rounds (fwd, bwd) per ring step per layer.
H100_NVLINK = HardwareProfile(
    name="h100_nvlink",
    attention_flops_per_s=500e12,
    p2p_bytes_per_s=350e9,
    p2p_latency_s=20e-6,
    source="H100 SXM5 datasheet, FlashAttention-3 paper, NVLink 4 spec (see SCHEDULING.md)",
)
# Same GPU, CP ring across nodes: 400 Gb/s NDR InfiniBand per GPU = 50 GB/s, ~40 GB/s achieved;
# inter-node p2p latency about 20 us per round.
H100_INFINIBAND = HardwareProfile(
    name="h100_infiniband",
    attention_flops_per_s=500e12,
    p2p_bytes_per_s=40e9,
    p2p_latency_s=40e-6,
    source="H100 SXM5 datasheet, ConnectX-7 NDR 400 Gb/s (see SCHEDULING.md)",
)
PROFILES = {profile.name: profile for profile in (H100_NVLINK, H100_INFINIBAND)}
# The fields a hardware-profile JSON file must give (tools/measure_cost_model.py writes them).
PROFILE_RATES = ("attention_flops_per_s", "p2p_bytes_per_s", "p2p_latency_s",
                 "linear_to_attention_ratio")


def load_hardware_profile(path: str) -> HardwareProfile:
    """A hardware profile from a JSON file (``--hardware-profile PATH``).

    Raises:
        ValueError: one line naming the file and what is wrong with it.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--hardware-profile {path}: cannot read a JSON profile "
                         f"({type(error).__name__}: {error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--hardware-profile {path}: expected a JSON object")
    missing = [key for key in PROFILE_RATES if key not in data]
    if missing:
        raise ValueError(f"--hardware-profile {path}: missing {', '.join(missing)} (write it "
                         f"with tools/measure_cost_model.py)")
    for key in PROFILE_RATES:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0 or (value == 0 and key != "p2p_latency_s"):
            raise ValueError(f"--hardware-profile {path}: {key}={value!r} must be a positive "
                             f"number")
    return HardwareProfile(name=str(data.get("name", path)), source=str(data.get("source", path)),
                           **{key: float(data[key]) for key in PROFILE_RATES})


def resolve_hardware_profile(profile: "str | HardwareProfile") -> HardwareProfile:
    """A profile from its name in :data:`PROFILES`, a JSON file's path, or itself."""
    if isinstance(profile, HardwareProfile):
        return profile
    if profile in PROFILES:
        return PROFILES[profile]
    if profile.endswith(".json"):
        return load_hardware_profile(profile)
    raise ValueError(f"unknown hardware profile {profile!r}; known: {sorted(PROFILES)} or a "
                     f"JSON file (check --hardware-profile)")


def _comm_coefficient(profile: HardwareProfile, kv_fraction: float) -> float:
    """g in time units per token: (12*h_kv/BW) / (12*h/F) = kv_fraction * F / BW."""
    ratio = RING_BYTES_PER_TOKEN_PER_KV_HIDDEN / ATTENTION_FLOPS_PER_PAIR_PER_HIDDEN
    return kv_fraction * ratio * profile.attention_flops_per_s / profile.p2p_bytes_per_s


def _latency_coefficient(profile: HardwareProfile, hidden_size: int) -> float:
    """d in time units: latency / (12*h / F)."""
    unit_seconds = ATTENTION_FLOPS_PER_PAIR_PER_HIDDEN * hidden_size / profile.attention_flops_per_s
    return profile.p2p_latency_s / unit_seconds


_DEFAULT_G = _comm_coefficient(H100_NVLINK, 1.0)
_DEFAULT_D = _latency_coefficient(H100_NVLINK, DEFAULT_HIDDEN_SIZE)


@dataclass(frozen=True)
class CostModel:
    """Coefficients of the cost model; defaults: a 4096-hidden dense model on H100 NVLink.

    Attributes:
        a: Quadratic (attention) coefficient; 1 by definition of the unit.
        b: Linear (dense layers) coefficient; 6*hidden_size unless measured.
        g: Per-token ring communication cost, paid on (c-1)/c of the tokens.
        d: Fixed per-micro-batch latency per ring step of a CP group.
        a_window: The windowed layers' share of the quadratic coefficient, priced on the
            sliding window's squared tokens (0: no window).
        window: The sliding window's LEFT (--window-size); needed when a_window > 0.
    """

    a: float = 1.0
    b: float = LINEAR_TO_ATTENTION_RATIO * DEFAULT_HIDDEN_SIZE
    g: float = _DEFAULT_G
    d: float = _DEFAULT_D
    a_window: float = 0.0
    window: int | None = None

    def __post_init__(self) -> None:
        for name in ("a", "b", "g", "d", "a_window"):
            value = getattr(self, name)
            if not 0.0 <= value < math.inf:  # also rejects NaN
                raise ValueError(f"cost coefficient {name}={value} must be >= 0 and finite "
                                 f"(check --cost-{name})")
        if self.a_window and (self.window is None or self.window < 0):
            raise ValueError(f"cost coefficient a_window={self.a_window} prices a sliding "
                             f"window, but window={self.window} (check --window-size)")
        if self.a == 0.0 and self.b == 0.0 and self.a_window == 0.0:
            raise ValueError("cost coefficients a and b are both 0: every sequence would be free "
                             "(check --cost-a/--cost-b)")

    @classmethod
    def for_model(cls, hidden_size: int, profile: str | HardwareProfile = "h100_nvlink",
                  kv_fraction: float = 1.0, **overrides: float) -> "CostModel":
        """Builds the default cost model of a dense decoder on a hardware profile.

        Args:
            hidden_size: The model's hidden size h (b = 6*h, or the profile's measured ratio
                times h).
            profile: A profile name from ``PROFILES``, a JSON profile's path or a
                HardwareProfile.
            kv_fraction: num_query_groups / num_attention_heads (GQA shrinks ring traffic).
            **overrides: Any of a, b, g, d to replace (e.g. from a measured profile).
        """
        if hidden_size <= 0:
            raise ValueError(f"hidden_size={hidden_size} must be positive (check --hidden-size)")
        profile = resolve_hardware_profile(profile)
        values = {
            "a": 1.0,
            "b": profile.linear_to_attention_ratio * hidden_size,
            "g": _comm_coefficient(profile, kv_fraction),
            "d": _latency_coefficient(profile, hidden_size),
        }
        unknown = set(overrides) - set(values)
        if unknown:
            raise ValueError(f"unknown cost overrides {sorted(unknown)}; expected a, b, g, d")
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)

    def time(self, padded, cp_size):
        """Per-rank time t(P, c) of padded length P on c ranks (without the group latency), for
        numbers or numpy arrays. On one rank the ring term is exactly 0.0, so one expression
        serves every size; P is squared as an integer (exact), then scaled by a (the windowed
        layers' squared tokens too, by a_window)."""
        attention = self.a * (padded * padded)
        if self.a_window:
            attention = attention + self.a_window * attention_area(padded, self.window)
        return ((attention + self.b * padded) / cp_size
                + self.g * padded * (cp_size - 1) / cp_size)

    @staticmethod
    def tokens(padded, cp_size):
        """Per-rank tokens (what the budget counts) of padded length P on c ranks."""
        return padded // cp_size

    def group_latency(self, cp_size):
        """Per-micro-batch fixed latency every rank of a group of ``cp_size`` pays."""
        return self.d * (cp_size - 1)

    def longest_fitting(self, time_room: float, token_room: int, cp_size: int) -> float:
        """The largest padded length P (a multiple of c) with time(P, c) <= time_room and
        tokens(P, c) <= token_room, as a real number (best fit rounds it down to the padding
        multiple): the positive root of c t = a P^2 + (b + g (c - 1)) P, or a line's; with a
        window, of (a + a_w) P^2 + ... up to the window's m = window + 1 tokens, and beyond of
        a P^2 + (b + g (c - 1) + 2 a_w m) P - a_w m^2 (time grows with P on both pieces)."""
        linear = self.b + self.g * (cp_size - 1)
        scaled = cp_size * time_room
        by_time = _positive_root(self.a + self.a_window, linear, scaled)
        if self.a_window and by_time > self.window + 1:
            band = self.window + 1
            by_time = _positive_root(self.a, linear + 2.0 * self.a_window * band,
                                     scaled + self.a_window * band * band)
        return min(by_time, token_room * cp_size)

    def as_dict(self) -> dict[str, float]:
        """The coefficients as a plain dict (for JSON output); the window's only with one."""
        window = {"a_window": self.a_window, "window": self.window} if self.a_window else {}
        return {"a": self.a, "b": self.b, "g": self.g, "d": self.d, **window}


def _positive_root(quadratic: float, linear: float, value: float) -> float:
    """The P >= 0 with quadratic P^2 + linear P = value (a line's root when quadratic is 0)."""
    if quadratic > 0.0:
        return (math.sqrt(linear * linear + 4.0 * quadratic * value) - linear) / (2.0 * quadratic)
    return value / linear
