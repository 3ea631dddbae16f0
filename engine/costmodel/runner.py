"""The simulated runner: the engine's Runner (engine/serving/runners.py) that runs no model.

Each forward turns the scheduler output into a StepShape, asks the cost model for the step's
duration, advances the virtual clock by it, and hands back one logits row per sampling request
with a single column: greedy sampling then picks token 0 every time, and with no end-of-text id
a request ends at its ``max_tokens`` (the workload's output length) or at the context limit.
Everything else in the step is the real engine's: scheduling, blocks, prefix cache, preemption.
"""
from __future__ import annotations

import torch

from engine.core.batch import BatchStage, SingleBatch
from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from engine.core.trace import ParallelLayout, PipelineTimeline
from engine.costmodel.clock import VirtualClock
from engine.costmodel.cost import StepCost
from engine.costmodel.model import SimulatedModel
from engine.costmodel.shape import step_shape


class SimulatedBatch(SingleBatch):
    """One batch per step; a rolled-back step also takes back the time it advanced."""

    def __init__(self, runner: SimulatedRunner) -> None:
        super().__init__(runner.forward)
        self.clock = runner.clock

    def checkpoint(self) -> object:
        return self.clock.now

    def restore(self, state: object) -> None:
        assert isinstance(state, float)
        self.clock.now = state


class SimulatedRunner:
    def __init__(self, sim: SimulatedModel, clock: VirtualClock, num_blocks: int, block_size: int) -> None:
        self.sim = sim
        self.clock = clock
        self.num_blocks, self.block_size = num_blocks, block_size
        self.last_cost: StepCost | None = None  # the last forward's prediction (the simulator records it)
        #: request id -> leading tokens whose KV was transferred in (disaggregated decode instances)
        self.imported: dict[str, int] = {}

    @property
    def model(self) -> None:
        """No weights in this process (studies that read the model do not apply)."""
        return None

    @property
    def kv_cache_dtype(self) -> str:
        return self.sim.deployment.kv_dtype

    @property
    def kv_cache_bytes_per_token(self) -> int:
        return self.sim.deployment.kv_bytes_per_token

    @property
    def kv_cache_total_bytes(self) -> int:
        """What the pool would hold on the target (nothing is allocated here)."""
        return self.num_blocks * self.block_size * self.kv_cache_bytes_per_token

    @property
    def layout(self) -> ParallelLayout | None:
        return None

    @property
    def timeline(self) -> PipelineTimeline | None:
        return None

    def forward(self, output: SchedulerOutput, requests: dict[str, Request], kv: KVCacheManager) -> torch.Tensor:
        """Predict the step, advance the clock by it -> logits [rows, 1] of zeros."""
        shape = step_shape(output, self.imported)
        cost = self.sim.cost.step_cost(shape)
        self.clock.advance(cost.total_s)
        self.last_cost = cost
        return torch.zeros(shape.num_samples, 1)

    def batch_stage(self) -> BatchStage:
        return SimulatedBatch(self)

    def set_observer(self, observer: object) -> None:
        if observer is not None:
            raise ValueError("a simulated run computes no activations to observe")

    def check_integrity(self) -> None:
        if not self.clock.now >= 0:
            raise AssertionError(f"simulated runner: the clock reads {self.clock.now!r}")

    def shutdown(self) -> None:
        """Nothing runs: nothing to stop."""
