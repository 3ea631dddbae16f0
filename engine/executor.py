"""Pipeline and tensor parallelism on real processes: the driver's side.

``ParallelExecutor`` starts p x t worker processes (torch.multiprocessing, spawn) that join one
torch.distributed gloo group on 127.0.0.1 (engine/worker.py), sends them each step, collects
the logits and every worker's timed events, and stops them. ``ParallelRunner`` is the model
runner an ``LLMEngine`` uses when p x t > 1: it turns the scheduler's batches into units
(micro-batches for "gpipe", whole batches for "batch_queue") and the workers' events into the
step's ``PipelineTimeline``.

Failure rule: a worker that dies, reports an error, or does not answer within
``worker_timeout_s`` makes the step raise ``WorkerError`` naming it; every worker is then
stopped (its peers may be blocked on it) and the executor refuses further steps, so the engine
must be restarted. Workers end on ``shutdown()``, on garbage collection (``weakref.finalize``),
at interpreter exit, and by themselves when the driver process disappears.
"""
from __future__ import annotations

import itertools
import os
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

import torch

from engine.config import EngineConfig
from engine.kv_cache import KVCacheManager
from engine.model_runner import batch_inputs, kv_cache_bytes_per_token
from engine.models.llama import LlamaModel
from engine.parallel_layout import build_layout
from engine.request import Request
from engine.scheduler import ScheduledRequest, SchedulerOutput
from engine.trace import ParallelLayout, PipelineTimeline, PipelineUnit, WorkEvent
from engine.worker import Failed, Ready, RunStep, StepDone, Unit, WorkerSpec, clock_ns, worker_main

START_TIMEOUT_S = 120.0  # spawn + import torch + load the model, per worker, on a busy 2-core machine
STOP_GRACE_S = 3.0

Progress = Callable[[str], None]


class WorkerError(RuntimeError):
    """A worker died, failed or hung; the executor has stopped every worker."""


class ParallelExecutor:
    """p x t worker processes and the pipes to them (rank = stage * t + tp_rank)."""

    def __init__(self, model: str, config: EngineConfig, layout: ParallelLayout,
                 progress: Progress | None = None) -> None:
        import torch.distributed as dist
        import torch.multiprocessing as mp

        self.layout = layout
        self.timeout_s = config.worker_timeout_s
        self.error: str | None = None
        # Batches sent whose results are not all read yet, oldest first (workers answer in
        # order), and every result read, by batch and rank, as soon as it is read: a step
        # interrupted halfway through reading loses nothing, and a rolled-back step's batch is
        # taken again by the retry (or dropped by ``forget``).
        self._outstanding: deque[int] = deque()
        self._results: dict[int, dict[int, object]] = {}
        say = progress or (lambda _: None)
        n = layout.num_workers
        # The driver hosts the rendezvous store (port 0: the OS picks a free one, no race).
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        ctx = mp.get_context("spawn")
        threads = max(1, (os.cpu_count() or 1) // n)
        self.processes: list[Any] = []
        self.conns: list[Connection] = []
        # Registered before the first spawn: whatever has started is stopped on any failure.
        self._finalizer = weakref.finalize(self, _stop, self.processes, self.conns)
        self.pids: tuple[int, ...] = ()
        say(f"starting {n} worker processes (p = {layout.pipeline_parallel_size}, "
            f"t = {layout.tensor_parallel_size})")
        try:
            for rank in range(n):
                parent, child = ctx.Pipe()
                spec = WorkerSpec(rank, model, config, layout, self._store.port, threads, os.getpid())
                process = ctx.Process(target=worker_main, args=(spec, child), daemon=True,
                                      name=f"inferscope-worker-{rank}")
                process.start()
                child.close()
                self.processes.append(process)
                self.conns.append(parent)
            ready = self._collect(START_TIMEOUT_S + self.timeout_s, "start",
                                  on_each=lambda k: say(f"worker {k} of {n} ready"))
        except BaseException:
            self.shutdown()
            raise
        self.pids = tuple(r.pid for r in ready if isinstance(r, Ready))

    @property
    def alive(self) -> bool:
        return self.error is None and self._finalizer.alive

    def run(self, step: RunStep) -> list[StepDone]:
        """Send one batch to every worker and wait for it; -> results by rank."""
        self.submit(step)
        results = self.receive(step.batch_id)
        self.forget(keep=())
        return results

    def submit(self, step: RunStep) -> None:
        """Send one batch to every worker without waiting (it queues behind earlier ones)."""
        if not self.alive:
            raise WorkerError(f"the worker processes were stopped ({self.error or 'shut down'}); "
                              f"restart the engine")
        sent = 0
        try:
            for conn in self.conns:
                conn.send(step)
                sent += 1
        except OSError as e:
            self._fail(f"a worker's pipe is closed ({e})")
        except BaseException:
            if sent:  # some workers have the batch, some not: they can no longer agree on one
                self.error = "a batch was interrupted while it was being sent"
                self.shutdown()
            raise
        self._outstanding.append(step.batch_id)

    def receive(self, batch_id: int) -> list[StepDone]:
        """The results of a submitted batch, by rank. Workers answer in order, so the results of
        every batch sent before it are read (and kept) first: a batch whose step was rolled back
        is simply never taken (``forget`` drops it). Raises WorkerError."""
        while batch_id in self._outstanding:
            oldest = self._outstanding[0]
            self._collect(self.timeout_s, "a step", self._results.setdefault(oldest, {}))
            self._outstanding.popleft()
        if batch_id not in self._results:
            raise ValueError(f"batch {batch_id} was never submitted (or its results were forgotten)")
        done = self._results[batch_id]
        return [r for r in (done[k] for k in range(len(self.conns))) if isinstance(r, StepDone)]

    def forget(self, keep: Iterable[int]) -> None:
        """Drop the results of every fully read batch not in ``keep`` (those a step has taken, and
        those of rolled-back steps)."""
        kept = set(keep) | set(self._outstanding)
        for batch_id in [b for b in self._results if b not in kept]:
            del self._results[batch_id]

    def _collect(self, timeout_s: float, what: str, results: dict[int, object] | None = None,
                 on_each: Callable[[int], None] | None = None) -> list[object]:
        """One message from every worker not yet in ``results`` (stored there as it is read),
        watching for deaths, failures and the deadline; -> the messages by rank."""
        results = {} if results is None else results
        deadline = clock_ns() + int(timeout_s * 1e9)
        while len(results) < len(self.conns):
            waiting = [r for r in range(len(self.conns)) if r not in results]
            left = (deadline - clock_ns()) / 1e9
            ready = wait([self.conns[r] for r in waiting], timeout=max(0.0, min(left, 0.5))) if left > 0 else []
            for r in waiting:
                if self.conns[r] in ready:
                    try:
                        message = self.conns[r].recv()
                    except (EOFError, OSError):
                        self._fail(self._describe(r) + f" died during {what} "
                                   f"(exit code {self.processes[r].exitcode})")
                    except BaseException:
                        # e.g. Ctrl-C part-way through a large message: the pipe no longer
                        # starts at a message boundary, so no later answer could be read.
                        self.error = f"reading {self._describe(r)}'s answer was interrupted"
                        self.shutdown()
                        raise
                    if isinstance(message, Failed):
                        # A peer's death surfaces first as this worker's communication error:
                        # name the dead worker, not the one that lost its connection to it.
                        dead = [k for k in range(len(self.conns)) if not self.processes[k].is_alive()]
                        first = (", ".join(f"{self._describe(k)} died during {what} (exit code "
                                           f"{self.processes[k].exitcode})" for k in dead) + "; ") if dead else ""
                        self._fail(first + self._describe(r) + f" failed during {what}: {message.message}")
                    results[r] = message
                    if on_each is not None:
                        on_each(len(results))
                elif not self.processes[r].is_alive():
                    self._fail(self._describe(r) + f" died during {what} (exit code {self.processes[r].exitcode})")
            if len(results) < len(self.conns) and clock_ns() >= deadline:
                late = [self._describe(r) for r in range(len(self.conns)) if r not in results]
                self._fail(f"{', '.join(late)} did not answer within {timeout_s:g} s during {what} (hung?)")
        return [results[r] for r in range(len(self.conns))]

    def _describe(self, rank: int) -> str:
        stage, tp = divmod(rank, self.layout.tensor_parallel_size)
        return f"worker {rank} (stage {stage}, tp rank {tp}, pid {self.processes[rank].pid})"

    def _fail(self, reason: str) -> NoReturn:
        self.error = reason
        self.shutdown()
        raise WorkerError(reason + "; every worker was stopped: restart the engine")

    def shutdown(self) -> None:
        """Stop every worker (idempotent): ask, then terminate, then kill."""
        self._finalizer()

    def check_integrity(self) -> None:
        """Running: every worker alive. Stopped: none alive."""
        for r, process in enumerate(self.processes):
            if self.alive and not process.is_alive():
                raise AssertionError(f"{self._describe(r)} is dead but the executor is running")
            if not self.alive and process.is_alive():
                raise AssertionError(f"{self._describe(r)} is alive after the executor stopped")


def _stop(processes: list[Any], conns: list[Connection]) -> None:
    """Ask each worker to stop, then terminate, then kill what is left, and reap them all. A
    SIGSTOPped (hung) worker ignores the first two; SIGKILL always works."""
    for conn in conns:
        try:
            conn.send(None)
        except OSError:
            pass
    deadline = clock_ns() + int(STOP_GRACE_S * 1e9)
    for process in processes:
        process.join(max(0.0, (deadline - clock_ns()) / 1e9))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(0.5)
        if process.is_alive():
            process.kill()
            process.join(STOP_GRACE_S)
    for conn in conns:
        conn.close()


@dataclass(frozen=True)
class InFlightBatch:
    """A batch sent to the workers and not yet taken back (its step's ``SchedulerOutput``)."""

    batch_id: int
    output: SchedulerOutput
    units: tuple[PipelineUnit, ...]
    t0_ns: int

    @property
    def request_ids(self) -> frozenset[str]:
        return frozenset(s.request_id for s in self.output.scheduled)


class ParallelRunner:
    """The engine's model runner over worker processes (same ``forward`` as ModelRunner)."""

    def __init__(self, model_name: str, model: LlamaModel, config: EngineConfig,
                 progress: Progress | None = None) -> None:
        c = model.config
        self.config = config
        self.model_config = c
        self.layout = build_layout(c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                                   c.intermediate_size, config.pipeline_parallel_size,
                                   config.tensor_parallel_size, config.pipeline_schedule,
                                   config.num_microbatches, config.pipeline_layer_split)
        self.kv_cache_dtype = config.cache_dtype
        self.timeline: PipelineTimeline | None = None
        self.executor = ParallelExecutor(model_name, config, self.layout, progress)
        self._batch_ids = itertools.count()
        self._epoch_ns = clock_ns()  # timelines' offsets count from here

    @property
    def kv_cache_bytes_per_token(self) -> int:
        return kv_cache_bytes_per_token(self.model_config, self.kv_cache_dtype)

    @property
    def kv_cache_total_bytes(self) -> int:
        """The whole pool, over every worker (with t beyond the KV heads, replicas count once)."""
        return self.kv_cache_bytes_per_token * self.config.pool_tokens

    @property
    def max_batches(self) -> int:
        """Batches in flight at once: p for "batch_queue", else one per step."""
        return self.layout.pipeline_parallel_size if self.layout.schedule == "batch_queue" else 1

    def forward(self, output: SchedulerOutput, requests: dict[str, Request], kv: KVCacheManager) -> torch.Tensor:
        """The "gpipe" step: the step's batch, cut into micro-batches, through the pipeline and
        back -> logits [S, V] in the order of its scheduled requests, as one process gives them
        (its results are dropped when the step commits: ``retain``)."""
        return self.collect(self.submit(output, requests, kv, self.layout.num_microbatches))

    def submit(self, output: SchedulerOutput, requests: dict[str, Request], kv: KVCacheManager,
               num_microbatches: int = 1) -> InFlightBatch:
        """Send a scheduled batch (cut into micro-batches) to the workers; do not wait."""
        units: list[Unit] = []
        described: list[PipelineUnit] = []
        batch_id = next(self._batch_ids)
        for j, group in enumerate(split_microbatches(output.scheduled, num_microbatches)):
            copies = [(c.src_block, c.dst_block) for c in output.copies] if j == 0 else []
            units.append(Unit(copies, batch_inputs(group, requests, kv)))
            described.append(PipelineUnit(j, batch_id, j, sum(s.num_new_tokens for s in group),
                                          tuple(s.request_id for s in group)))
        t0 = clock_ns()
        self.executor.submit(RunStep(batch_id, t0, units))
        return InFlightBatch(batch_id, output, tuple(described), t0)

    def collect(self, batch: InFlightBatch) -> torch.Tensor:
        """Wait for a submitted batch -> its logits; ``timeline`` becomes its PipelineTimeline."""
        results = self.executor.receive(batch.batch_id)
        now = clock_ns()
        logits = [torch.from_numpy(x) for r in results for x in r.logits]
        t = self.layout.tensor_parallel_size
        events = tuple(WorkEvent(r.rank, r.rank // t, r.rank % t, unit, kind, max(0.0, a), max(0.0, e))  # type: ignore[arg-type]
                       for r in results for unit, kind, a, e in r.events)
        self.timeline = PipelineTimeline(self.layout.schedule, self.layout.pipeline_parallel_size, t,
                                         self.layout.num_microbatches, batch.units, events,
                                         (now - batch.t0_ns) / 1e6, (batch.t0_ns - self._epoch_ns) / 1e6)
        return torch.cat(logits) if logits else torch.empty(0, self.model_config.vocab_size)

    def retain(self, in_flight: Iterable[InFlightBatch]) -> None:
        """After a step commits: keep only the results of batches still in flight."""
        self.executor.forget(b.batch_id for b in in_flight)

    def shutdown(self) -> None:
        self.executor.shutdown()

    def check_integrity(self) -> None:
        self.executor.check_integrity()


def split_microbatches(scheduled: Sequence[ScheduledRequest], m: int) -> list[list[ScheduledRequest]]:
    """Cut the scheduled requests, in order, into min(m, len) contiguous groups of about equal
    tokens (cut j goes where the running token count first reaches j/k of the total), each
    non-empty. A request is never split: its chunk stays in one micro-batch."""
    k = min(m, len(scheduled))
    if k <= 1:
        return [list(scheduled)] if scheduled else []
    total = sum(s.num_new_tokens for s in scheduled)
    groups: list[list[ScheduledRequest]] = [[]]
    seen = 0
    for i, s in enumerate(scheduled):
        left_items, left_groups = len(scheduled) - i, k - len(groups)
        if groups[-1] and (left_items == left_groups or (left_groups > 0 and seen >= total * len(groups) / k)):
            groups.append([])
        groups[-1].append(s)
        seen += s.num_new_tokens
    return groups
