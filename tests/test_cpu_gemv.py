"""The decode GEMVs (engine/model/cpu_gemv.py): fp32 equal to F.linear up to rounding, int4 equal
to torch's int4pack kernel up to one bf16 rounding, the same bits at every thread count, taken only
where they apply, and torch's kernels wherever the library cannot be built. Greedy parity with
Hugging Face through them is the parity suite's (fp32 decode steps run them inside the fused
layers, tests/test_cpu_decode.py; int4 ones through ``QuantizedLinear``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.model import cpu_gemv
from engine.model.quantization import QuantizedLinear, dequantize, linear, quantize_int4, quantize_int8

ROOT = Path(__file__).resolve().parents[1]


def test_the_library_builds_here() -> None:
    assert cpu_gemv.status() == "ready"


@pytest.mark.parametrize("m", [1, 2, 5, 8, 16])
@pytest.mark.parametrize("n,k", [(1728, 576), (7, 32), (5, 24), (3, 13), (1, 1), (49, 1536)])
def test_equals_f_linear_up_to_rounding(m: int, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(n * 1000 + k)
    w, x = torch.randn(n, k, generator=gen), torch.randn(m, k, generator=gen)
    assert cpu_gemv.applies(x, w)
    got = cpu_gemv.gemv(x, w)
    want = (x.double() @ w.double().T)
    assert got.shape == (m, n) and got.dtype == torch.float32
    # fp32 accumulation over k terms: within a few ulps of the float64 sum of |terms|
    bound = 4 * k * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().T)
    assert ((got.double() - want).abs() <= bound + 1e-30).all()
    assert (got - F.linear(x, w)).abs().max().item() <= bound.max().item() * 2


@pytest.mark.parametrize("m", [1, 3, 16])
def test_the_same_bits_at_every_thread_count(m: int) -> None:
    gen = torch.Generator().manual_seed(1)
    w, x = torch.randn(3072, 576, generator=gen), torch.randn(m, 576, generator=gen)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(cpu_gemv.gemv(x, w))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_linear_takes_it_only_where_it_applies() -> None:
    gen = torch.Generator().manual_seed(2)
    w, b = torch.randn(40, 64, generator=gen), torch.randn(40, generator=gen)
    x = torch.randn(cpu_gemv.MAX_ROWS + 1, 64, generator=gen)
    assert torch.equal(linear(x, w, b), F.linear(x, w, b))  # more rows than a decode batch: torch's GEMM
    assert not cpu_gemv.applies(x[:1].bfloat16(), w.bfloat16())
    assert not cpu_gemv.applies(x[:1], w.t().contiguous().t())  # a non-contiguous weight
    one = x[:1]
    assert torch.equal(linear(one, w, b), cpu_gemv.gemv(one, w) + b)
    assert torch.equal(linear(x[:4], w), cpu_gemv.gemv(x[:4], w))
    with cpu_gemv.enabled(False):
        assert cpu_gemv.status() == "off" and not cpu_gemv.applies(one, w)
        assert torch.equal(linear(one, w, b), F.linear(one, w, b))
    assert cpu_gemv.applies(one, w)


def test_a_background_build_leaves_torch_kernels_meanwhile(tmp_path: Path) -> None:
    """The model runner starts the build on a thread: until the library is there (a cold cache:
    seconds of compiling), linear runs F.linear; then the C kernel."""
    code = ("import torch, torch.nn.functional as F\n"
            "from engine.model import cpu_gemv\n"
            "from engine.model.quantization import linear\n"
            "w, x = torch.randn(8, 16), torch.randn(1, 16)\n"
            "cpu_gemv.build_in_background()\n"
            "during = cpu_gemv.applies(x, w)\n"
            "assert torch.equal(linear(x, w), F.linear(x, w))\n"
            "cpu_gemv._background.join()\n"
            "print(during, cpu_gemv.applies(x, w), cpu_gemv.status())\n")
    env = {**os.environ, "INFERSCOPE_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "ready"], done.stdout


def test_without_a_compiler_linear_falls_back(tmp_path: Path) -> None:
    """A build that fails (here: a compiler that exits 1) is reported and F.linear runs."""
    code = ("import torch, torch.nn.functional as F\n"
            "from engine.model import cpu_gemv\n"
            "from engine.model.quantization import linear\n"
            "w, x = torch.randn(8, 16), torch.randn(1, 16)\n"
            "assert torch.equal(linear(x, w), F.linear(x, w))\n"
            "print(cpu_gemv.status())\n")
    env = {**os.environ, "CC": "/bin/false", "INFERSCOPE_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("unavailable: /bin/false failed"), done.stdout


def _int4(n: int, k: int, g: int, seed: int) -> tuple[QuantizedLinear, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = quantize_int4(0.05 * torch.randn(n, k, generator=gen), g)
    return QuantizedLinear.from_quantized(q), dequantize(q)


@pytest.mark.parametrize("m", [1, 3, 8, 16])
@pytest.mark.parametrize("n,k,g", [(64, 32, 32), (960, 576, 32), (576, 1536, 64), (128, 256, 128)])
def test_int4_equals_torchs_int4pack_kernel(m: int, n: int, k: int, g: int) -> None:
    """The same dequantized product as aten's kernel (read from its own packed layout), within one
    bf16 rounding of the output; and as close to the float64 product as that kernel is."""
    ql, deq = _int4(n, k, g, seed=n + k + g)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
    assert cpu_gemv.applies_int4(x, ql.weight, n)
    got = cpu_gemv.gemv_int4(x, ql.weight, ql.block_scales, g)
    want = torch.ops.aten._weight_int4pack_mm_for_cpu(x, ql.weight, g, ql.scales)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    ulp = 2.0 ** -7 * want.float().abs().clamp(min=2.0 ** -100)  # one bf16 ulp (of the larger side)
    assert ((got.float() - want.float()).abs() <= ulp * 1.01).all()
    exact = x.double() @ deq.double().T
    assert (got.double() - exact).abs().max() <= (want.double() - exact).abs().max() * 1.5 + 1e-6


def test_int4_the_same_bits_at_every_thread_count_and_only_where_it_applies() -> None:
    ql, _ = _int4(3072, 576, 32, seed=4)
    x = torch.randn(2, 576, generator=torch.Generator().manual_seed(5)).bfloat16()
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(cpu_gemv.gemv_int4(x, ql.weight, ql.block_scales, 32))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert torch.equal(ql(x), outs[0])  # QuantizedLinear takes it for a decode step (up to MAX_ROWS rows)
    nine = torch.randn(cpu_gemv.MAX_ROWS + 1, 576).bfloat16()
    assert not cpu_gemv.applies_int4(nine, ql.weight, 3072)  # a prefill: torch's kernel
    assert torch.equal(ql(nine), torch.ops.aten._weight_int4pack_mm_for_cpu(nine, ql.weight, 32, ql.scales))
    odd, _ = _int4(96, 64, 32, seed=6)  # N not a multiple of the 64-row block
    assert not cpu_gemv.applies_int4(x[:, :64], odd.weight, 96)
    assert not cpu_gemv.applies_int4(x.float(), ql.weight, 3072)
    with cpu_gemv.enabled(False):
        assert not cpu_gemv.applies_int4(x, ql.weight, 3072)


@pytest.mark.parametrize("m", [1, 3, 8, 11])
@pytest.mark.parametrize("n,k", [(49152, 576), (576, 1536), (64, 96)])
def test_int8_equals_torchs_int8pack_kernel(m: int, n: int, k: int) -> None:
    """The int8 weight (the int8 scheme's projections, every scheme's LM head): within half a bf16
    rounding plus fp32 accumulation of float64, as close to it as aten's kernel is (11 rows: a
    chunk of 8, then 3); the same bits at 1 and 2 threads; taken by ``QuantizedLinear`` for up to
    MAX_ROWS rows only."""
    gen = torch.Generator().manual_seed(n + k)
    q = quantize_int8(0.05 * torch.randn(n, k, generator=gen))
    ql = QuantizedLinear.from_quantized(q)
    x = torch.randn(m, k, generator=gen).bfloat16()
    assert cpu_gemv.applies_int8(x, ql.weight, ql.scales)
    got = cpu_gemv.gemv_int8(x, ql.weight, ql.scales)
    want = torch.ops.aten._weight_int8pack_mm(x, ql.weight, ql.scales)
    w = dequantize(q).double()
    exact = x.double() @ w.T
    # half a bf16 ulp of the output, plus fp32 accumulation over k terms (a few ulps of the sum of |terms|)
    bound = 2.0 ** -8 * exact.abs() + 4 * k * torch.finfo(torch.float32).eps * (x.double().abs() @ w.abs().T)
    assert ((got.double() - exact).abs() <= bound).all()
    assert (got.double() - exact).abs().max() <= (want.double() - exact).abs().max() * 1.5 + 1e-6
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(cpu_gemv.gemv_int8(x, ql.weight, ql.scales), got)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(ql(x), got)
    nine = torch.randn(cpu_gemv.MAX_ROWS + 1, k, generator=gen).bfloat16()
    assert not cpu_gemv.applies_int8(nine, ql.weight, ql.scales)


@pytest.mark.skipif("avx512f" not in cpu_gemv._cpu_flags(), reason="this CPU has no AVX-512: the default build is the AVX2 one")
def test_the_avx2_build_passes_these_tests_too() -> None:
    """On an AVX-512 machine the library is built with AVX-512; machines without it run the AVX2
    variant (other vector width, other register tiles). This runs these tests and the fused layers'
    against that variant, in a process that builds it."""
    env = {**os.environ, cpu_gemv.NO_AVX512_ENV: "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cpu_gemv.py",
                           "tests/test_cpu_decode.py", "-k", "not avx2_build and not without_a_compiler"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:]
    check = subprocess.run([sys.executable, "-c", "from engine.model import cpu_gemv; print(cpu_gemv.flags())"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "-mavx512f" not in check.stdout and "-mavx2" in check.stdout
