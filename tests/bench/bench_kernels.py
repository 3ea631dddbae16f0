"""The Triton attention kernels on a GPU (issue #24): ``python -m tests.bench kernels``.

On CUDA it reports
    decode      achieved bandwidth of paged attention for a batch of decodes at several contexts
                (bytes = every K and V element each request reads + q and out) against the device's
                peak from its hardware preset (target >= 70 % at long contexts), with split-KV on;
    prefill     TFLOP/s of a causal prefill chunk (4 x causal (query, key) pairs x heads x head_dim).
Kernel time is the GPU time of the launch's kernels (attention + split-KV merge), read from torch's
profiler, as vLLM measures its kernels (CUDA graphs hide the host there). The whole call, host
checks and launch included, is reported beside it ("per call"): back to back, the host part
(validation reads seq_lens and query_start_loc to the host: a sync per call) bounds short launches.
On a machine without a CUDA GPU (this project's CI and dev machine) it says so and reports nothing:
the interpreter runs the same kernels on CPU tensors, for correctness only (tests/test_kernels.py).
"""
from __future__ import annotations

from typing import Any

import torch

DECODE_CONTEXTS = (1024, 4096, 16384)
DECODE_BATCH = 32
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16  # Llama-3-8B's attention shapes
TARGET_BANDWIDTH = 0.70


def _peak_bandwidth(name: str) -> tuple[float | None, str]:
    """The device's peak bytes/s from the hardware preset its name matches."""
    from engine.sizing.formats import SizingError
    from engine.sizing.hardware import get_hardware
    try:
        hw = get_hardware(name)
    except SizingError:
        short = name.replace("NVIDIA", "").strip()
        try:
            hw = get_hardware(short)
        except SizingError:
            return None, f"no hardware preset matches {name!r}"
    return hw.bandwidth, hw.name


def _kernel_ms(fn: Any, iters: int = 20) -> float:
    """GPU time per call of the Triton kernels ``fn`` launches (torch's profiler, CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    us = sum(getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0)
             for e in prof.key_averages() if "_attention_kernel" in e.key or "_merge_kernel" in e.key)
    return float(us) / 1e3 / iters


def _time_ms(fn: Any, iters: int = 20) -> float:
    """Wall time per call, back to back (host checks and launches included)."""
    fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / iters


def _decode_case(ctx: int, segments: int) -> tuple[float, float, float]:
    """(kernel ms, ms per call, bytes read) for DECODE_BATCH decodes of ``ctx`` context each."""
    from engine.kernels import paged_attention
    dev, dt = "cuda", torch.float16
    blocks_per = -(-ctx // BLOCK)
    k = torch.randn(DECODE_BATCH * blocks_per, BLOCK, KV_HEADS, HEAD_DIM, device=dev, dtype=dt)
    v = torch.randn_like(k)
    tables = torch.arange(DECODE_BATCH * blocks_per, device=dev, dtype=torch.int32).view(DECODE_BATCH, blocks_per)
    lens = torch.full((DECODE_BATCH,), ctx, device=dev, dtype=torch.int32)
    qsl = torch.arange(DECODE_BATCH + 1, device=dev, dtype=torch.int32)
    q = torch.randn(DECODE_BATCH, HEADS, HEAD_DIM, device=dev, dtype=dt)
    def call() -> None:
        paged_attention(q, k, v, tables, lens, qsl, HEAD_DIM ** -0.5, num_segments=segments)
    elem = 2  # fp16
    bytes_read = DECODE_BATCH * ctx * KV_HEADS * HEAD_DIM * 2 * elem + 2 * q.numel() * elem
    return _kernel_ms(call), _time_ms(call), bytes_read


def _prefill_case(q_len: int) -> tuple[float, float]:
    """(kernel ms, FLOPs) of one causal chunk of ``q_len`` tokens."""
    from engine.kernels import paged_attention
    dev, dt = "cuda", torch.float16
    blocks = -(-q_len // BLOCK)
    k = torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM, device=dev, dtype=dt)
    v = torch.randn_like(k)
    tables = torch.arange(blocks, device=dev, dtype=torch.int32).view(1, blocks)
    lens = torch.tensor([q_len], device=dev, dtype=torch.int32)
    qsl = torch.tensor([0, q_len], device=dev, dtype=torch.int32)
    q = torch.randn(q_len, HEADS, HEAD_DIM, device=dev, dtype=dt)
    ms = _kernel_ms(lambda: paged_attention(q, k, v, tables, lens, qsl, HEAD_DIM ** -0.5))
    pairs = q_len * (q_len + 1) / 2
    return ms, 4.0 * pairs * HEADS * HEAD_DIM


def run() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"name": "Triton attention kernels (needs a CUDA GPU)",
                "rows": [{"metric": "no CUDA GPU here: nothing measured (the interpreter is for correctness)",
                          "value": 0.0, "unit": "", "target": "", "met": None}]}
    name = torch.cuda.get_device_name()
    peak, preset = _peak_bandwidth(name)
    rows: list[dict[str, Any]] = []
    for ctx in DECODE_CONTEXTS:
        segments = max(1, min(8, ctx // 2048))
        ms, call_ms, nbytes = _decode_case(ctx, segments)
        gbs = nbytes / (ms / 1e3) / 1e9
        share = gbs * 1e9 / peak if peak else None
        rows.append({"metric": f"decode x{DECODE_BATCH}, context {ctx:,}, {segments} segment(s): bandwidth",
                     "value": gbs, "unit": "GB/s", "target": "", "met": None})
        rows.append({"metric": "  kernel time", "value": ms * 1e3, "unit": "us", "target": "", "met": None})
        rows.append({"metric": "  per call (host checks + launch)", "value": call_ms * 1e3, "unit": "us",
                     "target": "", "met": None})
        if share is not None:
            long_ctx = ctx >= 4096
            rows.append({"metric": f"  of the peak ({preset})", "value": share * 100, "unit": "%",
                         "target": f">= {TARGET_BANDWIDTH:.0%}" if long_ctx else "",
                         "met": (share >= TARGET_BANDWIDTH) if long_ctx else None})
    for q_len in (1024, 4096):
        ms, flops = _prefill_case(q_len)
        rows.append({"metric": f"prefill chunk of {q_len:,} tokens: TFLOP/s", "value": flops / (ms / 1e3) / 1e12,
                     "unit": "TFLOP/s", "target": "", "met": None})
    return {"name": f"Triton attention kernels on {name}", "rows": rows}
