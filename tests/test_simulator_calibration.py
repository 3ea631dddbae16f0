"""Calibration on this machine (engine/simulate/calibrate.py, engine/costmodel/measured.py).

Timing accuracy is a benchmark (tests/bench/bench_simulator.py), never asserted here: these test
what does not depend on the clock: the profile's JSON and cache, the curves' shape, that a burst
is scheduled step for step alike by the real engine and its simulation, and the bad inputs.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from engine.costmodel.measured import FUSED_CONTEXT, PROFILE_VERSION, CostProfile, Curve, FusedDecode, MachineInfo, \
    MeasuredCost, StepOverhead
from engine.model import cpu_gemv
from engine.costmodel.model import simulated_model
from engine.costmodel.shape import ChunkShape, StepShape, decode_shape, prefill_shape
from engine.simulate.__main__ import main
from engine.simulate.calibrate import TINY_PLAN, cache_path, calibrate, load_cached, machine_info, this_machine_model
from engine.simulate.simulator import ServingKnobs, run_real, simulate
from engine.simulate.workload import Lengths, generate

MODEL = "tiny-random"


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[CostProfile, Path]:
    cache_dir = tmp_path_factory.mktemp("calibration")
    return calibrate(MODEL, plan=TINY_PLAN, cache_dir=cache_dir), cache_dir


def _profile(**over: object) -> CostProfile:
    """A hand-made profile (no measuring): curves of the shapes a CPU gives."""
    base = dict(model=MODEL, dtype="float32", machine=machine_info(), num_layers=2,
                gemm=Curve((1.0, 2.0, 4.0, 64.0, 512.0), (0.010, 0.012, 0.011, 0.030, 0.200), log_x=True),
                lm_head=Curve((1.0, 8.0, 256.0), (0.002, 0.004, 0.050), log_x=True),
                decode_group=Curve((16.0, 2048.0, 16384.0), (0.0005, 0.003, 0.06)),
                prefill_causal=Curve((10.0, 2080.0, 131328.0), (0.001, 0.004, 0.2)),
                prefill_masked=Curve((256.0, 8192.0, 131072.0), (0.001, 0.005, 0.1)),
                overhead=StepOverhead(0.003, 0.0002, 0.0004, 0.00001, 0.002))
    base.update(over)
    return CostProfile(**base)  # type: ignore[arg-type]


def test_profile_round_trips_through_json(calibrated: tuple[CostProfile, Path]) -> None:
    profile, _ = calibrated
    assert CostProfile.from_json(profile.to_json()) == profile
    assert profile.model == MODEL and profile.dtype == "float32" and profile.machine == machine_info()
    d = json.loads(profile.to_json())
    assert d["version"] == PROFILE_VERSION and d["machine"]["torch_threads"] >= 1
    assert _profile() == CostProfile.from_json(_profile().to_json())


def test_cache_hit_then_corrupt_file_is_measured_again(calibrated: tuple[CostProfile, Path]) -> None:
    profile, cache_dir = calibrated
    heard: list[str] = []
    assert calibrate(MODEL, plan=TINY_PLAN, cache_dir=cache_dir, progress=heard.append) == profile
    assert any("cached" in h for h in heard) and not any("GEMM" in h for h in heard)
    path = cache_path(MODEL, "float32", None, cache_dir)
    path.write_text('{"version": 1, "model": "tiny-ran')  # a write cut short
    heard.clear()
    again = calibrate(MODEL, plan=TINY_PLAN, cache_dir=cache_dir, progress=heard.append)
    assert any("not usable" in h for h in heard) and any("GEMM" in h for h in heard)
    assert CostProfile.from_json(path.read_text()) == again  # the file is whole again
    # another version or another machine's profile is never trusted
    d = json.loads(again.to_json())
    path.write_text(json.dumps({**d, "version": PROFILE_VERSION + 1}))
    assert load_cached(MODEL, "float32", cache_dir) is None
    path.write_text(json.dumps({**d, "machine": {**d["machine"], "cpu_model": "another CPU"}}))
    assert load_cached(MODEL, "float32", cache_dir) is None
    for bad in ("[]", "{}", '{"version": 1}', json.dumps({**d, "gemm": {"xs": [2, 1], "ys": [1, 1]}}),
                json.dumps({**d, "overhead": {**d["overhead"], "per_step_s": -1}})):
        with pytest.raises(ValueError, match="calibration profile"):
            CostProfile.from_json(bad)


def test_curves_interpolate_and_stay_monotone() -> None:
    c = Curve((1.0, 4.0, 16.0), (1.0, 3.0, 7.0))
    assert [c(x) for x in (0.5, 1.0, 2.5, 4.0, 10.0, 16.0, 22.0)] == [1.0, 1.0, 2.0, 3.0, 5.0, 7.0, 9.0]
    log = Curve((1.0, 4.0, 16.0), (1.0, 3.0, 7.0), log_x=True)
    assert log(2.0) == pytest.approx(2.0) and log(8.0) == pytest.approx(5.0)
    noisy = Curve.monotone((1.0, 2.0, 3.0, 4.0, 5.0), (1.0, 3.0, 2.0, 2.5, 6.0))
    assert noisy.is_monotone and noisy.ys[0] == 1.0 and noisy.ys[-1] == 6.0
    assert sum(noisy.ys) == pytest.approx(1.0 + 3.0 + 2.0 + 2.5 + 6.0)  # pooled, not clipped
    with pytest.raises(ValueError):
        Curve((1.0, 1.0), (0.0, 1.0))
    with pytest.raises(ValueError):
        Curve((0.0, 1.0), (0.0, 1.0), log_x=True)


def test_measured_cost_grows_where_it_should(calibrated: tuple[CostProfile, Path]) -> None:
    for profile in (_profile(), calibrated[0]):
        cost = MeasuredCost(profile)
        for curve in (profile.lm_head, profile.decode_group, profile.prefill_causal, profile.prefill_masked):
            assert curve.is_monotone
        big = [x for x in profile.gemm.xs if x >= 8]
        assert all(profile.gemm(a) <= profile.gemm(b) for a, b in zip(big, big[1:]))
        t = [cost.step_cost(decode_shape(b, 64)).total_s for b in (8, 16, 64, 256)]
        assert t == sorted(t)
        t = [cost.step_cost(decode_shape(4, c)).total_s for c in (16, 128, 1024, 4096)]
        assert t == sorted(t)
        t = [cost.step_cost(prefill_shape(n)).total_s for n in (8, 64, 256, 512, 1024)]
        assert t == sorted(t)
        t = [cost.step_cost(prefill_shape(64, s)).total_s for s in (16, 256, 1024)]
        assert t == sorted(t)
        parts = cost.step_cost(StepShape((ChunkShape(128, 0, 1), ChunkShape(1, 40, 1))))
        assert parts.comm_s == 0 and min(parts.as_dict().values()) >= 0 and parts.total_s > 0
    assert "measured on this machine" in MeasuredCost(_profile()).label


def test_each_prefill_chunk_costs_its_own_time_beside_its_tokens() -> None:
    """The same 64 prefill tokens as one chunk and as two: the elementwise part differs by one
    per-prefill time exactly (the per-token time is the same); a 1-token chunk is no prefill."""
    o = _profile().overhead
    cost = MeasuredCost(_profile())
    one = cost.step_cost(StepShape((ChunkShape(64, 0, 1),)))
    two = cost.step_cost(StepShape((ChunkShape(32, 0, 1), ChunkShape(32, 0, 1))))
    assert two.elementwise_s - one.elementwise_s == pytest.approx(o.per_prefill_s)
    assert StepShape((ChunkShape(1, 10, 0), ChunkShape(5, 0, 1), ChunkShape(1, 9, 1))).num_prefill_chunks == 1


def test_decode_only_steps_take_the_fused_layers_time(calibrated: tuple[CostProfile, Path]) -> None:
    """Where the C library runs, a decode-only step of up to 16 rows is priced as the fused C
    layers (one call: no per-row elementwise time); any other step by the parts, as before."""
    assert (calibrated[0].fused is not None) == (cpu_gemv.status() == "ready")
    fused = FusedDecode(Curve((1.0, 16.0), (0.008, 0.012)), 1e-7)
    profile = _profile(fused=fused)
    assert CostProfile.from_json(profile.to_json()) == profile
    cost, plain = MeasuredCost(profile), MeasuredCost(_profile())
    step = cost.step_cost(decode_shape(4, 64))
    assert step.gemm_s == pytest.approx(fused.rows(4)) and step.elementwise_s == 0  # the LM head included
    assert step.attention_s == pytest.approx(1e-7 * 4 * (64 - FUSED_CONTEXT))
    assert step.total_s < plain.step_cost(decode_shape(4, 64)).total_s
    for other in (StepShape((ChunkShape(8, 0, 1), ChunkShape(1, 40, 1))), decode_shape(fused.max_rows + 1, 64)):
        assert cost.step_cost(other) == plain.step_cost(other)


def test_burst_is_scheduled_step_for_step_alike(calibrated: tuple[CostProfile, Path]) -> None:
    """The real engine and its simulation make the same decisions on a burst (a small pool:
    preemptions included), so their steps can be compared one by one."""
    profile, _ = calibrated
    workload = generate(10, math.inf, Lengths("uniform", 4, 40), Lengths("uniform", 2, 12), seed=3, prefix_groups=2,
                        prefix_tokens=8)
    knobs = ServingKnobs(max_num_seqs=6, max_num_batched_tokens=32)
    sim_model = this_machine_model(MODEL, profile, num_blocks=20, block_size=4, max_num_batched_tokens=32)
    assert sim_model.deployment.kv_pool_tokens == 80 and sim_model.deployment.hardware == "this-machine"
    sim = simulate(sim_model, workload, knobs)
    real = run_real(MODEL, workload, knobs, num_blocks=20, block_size=4)
    assert [(s.num_tokens, s.num_decodes, s.running, s.waiting, s.preempted, s.kv_blocks_used) for s in sim.steps] == \
        [(s.num_tokens, s.num_decodes, s.running, s.waiting, s.preempted, s.kv_blocks_used) for s in real.steps]
    assert sum(s.preempted for s in real.steps) > 0  # the pool was small enough to matter
    assert [(r.prompt_tokens, r.output_tokens, r.cached_tokens) for r in sim.requests] == \
        [(r.prompt_tokens, r.output_tokens, r.cached_tokens) for r in real.requests]
    assert sim.simulated and not real.simulated and sim.kv_pool_tokens == real.kv_pool_tokens


def test_bad_inputs_are_clear(calibrated: tuple[CostProfile, Path], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    profile, _ = calibrated
    with pytest.raises(ValueError, match="model"):
        calibrate("no-such-model-here", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="num_blocks"):
        this_machine_model(MODEL, profile, num_blocks=0)
    with pytest.raises(ValueError, match="profile"):
        this_machine_model("smollm2-135m", profile)
    with pytest.raises(ValueError, match="this-machine"):
        simulated_model("smollm2-135m", "this-machine")
    for argv, needle in ((["--model", "llama-3-8b", "--hardware", "a100-80gb", "--rate", "1", "--compare-real"],
                          "--compare-real"),
                         (["--model", MODEL, "--hardware", "this-machine", "--rate", "1", "--tp", "2"], "--tp")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err


def test_cli_compare_real_prints_both(calibrated: tuple[CostProfile, Path], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    profile, _ = calibrated
    monkeypatch.setenv("INFERSCOPE_CACHE", str(tmp_path))
    # the CLI sets the app's torch threads: keep this process's, so the profile below is this machine's
    monkeypatch.setenv("INFERSCOPE_TORCH_THREADS", str(torch.get_num_threads()))
    path = cache_path(MODEL, "float32")
    path.parent.mkdir(parents=True)
    path.write_text(profile.to_json())  # cached: the CLI measures nothing
    assert main(["--model", MODEL, "--hardware", "this-machine", "--rate", "inf", "--num-requests", "4",
                 "--prompt-len", "12", "--output-len", "5", "--num-blocks", "32", "--block-size", "4",
                 "--compare-real", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulated"] is True and out["real"]["simulated"] is False
    assert set(out["real"]) == set(out) - {"real"}
    assert out["steps"] == out["real"]["steps"] and out["kv_pool_tokens"] == out["real"]["kv_pool_tokens"] == 128
    assert main(["--model", MODEL, "--hardware", "this-machine", "--rate", "inf", "--num-requests", "3",
                 "--prompt-len", "8", "--output-len", "3", "--num-blocks", "32", "--block-size", "4",
                 "--compare-real"]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED vs REAL" in text and "TTFT p50" in text and "makespan" in text
