"""llama.cpp logs (llama-server, llama-cli, llama-cpp-python) and ``llama-bench`` tables.

Lines it reads:

    build: 4589 (eb7cf15a) with cc ...             (llama-bench: build: 32d9f7d9 (1786))
    system_info: n_threads = 8 ... | CUDA : ARCHS = 890 | USE_GRAPHS = 1 | ... | CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 0 | ...
    load_tensors: offloaded 33/33 layers to GPU     (llm_load_tensors: in older builds)
    llama_context: n_ctx = 4096                     (llama_new_context_with_model: in older builds)
    llama_context: flash_attn = 1 | enabled | auto
    llama_kv_cache_init: ... type_k = 'q8_0', type_v = 'q8_0'   /   llama_kv_cache: ... K (f16): ..., V (f16): ...
    srv load_model: loading model '/models/x.gguf'
    Device 0: NVIDIA GeForce RTX 3090, compute capability 8.6     (the device: checked against the hardware)
    | model | size | params | backend | ngl | fa | type_k | test | t/s |     (llama-bench)
"""
from __future__ import annotations

import re

from engine.audit.evidence import Benchmark, Setting, Value
from engine.audit.readers.common import Found, number

_BUILD = re.compile(r"^\s*build: (?:([0-9]+) \(([0-9a-f]+|unknown)\)|([0-9a-f]{6,}) \(([0-9]+)\))")
_SYSTEM = re.compile(r"system_info:|\bAVX = [01] \|")
_OFFLOADED = re.compile(r"offloaded ([0-9]+)/([0-9]+) layers to GPU")
_N_CTX = re.compile(r"(?:llama_context|llama_new_context_with_model|llama_init_from_model):\s+n_ctx\s+= ([0-9]+)")
_FLASH = re.compile(r":\s+flash_attn\s+= (\w+)")
_TYPE_KV = re.compile(r"type_k = '(\w+)', type_v = '(\w+)'")
_KV_SIZES = re.compile(r"K \((\w+)\): [0-9.]+ MiB, V \((\w+)\)")
_MODEL = re.compile(r"loading model '([^']+)'")
_DEVICE = re.compile(r"Device [0-9]+: (.+?), compute capability ([0-9.]+)")
_PAIR = re.compile(r"([A-Z][A-Z0-9_]*) = ([0-9]+)")
#: instruction-set features (system_info also lists build options: BLAS, OPENMP, LLAMAFILE, ...)
CPU_FEATURES = ("SSE3", "SSSE3", "AVX", "AVX_VNNI", "AVX2", "F16C", "FMA", "BMI2", "AVX512", "AVX512_VBMI",
                "AVX512_VNNI", "AVX512_BF16", "AMX_INT8", "NEON", "ARM_FMA", "FP16_VA", "DOTPROD", "SVE", "SME",
                "MATMUL_INT8", "WASM_SIMD", "VSX", "RISCV_V")


def _flash(text: str) -> Value:
    return {"1": True, "0": False, "enabled": True, "disabled": False, "on": True, "off": False,
            "true": True, "false": False}.get(text.lower(), text.lower())


def _kv_dtype(k: str, v: str) -> str:
    return k if k == v else f"K {k} / V {v}"


def _bench_table(lines: list[str], put: "_Put") -> Benchmark | None:
    """A llama-bench markdown table -> its rates (test -> t/s, first row per test) and the settings
    its columns state."""
    header: list[str] | None = None
    rates: dict[str, float] = {}
    used: list[int] = []
    for n, line in enumerate(lines, 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if not cells:
            header = None if header and not line.strip() else header
            continue
        if "t/s" in cells and "test" in cells:
            header = cells
            used.append(n)
            continue
        if header is None or len(cells) != len(header) or set(cells[0]) <= set("-: "):
            continue
        row = dict(zip(header, cells))
        m = re.match(r"([0-9.]+)", row.get("t/s", ""))
        if not m:
            continue
        used.append(n)
        rates.setdefault(row["test"].replace(" ", ""), float(m.group(1)))
        if "model" in row:
            put("model", row["model"], n, line)
        if row.get("ngl", "").isdigit():
            put("n_gpu_layers", int(row["ngl"]), n, line)
        if row.get("fa") in ("0", "1"):
            put("flash_attn", row["fa"] == "1", n, line)
        if row.get("type_k") and row.get("type_v"):
            put("kv_cache_dtype", _kv_dtype(row["type_k"], row["type_v"]), n, line)
    return Benchmark("llama-bench", {}, rates, tuple(used)) if rates else None


class _Put:
    def __init__(self) -> None:
        self.found: dict[str, Setting] = {}
        self.used: set[int] = set()

    def __call__(self, name: str, value: Value, n: int, line: str) -> None:
        if value is not None:
            self.found.setdefault(name, Setting(name, value, "log", line, n))
            self.used.add(n)


def read(lines: list[str]) -> Found:
    """Every setting a llama.cpp log or llama-bench table states (module doc)."""
    put = _Put()
    devices: list[tuple[str, int]] = []
    for n, line in enumerate(lines, 1):
        m = _DEVICE.search(line)
        if m:
            devices.append((f"{m.group(1)} (compute capability {m.group(2)})", n))
            put.used.add(n)
            continue
        m = _BUILD.search(line)
        if m:
            build = m.group(1) or m.group(4)
            if build and build != "0":
                put("version", build, n, line)
            continue
        if _SYSTEM.search(line):
            cpu_part = line.split("CPU :", 1)[1] if "CPU :" in line else line
            feats = [k for k, v in _PAIR.findall(cpu_part) if v == "1" and k in CPU_FEATURES]
            if feats:
                put("cpu_features", ",".join(feats), n, line)
            if re.search(r"USE_GRAPHS = 1", line):
                put("cuda_graphs", True, n, line)
            continue
        m = _OFFLOADED.search(line)
        if m:
            put("n_gpu_layers", int(m.group(1)), n, line)
            continue
        m = _N_CTX.search(line)
        if m:
            put("max_model_len", int(number(m.group(1))), n, line)
            continue
        m = _FLASH.search(line)
        if m:
            put("flash_attn", _flash(m.group(1)), n, line)
            continue
        m = _TYPE_KV.search(line) or _KV_SIZES.search(line)
        if m:
            put("kv_cache_dtype", _kv_dtype(m.group(1), m.group(2)), n, line)
            continue
        m = _MODEL.search(line)
        if m:
            put("model", m.group(1), n, line)
    bench = _bench_table(lines, put)
    if not put.found and bench is None:
        return Found([], None, set(), [])
    used = put.used | set(bench.lines if bench else ())
    first = min(used)
    return Found([Setting("framework", "llama.cpp", "log", lines[first - 1], first), *put.found.values()], bench,
                 used, [], None, tuple(devices))
