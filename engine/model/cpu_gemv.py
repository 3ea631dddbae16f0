"""The GEMVs of a CPU decode step (1 to MAX_ROWS rows) in C (engine/model/gemv_avx2.c; AVX2 + FMA,
and AVX-512 where the CPU has it), built once with the system C compiler and called through ctypes:
fp32 weights (``gemv``), int4 ones in torch's int4pack layout (``gemv_int4``) and int8 ones
(``gemv_int8``), the last two with bf16 rows. The same library holds the fused decode layers
(decode_avx2.c, engine/model/cpu_decode.py), which call these GEMVs, the final norm and the greedy
pick (greedy_avx2.c).

Why: a decode step reads every weight once, so its speed is the GEMV's read rate. On one of this
project's 2-core CPUs torch's ``F.linear`` at one row (MKL sgemv) read about 8 GB/s where a plain
sum read about 18, and at 2-8 rows MKL's small-M GEMM was slower still; on another (AVX-512) MKL
read as fast as the sum at one row, but its small-M GEMM still lost (16 rows: 56 ms where the C
kernel takes 51). torch's int4 and int8 kernels read ~1-2 and ~11 GB/s from memory where the C
ones, prefetching ahead of their stream, read at the sum's rate. The C kernels stream each weight
in address order on every thread and, at several rows, load each weight chunk once and multiply it
into every row, so the weight is still read once (``python -m tests.bench speed``).

Where they apply (``applies``, ``applies_int4``, ``applies_int8``): 1..MAX_ROWS rows on CPU in the
kernel's dtype, contiguous weights (int4: N a multiple of 64). Everything else, and every machine
where the library cannot be built (no C compiler, a CPU without AVX2 and FMA), takes torch's
kernels. The results differ from torch's in rounding only (another summation order), and do not
depend on the thread count. ``enabled(False)`` turns them off (the benchmark's side-by-side
baseline).

The library is compiled into the model cache (``kernels/``), named after a hash of the C sources
and the compiler flags, published atomically; the model runner starts that on a background thread
(``build_in_background``: torch's kernels run until it is ready, so a demo's first step does not
wait ~2 s for the compiler); a failed build is remembered for the process and
reported by ``status()``.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from engine.model.cache import cache_root

#: The library's C sources: the GEMVs, and the fused decode step that calls them (cpu_decode.py).
SOURCES = tuple(Path(__file__).with_name(name) for name in ("gemv_avx2.c", "decode_avx2.c", "greedy_avx2.c"))
HEADERS = (Path(__file__).with_name("bf16.h"),)  # included by the sources (part of the library's hash)
MAX_ROWS = 16  # a decode batch of up to 16 rows (beyond, torch's GEMM: the C kernels keep each
# weight chunk in cache across the rows, which pays while the rows' products do not dominate)
# -ffp-contract=off: a * b + c in plain C code rounds twice, as torch's separate ops do (the
# GEMVs' FMAs are explicit intrinsics)
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
AVX512_FLAGS = ("-mavx512f",)  # added where the CPU has AVX-512: vectors of 16 floats

_lock = threading.Lock()  # held while building
_state_lock = threading.Lock()
_background: threading.Thread | None = None
_lib: ctypes.CDLL | None = None
_error: str | None = None


class Switch:
    """A process-wide on / off flag (the C kernels' side-by-side baselines in tests and benchmarks)."""

    def __init__(self) -> None:
        self.on = True

    @contextmanager
    def enabled(self, on: bool) -> Iterator[None]:
        """On or off for the block, then as before."""
        before, self.on = self.on, on
        try:
            yield
        finally:
            self.on = before


_switch = Switch()
#: ``with enabled(False):`` turns the GEMVs off for the block (process-wide; torch's kernels run)
enabled = _switch.enabled


def _cpu_flags() -> set[str]:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((ln for ln in info.splitlines() if ln.startswith("flags")), "").split())


NO_AVX512_ENV = "INFERSCOPE_NO_AVX512"  # "1": build the AVX2 variant even where the CPU has AVX-512


def flags() -> tuple[str, ...]:
    """The compiler flags for this CPU (AVX2 + FMA, and AVX-512 where it has it, unless
    NO_AVX512_ENV says not to: the tests run the AVX2 variant that way on an AVX-512 machine)."""
    avx512 = "avx512f" in _cpu_flags() and os.environ.get(NO_AVX512_ENV) != "1"
    return FLAGS + (AVX512_FLAGS if avx512 else ())


def _build() -> ctypes.CDLL:
    """Compile (once per source and flags) and load the library; raises OSError / RuntimeError."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (gcc / cc) on PATH")
    if not {"avx2", "fma"} <= _cpu_flags():
        raise RuntimeError("this CPU lacks AVX2 + FMA")
    options = flags()
    code = b"".join(p.read_bytes() for p in SOURCES + HEADERS)
    key = hashlib.sha256(code + " ".join(options).encode()).hexdigest()[:16]
    out = cache_root() / "kernels" / f"gemv-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            built = Path(tmp) / out.name
            done = subprocess.run([compiler, *options, *map(str, SOURCES), "-o", str(built)], capture_output=True,
                                  text=True, timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[:300]}")
            os.replace(built, out)  # atomic: a concurrent build publishes the same bytes
    lib = ctypes.CDLL(str(out))
    lib.gemv_f32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                             ctypes.c_int]
    lib.gemv_f32.restype = None
    lib.gemm_rows_f32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                                  ctypes.c_long, ctypes.c_int]
    lib.gemm_rows_f32.restype = None
    lib.gemv_int4.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 4 + [ctypes.c_int]
    lib.gemv_int4.restype = ctypes.c_int
    lib.gemv_int8.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
    lib.gemv_int8.restype = ctypes.c_int
    return lib


def build_in_background() -> None:
    """Start building (or loading) the library on a daemon thread, once per process. Until it is
    ready, the ``applies*`` checks answer no and torch's kernels run, so an engine's first steps on
    a machine that has never built it (~2 s) do not wait for the compiler (the model runner calls
    this when it starts)."""
    global _background
    with _state_lock:
        if _background is not None or _lib is not None or _error is not None:
            return
        _background = threading.Thread(target=_library, name="inferscope-gemv-build", daemon=True)
        _background.start()


def ready_library() -> ctypes.CDLL | None:
    """The library if it is there; None while a background build runs (torch's kernels meanwhile);
    otherwise built here, now."""
    if _lib is not None or _error is not None:
        return _lib
    if _background is not None and _background.is_alive():
        return None
    return _library()


def _library() -> ctypes.CDLL | None:
    global _lib, _error
    if _lib is not None or _error is not None:
        return _lib
    with _lock:
        if _lib is None and _error is None:
            try:
                _lib = _build()
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                _error = str(e)
    return _lib


def status() -> str:
    """"ready", "off", or why the library is not available (then torch's kernels run)."""
    if not _switch.on:
        return "off"
    return "ready" if _library() is not None else f"unavailable: {_error}"


def _rows(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """The kernels are on and ``x`` is 1..MAX_ROWS rows of ``dtype`` on CPU (the library checked last)."""
    return (_switch.on and x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS and x.dtype == dtype
            and x.device.type == "cpu")


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """1..MAX_ROWS fp32 rows against a contiguous fp32 weight on CPU, with the library ready."""
    return (_rows(x, torch.float32) and weight.dtype == torch.float32 and weight.device.type == "cpu"
            and weight.dim() == 2 and weight.is_contiguous() and x.shape[1] == weight.shape[1]
            and not weight.requires_grad and ready_library() is not None)


def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] fp32 @ weight [N, K]^T -> [M, N] fp32, M in 1..MAX_ROWS (call ``applies`` first)."""
    lib = _library()
    assert lib is not None
    x = x.contiguous()
    m, (n, k) = x.shape[0], weight.shape
    y = torch.empty(m, n, dtype=torch.float32)
    if m == 1:
        lib.gemv_f32(weight.data_ptr(), x.data_ptr(), y.data_ptr(), n, k, torch.get_num_threads())
    else:
        lib.gemm_rows_f32(weight.data_ptr(), x.data_ptr(), y.data_ptr(), n, k, m, torch.get_num_threads())
    return y


INT4_BLOCK = 64  # rows per block of torch's CPU int4pack layout (gemv_avx2.c's gemv_int4 reads it)


def int4_readable(packed: torch.Tensor, out_features: int) -> bool:
    """An int4pack weight [N, K/2] uint8 the C kernel reads: contiguous, on CPU, N whole 64-row blocks."""
    return (packed.dtype == torch.uint8 and packed.device.type == "cpu" and packed.is_contiguous()
            and out_features % INT4_BLOCK == 0 and packed.dim() == 2 and packed.shape[0] == out_features)


def applies_int4(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> bool:
    """1..MAX_ROWS bf16 rows against an int4pack weight [N, K/2] uint8 whose N is a multiple of 64."""
    return (_rows(x, torch.bfloat16) and int4_readable(packed, out_features) and packed.shape[1] * 2 == x.shape[1]
            and ready_library() is not None)


def int4_block_scales(scales_zeros: torch.Tensor) -> torch.Tensor:
    """torch's int4 scales and zeros, bf16 [K/g, N, 2], as the C kernel reads them: [N/64, K/g, 64, 2],
    each 64-row block's pairs contiguous (gemv_avx2.c's gemv_int4)."""
    groups, n, _ = scales_zeros.shape
    return scales_zeros.view(groups, n // INT4_BLOCK, INT4_BLOCK, 2).permute(1, 0, 2, 3).contiguous()


def gemv_int4(x: torch.Tensor, packed: torch.Tensor, block_scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """x [M, K] bf16 @ the int4 weight [N, K]^T -> [M, N] bf16 (call ``applies_int4`` first):
    ``packed`` torch's int4pack layout [N, K/2] uint8, ``block_scales`` from ``int4_block_scales``."""
    lib = _library()
    assert lib is not None
    x, sz = x.contiguous(), block_scales.contiguous()
    m, k = x.shape
    n = packed.shape[0]
    y = torch.empty(m, n, dtype=torch.bfloat16)
    if lib.gemv_int4(packed.data_ptr(), sz.data_ptr(), x.data_ptr(), y.data_ptr(), n, k, m, group_size,
                     torch.get_num_threads()):
        raise MemoryError(f"gemv_int4: no memory for {m} x {k} + {m} x {n} floats")
    return y


def applies_int8(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> bool:
    """1..MAX_ROWS bf16 rows against an int8 weight [N, K] with bf16 scales [N], contiguous."""
    return (_rows(x, torch.bfloat16) and codes.dtype == torch.int8 and codes.dim() == 2 and codes.is_contiguous()
            and codes.shape[1] == x.shape[1] and scales.dtype == torch.bfloat16 and scales.is_contiguous()
            and tuple(scales.shape) == (codes.shape[0],) and ready_library() is not None)


def gemv_int8(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16 @ (codes [N, K] int8 * scales [N])^T -> [M, N] bf16 (call ``applies_int8`` first)."""
    lib = _library()
    assert lib is not None
    x = x.contiguous()
    m, k = x.shape
    n = codes.shape[0]
    y = torch.empty(m, n, dtype=torch.bfloat16)
    if lib.gemv_int8(codes.data_ptr(), scales.data_ptr(), x.data_ptr(), y.data_ptr(), n, k, m,
                     torch.get_num_threads()):
        raise MemoryError(f"gemv_int8: no memory for {m} x {k} floats")
    return y
