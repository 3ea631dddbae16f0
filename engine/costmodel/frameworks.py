"""How each serving framework turns a cost model's step into what its users measure.

The cost model (roofline.py) predicts the GPU's work per step and the framework's fixed time
per step (the calculator's decode rule: engine/sizing/backends.py). Three more things separate
a framework's measured TTFT and TPOT from that:

    prefill_schedule  how prompts share steps with decodes. vLLM V0 (without chunked prefill) and
                      SGLang run a step of prefills whenever prompts wait, and the decodes stall
                      for it ("prefill_first"); vLLM V1 mixes prefill chunks into the decodes'
                      steps under one token budget (Sarathi-Serve's stall-free batching, "mixed")
    frontend_s        arrival -> the engine: the API server's HTTP handling, chat template and
                      tokenization (and the first token's way back); it adds to TTFT only
    per_request_s     CPU time per scheduled request per step (input preparation, sampling and
                      output processing in Python): steps grow with the batch beyond the GPU's work
    gemm_efficiency   the share of the dense peak the framework's compute-bound steps reach end to
                      end (None: the hardware preset's). Kernels alone reach more (Vidur measured
                      54-88 % of H100's peak for large GEMMs); a served prefill also pays for
                      attention, norms, sampling and the host, and lands near a third of the peak

frontend_s and per_request_s are not published as such (efficiency.md, item 3: only shares of
the time are), so each rule fits them to the points of tests/data/serving_published.json whose
role is "fit" (tests/fit_serving_rules.py re-runs the fit); every other point validates them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PrefillSchedule = Literal["mixed", "prefill_first"]


@dataclass(frozen=True)
class ServingRule:
    key: str
    label: str
    prefill_schedule: PrefillSchedule
    chunked_prefill: bool  # a prompt longer than the token budget is split across steps
    frontend_s: float
    per_request_s: float
    gemm_efficiency: float | None = None
    fitted_on: tuple[str, ...] = ()  # point ids in tests/data/serving_published.json
    sources: tuple[str, ...] = ()
    note: str = ""

    @property
    def words(self) -> str:
        return (f"{self.label}: {'prefill steps stall decodes' if self.prefill_schedule == 'prefill_first' else 'prefill chunks mixed into decode steps'},"
                f" frontend {self.frontend_s * 1e3:.0f} ms, {self.per_request_s * 1e6:.0f} us per request per step")


#: the engine of this project on this machine (and any framework without a fitted rule): requests
#: enter the engine directly, mixed batches, no per-request cost beyond the measured step
IN_PROCESS = ServingRule("in-process", "in-process engine", "mixed", True, 0.0, 0.0)

RULES: dict[str, ServingRule] = {r.key: r for r in (
    ServingRule(
        "vllm-v0-python", "vLLM < 0.6 (V0)", "prefill_first", False, frontend_s=0.0, per_request_s=300e-6,
        fitted_on=("rtx3090-llama3-8b-vllm041-rate1", "rtx3090-llama3-8b-vllm041-rate5"),
        sources=("https://github.com/vllm-project/vllm-project.github.io/blob/c3a01c4a5807c8d900ae468897e45263373e534e/_posts/2024-09-05-perf-update.md",),
        note="V0 schedules waiting prompts first and runs them in a step of their own (chunked prefill off by"
             " default below 32k context); before 0.6 the perf-update post puts 29 % of the time in scheduling"
             " and input preparation and 33 % in the API server (Llama-3-8B, 1 x H100)"),
    ServingRule(
        "vllm-v0", "vLLM 0.6 - 0.7 (V0)", "prefill_first", False, frontend_s=0.0, per_request_s=0.0,
        sources=("https://github.com/vllm-project/vllm-project.github.io/blob/c3a01c4a5807c8d900ae468897e45263373e534e/_posts/2024-09-05-perf-update.md",),
        note="0.6 took the CPU work off the GPU's path (multi-step scheduling, asynchronous output processing:"
             " 2.7x the throughput of 0.5.3 on Llama-3-8B); no published point here isolates what is left, so"
             " the per-request time is 0 and the frontend that of < 0.6 (0: the fit found none)"),
    ServingRule(
        "vllm-v1", "vLLM V1 (>= 0.8)", "mixed", True, frontend_s=50.9e-3, per_request_s=0.0, gemm_efficiency=0.35,
        fitted_on=("gpustack-qwen3-8b-h100-vllm-c4", "gpustack-qwen3-14b-h100-vllm-random-2000-100"),
        sources=("https://github.com/vllm-project/vllm-project.github.io/blob/c3a01c4a5807c8d900ae468897e45263373e534e/_posts/2025-01-27-v1-alpha-release.md",),
        note="V1 always chunks prefills into the decodes' steps under max_num_batched_tokens"),
    ServingRule(
        "sglang", "SGLang", "prefill_first", True, frontend_s=19.6e-3, per_request_s=0.0,
        fitted_on=("gpustack-qwen3-8b-h100-sglang-c4",),
        sources=("https://lmsys.org/blog/2024-12-04-sglang-v0-4/",),
        note="SGLang runs prefill batches (chunked at --chunked-prefill-size) apart from decode batches unless"
             " --enable-mixed-chunk; its overlap scheduler hides most CPU time (1.1x throughput, v0.4)"),
)}


def serving_rule(framework: str, budget_rule: str, version: tuple[int, ...] | None = None) -> ServingRule:
    """The rule for a framework at the calculator's budget rule (engine/sizing/budget.py VLLM_RULES,
    SGLANG_RULES) and version; IN_PROCESS for the rest (none, inferscope, vllm-ascend, MindIE: no
    published points)."""
    if framework == "vllm":
        if budget_rule != "v0":
            return RULES["vllm-v1"]
        return RULES["vllm-v0-python" if version is not None and version < (0, 6) else "vllm-v0"]
    if framework == "sglang":
        return RULES["sglang"]
    return IN_PROCESS
