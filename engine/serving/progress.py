"""The no-progress backstop of the step loop."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.core.config import EngineConfig
from engine.core.kv_cache import cdiv
from engine.core.scheduler import SchedulerOutput


@dataclass
class ProgressWatch:
    """Steps since any request last made progress.

    Progress: a token appended, a request finished, or a scheduled chunk reaching past the most
    tokens its request ever had computed (its high-water mark). Without preemption every
    scheduled chunk is progress; a preempted request that is recomputed makes none until it
    passes where it was. Rule: ``stuck`` once ``limit`` steps in a row made no progress while
    preempting -- the schedule keeps undoing its own work (a livelock), which the scheduler's
    preemption order rules out; this only turns a bug into an error instead of a hang.
    """

    limit: int
    high_water: dict[str, int] = field(default_factory=dict)
    idle_steps: int = 0
    preemptions: int = 0  # during the idle steps

    @staticmethod
    def limit_for(config: EngineConfig, max_model_len: int) -> int:
        """Steps a correct schedule may go without progress, with a wide margin: the oldest
        request is never preempted and is scheduled at least every 2p steps (the batch queue
        can make it wait for an in-flight batch), so it passes its high-water mark after
        recomputing at most max_model_len tokens, max_num_batched_tokens per schedule."""
        p = config.parallel_config.pipeline_parallel_size
        return 4 * p * (cdiv(max_model_len, config.scheduler_config.max_num_batched_tokens) + 2) + 16

    def observe(self, output: SchedulerOutput, appended: bool, finished: Sequence[str]) -> None:
        """Account one step: its (retired) scheduled chunks, whether it appended tokens, the
        requests that finished."""
        progressed = appended or bool(finished)
        for s in output.scheduled:
            end = s.start + s.num_new_tokens
            if end > self.high_water.get(s.request_id, 0):
                self.high_water[s.request_id] = end
                progressed = True
        for rid in finished:
            self.high_water.pop(rid, None)
        if progressed:
            self.idle_steps = self.preemptions = 0
        else:
            self.idle_steps += 1
            self.preemptions += len(output.preempted)

    @property
    def stuck(self) -> bool:
        return self.idle_steps >= self.limit and self.preemptions > 0

    def checkpoint(self) -> object:
        return (dict(self.high_water), self.idle_steps, self.preemptions)

    def restore(self, state: object) -> None:
        assert isinstance(state, tuple)
        high_water, self.idle_steps, self.preemptions = state
        self.high_water = dict(high_water)
