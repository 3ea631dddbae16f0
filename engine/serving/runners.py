"""The Runner seam: what the engine loop needs of whatever runs the model, and the one place a
runner is chosen (``EngineConfig.runner`` -> ``RUNNERS``).

    in_process  ModelRunner (engine/model/runner.py): the model and its KV cache in this process
    workers     ParallelRunner (engine/parallel/executor.py): pipeline x tensor parallel worker
                processes (pipeline_parallel_size x tensor_parallel_size of them)
    simulated   SimulatedRunner (engine/costmodel/runner.py): runs no model; predicts each step's
                duration on the target hardware and advances the engine's virtual clock

"auto" is "simulated" for a SimulatedModel, else "workers" when p x t > 1, else "in_process". A new
runner is one module with a class that has the members of ``Runner``, plus one entry in
``RUNNERS`` (docs/architecture.md); the engine never tells runners apart.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch

from engine.core.batch import BatchStage
from engine.core.config import EngineConfig
from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from engine.core.trace import ParallelLayout, PipelineTimeline
from engine.costmodel.clock import VirtualClock
from engine.costmodel.model import SimulatedModel
from engine.costmodel.runner import SimulatedRunner
from engine.model.attention import attention_backend
from engine.model.forward_batch import decode_group_overhead
from engine.model.llama import LlamaModel, Observer
from engine.model.runner import ModelRunner
from engine.model.shared import SharedModel
from engine.parallel.executor import ParallelRunner


class Runner(Protocol):
    """Runs the scheduled batches of an engine's steps and owns the KV tensors."""

    @property
    def model(self) -> LlamaModel | None:
        """The whole model in this process (studies read it), or None when it runs elsewhere."""
        ...

    @property
    def kv_cache_dtype(self) -> str: ...

    @property
    def kv_cache_bytes_per_token(self) -> int: ...

    @property
    def kv_cache_total_bytes(self) -> int: ...

    @property
    def layout(self) -> ParallelLayout | None:
        """How the model is split over processes (the Snapshot's ``parallel``), None: not split."""
        ...

    @property
    def timeline(self) -> PipelineTimeline | None:
        """The last batch's work per worker (the StepTrace's ``pipeline``), None: no workers."""
        ...

    def forward(self, output: SchedulerOutput, requests: dict[str, Request], kv: KVCacheManager) -> torch.Tensor:
        """The scheduled batch -> logits [rows, V] (one row per sampling request, 1 + k for one
        verifying k drafts)."""
        ...

    def batch_stage(self) -> BatchStage:
        """How steps feed this runner: one batch per step, or a queue of batches in flight."""
        ...

    def set_observer(self, observer: Observer | None) -> None:
        """Let ``observer`` see every linear input of later steps (ValueError if it cannot)."""
        ...

    def check_integrity(self) -> None: ...

    def shutdown(self) -> None: ...


class RunnerContext(NamedTuple):
    """What a runner is built from."""

    model_name: str  # what a worker process loads
    shared: SharedModel | SimulatedModel  # the weights in this process, or a simulated model
    config: EngineConfig
    progress: Callable[[str], None] | None  # start-up progress (worker processes)
    clock: Callable[[], float]  # the engine's clock (a VirtualClock for a simulated model)


def _weights(ctx: RunnerContext, name: str) -> SharedModel:
    if not isinstance(ctx.shared, SharedModel):
        raise ValueError(f"runner: {name!r} runs a model's weights; a simulated model runs on 'simulated' (or 'auto')")
    return ctx.shared


def _in_process(ctx: RunnerContext) -> Runner:
    shared = _weights(ctx, "in_process")
    c = ctx.config
    if c.parallel_config.world_size > 1:
        raise ValueError(f"runner: 'in_process' runs the model in this process; pipeline_parallel_size x "
                         f"tensor_parallel_size = {c.parallel_config.world_size} needs 'workers' (or 'auto')")
    return ModelRunner(shared.model, c.cache_config.num_blocks, c.cache_config.block_size, c.kv_cache_dtype,
                       attention_backend(c.attention_backend, c.device), decode_group_overhead(c.decode_grouping))


def _workers(ctx: RunnerContext) -> Runner:
    shared = _weights(ctx, "workers")
    if ctx.config.parallel_config.world_size == 1:
        raise ValueError("runner: 'workers' needs pipeline_parallel_size x tensor_parallel_size > 1 "
                         "(use 'auto' or 'in_process' for one process)")
    attention_backend(ctx.config.attention_backend)  # an unknown backend fails here, not in a worker
    return ParallelRunner(ctx.model_name, shared.model, ctx.config, ctx.progress)


def _simulated(ctx: RunnerContext) -> Runner:
    if not isinstance(ctx.shared, SimulatedModel) or not isinstance(ctx.clock, VirtualClock):
        raise ValueError("runner: 'simulated' needs a SimulatedModel and a VirtualClock (engine.simulate builds "
                         "both)")
    c = ctx.config
    if c.parallel_config.world_size > 1:
        raise ValueError("runner: a simulated run takes its TP x PP from the deployment (SimulatedModel), not "
                         "from pipeline_parallel_size / tensor_parallel_size")
    if c.speculative_config is not None:
        raise ValueError("speculative_config: a simulated run does not model speculative decoding")
    return SimulatedRunner(ctx.shared, ctx.clock, c.cache_config.num_blocks, c.cache_config.block_size)


#: EngineConfig.runner -> the runner's constructor.
RUNNERS: dict[str, Callable[[RunnerContext], Runner]] = {"in_process": _in_process, "workers": _workers,
                                                         "simulated": _simulated}


def runner_name(config: EngineConfig, simulated: bool = False) -> str:
    """The registered name ``config.runner`` stands for ("auto" resolved)."""
    if config.runner == "auto":
        if simulated:
            return "simulated"
        return "workers" if config.parallel_config.world_size > 1 else "in_process"
    return config.runner


def build_runner(ctx: RunnerContext) -> Runner:
    """The runner ``ctx.config.runner`` names; an unknown name is a ValueError naming the knob."""
    name = runner_name(ctx.config, isinstance(ctx.shared, SimulatedModel))
    factory = RUNNERS.get(name)
    if factory is None:
        raise ValueError(f"runner: must be 'auto' or one of {sorted(RUNNERS)}, got {name[:40]!r}")
    return factory(ctx)
