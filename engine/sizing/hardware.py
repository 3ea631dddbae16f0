"""Hardware presets (presets/hardware/*.json), custom hardware, and "this machine".

Every preset figure is an object ``{"value", "source", "confidence"}``; user-written files may
also give plain numbers. Compute figures are dense (no 2:4 sparsity). A preset may list
``variants`` (the same product with other memory or bandwidth, each answered too) and a server
preset (DGX H100, Atlas 800I A2) names its device preset and how many one server holds.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .formats import SizingError

GiB = 1 << 30
MiB = 1 << 20
PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"
DEVICE_CLASSES = ("nvidia-datacenter", "nvidia-consumer", "nvidia-edge", "apple", "ascend-310p",
                  "ascend-910", "cpu", "custom")
FRAMEWORKS = ("none", "vllm", "sglang", "vllm-ascend", "mindie", "inferscope")


@dataclass(frozen=True)
class Source:
    """Where one figure of a hardware preset comes from, as its file states it."""

    value: Any  # the figure in the file's unit (None: the device lacks it; absent for grouped figures)
    source: str
    confidence: str


@dataclass(frozen=True)
class Measurement:
    """What ``measure_this_machine`` read off this machine: memory from the OS, the rest timed."""

    memory_total: int  # bytes
    memory_available: int  # bytes
    bandwidth: float  # copy bandwidth, bytes/s
    flops: float  # FP32 matmul FLOP/s
    cpus: int
    method: str  # how bandwidth and FLOP/s were timed


@dataclass(frozen=True)
class PresetInfo:
    """A hardware preset as the listings show it, without building (or measuring) it."""

    key: str
    name: str
    measured: bool  # "measure": true - the figures are read off this machine when it is selected
    vendor: str


@dataclass(frozen=True)
class Hardware:
    key: str
    name: str
    device_class: str
    memory_bytes: int  # per device, what the runtime reports as total (vLLM's util applies to this)
    bandwidth: float  # bytes/s per device
    fp16_flops: float  # dense FLOP/s per device
    bf16_flops: float | None = None  # None: no BF16
    fp8_flops: float | None = None
    int8_ops: float | None = None
    fp32_flops: float | None = None
    interconnect: float | None = None  # bytes/s per direction between devices
    devices_per_card: int = 1
    usable_fraction: float = 1.0  # unified memory: share an accelerator may take
    eta_memory: float = 0.7
    eta_compute: float = 0.5
    runtime_overhead_bytes: int = 650_000_000
    default_framework: str = "none"
    vendor: str = ""
    chip: str = ""
    nominal_memory_bytes: int = 0
    measured: bool = False
    notes: tuple[str, ...] = ()
    sources: Mapping[str, Source] = field(default_factory=dict)  # figure name -> where it comes from
    alias_note: str = ""  # set when an ambiguous alias (e.g. "a100") was resolved to one preset
    #: a server preset: "DGX H100 (8 x H100 SXM 80GB)"; "" for a single device
    server: str = ""
    devices_per_node: int | None = None  # devices one server holds (None: the usual 8)
    #: the same product with other figures (Atlas 300V Pro 24 GB beside 48 GB): each answered too
    variants: tuple[Hardware, ...] = ()

    @property
    def is_310p(self) -> bool:
        return self.device_class == "ascend-310p"

    @property
    def is_ascend(self) -> bool:
        return self.device_class.startswith("ascend")

    @property
    def supports_bf16(self) -> bool:
        return bool(self.bf16_flops)

    @property
    def supports_fp8(self) -> bool:
        return bool(self.fp8_flops)

    def peak(self, compute: str) -> tuple[float, str]:
        """Dense peak for a matmul dtype, falling back to FP16 where the unit is missing."""
        if compute == "fp8" and self.fp8_flops:
            return self.fp8_flops, "FP8"
        if compute == "int8" and self.int8_ops:
            return self.int8_ops, "INT8"
        if compute == "bf16" and self.bf16_flops:
            return self.bf16_flops, "BF16"
        if compute == "fp32":
            if self.fp32_flops:
                return self.fp32_flops, "FP32"
            return self.fp16_flops / 4, "FP32 (assumed FP16/4)"
        return self.fp16_flops, "FP16"


# --------------------------------------------------------------------------------------
# validation: every field of a hardware file (or dict) is checked and named on failure

REQUIRED_FIELDS = ("memory_gib", "bandwidth_gb_s", "fp16_tflops")
# sanity ceilings (far above any real device; they only stop absurd inputs such as 1e300)
CEILINGS: dict[str, float] = {
    "memory_gib": 1e5, "memory_visible_mib": 1e8, "bandwidth_gb_s": 1e6, "fp16_tflops": 1e6, "bf16_tflops": 1e6,
    "fp8_tflops": 1e6, "int8_tops": 1e6, "fp32_tflops": 1e6, "interconnect_gb_s": 1e5,
}
OPTIONAL_RATES = ("bf16_tflops", "fp8_tflops", "int8_tops", "fp32_tflops", "interconnect_gb_s")
MAX_DEVICES_PER_CARD = 16
_SCALE = {"interconnect_gb_s": 1e9}  # unit of each rate field in the file (default: tera, 1e12)
_MISSING = object()


def _bad(name: str, why: str, value: Any) -> SizingError:
    """One-line error that names the field (the CLI prints it and exits 2)."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return SizingError(f"hardware field {name!r} {why}, got {shown}")


def _raw(d: dict[str, Any], name: str) -> Any:
    """A field's value: plain, or the ``value`` of a ``{"value", "source", "confidence"}`` object;
    ``_MISSING`` when absent (a wrapper without ``value`` counts as absent)."""
    if name not in d:
        return _MISSING
    raw = d[name]
    if isinstance(raw, dict):
        return raw.get("value", _MISSING)
    return raw


def _number(name: str, value: Any) -> float:
    """A finite real number (not a bool, not a string, not NaN/inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, "must be a number", value)
    if not math.isfinite(value):
        raise _bad(name, "must be a finite number", value)
    return float(value)


def _positive(name: str, value: Any, *, ceiling: float | None = None) -> float:
    """A required number in (0, ceiling] (absent or null is an error naming the field)."""
    if value is None or value is _MISSING:
        raise SizingError(f"hardware is missing {name!r}" if value is _MISSING else
                          f"hardware field {name!r} must be a positive number, got None")
    v = _number(name, value)
    if v <= 0:
        raise _bad(name, "must be a positive number", value)
    top = CEILINGS.get(name) if ceiling is None else ceiling
    if top is not None and v > top:
        raise _bad(name, f"must be at most {top:g}", value)
    return v


def _optional_positive(name: str, value: Any) -> float | None:
    """An optional figure: None when absent or null (the unit is missing), else as ``_positive``."""
    if value is None or value is _MISSING:
        return None
    return _positive(name, value)


def _fraction(name: str, value: Any) -> float:
    """A share in (0, 1] (efficiencies, usable_fraction)."""
    v = _number(name, value)
    if not 0 < v <= 1:
        raise _bad(name, "must be in (0, 1]", value)
    return v


def _text(d: dict[str, Any], name: str, default: str) -> str:
    value = d.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _bad(name, "must be a string", value)
    return value


def _choice(d: dict[str, Any], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = _text(d, name, default)
    if value not in allowed:
        raise SizingError(f"hardware field {name!r}: unknown value {value!r}; one of: {', '.join(allowed)}")
    return value


def _devices_per_card(d: dict[str, Any]) -> int:
    value = _raw(d, "devices_per_card")
    if value is _MISSING or value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or float(value) != int(value):
        raise _bad("devices_per_card", "must be a whole number", value)
    if not 1 <= int(value) <= MAX_DEVICES_PER_CARD:
        raise _bad("devices_per_card", f"must be between 1 and {MAX_DEVICES_PER_CARD}", value)
    return int(value)


def _efficiency(d: dict[str, Any]) -> tuple[float, float]:
    """``efficiency: {"memory": eta_mem, "compute": eta_compute}``, each in (0, 1]."""
    eff = d.get("efficiency", {})
    if eff is None:
        eff = {}
    if not isinstance(eff, dict):
        raise _bad("efficiency", "must be an object {\"memory\": ..., \"compute\": ...}", eff)
    return (_fraction("efficiency.memory", eff.get("memory", 0.7)),
            _fraction("efficiency.compute", eff.get("compute", 0.5)))


def _overhead_bytes(d: dict[str, Any], memory_bytes: int, default_mb: float) -> int:
    """Runtime overhead (CUDA context, cuBLAS workspace, ...) in MB: >= 0 and below the memory."""
    value = _raw(d, "runtime_overhead_mb")
    if value is _MISSING or value is None:
        value = default_mb
    mb = _number("runtime_overhead_mb", value)
    if mb < 0:
        raise _bad("runtime_overhead_mb", "must be >= 0 MB", value)
    if mb * 1e6 >= memory_bytes:
        raise _bad("runtime_overhead_mb", f"must be below the device memory ({memory_bytes / 1e6:,.0f} MB)", value)
    return int(mb * 1e6)


def _sources(d: dict[str, Any]) -> dict[str, Source]:
    """Each figure of a preset that names its source (``{"value": ..., "source": ..., "confidence": ...}``)."""
    return {k: Source(v.get("value"), str(v.get("source", "")), str(v.get("confidence", "")))
            for k, v in d.items() if isinstance(v, dict) and "source" in v}


def _notes(d: dict[str, Any]) -> tuple[str, ...]:
    notes = d.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise _bad("notes", "must be a list of strings", notes)
    return tuple(notes)


def _memory_bytes(d: dict[str, Any]) -> tuple[int, int]:
    """(memory the runtime sees, nominal memory) in bytes.

    ``memory_visible_mib`` is what CUDA reports as the device total (``cudaMemGetInfo`` /
    ``torch.cuda.mem_get_info()[1]``, the figure vLLM multiplies by gpu_memory_utilization); it
    sits a few hundred MiB under nvidia-smi's total and under the nominal ``memory_gib``.
    """
    mem_gib = _positive("memory_gib", _raw(d, "memory_gib"))
    nominal = int(mem_gib * GiB)
    visible_raw = _raw(d, "memory_visible_mib")
    if visible_raw is _MISSING or visible_raw is None:
        return nominal, nominal
    visible = _positive("memory_visible_mib", visible_raw)
    if visible * MiB > nominal:
        raise _bad("memory_visible_mib", f"must not exceed memory_gib ({mem_gib:g} GiB = {mem_gib * 1024:,.0f} MiB)",
                   visible_raw)
    return int(visible * MiB), nominal


def _tera(d: dict[str, Any], name: str) -> float | None:
    """An optional rate (TFLOPS / TOPS, interconnect GB/s) in FLOP/s or B/s; None: the unit is absent."""
    v = _optional_positive(name, _raw(d, name))
    return None if v is None else v * _SCALE.get(name, 1e12)


def _required_tera(d: dict[str, Any], name: str) -> float:
    """A required rate (fp16_tflops) in FLOP/s."""
    return _positive(name, _raw(d, name)) * _SCALE.get(name, 1e12)


MAX_SERVER_DEVICES = 64
#: the figures a variant may change (everything else is the preset's)
VARIANT_FIELDS = ("name", "memory_gib", "memory_visible_mib", "bandwidth_gb_s", "fp16_tflops", "bf16_tflops",
                  "int8_tops", "chip", "notes")


def _server(d: dict[str, Any]) -> tuple[str, int | None]:
    """``server: {"name": "DGX H100", "devices": 8}`` -> ("DGX H100 (8 x H100 SXM 80GB)", 8): the
    words name the device preset the server is made of; ("", None) for a single device."""
    server = d.get("server")
    if server is None:
        return "", None
    if not isinstance(server, dict):
        raise _bad("server", 'must be an object {"name": ..., "devices": ...}', server)
    name = _text(server, "name", "")
    if not name:
        raise _bad("server.name", "must be a non-empty string", server.get("name"))
    devices = server.get("devices")
    if isinstance(devices, bool) or not isinstance(devices, int) or not 2 <= devices <= MAX_SERVER_DEVICES:
        raise _bad("server.devices", f"must be a whole number between 2 and {MAX_SERVER_DEVICES}", devices)
    return f"{name} ({devices} x {_text(server, 'device_name', '') or _text(d, 'name', 'devices')})", devices


def _device_name(d: dict[str, Any], key: str) -> str:
    """The name answers use: a server preset's device ("H100 SXM 80GB"), else the preset's name."""
    server = d.get("server")
    if isinstance(server, dict) and isinstance(server.get("device_name"), str) and server["device_name"]:
        return str(server["device_name"])
    return _text(d, "name", key)


def _variants(d: dict[str, Any], key: str) -> tuple[Hardware, ...]:
    """``variants: [{"name": ..., "memory_gib": ...}, ...]``: the preset with those figures changed."""
    raw = d.get("variants")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad("variants", "must be a list of objects", raw)
    base = {k: v for k, v in d.items() if k not in ("variants", "aliases")}
    out = []
    for i, variant in enumerate(raw):
        if not isinstance(variant, dict) or not isinstance(variant.get("name"), str):
            raise _bad(f"variants[{i}]", 'must be an object with a "name"', variant)
        unknown = sorted(set(variant) - set(VARIANT_FIELDS))
        if unknown:
            raise _bad(f"variants[{i}]", f"may only change {', '.join(VARIANT_FIELDS)}", unknown)
        out.append(hardware_from_dict({**base, **variant}, f"{key}#{i + 1}"))
    return tuple(out)


def hardware_from_dict(d: dict[str, Any], key: str = "custom") -> Hardware:
    """Build Hardware from a preset-style dict (values plain or {"value": ...}).

    Every field is validated and named on failure (SizingError, a ValueError): required
    ``memory_gib``, ``bandwidth_gb_s``, ``fp16_tflops`` positive and finite; optional rates positive
    or null; ``memory_visible_mib`` <= ``memory_gib``; ``usable_fraction`` and efficiencies in (0, 1];
    ``devices_per_card`` a whole number 1..16; ``runtime_overhead_mb`` >= 0 and below the memory;
    ``server`` {"name", "devices" 2..64}; ``variants`` a list of objects changing only ``VARIANT_FIELDS``.
    """
    if not isinstance(d, dict):
        raise SizingError("a hardware description must be a JSON object")
    if d.get("measure"):
        return this_machine(d, key)
    memory, nominal = _memory_bytes(d)
    server, server_devices = _server(d)
    fp16 = _required_tera(d, "fp16_tflops")
    bf16 = _tera(d, "bf16_tflops") if "bf16_tflops" in d else fp16
    bandwidth = _positive("bandwidth_gb_s", _raw(d, "bandwidth_gb_s"))
    usable = _raw(d, "usable_fraction")
    eta_m, eta_c = _efficiency(d)
    return Hardware(
        key=key, name=_device_name(d, key), device_class=_choice(d, "device_class", "custom", DEVICE_CLASSES),
        memory_bytes=memory, bandwidth=bandwidth * 1e9, fp16_flops=fp16, bf16_flops=bf16,
        fp8_flops=_tera(d, "fp8_tflops"), int8_ops=_tera(d, "int8_tops"), fp32_flops=_tera(d, "fp32_tflops"),
        interconnect=_tera(d, "interconnect_gb_s"), devices_per_card=_devices_per_card(d),
        usable_fraction=1.0 if usable is _MISSING or usable is None else _fraction("usable_fraction", usable),
        eta_memory=eta_m, eta_compute=eta_c, runtime_overhead_bytes=_overhead_bytes(d, memory, 650),
        default_framework=_choice(d, "default_framework", "none", FRAMEWORKS), vendor=_text(d, "vendor", ""),
        chip=_text(d, "chip", ""), nominal_memory_bytes=nominal, notes=_notes(d), sources=_sources(d),
        server=server, devices_per_node=server_devices, variants=_variants(d, key),
    )


CUSTOM_LABELS = {"memory_gib": "memory", "bandwidth_gb_s": "bandwidth", "fp16_tflops": "FP16 TFLOPS",
                 "efficiency.memory": "efficiency (memory)", "efficiency.compute": "efficiency (compute)",
                 "runtime_overhead_mb": "overhead", "devices_per_card": "devices per card",
                 "interconnect_gb_s": "interconnect", "int8_tops": "INT8 TOPS", "fp8_tflops": "FP8 TFLOPS"}


def custom_hardware(memory_gib: float, bandwidth_gb_s: float, fp16_tflops: float, *, name: str = "Custom",
                    int8_tops: float | None = None, bf16: bool = True, fp8_tflops: float | None = None,
                    device_class: str = "custom", devices_per_card: int = 1, eta_memory: float = 0.7,
                    eta_compute: float = 0.5, overhead_mb: float = 650, framework: str = "none",
                    interconnect_gb_s: float | None = 32) -> Hardware:
    """Hardware the user typed in (page: custom entry); every value checked as in a hardware file,
    the error naming the field by its label on the page ("custom hardware: memory must be ...")."""
    optional = {"fp8_tflops": fp8_tflops, "int8_tops": int8_tops}
    d: dict[str, Any] = {
        "name": name, "device_class": device_class, "memory_gib": memory_gib, "bandwidth_gb_s": bandwidth_gb_s,
        "fp16_tflops": fp16_tflops, "bf16_tflops": fp16_tflops if bf16 else None,
        **{k: (None if v in (0, None) and not isinstance(v, bool) else v) for k, v in optional.items()},
        "devices_per_card": devices_per_card, "efficiency": {"memory": eta_memory, "compute": eta_compute},
        "runtime_overhead_mb": overhead_mb, "default_framework": framework, "interconnect_gb_s": interconnect_gb_s}
    try:
        return hardware_from_dict(d, "custom")
    except SizingError as exc:
        text = str(exc)
        for field_name, label in CUSTOM_LABELS.items():
            text = text.replace(f"hardware field {field_name!r}", label).replace(f"hardware is missing {field_name!r}",
                                                                                  f"{label} is missing")
        raise SizingError(f"custom hardware: {text}") from None


# --------------------------------------------------------------------------------------
# this machine


def _meminfo() -> tuple[int, int]:
    total = avail = 0
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    kib = int(rest.split()[0]) * 1024
                    if name == "MemTotal":
                        total = kib
                    else:
                        avail = kib
    except OSError:
        pass
    if not total:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = avail = 8 * GiB
    return total, avail or total


def _best_seconds(work: Any, repeats: int) -> float:
    """Fastest of ``repeats`` timed calls."""
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - t)
    return best


def _measure_numpy(n: int, repeats: int) -> tuple[float, float, str]:
    """(copy bandwidth B/s = 2 n / t (read + write), FP32 matmul FLOP/s = 2 m^3 / t, method)."""
    import numpy as np

    src = np.ones(n // 8, dtype=np.float64)
    dst = np.empty_like(src)
    bandwidth = 2 * n / _best_seconds(lambda: np.copyto(dst, src), repeats)
    m = 1024  # small matrices under-report: BLAS thread wake-up dominates
    a = np.ones((m, m), dtype=np.float32)
    b = np.ones((m, m), dtype=np.float32)
    a @ b
    flops = 2 * m ** 3 / _best_seconds(lambda: a @ b, 2)
    return bandwidth, flops, "numpy"


def _measure_bytes(n: int, repeats: int) -> tuple[float, float, str]:  # pragma: no cover - numpy is a dependency
    src = bytearray(n)
    dst = bytearray(n)

    def copy() -> None:
        dst[:] = src

    return 2 * n / _best_seconds(copy, repeats), 5e9, "bytearray copy (numpy missing: compute assumed 5 GFLOP/s)"


@functools.lru_cache(maxsize=1)
def measure_this_machine(buffer_mib: int = 64, repeats: int = 3) -> Measurement:
    """Memory from the OS, copy bandwidth and FP32 matmul rate measured (once per process)."""
    total, avail = _meminfo()
    n = buffer_mib * MiB
    try:
        bandwidth, flops, method = _measure_numpy(n, repeats)
    except ImportError:  # pragma: no cover - numpy is a dependency
        bandwidth, flops, method = _measure_bytes(n, repeats)
    return Measurement(total, avail, bandwidth, flops, os.cpu_count() or 1, method)


def this_machine(d: dict[str, Any] | None = None, key: str = "this-machine") -> Hardware:
    """The CPU this process runs on, measured (memory from the OS, copy bandwidth, matmul rate)."""
    d = d or {}
    m = measure_this_machine()
    eta_m, eta_c = _efficiency({"efficiency": {"memory": 0.9, "compute": 0.8}} if "efficiency" not in d else d)
    return Hardware(
        key=key, name=_text(d, "name", "This machine (measured)"), device_class="cpu",
        memory_bytes=m.memory_total, bandwidth=m.bandwidth, fp16_flops=m.flops,
        bf16_flops=m.flops, fp8_flops=None, int8_ops=None, fp32_flops=m.flops, interconnect=None,
        usable_fraction=max(0.05, min(1.0, m.memory_available / m.memory_total)),
        eta_memory=eta_m, eta_compute=eta_c,
        runtime_overhead_bytes=_overhead_bytes(d, m.memory_total, 500), default_framework="none",
        vendor="local", chip=f"{m.cpus} CPU cores", nominal_memory_bytes=m.memory_total, measured=True,
        notes=(f"Measured now: {m.memory_total / GiB:.1f} GiB total, {m.memory_available / GiB:.1f} GiB available,"
               f" copy bandwidth {m.bandwidth / 1e9:.1f} GB/s, FP32 matmul {m.flops / 1e9:.0f} GFLOP/s ({m.method}).",),
        sources=_sources(d),
    )


# --------------------------------------------------------------------------------------
# lookup: preset keys, display names and each preset's "aliases" (case and punctuation ignored)


def norm_name(name: str) -> str:
    """Lower case, letters and digits only: "RTX 4090" == "rtx-4090" == "rtx4090"."""
    return "".join(c for c in str(name).lower() if c.isalnum())


@functools.lru_cache(maxsize=1)
def _preset_files() -> dict[str, Path]:
    folder = PRESETS_DIR / "hardware"
    return {p.stem: p for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


@functools.lru_cache(maxsize=64)
def _preset_dict(key: str) -> dict[str, Any]:
    """A preset file's object. A server preset names its device preset (``"device": "h100-sxm"``)
    and holds only what differs (name, aliases, ``server``): the device's figures are filled in."""
    data = json.loads(_preset_files()[key].read_text())
    if not isinstance(data, dict):
        raise SizingError(f"hardware preset {key}: not a JSON object")
    device = data.get("device")
    if device is None:
        return data
    if not isinstance(device, str) or device not in _preset_files() or device == key:
        raise SizingError(f"hardware preset {key}: 'device' must name another preset, got {device!r}")
    base = _preset_dict(device)
    if "device" in base:
        raise SizingError(f"hardware preset {key}: its device {device!r} is itself a server preset")
    inherited = {k: v for k, v in base.items() if k not in ("name", "aliases", "variants", "_source")}
    merged = {**inherited, **{k: v for k, v in data.items() if k != "device"}}
    if isinstance(merged.get("server"), dict):
        merged["server"] = {"device_name": base.get("name", device), **merged["server"]}
    return merged


def hardware_presets() -> list[str]:
    return list(_preset_files())


def hardware_info(key: str) -> dict[str, Any]:
    """The preset file's JSON as written (every figure with its source), for tools that audit or
    edit the files; listings and pages use ``preset_info`` and ``get_hardware``."""
    return _preset_dict(key)


def preset_info(key: str) -> PresetInfo:
    """Key, display name, whether it is measured, vendor: what a listing needs, without measuring."""
    d = _preset_dict(key)
    return PresetInfo(key, _text(d, "name", key), bool(d.get("measure")), _text(d, "vendor", ""))


def preset_aliases(key: str) -> list[str]:
    """The names a preset also answers to: its ``aliases`` list (strings), documented in the JSON."""
    aliases = _preset_dict(key).get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise SizingError(f"hardware preset {key}: 'aliases' must be a list of strings")
    return aliases


@functools.lru_cache(maxsize=1)
def _name_index() -> dict[str, str]:
    """Normalised key, display name and alias -> preset key. Keys win over names, names over aliases;
    an alias claimed by two presets is a data error (caught by tests/test_memory_hardware.py)."""
    index: dict[str, str] = {}
    for pass_ in ("alias", "name", "key"):
        for key in _preset_files():
            names = {"key": [key], "name": [str(_preset_dict(key).get("name", ""))], "alias": preset_aliases(key)}[pass_]
            for n in names:
                if norm_name(n):
                    index[norm_name(n)] = key
    return index


def _family_note(text: str, key: str) -> str:
    """When a short family name (``a100``, ``h100``) picked one of several presets, say so."""
    wanted = norm_name(text)
    siblings = [k for k in _preset_files() if k != key and norm_name(k).startswith(wanted)]
    if not siblings:
        return ""
    name = _preset_dict(key).get("name", key)
    return (f"hardware {text!r} matches several presets ({', '.join([key, *siblings])}); taken as {key}"
            f" ({name}), the most common variant; name the one you have to be sure")


def suggest_hardware(text: str, limit: int = 3) -> list[str]:
    """Closest preset keys to a mistyped name (difflib over keys, names and aliases)."""
    index = _name_index()
    wanted = norm_name(text)
    close = difflib.get_close_matches(wanted, list(index), n=limit * 3, cutoff=0.5)
    close += [n for n in index if wanted and (n.startswith(wanted) or wanted in n)]
    keys: list[str] = []
    for n in close:
        if index[n] not in keys:
            keys.append(index[n])
    return keys[:limit]


def _unknown(text: str) -> SizingError:
    shown = text if len(text) <= 60 else text[:57] + "..."
    close = suggest_hardware(text)
    if close:
        return SizingError(f"unknown hardware {shown!r}; did you mean {', '.join(close)}? (see --list-hardware)")
    return SizingError(f"unknown hardware {shown!r}; presets: {', '.join(hardware_presets())} (see --list-hardware)")


def _from_file(text: str) -> Hardware:
    path = Path(text)
    if not path.is_file():
        raise SizingError(f"hardware file not found: {text}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise SizingError(f"hardware file {text} is not valid JSON: {exc}") from None
    try:
        return hardware_from_dict(data, path.stem)
    except SizingError as exc:
        raise SizingError(f"hardware file {path.name}: {exc}") from None


def resolve_hardware_name(name: str) -> tuple[str, str]:
    """(preset key, note) for a preset key, display name or alias; SizingError with suggestions."""
    text = str(name or "").strip()
    if not text:
        raise SizingError("no hardware given; see --list-hardware")
    if text in _preset_files():
        return text, ""
    key = _name_index().get(norm_name(text))
    if key is None:
        raise _unknown(text)
    return key, _family_note(text, key)


def get_hardware(name: str | os.PathLike[str] | Hardware) -> Hardware:
    """A preset key, display name or alias (case and punctuation ignored), or a JSON file path."""
    if isinstance(name, Hardware):
        return name
    if isinstance(name, os.PathLike):
        return _from_file(os.fspath(name))
    if not isinstance(name, str):
        raise SizingError(f"hardware must be a name or a JSON file path, got {type(name).__name__}")
    text = name.strip()
    if text.endswith(".json") or os.sep in text:
        return _from_file(text)
    key, note = resolve_hardware_name(text)
    hw = hardware_from_dict(_preset_dict(key), key)
    return dataclasses.replace(hw, alias_note=note) if note else hw
