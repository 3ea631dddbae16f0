"""The calculator's answer records: ``Estimate`` (the JSON contract of ``python -m engine.memory
--json``), the layout where it fits, and the other weight formats tried. Records only, so the
modules that fill them (estimate, advice, formulas) import them without importing each other.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .backends import BACKENDS
from .plan import StageMemory
from .units import margin


@dataclass(frozen=True)
class FormatOption:
    """One weight format tried on the same hardware and workload (a row of "Other formats")."""

    format: str
    label: str
    weight_bytes: int
    total_bytes_per_device: int
    fits: bool
    kv_room_tokens: int
    decode_tokens_per_s: float
    decode_tokens_per_s_roofline: float
    prefill_seconds: float
    support: str  # "supported", or what limits it here
    current: bool


@dataclass(frozen=True)
class VariantAnswer:
    """The verdict on another variant of the same product (Atlas 300V Pro 24 GB beside 48 GB),
    listed where it differs from the main answer."""

    hardware_name: str
    device_memory_bytes: int
    fits: bool
    verdict: str
    devices_needed: int | None
    kv_room_tokens: int


_NOT_CONTRACT = {"contract": False}


@dataclass(frozen=True)
class FittedLayout:
    """Speed and command where it does fit, when it needs more devices than configured."""

    devices: int
    tp: int
    pp: int
    decode_tokens_per_s: float
    decode_tokens_per_s_roofline: float
    prefill_seconds: float
    prefill_seconds_roofline: float
    serve_command: str


@dataclass
class Estimate:
    # identity
    model: str
    model_name: str
    hardware: str
    hardware_name: str
    framework: str
    framework_version: str  # as asked ("" = the default rule)
    budget_rule: str  # budget.VLLM_RULES / SGLANG_RULES entry ("" for none / vllm-ascend)
    weights_format: str
    kv_dtype: str
    vision_dtype: str | None
    # workload
    batch: int
    context: int
    prompt_tokens: int
    output_tokens: int
    images: int
    tiles: int
    image_tokens: int
    tp: int
    pp: int
    devices: int
    device_unit: str  # "chip" for multi-chip cards, else "device"
    # parameters and memory (bytes)
    params_total: int
    params_active: int
    params_vision: int
    weight_bytes: int
    weight_bytes_per_device: int
    vision_weight_bytes_per_device: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_device: int
    kv_bytes: int
    kv_bytes_per_device: int
    activation_bytes: int
    mask_bytes: int
    overhead_bytes: int
    reserve_bytes: int
    total_bytes_per_device: int
    usable_bytes_per_device: int
    over_bytes_per_device: int  # total - usable on the worst device: > 0 over, <= 0 to spare
    device_memory_bytes: int
    kv_pool_bytes: int
    kv_room_tokens: int
    # verdict and searches
    fits: bool
    verdict: str
    verdict_key: str
    reason: str
    devices_needed: int | None
    devices_needed_tp: int | None
    devices_needed_pp: int | None
    max_context: int
    max_batch: int
    # speed
    prefill_seconds: float
    prefill_seconds_roofline: float
    prefill_bound: str
    decode_tokens_per_s: float
    decode_tokens_per_s_roofline: float
    decode_tokens_per_s_total: float
    bound: str
    efficiency_memory: float
    efficiency_compute: float
    peak_flops: float
    peak_label: str
    bandwidth_bytes_per_s: float
    ridge_flops_per_byte: float
    decode_bytes_per_step: float
    decode_flops_per_step: float
    prefill_flops: float
    prefill_bytes: float
    # advice
    serve_command: str
    #: when it only fits on more devices: speed and command there; else None
    at_devices_needed: FittedLayout | None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    alternatives: list[FormatOption] = field(default_factory=list)
    formulas: dict[str, str] = field(default_factory=dict)
    stages: list[StageMemory] = field(default_factory=list)
    #: the hardware's other variants whose verdict differs from this one (module doc of hardware: variants)
    variants: list[VariantAnswer] = field(default_factory=list)
    #: for a server preset (DGX H100, Atlas 800I A2): how the answer uses its devices; "" otherwise
    server: str = ""
    #: the serving backend whose fitted decode rule gave decode_tokens_per_s (backends.BACKENDS key; "" = the
    #: preset's efficiency, no fixed cost) and that rule's fixed time per decode step
    decode_backend: str = ""
    decode_overhead_s: float = 0.0
    # not in the JSON contract
    serve_heading: str = field(default="", metadata=_NOT_CONTRACT)  # which tool the serve line is for, and why
    devices_note: str = field(default="", metadata=_NOT_CONTRACT)  # how the fewest-devices layout was chosen
    serve_note: str = field(default="", metadata=_NOT_CONTRACT)  # why the serve command's context is capped
    #: a window on every KV layer: the most tokens a sequence keeps; kv_room_tokens then counts the pool's
    #: token slots (shared by sequences), not a context limit. None: some layer keeps every token.
    kv_window: int | None = field(default=None, metadata=_NOT_CONTRACT)
    kv_window_sequences: int | None = field(default=None, metadata=_NOT_CONTRACT)  # sequences at a full window

    @property
    def decode_basis(self) -> str:
        """How the decode 'expect' was made: the backend's fitted rule, or the preset's efficiency."""
        rule = BACKENDS.get(self.decode_backend)
        if rule is None:
            return f"at efficiency {self.efficiency_memory:.2f}"
        return (f"at efficiency {self.efficiency_memory:.2f} + {self.decode_overhead_s * 1e3:.1f} ms per step"
                f" ({rule.label}, fitted to published runs)")

    @property
    def margin(self) -> str:
        """How far over the usable memory the worst device is, or how much it has to spare, in words."""
        return margin(self.over_bytes_per_device)

    @property
    def kv_room_unit(self) -> str:
        """What kv_room_tokens counts: "tokens" (the longest context), or "token slots" when every layer slides."""
        return "token slots" if self.kv_window else "tokens"

    @property
    def kv_room_meaning(self) -> str:
        """Words for the KV room when every layer slides ("" otherwise)."""
        if not self.kv_window:
            return ""
        return (f"with a window on every layer a sequence keeps at most its last {self.kv_window:,} tokens, so the"
                f" slots hold {self.kv_window_sequences or 0:,} sequence(s) at a full window and do not limit the context")

    def to_dict(self) -> dict[str, Any]:
        """The JSON contract: every contract field, nested records as plain dicts."""
        d = asdict(self)
        for f in fields(self):
            if f.metadata.get("contract") is False:
                d.pop(f.name)
        return d
