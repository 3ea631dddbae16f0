"""Storage formats: bytes per weight parameter and bytes per KV-cache element.

All sizes are exact fractions so that byte counts come out as exact integers (rounded up
once, at the end). Sources: sizing.md §3.2 (llama.cpp ``GGML_QUANT_SIZES``, AWQ/GPTQ group
layout, bitsandbytes NF4) and §3.3 (per-token-head KV scales).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction as F

# The one dtype vocabulary lives with the shared HF-config readers (engine/core/hf_config.py, torch-free);
# the calculator's names for it are these.
from ..core.hf_config import CHECKPOINT_DTYPES as CHECKPOINT_DTYPES
from ..core.hf_config import DTYPE_ALIASES as DTYPE_ALIASES
from ..core.hf_config import FLOAT_DTYPE_NAMES as FLOAT_DTYPE_NAMES
from ..core.hf_config import dtype_key as dtype_key
from ..core.hf_config import dtype_spellings as dtype_spellings


class SizingError(ValueError):
    """A bad input to the calculator. The message is one line, meant for a person."""


@dataclass(frozen=True)
class WeightFormat:
    key: str
    label: str
    bytes_per_param: F
    #: Embeddings and LM head stored in this format too (GGUF) or kept in 16 bit (AWQ, GPTQ,
    #: bitsandbytes, FP8/INT8 recipes usually skip them).
    quantizes_embeddings: bool
    #: Which peak the matrix multiplies run at: "fp32", "fp16", "bf16", "fp8" or "int8".
    compute: str
    family: str  # "float" | "quant" | "gguf"
    vllm_quantization: str | None
    sglang_quantization: str | None
    note: str
    #: Decode efficiency relative to 16-bit weights: dequantising kernels reach a smaller share of
    #: the bandwidth roofline. sizing.md §9 (llama.cpp, same GPUs): Q4_K_M eta 0.35-0.65 vs F16
    #: 0.45-0.90, about 0.7x; 8-bit formats sit between (assumed 0.9x).
    eta_factor: float = 1.0
    #: Only the routed experts are stored in this format, everything else 16-bit (MXFP4 checkpoints).
    experts_only: bool = False

    @property
    def bits_per_param(self) -> float:
        return float(self.bytes_per_param * 8)


_G128 = F(1, 2) + F(2, 128) + F(1, 2 * 128)  # 4-bit + fp16 scale + 4-bit zero per group of 128
_NF4 = F(1, 2) + F(1, 64) + F(4, 64 * 256)  # 4-bit + 8-bit absmax per 64 + fp32 per 256 blocks

WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.key: f
    for f in [
        WeightFormat("fp32", "FP32", F(4), True, "fp32", "float", None, None, "4 B/param"),
        WeightFormat("bf16", "BF16", F(2), True, "bf16", "float", None, None, "2 B/param"),
        WeightFormat("fp16", "FP16", F(2), True, "fp16", "float", None, None, "2 B/param"),
        WeightFormat("fp8", "FP8 (E4M3, W8A8)", F(1), False, "fp8", "quant", "fp8", "fp8",
                     "1 B/param + per-channel scales (~0); embeddings/LM head kept 16-bit", 0.9),
        WeightFormat("w8a8", "INT8 W8A8", F(1), False, "int8", "quant", "compressed-tensors", "w8a8_int8",
                     "1 B/param (+ scales ~0); INT8 matmuls; embeddings/LM head kept 16-bit", 0.9),
        WeightFormat("int8", "INT8 weight-only (W8A16)", F(1), False, "fp16", "quant", "compressed-tensors", "w8a8_int8",
                     "1 B/param (+ scales ~0); dequantised to 16-bit for the matmuls", 0.9),
        WeightFormat("int4", "INT4 W4A16 g128 (AWQ/GPTQ)", _G128, False, "fp16", "quant", "awq", "awq",
                     "0.5 + (fp16 scale + 4-bit zero)/128 = 0.5195 B/param; embeddings/LM head kept 16-bit", 0.72),
        WeightFormat("nf4", "NF4 (bitsandbytes, double quant)", _NF4, False, "fp16", "quant", "bitsandbytes", "bitsandbytes",
                     "0.5 + 8-bit absmax/64 + fp32/(64*256) = 0.5159 B/param", 0.72),
        WeightFormat("q8_0", "GGUF Q8_0", F(34, 32), True, "fp16", "gguf", "gguf", "gguf", "34 B per block of 32", 0.9),
        WeightFormat("q6_k", "GGUF Q6_K", F(210, 256), True, "fp16", "gguf", "gguf", "gguf", "210 B per block of 256", 0.72),
        WeightFormat("q5_k", "GGUF Q5_K", F(176, 256), True, "fp16", "gguf", "gguf", "gguf", "176 B per block of 256", 0.72),
        WeightFormat("q4_k_m", "GGUF Q4_K_M", F(484, 800), True, "fp16", "gguf", "gguf", "gguf",
                     "mixed recipe, measured 4.84 bits/param (Llama-2-7B Q4_K_M file 4.08 GB)", 0.72),
        WeightFormat("q4_0", "GGUF Q4_0", F(18, 32), True, "fp16", "gguf", "gguf", "gguf", "18 B per block of 32", 0.72),
        WeightFormat("q4_1", "GGUF Q4_1", F(20, 32), True, "fp16", "gguf", "gguf", "gguf", "20 B per block of 32", 0.72),
        WeightFormat("q3_k", "GGUF Q3_K", F(110, 256), True, "fp16", "gguf", "gguf", "gguf", "110 B per block of 256", 0.72),
        WeightFormat("q2_k", "GGUF Q2_K", F(84, 256), True, "fp16", "gguf", "gguf", "gguf", "84 B per block of 256", 0.72),
    ]
}

def torch_dtype_name(key: str) -> str:
    """The long name vLLM's/SGLang's ``--dtype`` takes ("bf16" -> "bfloat16"); "auto" otherwise."""
    return FLOAT_DTYPE_NAMES.get(key, "auto")


WEIGHT_ALIASES = {
    **DTYPE_ALIASES, "w4a16": "int4", "awq": "int4", "gptq": "int4", "int4-g128": "int4", "w8a16": "int8", "fp8-e4m3": "fp8",
    "q4_k": "q4_k_m", "q5_k_m": "q5_k", "q6_k_m": "q6_k", "bnb-nf4": "nf4",
}


def weight_format(name: str) -> WeightFormat:
    """The format for a key or alias (case-insensitive; "-" and "_" alike)."""
    key = str(name).strip().lower()
    key = WEIGHT_ALIASES.get(key, key).replace("-", "_")
    key = WEIGHT_ALIASES.get(key, key)
    if key not in WEIGHT_FORMATS:
        raise SizingError(
            f"unknown weight format {name!r}; choose one of: {', '.join(WEIGHT_FORMATS)} (or 'auto')")
    return WEIGHT_FORMATS[key]


@dataclass(frozen=True)
class KVDtype:
    key: str
    label: str
    bytes_per_elem: F
    #: fp32 scale per (token, head, K|V) for per-token-head quantised caches (sizing.md §3.3)
    per_head_scale_bytes: int
    vllm_name: str | None
    sglang_name: str | None


KV_DTYPES: dict[str, KVDtype] = {
    k.key: k
    for k in [
        KVDtype("fp32", "FP32", F(4), 0, "float32", None),
        KVDtype("bf16", "BF16", F(2), 0, "auto", "auto"),
        KVDtype("fp16", "FP16", F(2), 0, "auto", "auto"),
        KVDtype("fp8", "FP8", F(1), 0, "fp8", "fp8_e4m3"),
        KVDtype("int8", "INT8 (per-token-head scales)", F(1), 4, "int8", None),
        # InferScope's own engine (engine/model/kv_quant.py): fp8 with an fp32 scale per token-head
        KVDtype("fp8_token", "FP8 E4M3 (per-token-head scales)", F(1), 4, None, None),
        KVDtype("int4", "INT4 (per-token-head scales)", F(1, 2), 4, None, None),
        KVDtype("q8_0", "GGUF Q8_0 (llama.cpp cache)", F(34, 32), 0, None, None),
        KVDtype("q4_0", "GGUF Q4_0 (llama.cpp cache)", F(18, 32), 0, None, None),
    ]
}
KV_ALIASES = {**DTYPE_ALIASES, "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}


def kv_dtype(name: str) -> KVDtype:
    """The KV-cache dtype for a key or alias (case-insensitive)."""
    key = str(name).strip().lower()
    key = KV_ALIASES.get(key, key)
    if key not in KV_DTYPES:
        raise SizingError(f"unknown KV-cache dtype {name!r}; choose one of: {', '.join(KV_DTYPES)} (or 'auto')")
    return KV_DTYPES[key]


#: Safetensors dtype -> bytes per element (for exact checkpoint sizes).
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
}
FLOAT_SAFETENSORS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
