"""The serving simulator (issue #22): the real engine on simulated hardware, in virtual time.

Every run here is predicted (no model runs), so the tests are cheap; they check the seams
(the calculator's KV pool and decode step, the runner, the clock), the loop (arrivals, idle gaps,
closed-loop clients, time limits), the metrics, and every bad input."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from engine import LLMEngine, SamplingParams
from engine.costmodel.clock import VirtualClock
from engine.costmodel.model import simulated_model
from engine.costmodel.shape import decode_shape, prefill_shape
from engine.simulate.__main__ import JSON_KEYS, main
from engine.simulate.capacity import find_capacity
from engine.simulate.metrics import SLO, percentile, summarize
from engine.simulate.simulator import ServingKnobs, simulate, simulated_engine
from engine.simulate.workload import Lengths, generate, parse_lengths, parse_workload, published
from engine.sizing import Settings, Workload, estimate

FAST = ("llama-3-8b", "rtx-3090")  # a small pool (2,919 blocks): integrity checks stay cheap


@pytest.fixture(scope="module")
def sim():
    return simulated_model(*FAST, Settings(framework="vllm"), max_model_len=4096)


def _checked(engine: LLMEngine) -> None:
    engine.check_integrity()


def _short(n: int = 30, rate: float = 20.0, seed: int = 0, **kw):
    return generate(n, rate, Lengths("uniform", 20, 300), Lengths("uniform", 2, 40), seed=seed, **kw)


# -- one source of truth with the calculator -----------------------------------------------------
def test_kv_pool_is_the_calculators_room(sim):
    est = estimate(FAST[0], FAST[1], Workload(batch=1, context=4096), Settings(framework="vllm"), detail=False)
    d = sim.deployment
    assert d.kv_pool_tokens == est.kv_room_tokens and d.num_blocks * d.block_size == est.kv_room_tokens
    engine, _ = simulated_engine(sim)
    assert engine.config.cache_config.pool_tokens == est.kv_room_tokens


def test_a_batch_of_decodes_costs_the_calculators_decode_step(sim):
    for batch in (1, 8):
        est = estimate(FAST[0], FAST[1], Workload(batch=batch, context=1024), Settings(framework="vllm"), detail=False)
        step = sim.cost.step_cost(decode_shape(batch, 1024))
        # the calculator's step + the elementwise term (norms, residuals: well under 1 % here)
        assert step.total_s - step.elementwise_s == pytest.approx(batch / est.decode_tokens_per_s_total, rel=0.01)


def test_costs_grow_with_work(sim):
    c = sim.cost
    assert c.step_cost(prefill_shape(2048)).total_s > c.step_cost(prefill_shape(256)).total_s > \
        c.step_cost(decode_shape(1, 256)).total_s
    assert c.step_cost(decode_shape(64, 4096)).attention_s > c.step_cost(decode_shape(64, 256)).attention_s
    tp2 = simulated_model("llama-3-8b", "a100-80gb", Settings(tp=2), max_model_len=4096)
    assert tp2.cost.step_cost(decode_shape(4, 512)).comm_s > 0 == sim.cost.step_cost(decode_shape(4, 512)).comm_s


# -- the loop ------------------------------------------------------------------------------------
def test_a_simulated_run_is_the_real_engine_in_virtual_time(sim):
    w = _short()
    run = simulate(sim, w, after_step=_checked)
    assert not run.partial and all(r.finished for r in run.requests)
    assert [r.output_tokens for r in run.requests] == [q.max_tokens for q in w.requests]  # outputs follow the workload
    for r, q in zip(run.requests, w.requests):
        assert r.arrival_s == q.arrival_s and r.arrival_s < r.first_token_s <= r.finish_s
    for a, b in zip(run.steps, run.steps[1:]):
        assert a.start_s + a.duration_s <= b.start_s + 1e-12  # steps never overlap; gaps are idle time
    again = simulate(sim, w)
    assert again.requests == run.requests  # deterministic


def test_idle_gaps_are_skipped_not_simulated(sim):
    w = generate(3, 0.01, Lengths("fixed", 50), Lengths("fixed", 5), seed=1)  # ~100 s apart
    run = simulate(sim, w)
    assert len(run.steps) <= 3 * 6 and run.makespan_s > 50  # a handful of steps, a long makespan
    assert sum(s.duration_s for s in run.steps) < 1.0


def test_closed_loop_clients_keep_at_most_max_concurrency_outstanding(sim):
    w = generate(12, math.inf, Lengths("fixed", 40), Lengths("fixed", 8), seed=2)
    run = simulate(sim, w, max_concurrency=3, after_step=_checked)
    assert max(s.running + s.waiting for s in run.steps) <= 3
    events = sorted([(r.arrival_s, 1) for r in run.requests] + [(r.finish_s, -1) for r in run.requests],
                    key=lambda e: (e[0], e[1]))
    live = 0
    for _, d in events:
        live += d
        assert live <= 3


def test_a_time_limit_stops_with_a_partial_result(sim):
    w = generate(400, 2.0, Lengths("fixed", 200), Lengths("fixed", 200), seed=3)
    run = simulate(sim, w, time_limit_s=0.05)
    assert run.partial and not all(r.finished for r in run.requests)
    s = summarize(run)
    assert s.partial and s.finished < s.num_requests == 400


def test_preemption_and_prefix_sharing_happen_in_the_real_scheduler():
    small = simulated_model("llama-3-8b", "rtx-3090", Settings(gpu_memory_utilization=0.73), max_model_len=2048)
    assert small.deployment.kv_pool_tokens < 8000
    w = generate(40, math.inf, Lengths("fixed", 300), Lengths("fixed", 300), seed=4, prefix_groups=2,
                 prefix_tokens=256)
    run = simulate(small, w, after_step=_checked)
    s = summarize(run)
    assert s.preemptions > 0 and s.max_kv_usage > 0.9 and s.prefix_hit_rate > 0.5 and s.finished == 40


# -- metrics, capacity ---------------------------------------------------------------------------
def test_percentiles_and_goodput(sim):
    assert percentile([], 50) is None and percentile([1.0, 3.0], 50) == 2.0 and percentile([5.0], 99) == 5.0
    run = simulate(sim, _short(20))
    loose, tight = summarize(run, SLO(10.0, 1.0)), summarize(run, SLO(1e-6, None))
    assert loose.slo_attainment == 1.0 and loose.goodput == pytest.approx(loose.requests_per_s)
    assert tight.slo_attainment == 0.0 and tight.goodput == 0.0
    assert loose.ttft_p50_s <= loose.ttft_p90_s <= loose.ttft_p99_s


def test_capacity_finds_the_knee(sim):
    def at(rate: float):
        return generate(40, rate, Lengths("fixed", 400), Lengths("fixed", 60), seed=5)
    cap = find_capacity(lambda w: simulate(sim, w), at, SLO(ttft_s=0.5, tpot_s=None), tolerance=0.1)
    assert cap.max_rate > 0 and cap.knee is not None and cap.knee.meets
    missed = [p for p in cap.points if not p.meets]
    assert missed and min(p.rate for p in missed) > cap.max_rate  # the first rate above that fails


# -- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [0, -1, float("nan"), True, "5"])
def test_bad_rates_are_refused(rate):
    with pytest.raises(ValueError, match="rate"):
        generate(5, rate, Lengths("fixed", 5), Lengths("fixed", 5))


@pytest.mark.parametrize("text, field", [
    ("[]", "workload"), ("{", "workload"), ('[{"arrival_s": 0, "max_tokens": 4}]', "prompt"),
    ('[{"arrival_s": -1, "prompt_tokens": 4, "max_tokens": 4}]', "arrival_s"),
    ('[{"arrival_s": 0, "prompt_tokens": 4, "max_tokens": 0}]', "max_tokens"),
    ('[{"arrival_s": 0, "prompt_tokens": 4}]', "max_tokens"),
    ('[{"arrival_s": 0, "prompt_tokens": 4, "max_tokens": 2, "colour": 1}]', "colour"),
    ('[{"arrival_s": 0, "prompt_tokens": [1, 999], "max_tokens": 2}]', "prompt_tokens"),
    ('[{"arrival_s": "soon", "prompt": "hi", "max_tokens": 2}]', "arrival_s"),
    ('[{"arrival_s": 0, "prompt": "hi", "max_tokens": 2, "priority": 1.5}]', "priority"),
])
def test_a_malformed_workload_file_names_the_field(text, field):
    with pytest.raises(ValueError, match=field):
        parse_workload(text)


def test_a_workload_file_runs_sorted_by_arrival(sim):
    w = parse_workload(json.dumps([{"arrival_s": 0.5, "prompt": "hello there", "max_tokens": 3},
                                   {"arrival_s": 0.0, "prompt_tokens": 20, "max_tokens": 4, "priority": 2}]))
    assert [r.arrival_s for r in w.requests] == [0.0, 0.5] and w.requests[0].priority == 2
    run = simulate(sim, w)
    assert [r.output_tokens for r in run.requests] == [4, 3]


def test_a_request_that_can_never_fit_is_refused_before_anything_runs(sim):
    w = generate(3, 1.0, Lengths("fixed", 4000), Lengths("fixed", 200))
    with pytest.raises(ValueError, match="workload request 0.*can never fit"):
        simulate(sim, w)


@pytest.mark.parametrize("text", ["0", "uniform:5-2", "lognormal:10,0", "sharegpt2", "x"])
def test_bad_length_distributions_name_the_flag(text):
    with pytest.raises(ValueError, match="--prompt-len"):
        parse_lengths(text, "--prompt-len")


def test_published_lengths_have_their_means():
    p = published("sharegpt", "prompt")
    assert p.mean == pytest.approx(214.0) and p.lo == 4 and p.hi == 1024


def test_the_simulated_runner_refuses_what_it_cannot_model(sim):
    with pytest.raises(ValueError, match="runner"):
        LLMEngine(sim, clock=VirtualClock(), runner="in_process", num_blocks=16)
    with pytest.raises(ValueError, match="runner"):
        LLMEngine(sim, num_blocks=16)  # no VirtualClock
    with pytest.raises(ValueError, match="keeps no KV cache"):
        simulated_model("mamba-2.8b", "a100-80gb")
    with pytest.raises(ValueError, match="does not fit"):
        simulated_model("llama-3-70b", "rtx-3090")


def test_a_step_that_fails_puts_the_clock_back(sim, monkeypatch):
    engine, clock = simulated_engine(sim, ServingKnobs(max_num_seqs=4))
    engine.add_request(list(range(50)), SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), arrival_time=0.0)
    engine.step()
    before = clock()
    monkeypatch.setattr(engine.runner, "forward", _advance_then_fail(engine.runner.forward))
    engine.batches.forward = engine.runner.forward
    with pytest.raises(RuntimeError, match="injected"):
        engine.step()
    assert clock() == before
    engine.check_integrity()


def _advance_then_fail(forward):
    def run(*args):
        forward(*args)
        raise RuntimeError("injected")
    return run


# -- the command line ----------------------------------------------------------------------------
def test_cli_json_has_the_contract_keys(capsys):
    assert main(["--model", FAST[0], "--hardware", FAST[1], "--rate", "5", "--num-requests", "20", "--max-model-len",
                 "4096", "--prompt-len", "uniform:20-200", "--output-len", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(JSON_KEYS) <= set(out) and out["simulated"] is True and len(out["per_request"]) == 20
    assert set(out["per_request"][0]) == {"arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens"}


@pytest.mark.parametrize("args, word", [
    (["--rate", "0"], "rate"), (["--rate", "nan"], "rate"), ([], "--rate"), (["--rate", "1", "--prompt-len", "z"], "--prompt-len"),
    (["--workload", "/nonexistent.json"], "--workload"), (["--rate", "1", "--time-limit", "-1"], "--time-limit"),
])
def test_cli_bad_input_is_one_line_and_status_2(args, word, capsys):
    assert main(["--model", FAST[0], "--hardware", FAST[1], *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and word in err


def test_cli_as_a_process_exits_2_with_one_line():
    p = subprocess.run([sys.executable, "-m", "engine.simulate", "--model", FAST[0], "--hardware", "no-such-gpu",
                        "--rate", "1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1 and "hardware" in p.stderr


# -- disaggregated prefill / decode --------------------------------------------------------------
def test_disaggregation_trades_ttft_for_steadier_decodes(sim):
    from engine.simulate.cluster import colocated, disaggregated
    w = generate(40, 8.0, Lengths("uniform", 600, 1500), Lengths("uniform", 20, 60), seed=6)
    dis = disaggregated(sim, w, 1, 1, after_step=_checked)
    col = colocated(sim, w, 2, after_step=_checked)
    for run in (dis, col):
        assert all(r.finished for r in run.requests) and not run.partial
        assert [r.output_tokens for r in run.requests] == [q.max_tokens for q in w.requests]
    d, c = summarize(dis), summarize(col)
    assert d.tpot_p90_s < c.tpot_p90_s  # no prompt ever stalls a decode step
    assert d.kv_pool_tokens == c.kv_pool_tokens == 2 * sim.deployment.kv_pool_tokens


def test_a_slow_link_delays_everything_after_the_first_token(sim):
    from engine.simulate.cluster import disaggregated, kv_transfer_seconds
    w = generate(4, 0.5, Lengths("fixed", 1000), Lengths("fixed", 10), seed=7)
    fast, slow = disaggregated(sim, w, 1, 1), disaggregated(sim, w, 1, 1, link_bytes_per_s=1e9)
    gap = kv_transfer_seconds(sim, 1000, 1e9) - kv_transfer_seconds(sim, 1000, sim.deployment.link_bytes_per_s)
    for f, s in zip(fast.requests, slow.requests):
        assert s.first_token_s == pytest.approx(f.first_token_s)  # the prefill instance is not slowed
        assert s.finish_s - f.finish_s == pytest.approx(gap, rel=0.05)


@pytest.mark.parametrize("kw", [{"prefill": 0, "decode": 1}, {"prefill": 1, "decode": 65}, {"prefill": True, "decode": 1}])
def test_bad_instance_counts_are_refused(sim, kw):
    from engine.simulate.cluster import disaggregated
    with pytest.raises(ValueError, match="prefill|decode"):
        disaggregated(sim, _short(2), **kw)
