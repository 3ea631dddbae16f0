"""Hardware presets (presets/hardware/*.json), custom hardware, and "this machine".

Every preset figure is an object ``{"value", "source", "confidence"}``; user-written files may
also give plain numbers. Compute figures are dense (no 2:4 sparsity).
"""
from __future__ import annotations

import functools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .formats import SizingError

GiB = 1 << 30
MiB = 1 << 20
PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"
DEVICE_CLASSES = ("nvidia-datacenter", "nvidia-consumer", "nvidia-edge", "apple", "ascend-310p",
                  "ascend-910", "cpu", "custom")
FRAMEWORKS = ("none", "vllm", "sglang", "vllm-ascend")


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
    sources: dict = field(default_factory=dict)

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


def _value(d: dict, name: str, default: Any = None) -> Any:
    raw = d.get(name, default)
    if isinstance(raw, dict):
        return raw.get("value", default)
    return raw


def _positive(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SizingError(f"hardware field {name!r} must be a positive number, got {value!r}")
    return float(value)


def hardware_from_dict(d: dict, key: str = "custom") -> Hardware:
    """Build Hardware from a preset-style dict (values plain or {"value": ...})."""
    if not isinstance(d, dict):
        raise SizingError("a hardware description must be a JSON object")
    if d.get("measure"):
        return this_machine(d, key)
    mem_gib = _positive("memory_gib", _value(d, "memory_gib"))
    visible_mib = _value(d, "memory_visible_mib")
    memory = int(_positive("memory_visible_mib", visible_mib) * MiB) if visible_mib is not None else int(mem_gib * GiB)
    eff = d.get("efficiency") or {}
    cls = str(d.get("device_class", "custom"))
    if cls not in DEVICE_CLASSES:
        raise SizingError(f"unknown device_class {cls!r}; one of: {', '.join(DEVICE_CLASSES)}")
    framework = str(d.get("default_framework", "none"))
    if framework not in FRAMEWORKS:
        raise SizingError(f"unknown default_framework {framework!r}; one of: {', '.join(FRAMEWORKS)}")

    def tera(name: str) -> float | None:
        v = _positive(name, _value(d, name), allow_none=True)
        return None if v is None else v * 1e12

    fp16 = tera("fp16_tflops")
    if fp16 is None:
        raise SizingError("hardware is missing 'fp16_tflops'")
    bf16 = tera("bf16_tflops") if "bf16_tflops" in d else fp16
    ic = _value(d, "interconnect_gb_s")
    sources = {k: v for k, v in d.items() if isinstance(v, dict) and "source" in v}
    return Hardware(
        key=key, name=str(d.get("name", key)), device_class=cls, memory_bytes=memory,
        bandwidth=_positive("bandwidth_gb_s", _value(d, "bandwidth_gb_s")) * 1e9,
        fp16_flops=fp16, bf16_flops=bf16, fp8_flops=tera("fp8_tflops"), int8_ops=tera("int8_tops"),
        fp32_flops=tera("fp32_tflops"),
        interconnect=None if ic is None else _positive("interconnect_gb_s", ic) * 1e9,
        devices_per_card=int(d.get("devices_per_card", 1) or 1),
        usable_fraction=float(_value(d, "usable_fraction", 1.0) or 1.0),
        eta_memory=_positive("efficiency.memory", eff.get("memory", 0.7)),
        eta_compute=_positive("efficiency.compute", eff.get("compute", 0.5)),
        runtime_overhead_bytes=int(float(_value(d, "runtime_overhead_mb", 650) or 0) * 1e6),
        default_framework=framework, vendor=str(d.get("vendor", "")), chip=str(d.get("chip", "")),
        nominal_memory_bytes=int(mem_gib * GiB), notes=tuple(d.get("notes") or ()), sources=sources,
    )


def custom_hardware(memory_gib: float, bandwidth_gb_s: float, fp16_tflops: float, *, name: str = "Custom",
                    int8_tops: float | None = None, bf16: bool = True, fp8_tflops: float | None = None,
                    device_class: str = "custom", devices_per_card: int = 1, eta_memory: float = 0.7,
                    eta_compute: float = 0.5, overhead_mb: float = 650, framework: str = "none",
                    interconnect_gb_s: float | None = 32) -> Hardware:
    """Hardware the user typed in (page: custom entry)."""
    for label, v in (("memory", memory_gib), ("bandwidth", bandwidth_gb_s), ("FP16 TFLOPS", fp16_tflops)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise SizingError(f"custom hardware: {label} must be a positive number, got {v!r}")
    for label, v in (("efficiency (memory)", eta_memory), ("efficiency (compute)", eta_compute)):
        if not 0 < v <= 1:
            raise SizingError(f"custom hardware: {label} must be in (0, 1], got {v!r}")
    if overhead_mb < 0:
        raise SizingError(f"custom hardware: overhead must be >= 0 MB, got {overhead_mb!r}")
    d = {"name": name, "device_class": device_class, "memory_gib": memory_gib, "bandwidth_gb_s": bandwidth_gb_s,
         "fp16_tflops": fp16_tflops, "bf16_tflops": fp16_tflops if bf16 else None,
         "fp8_tflops": fp8_tflops or None, "int8_tops": int8_tops or None, "devices_per_card": devices_per_card,
         "efficiency": {"memory": eta_memory, "compute": eta_compute}, "runtime_overhead_mb": overhead_mb,
         "default_framework": framework, "interconnect_gb_s": interconnect_gb_s}
    return hardware_from_dict(d, "custom")


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


@functools.lru_cache(maxsize=1)
def measure_this_machine(buffer_mib: int = 64, repeats: int = 3) -> dict:
    """Memory from the OS, copy bandwidth and FP32 matmul rate measured (once per process)."""
    total, avail = _meminfo()
    n = buffer_mib * MiB
    try:
        import numpy as np

        src = np.ones(n // 8, dtype=np.float64)
        dst = np.empty_like(src)
        best = math.inf
        for _ in range(repeats):
            t = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - t)
        bandwidth = 2 * n / best  # read + write
        m = 1024  # small matrices under-report: BLAS thread wake-up dominates
        a = np.ones((m, m), dtype=np.float32)
        b = np.ones((m, m), dtype=np.float32)
        a @ b
        best_mm = math.inf
        for _ in range(2):
            t = time.perf_counter()
            a @ b
            best_mm = min(best_mm, time.perf_counter() - t)
        flops = 2 * m ** 3 / best_mm
        method = "numpy"
    except ImportError:  # pragma: no cover - numpy is a dependency
        src = bytearray(n)
        dst = bytearray(n)
        best = math.inf
        for _ in range(repeats):
            t = time.perf_counter()
            dst[:] = src
            best = min(best, time.perf_counter() - t)
        bandwidth = 2 * n / best
        flops = 5e9
        method = "bytearray copy (numpy missing: compute assumed 5 GFLOP/s)"
    return {"memory_total": total, "memory_available": avail, "bandwidth": bandwidth, "flops": flops,
            "cpus": os.cpu_count() or 1, "method": method}


def this_machine(d: dict | None = None, key: str = "this-machine") -> Hardware:
    d = d or {}
    m = measure_this_machine()
    eff = d.get("efficiency") or {}
    return Hardware(
        key=key, name=str(d.get("name", "This machine (measured)")), device_class="cpu",
        memory_bytes=int(m["memory_total"]), bandwidth=m["bandwidth"], fp16_flops=m["flops"],
        bf16_flops=m["flops"], fp8_flops=None, int8_ops=None, fp32_flops=m["flops"], interconnect=None,
        usable_fraction=max(0.05, min(1.0, m["memory_available"] / m["memory_total"])),
        eta_memory=float(eff.get("memory", 0.9)), eta_compute=float(eff.get("compute", 0.8)),
        runtime_overhead_bytes=int(float(_value(d, "runtime_overhead_mb", 500)) * 1e6), default_framework="none",
        vendor="local", chip=f"{m['cpus']} CPU cores", nominal_memory_bytes=int(m["memory_total"]), measured=True,
        notes=(f"Measured now: {m['memory_total'] / GiB:.1f} GiB total, {m['memory_available'] / GiB:.1f} GiB available,"
               f" copy bandwidth {m['bandwidth'] / 1e9:.1f} GB/s, FP32 matmul {m['flops'] / 1e9:.0f} GFLOP/s ({m['method']}).",),
        sources={k: v for k, v in d.items() if isinstance(v, dict) and "source" in v},
    )


# --------------------------------------------------------------------------------------
# lookup


def _norm(name: str) -> str:
    return "".join(c for c in str(name).lower() if c.isalnum())


@functools.lru_cache(maxsize=1)
def _preset_files() -> dict[str, Path]:
    folder = PRESETS_DIR / "hardware"
    return {p.stem: p for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


@functools.lru_cache(maxsize=64)
def _preset_dict(key: str) -> dict:
    return json.loads(_preset_files()[key].read_text())


def hardware_presets() -> list[str]:
    return list(_preset_files())


def hardware_info(key: str) -> dict:
    """The raw preset (with sources), for listings and the page."""
    return _preset_dict(key)


def get_hardware(name: str) -> Hardware:
    """A preset key (case and punctuation ignored), a preset's display name, or a JSON file path."""
    if isinstance(name, Hardware):
        return name
    text = str(name or "").strip()
    if not text:
        raise SizingError("no hardware given; see --list-hardware")
    files = _preset_files()
    if text in files:
        return hardware_from_dict(_preset_dict(text), text)
    wanted = _norm(text)
    for key in files:
        if _norm(key) == wanted or _norm(_preset_dict(key).get("name", "")) == wanted:
            return hardware_from_dict(_preset_dict(key), key)
    path = Path(text)
    if path.suffix == ".json" or os.sep in text:
        if not path.is_file():
            raise SizingError(f"hardware file not found: {text}")
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SizingError(f"hardware file {text} is not valid JSON: {exc}") from None
        return hardware_from_dict(data, path.stem)
    raise SizingError(f"unknown hardware {text!r}; see --list-hardware")
