"""The cost-model interface: a StepShape -> a StepCost (seconds, by operator kind)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.costmodel.shape import StepShape


@dataclass(frozen=True)
class StepCost:
    """One step's predicted seconds, by operator kind (they run one after another)."""

    gemm_s: float  # linear layers, LM head included
    attention_s: float  # attention: KV reads (decode) and query x context FLOPs (prefill)
    elementwise_s: float  # norms, rotary, activation, residual adds
    comm_s: float  # tensor-parallel all-reduces and pipeline sends
    overhead_s: float  # the framework's time per step (scheduling, launches, sampling)

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.comm_s + self.overhead_s

    def as_dict(self) -> dict[str, float]:
        return {"gemm_s": self.gemm_s, "attention_s": self.attention_s, "elementwise_s": self.elementwise_s,
                "comm_s": self.comm_s, "overhead_s": self.overhead_s, "total_s": self.total_s}


class CostModel(Protocol):
    """Predicts how long a scheduled batch takes on one deployment."""

    @property
    def label(self) -> str:
        """What the prediction stands on, for people ("roofline x efficiency: H100 ...")."""
        ...

    def step_cost(self, shape: StepShape) -> StepCost: ...
