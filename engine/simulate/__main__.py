"""python -m engine.simulate: serving under load, the real scheduler on simulated hardware.

    python -m engine.simulate --model llama-3-70b --hardware h100-sxm --tp 8 --rate 10 --num-requests 2000
    python -m engine.simulate --model llama-3-8b --hardware a100-80gb --workload requests.json --json
    python -m engine.simulate ... --capacity --slo-ttft 1 --slo-tpot 0.05
    python -m engine.simulate --model smollm2-135m --hardware this-machine --rate 1 --num-requests 30 \
        --prompt-len lognormal:60,0.6 --output-len lognormal:30,0.5 --compare-real

``--hardware this-machine`` predicts the real engine on this CPU from a profile measured here
(engine/simulate/calibrate.py: cached; measured first, with progress on stderr, when there is
none; ``--recalibrate`` measures again); ``--compare-real`` then also serves the workload with the
real engine and prints both.

Times are predicted (a cost model), not measured: the output says so. A bad input exits with
status 2 and one line on stderr; never a traceback.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.core.config import PREFILL_SCHEDULES, SCHEDULING_POLICIES
from engine.costmodel.model import DEFAULT_MAX_NUM_SEQS, SimulatedModel, simulated_model
from engine.simulate.calibrate import DEFAULT_BATCHED_TOKENS, DEFAULT_BLOCK_SIZE, DEFAULT_NUM_BLOCKS, THIS_MACHINE, \
    calibrate, this_machine_model, use_app_threads
from engine.simulate.capacity import Capacity, find_capacity
from engine.simulate.cluster import colocated, disaggregated
from engine.simulate.metrics import SLO, Summary, summarize
from engine.simulate.result import RunResult
from engine.simulate.simulator import Progress, ServingKnobs, run_real, simulate
from engine.simulate.workload import Workload, generate, parse_lengths, parse_workload
from engine.sizing import Settings, SizingError
from engine.sizing.cli import one_line

#: the --json keys (a stable contract)
JSON_KEYS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "e2e_p50_s", "output_tokens_per_s",
             "requests_per_s", "goodput", "kv_pool_tokens", "max_kv_usage", "preemptions", "steps")
MAX_WORKLOAD_BYTES = 64 << 20


class InputError(ValueError):
    """A bad command-line value: one line on stderr, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.simulate", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--model", required=True, help="a model preset, a config.json or a model folder")
    a("--hardware", required=True, help="a hardware preset (python -m engine.memory --list-hardware)")
    a("--tp", type=int, help="tensor parallel size (default: the calculator's)")
    a("--pp", type=int, default=1, help="pipeline parallel size")
    a("--framework", default="auto", help="vllm, sglang, ... (its KV budget rule and step overhead)")
    a("--framework-version", help="the framework version whose budget rule applies")
    a("--gpu-memory-utilization", type=float, help="vLLM's util / SGLang's mem_fraction_static")
    a("--weights", default="auto", help="weight format (bf16, fp8, awq, ...)")
    a("--kv-dtype", default="auto", help="KV cache dtype")
    a("--max-model-len", type=int, help="context limit (default: the model's)")
    a("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS, help="most requests running at once")
    a("--max-num-batched-tokens", type=int, help="token budget per step (default: the framework's)")
    a("--no-prefix-caching", action="store_true")
    a("--no-chunked-prefill", action="store_true")
    a("--policy", default="fcfs", help=f"scheduling_policy: {', '.join(SCHEDULING_POLICIES)}")
    a("--prefill-schedule", choices=PREFILL_SCHEDULES, help="default: the framework's (frameworks.py)")
    a("--disaggregate", nargs=2, type=int, metavar=("P", "D"), help="P prefill + D decode instances, KV over the link")
    a("--colocate", type=int, metavar="N", help="N instances serving prefill and decode (to compare)")
    a("--rate", type=float, help="Poisson arrivals per second (inf: all at t = 0)")
    a("--num-requests", type=int, default=200)
    a("--prompt-len", default="sharegpt", help="N | uniform:LO-HI | lognormal:MEAN,SIGMA | sharegpt | lmsys-chat"
                                                " | arxiv-summarization")
    a("--output-len", default="sharegpt", help="as --prompt-len")
    a("--prefix-groups", type=int, default=0, help="interleaved groups sharing a prompt prefix")
    a("--prefix-tokens", type=int, default=0, help="tokens of each group's shared prefix")
    a("--seed", type=int, default=0)
    a("--workload", help="a JSON list of {arrival_s, prompt | prompt_tokens, max_tokens, priority?}")
    a("--slo-ttft", type=float, help="TTFT target in seconds (goodput, capacity)")
    a("--slo-tpot", type=float, help="TPOT target in seconds (goodput, capacity)")
    a("--capacity", action="store_true", help="find the highest rate meeting the SLOs (p90)")
    a("--time-limit", type=float, default=600.0, help="wall seconds per run before it stops, partial")
    a("--json", action="store_true", help="machine-readable output")
    a("--num-blocks", type=int, default=DEFAULT_NUM_BLOCKS, help="this-machine: the real engine's KV blocks")
    a("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="this-machine: tokens per KV block")
    a("--recalibrate", action="store_true", help="this-machine: measure the profile again")
    a("--compare-real", action="store_true", help="this-machine: also run the real engine on the workload")
    return p


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(weights=args.weights, kv_dtype=args.kv_dtype, tp=args.tp, pp=args.pp, framework=args.framework,
                    framework_version=args.framework_version, gpu_memory_utilization=args.gpu_memory_utilization,
                    max_num_batched_tokens=args.max_num_batched_tokens)


def _workload_at(args: argparse.Namespace) -> Any:
    prompt = parse_lengths(args.prompt_len, "--prompt-len", "prompt")
    output = parse_lengths(args.output_len, "--output-len", "output")

    def at(rate: float) -> Workload:
        return generate(args.num_requests, rate, prompt, output, seed=args.seed, prefix_groups=args.prefix_groups,
                        prefix_tokens=args.prefix_tokens)
    return at


def _read_workload(path: str) -> Workload:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--workload: no such file {path[:200]!r}")
    if p.stat().st_size > MAX_WORKLOAD_BYTES:
        raise InputError(f"--workload: larger than {MAX_WORKLOAD_BYTES >> 20} MiB")
    return parse_workload(p.read_bytes(), name=p.name, seed=0)


def _check(args: argparse.Namespace) -> None:
    if (args.rate is None) == (args.workload is None) and not args.capacity:
        raise InputError("give --rate (with --num-requests) or --workload")
    if args.capacity and args.workload:
        raise InputError("--capacity sweeps the rate of a generated workload; it cannot take --workload")
    if args.policy not in SCHEDULING_POLICIES:
        raise InputError(f"--policy: must be one of {', '.join(SCHEDULING_POLICIES)}, got {args.policy[:40]!r}")
    if args.disaggregate and args.colocate:
        raise InputError("--disaggregate and --colocate are two runs: give one")
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise InputError(f"--time-limit: must be a number of seconds > 0, got {args.time_limit!r}")
    here = args.hardware == THIS_MACHINE
    for flag, value in (("--compare-real", args.compare_real), ("--recalibrate", args.recalibrate)):
        if value and not here:
            raise InputError(f"{flag}: only with --hardware {THIS_MACHINE} (the real engine runs on this machine only)")
    if args.compare_real and args.capacity:
        raise InputError("--compare-real runs one workload; it cannot take --capacity")
    if here and ((args.tp or 1) != 1 or args.pp != 1):
        raise InputError(f"--tp, --pp: the real engine on {THIS_MACHINE} is simulated in one process (1, 1)")


def _this_machine(args: argparse.Namespace) -> SimulatedModel:
    """The real engine on this CPU, simulated: the cached profile, or measured now (progress on stderr)."""
    def say(text: str) -> None:
        print(f"calibration: {text}", file=sys.stderr, flush=True)
    use_app_threads()  # the real engine as the app runs it (and as the profile is measured)
    profile = calibrate(args.model, progress=say, force=args.recalibrate)
    return this_machine_model(args.model, profile, num_blocks=args.num_blocks, block_size=args.block_size,
                              max_num_batched_tokens=args.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS,
                              max_model_len=args.max_model_len)


def _progress(enabled: bool) -> Any:
    def say(p: Progress) -> None:
        print(f"\r{p.finished:,} of {p.total:,} requests done, {p.clock_s:,.1f} s simulated in {p.wall_s:,.1f} s",
              end="", file=sys.stderr, flush=True)
    return say if enabled else None


def _report(sim: SimulatedModel, run: RunResult, s: Summary, capacity: Capacity | None) -> dict[str, Any]:
    out: dict[str, Any] = {k: getattr(s, k) for k in JSON_KEYS}
    simulated = run.simulated
    out.update(simulated=simulated, partial=s.partial, deployment=run.label,
               cost_model=sim.cost.label if simulated else "measured: the real engine's wall-clock times",
               serving_rule=sim.serving.words,
               slo_attainment=s.slo_attainment, finished=s.finished, num_requests=s.num_requests,
               makespan_s=s.makespan_s, per_request=[r.as_dict() for r in run.requests])
    if capacity is not None:
        out["max_rate"] = capacity.max_rate
        out["capacity_points"] = [{"rate": p.rate, "ttft_p90_s": p.summary.ttft_p90_s,
                                   "tpot_p90_s": p.summary.tpot_p90_s, "meets": p.meets} for p in capacity.points]
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:,.1f} ms"


def render_text(report: dict[str, Any], workload: str) -> str:
    lines = [f"SIMULATED - predicted times, not measured ({report['cost_model']})",
             f"deployment: {report['deployment']}", f"framework:  {report['serving_rule']}", f"workload:   {workload}",
             f"finished {report['finished']:,} of {report['num_requests']:,} requests in {report['makespan_s']:,.1f} s"
             + ("  (PARTIAL: stopped at the time limit)" if report["partial"] else ""),
             f"TTFT  p50 {_ms(report['ttft_p50_s'])}  p90 {_ms(report['ttft_p90_s'])}  p99 {_ms(report['ttft_p99_s'])}",
             f"TPOT  p50 {_ms(report['tpot_p50_s'])}  p90 {_ms(report['tpot_p90_s'])}",
             f"E2E   p50 {report['e2e_p50_s'] or 0:,.2f} s",
             f"throughput {report['output_tokens_per_s']:,.0f} output tok/s, {report['requests_per_s']:,.2f} req/s;"
             f" goodput {report['goodput']:,.2f} req/s ({report['slo_attainment']:.0%} met the SLOs)",
             f"KV pool {report['kv_pool_tokens']:,} tokens, at most {report['max_kv_usage']:.1%} used;"
             f" {report['preemptions']:,} preemptions; {report['steps']:,} steps"]
    if "max_rate" in report:
        lines.append(f"capacity: {report['max_rate']:,.2f} req/s meet p90 TTFT and TPOT SLOs")
    return "\n".join(lines)


#: (label, key, kind) of the side-by-side table of --compare-real
_COMPARE_ROWS = (("TTFT p50", "ttft_p50_s", "ms"), ("TTFT p90", "ttft_p90_s", "ms"), ("TTFT p99", "ttft_p99_s", "ms"),
                 ("TPOT p50", "tpot_p50_s", "ms"), ("TPOT p90", "tpot_p90_s", "ms"), ("E2E p50", "e2e_p50_s", "s"),
                 ("makespan", "makespan_s", "s"), ("output tok/s", "output_tokens_per_s", "n"),
                 ("requests/s", "requests_per_s", "n"), ("steps", "steps", "n"), ("preemptions", "preemptions", "n"))


def render_compare(report: dict[str, Any], workload: str) -> str:
    """The simulated and the real run side by side, with the relative error of the prediction."""
    real = report["real"]

    def cell(v: Any, kind: str) -> str:
        if v is None:
            return "-"
        if kind == "ms":
            return _ms(v)
        return f"{v:,.2f} s" if kind == "s" else f"{v:,}" if isinstance(v, int) else f"{v:,.2f}"
    lines = [f"SIMULATED vs REAL on this machine ({report['cost_model']})", f"deployment: {report['deployment']}",
             f"workload:   {workload}", f"{'':<14} {'simulated':>14} {'real':>14} {'error':>8}"]
    for label, key, kind in _COMPARE_ROWS:
        p, m = report[key], real[key]
        err = f"{(p - m) / m:+.1%}" if p is not None and m else "-"
        lines.append(f"{label:<14} {cell(p, kind):>14} {cell(m, kind):>14} {err:>8}")
    if report["partial"] or real["partial"]:
        lines.append("PARTIAL: a run stopped at the time limit")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        _check(args)
        sim = _this_machine(args) if args.hardware == THIS_MACHINE else \
            simulated_model(args.model, args.hardware, _settings(args), args.max_model_len)
        knobs = ServingKnobs(args.max_num_seqs, args.max_num_batched_tokens, not args.no_prefix_caching,
                             False if args.no_chunked_prefill else None, args.policy, args.prefill_schedule)
        slo = SLO(args.slo_ttft, args.slo_tpot)
        say = _progress(not args.json and sys.stderr.isatty())

        def run(w: Workload) -> RunResult:
            if args.disaggregate:
                prefill, decode = args.disaggregate
                return disaggregated(sim, w, prefill, decode, knobs, time_limit_s=args.time_limit)
            if args.colocate:
                return colocated(sim, w, args.colocate, knobs, time_limit_s=args.time_limit)
            return simulate(sim, w, knobs, time_limit_s=args.time_limit, progress=say)
        capacity = None
        if args.capacity:
            workload_at = _workload_at(args)
            capacity = find_capacity(run, workload_at, slo,
                                     progress=None if args.json else lambda m: print(m, file=sys.stderr))
            workload = workload_at(capacity.max_rate if capacity.max_rate > 0 else 1e-3)
        else:
            workload = _read_workload(args.workload) if args.workload else _workload_at(args)(args.rate)
        result = run(workload)
        if say is not None:
            print(file=sys.stderr)
        report = _report(sim, result, summarize(result, slo), capacity)
        if args.compare_real:
            extra = {} if args.max_model_len is None else {"max_model_len": args.max_model_len}
            real = run_real(args.model, workload, knobs, num_blocks=args.num_blocks, block_size=args.block_size,
                            time_limit_s=args.time_limit, progress=say, **extra)
            if say is not None:
                print(file=sys.stderr)
            report["real"] = _report(sim, real, summarize(real, slo), None)
            print(json.dumps(report) if args.json else render_compare(report, workload.name))
            return 0
        print(json.dumps(report) if args.json else render_text(report, workload.name))
        return 0
    except (InputError, SizingError, ValueError) as e:
        print(one_line(f"error: {e}"), file=sys.stderr)
        return 2
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), already printed
        return int(e.code or 0)
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - the contract: one line, no traceback
        print(one_line(f"error: unexpected {type(e).__name__}: {e}"), file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
