"""vLLM startup logs, V0 and V1 (and vllm-ascend, which is vLLM with a platform plugin).

Lines it reads (the version's own words; each setting keeps the line it came from):

    Initializing an LLM engine (v0.6.3) with config: model='...', ..., tensor_parallel_size=1, ...
    Initializing a V1 LLM engine (v0.8.5) with config: model='...', ..., enable_prefix_caching=True, ...
    vLLM API server version 0.6.3
    args: Namespace(..., gpu_memory_utilization=0.9, max_num_seqs=256, ...)       (V0-era API server)
    non-default args: {'model': '...', 'max_model_len': 8192, ...}               (0.9 onwards)
    # GPU blocks: 27264, # CPU blocks: 2048       (V0: x the block size = tokens, when the log states one)
    GPU KV cache size: 566,016 tokens                                             (V1)
    Maximum concurrency for 32,768 tokens per request: 17.27x                     (its max_model_len)
    Using Flash Attention backend. / Using FlashInfer backend. / Using XFormers backend.
    ... is not supported with TritonMLABackend backend ...                         (V1 names its backend)
    Chunked prefill is enabled with max_num_batched_tokens=2048.
    Graph capturing finished in 13 secs                                           (CUDA graphs on)
    Platform plugin ascend is activated / vllm_ascend / device_config=npu           (vllm-ascend)

Settings a Namespace or dict leaves at None are unset there, not stated, and are skipped.
"""
from __future__ import annotations

import re

from engine.audit.evidence import Setting, Value
from engine.audit.readers.common import Found, join_wrapped, literal, number, scan_dict, scan_pairs

_INIT = re.compile(r"Initializing an? (?:(V[01]) )?LLM engine \(v?([0-9][^)\s]*)\) with config: (.*)$")
_VERSION = re.compile(r"vLLM API server version:? v?([0-9][0-9A-Za-z.+_-]*)")
_NAMESPACE = re.compile(r"args: Namespace\((.*?)\)?\s*$")
_NON_DEFAULT = re.compile(r"non-default args: \{(.*?)\}?\s*$")
_GPU_BLOCKS = re.compile(r"# GPU blocks: ([0-9,]+)")
_KV_TOKENS = re.compile(r"GPU KV cache size: ([0-9,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([0-9,]+) tokens per request")
_BACKEND = re.compile(r"Using ([A-Za-z][A-Za-z0-9 _-]*?) backend|with ([A-Za-z0-9]+)Backend backend")
_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=([0-9]+)")
_GRAPHS = re.compile(r"Graph capturing finished in|Capturing CUDA graphs? (?:for|\()|Capturing cudagraphs? for|"
                     r"setting cudagraph_mode=(?:PIECEWISE|FULL)")
_ASCEND = re.compile(r"Platform plugin ascend is activated|vllm_ascend|vllm-ascend", re.IGNORECASE)

#: the config line's / args' key -> the canonical name (and how to turn the value)
_KEYS: dict[str, str] = {
    "model": "model", "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size", "enable_prefix_caching": "enable_prefix_caching",
    "chunked_prefill_enabled": "enable_chunked_prefill", "enable_chunked_prefill": "enable_chunked_prefill",
    "kv_cache_dtype": "kv_cache_dtype", "quantization": "quantization", "max_seq_len": "max_model_len",
    "max_model_len": "max_model_len", "gpu_memory_utilization": "gpu_memory_utilization",
    "max_num_seqs": "max_num_seqs", "speculative_config": "speculative", "speculative_model": "speculative",
    "enforce_eager": "cuda_graphs",
}


def backend_name(text: str) -> str:
    """A backend as the log names it -> one spelling ("Flash Attention" and "FLASH_ATTN" -> flash_attn)."""
    key = re.sub(r"[\s_-]", "", text).lower()
    return {"flashattention": "flash_attn", "flashattn": "flash_attn", "flashattentionv1": "flash_attn",
            "flashinfer": "flashinfer", "xformers": "xformers", "torchsdpa": "torch_sdpa",
            "tritonattn": "triton", "triton": "triton", "tritonmla": "triton_mla", "flashmla": "flashmla",
            "ascend": "ascend"}.get(key, text.strip().lower())


def _canonical(key: str, raw: str) -> tuple[str, Value] | None:
    name = _KEYS.get(key)
    if name is None:
        return None
    v = literal(raw)
    if name == "cuda_graphs":
        return (name, (not v) if isinstance(v, bool) else None)
    if name in ("speculative", "quantization"):
        return (name, "none" if v is None else str(v))
    if name == "max_model_len" and v is None:
        return None
    return name, v


def read(lines: list[str]) -> Found:
    """Every setting a vLLM startup log states (module doc)."""
    found: dict[str, Setting] = {}
    used: set[int] = set()
    warnings: list[str] = []
    engine: str | None = None
    ascend = False
    devices: list[tuple[str, int]] = []
    block_size = 0  # stated by the config or the args, else unknown
    blocks: tuple[int, int, str] | None = None  # (blocks, line_no, line)

    def put(name: str, value: Value, n: int, line: str) -> None:
        if value is None:
            return
        found.setdefault(name, Setting(name, value, "log", line, n))
        used.add(n)

    for n, line in join_wrapped(lines):
        if _ASCEND.search(line):
            ascend = True
            used.add(n)
        m = _INIT.search(line)
        if m:
            engine = m.group(1) or engine or ("V1" if "V1" in line else "V0")
            put("version", m.group(2), n, line)
            pairs = scan_pairs(m.group(3))
            ascend = ascend or pairs.get("device_config") == "npu"
            if pairs.get("device_config") in ("npu", "cuda"):
                devices.append(("an Ascend NPU (device_config=npu)" if pairs["device_config"] == "npu"
                                else "a CUDA GPU (device_config=cuda)", n))
            for key, raw in pairs.items():
                got = _canonical(key, raw)
                if got:
                    put(*got, n, line)
            if "block_size" in pairs and isinstance(literal(pairs["block_size"]), int):
                block_size = int(literal(pairs["block_size"]))  # type: ignore[arg-type]
            continue
        m = _VERSION.search(line)
        if m:
            put("version", m.group(1), n, line)
            continue
        m = _NAMESPACE.search(line) or _NON_DEFAULT.search(line)
        if m:
            pairs = scan_pairs(m.group(1)) if m.re is _NAMESPACE else scan_dict(m.group(1))
            for key, raw in pairs.items():
                if literal(raw) is None:  # unset in args: not a statement
                    continue
                got = _canonical(key, raw)
                if got:
                    put(*got, n, line)
            if isinstance(literal(pairs.get("block_size", "")), int):
                block_size = int(literal(pairs["block_size"]))  # type: ignore[arg-type]
            continue
        m = _KV_TOKENS.search(line)
        if m:
            put("kv_cache_tokens", int(number(m.group(1))), n, line)
            continue
        m = _GPU_BLOCKS.search(line)
        if m:
            blocks = (int(number(m.group(1))), n, line)
            continue
        m = _CONCURRENCY.search(line)
        if m:  # vLLM prints its max_model_len here
            put("max_model_len", int(number(m.group(1))), n, line)
            continue
        m = _CHUNKED.search(line)
        if m:
            put("enable_chunked_prefill", True, n, line)
            continue
        if _GRAPHS.search(line):
            put("cuda_graphs", True, n, line)
            continue
        m = _BACKEND.search(line)
        if m:
            put("attention_backend", backend_name(m.group(1) or m.group(2)), n, line)
    if blocks is not None and "kv_cache_tokens" not in found:
        if block_size:
            put("kv_cache_tokens", blocks[0] * block_size, blocks[1], blocks[2])
        else:
            used.add(blocks[1])
            warnings.append(f"kv_cache_tokens: {blocks[0]:,} GPU blocks, but the log states no block size: the "
                            f"tokens are not known (vLLM's CUDA default is 16)")
    if not found and not ascend:
        return Found([], None, set(), [])
    framework = "vllm-ascend" if ascend else "vllm"
    first = min(used) if used else 1
    settings = [Setting("framework", framework, "log", lines[first - 1], first)] + list(found.values())
    return Found(settings, None, used, warnings, engine, tuple(devices))
