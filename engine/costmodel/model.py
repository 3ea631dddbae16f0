"""A deployment the engine can serve without weights: a calculator model on a hardware preset.

The engine needs four facts of a model to run its loop (layers, positions, vocabulary, end-of-text
ids) and a runner; a SimulatedModel gives the facts and a cost model for the simulated runner.
Its KV pool is the calculator's: ``estimate(...).kv_room_tokens`` for the deployment, in whole
blocks of the framework's block size (one source of truth with the Fit page and the CLI).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from engine.costmodel.cost import CostModel
from engine.costmodel.frameworks import IN_PROCESS, ServingRule, serving_rule
from engine.costmodel.roofline import Efficiency, RooflineCost, plan_efficiency
from engine.model.loader import byte_tokenizer
from engine.model.model_config import ModelFacts
from engine.sizing import Estimate, Hardware, ModelSpec, Settings, Workload, estimate, get_hardware, get_model
from engine.sizing.plan import DEFAULT_LINK, Plan

#: vLLM's default max_num_seqs (EngineArgs), used where the caller sets none.
DEFAULT_MAX_NUM_SEQS = 256
#: vLLM's token budget floor without chunked prefill (SchedulerConfig: max(max_model_len, 2048))
UNCHUNKED_MIN_BATCHED_TOKENS = 2048
#: positions assumed for a config that names no limit
DEFAULT_MAX_POSITIONS = 131_072


@dataclass(frozen=True)
class Deployment:
    """What is simulated, as the calculator resolved it (the figures a page shows beside the run)."""

    model: str
    model_name: str
    hardware: str
    hardware_name: str
    framework: str
    budget_rule: str
    tp: int
    pp: int
    weights_format: str
    kv_dtype: str
    block_size: int
    kv_pool_tokens: int  # the calculator's KV room for this deployment, whole blocks
    kv_bytes_per_token: int  # every layer, whole model
    max_num_batched_tokens: int
    max_model_len: int
    link_bytes_per_s: float  # between devices and between instances (the preset's interconnect)

    @property
    def num_blocks(self) -> int:
        return self.kv_pool_tokens // self.block_size

    @property
    def words(self) -> str:
        return (f"{self.model_name} on {self.tp * self.pp} x {self.hardware_name} (TP {self.tp}, PP {self.pp}),"
                f" {self.framework}, {self.weights_format} weights, {self.kv_dtype} KV,"
                f" {self.kv_pool_tokens:,} KV tokens")


@dataclass(frozen=True)
class SimulatedModel:
    """The model side of a simulated engine: facts, a tokenizer for text prompts, a cost model."""

    name: str
    facts: ModelFacts
    tokenizer: Any  # byte-level: a text prompt costs one token per byte (token ids are exact)
    cost: CostModel
    deployment: Deployment
    serving: ServingRule = IN_PROCESS  # the framework's scheduling and overheads (frameworks.py)


def _deployment(spec: ModelSpec, est: Estimate, plan: Plan, max_model_len: int) -> Deployment:
    return Deployment(model=spec.key, model_name=spec.display_name, hardware=est.hardware,
                      hardware_name=est.hardware_name, framework=est.framework, budget_rule=est.budget_rule,
                      tp=est.tp, pp=est.pp, weights_format=est.weights_format, kv_dtype=est.kv_dtype,
                      block_size=plan.budget.block, kv_pool_tokens=est.kv_room_tokens,
                      kv_bytes_per_token=est.kv_bytes_per_token, max_num_batched_tokens=plan.batched_tokens,
                      max_model_len=max_model_len, link_bytes_per_s=plan.hw.interconnect or DEFAULT_LINK)


def simulated_model(model: str | ModelSpec, hardware: str | Hardware, settings: Settings | None = None,
                    max_model_len: int | None = None, efficiency: Efficiency | None = None,
                    serving: ServingRule | None = None) -> SimulatedModel:
    """A calculator model served on ``hardware`` as ``settings`` say (TP, PP, framework, formats).

    ValueError (naming the field) when the calculator cannot size it, when it does not fit, or when
    the model keeps no KV cache (a pure state-space model has no blocks to schedule). ``serving``:
    the framework's rule (frameworks.py) instead of the one its version gives (a fit tries others)."""
    if hardware == "this-machine":  # the real engine on this CPU needs a measured profile (a layer above)
        raise ValueError("hardware: 'this-machine' is the real engine on this machine, calibrated here: use "
                         "engine.simulate.calibrate.this_machine_model(model) (python -m engine.simulate "
                         "--hardware this-machine)")
    spec = get_model(model) if isinstance(model, str) else model
    hw = get_hardware(hardware)
    settings = settings or Settings()
    if not spec.has_kv:
        raise ValueError(f"model: {spec.display_name} keeps no KV cache (a state-space model); the simulator "
                         f"schedules KV blocks")
    positions = spec.max_model_len or DEFAULT_MAX_POSITIONS
    length = positions if max_model_len is None else max_model_len
    if not 2 <= length <= positions:
        raise ValueError(f"max_model_len: must be 2 .. {positions:,} ({spec.display_name}), got {length!r}")
    workload = Workload(batch=1, context=length)
    plan = Plan(spec, hw, workload, settings)
    rule = serving or serving_rule(plan.framework, plan.budget.rule, plan.budget.version_nums)
    if not rule.chunked_prefill and settings.max_num_batched_tokens is None:
        # without chunked prefill a prompt runs whole: vLLM's budget is then max(max_model_len, 2048),
        # and its profiling run (so the KV pool) is sized at that budget
        settings = replace(settings, max_num_batched_tokens=max(length, UNCHUNKED_MIN_BATCHED_TOKENS))
        plan = Plan(spec, hw, workload, settings)
    est = estimate(spec, hw, workload, settings, detail=False)
    if not est.fits or est.kv_room_tokens <= 0:
        raise ValueError(f"hardware: {spec.display_name} does not fit on {est.devices} x {est.hardware_name}"
                         f" (TP {est.tp}, PP {est.pp}) at max_model_len {length:,}: {est.reason}")
    deployment = _deployment(spec, est, plan, length)
    facts = ModelFacts(num_hidden_layers=spec.num_layers, max_position_embeddings=positions,
                       vocab_size=max(spec.vocab, 258), eos_token_ids=())
    if efficiency is None:
        base = plan_efficiency(plan)
        efficiency = replace(base, per_request_s=rule.per_request_s, gemm=rule.gemm_efficiency or base.gemm)
    return SimulatedModel(name=f"{spec.key} (simulated)", facts=facts, tokenizer=byte_tokenizer(),
                          cost=RooflineCost(plan, efficiency), deployment=deployment, serving=rule)
