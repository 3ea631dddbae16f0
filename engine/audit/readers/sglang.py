"""SGLang startup logs.

Lines it reads:

    server_args=ServerArgs(model_path='...', tp_size=1, mem_fraction_static=0.88, chunked_prefill_size=8192,
                           disable_radix_cache=False, disable_cuda_graph=False, attention_backend='flashinfer', ...)
    max_total_num_tokens=N, chunked_prefill_size=..., max_prefill_tokens=..., max_running_requests=..., context_len=...
    Using KV cache dtype: torch.bfloat16
    Attention backend not specified. Use fa3 backend by default.
    KV Cache is allocated. #tokens: N, K size: ... GB, V size: ... GB
    Capture cuda graph begin / end                                                  (CUDA graphs on)
    sglang==0.4.6 / sglang: 0.4.6.post1 (collect_env) / SGLang v0.4.6

``ServerArgs`` is printed after SGLang resolved its defaults, so its values are what ran; a None
there means "left to the model or the runtime" and is not a statement.
"""
from __future__ import annotations

import re

from engine.audit.evidence import Setting, Value
from engine.audit.readers.common import Found, join_wrapped, literal, number, scan_pairs

_SERVER_ARGS = re.compile(r"server_args=ServerArgs\((.*?)\)?\s*$")
_MAX_TOTAL = re.compile(r"max_total_num_tokens=([0-9,]+)")
_KV_DTYPE = re.compile(r"Using KV cache dtype: (\S+)")
_BACKEND_DEFAULT = re.compile(r"Attention backend not (?:specified|set)\. Use (\w+) backend by default")
_KV_ALLOC = re.compile(r"KV Cache is allocated\.? #tokens: ([0-9,]+)")
_GRAPH = re.compile(r"Capture (?:cuda|CUDA) graph (?:begin|end)")
_VERSION = re.compile(r"\bsglang(?:==|:\s*|\s+v|\s+version:?\s*v?)([0-9]+\.[0-9][0-9A-Za-z.+_-]*)", re.IGNORECASE)


#: ServerArgs field -> canonical name, for fields read as they are
_SAME: dict[str, str] = {
    "model_path": "model", "tp_size": "tensor_parallel_size", "pp_size": "pipeline_parallel_size",
    "kv_cache_dtype": "kv_cache_dtype", "quantization": "quantization", "attention_backend": "attention_backend",
    "context_length": "max_model_len", "mem_fraction_static": "gpu_memory_utilization",
    "max_running_requests": "max_num_seqs", "speculative_algorithm": "speculative",
}
#: ServerArgs "disable_*" switch -> the canonical setting it turns off
_DISABLES: dict[str, str] = {"disable_radix_cache": "enable_prefix_caching", "disable_cuda_graph": "cuda_graphs"}


def _canonical(key: str, raw: str) -> tuple[str, Value] | None:
    v = literal(raw)
    if v is None:
        return None
    if key in _SAME:
        return _SAME[key], v
    if key in _DISABLES and isinstance(v, bool):
        return _DISABLES[key], not v
    if key == "chunked_prefill_size" and isinstance(v, int):  # -1 (or 0) turns chunking off
        return "enable_chunked_prefill", v > 0
    return None


def read(lines: list[str]) -> Found:
    """Every setting an SGLang startup log states (module doc)."""
    found: dict[str, Setting] = {}
    used: set[int] = set()
    marked = False  # a line only SGLang prints was read (ServerArgs, its token budget, its version)

    def put(name: str, value: Value, n: int, line: str) -> None:
        found.setdefault(name, Setting(name, value, "log", line, n))
        used.add(n)

    for n, line in join_wrapped(lines):
        m = _SERVER_ARGS.search(line)
        if m:
            marked = True
            for key, raw in scan_pairs(m.group(1)).items():
                got = _canonical(key, raw)
                if got:
                    put(*got, n, line)
            continue
        m = _MAX_TOTAL.search(line) or _KV_ALLOC.search(line)
        if m:
            marked = True
            put("kv_cache_tokens", int(number(m.group(1))), n, line)
            pairs = scan_pairs(line[m.start():]) if m.re is _MAX_TOTAL else {}
            for key in ("chunked_prefill_size", "max_running_requests", "context_len"):
                if key in pairs:
                    got = _canonical("context_length" if key == "context_len" else key, pairs[key])
                    if got:
                        put(*got, n, line)
            continue
        m = _KV_DTYPE.search(line)
        if m:
            put("kv_cache_dtype", m.group(1), n, line)
            continue
        m = _BACKEND_DEFAULT.search(line)
        if m:
            put("attention_backend", m.group(1), n, line)
            continue
        if _GRAPH.search(line):
            put("cuda_graphs", True, n, line)
            continue
        m = _VERSION.search(line)
        if m:
            marked = True
            put("version", m.group(1), n, line)
    if not found or not marked:  # (a graph-capture or KV-dtype line alone does not make a log SGLang's)
        return Found([], None, set(), [])
    first = min(used)
    return Found([Setting("framework", "sglang", "log", lines[first - 1], first), *found.values()], None, used, [])
