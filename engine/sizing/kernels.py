"""Which serving kernel runs a quantized checkpoint on a device, or why none does.

vLLM's rules (each quantization method's minimum compute capability). The device's class and its
BF16 / FP8 units stand for the capability: NVIDIA with BF16 units is Ampere (sm80) or newer, with
FP8 units Ada / Hopper (sm89+); NVIDIA without BF16 is Turing or older (T4: sm75).

    awq                 awq_marlin on sm80+, awq (GEMM kernels) on sm75
    gptq                gptq_marlin on sm80+ for 4- and 8-bit symmetric weights, else gptq (exllama)
    bitsandbytes        bitsandbytes on any NVIDIA GPU
    mxfp4               sm80+ (Marlin on Ampere, native on Hopper / Blackwell)
    compressed-tensors  W4A16 / W8A16 run on Marlin: sm80+; W8A8 INT8 (CUTLASS): sm75+
    Ascend              none: vllm-ascend and MindIE load msmodelslim W8A8 / W4A8 checkpoints
    Apple, CPU          none: llama.cpp and MLX load their own formats (GGUF, MLX)

FP8 checkpoints keep the calculator's FP8 path (``precision``): native FP8 on sm89+, weight-only
Marlin on Ampere, 16-bit elsewhere.
"""
from __future__ import annotations

from dataclasses import replace

from .arch import QuantScheme
from .formats import SizingError, WeightFormat
from .hardware import Hardware


def _sm80(hw: Hardware) -> bool:
    return hw.device_class.startswith("nvidia") and hw.supports_bf16


def _refuse(scheme: QuantScheme, hw: Hardware, why: str) -> SizingError:
    return SizingError(f"{scheme.label.removesuffix(' (checkpoint)')} checkpoints do not run on {hw.name}: {why}")


def checkpoint_kernel(scheme: QuantScheme, fmt: WeightFormat, hw: Hardware) -> WeightFormat:
    """``fmt`` with the vLLM / SGLang method that runs it on ``hw`` (module doc), or a
    ``SizingError`` naming the format, the device and the reason."""
    if hw.is_ascend:
        raise _refuse(scheme, hw, "vllm-ascend and MindIE load msmodelslim W8A8 / W4A8 checkpoints, not"
                                  f" {scheme.method}; quantize the 16-bit model with msmodelslim")
    if not hw.device_class.startswith("nvidia"):
        raise _refuse(scheme, hw, "its runtimes (llama.cpp, MLX) load their own formats; size a GGUF instead"
                                  " (--weights q4_k_m)")
    name = fmt.vllm_quantization
    if scheme.method == "awq":
        name = "awq_marlin" if _sm80(hw) else "awq"
    elif scheme.method == "gptq":
        marlin = _sm80(hw) and scheme.bits in (4, 8) and scheme.symmetric
        name = "gptq_marlin" if marlin else "gptq"
    elif scheme.method == "mxfp4" and not _sm80(hw):
        raise _refuse(scheme, hw, "MXFP4 kernels need Ampere (sm80) or newer")
    elif scheme.method == "compressed-tensors" and scheme.activations == "16bit" and not _sm80(hw):
        raise _refuse(scheme, hw, "weight-only compressed-tensors schemes run on Marlin kernels, Ampere (sm80)"
                                  " or newer")
    return replace(fmt, vllm_quantization=name, sglang_quantization=name)
