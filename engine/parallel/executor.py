"""Pipeline and tensor parallelism on real processes: the driver's side.

``ParallelExecutor`` starts p x t worker processes that join one torch.distributed gloo group
on 127.0.0.1 (engine/parallel/worker.py), sends them each step, collects the logits and every worker's
timed events, and stops them. ``ParallelRunner`` is the model runner an ``LLMEngine`` uses when
p x t > 1: it turns the scheduler's batches into units (micro-batches for "gpipe", whole batches
for "batch_queue") and the workers' events into the step's ``PipelineTimeline``.

Processes: each worker is a fresh interpreter (``engine.parallel.worker.WORKER_PRELUDE``) started by one
long-lived daemon thread of the driver (``_Spawner``), because the kernel's parent-death signal
the worker asks for fires when the thread that spawned it ends (Streamlit steps engines from
short-lived script threads). Its pipe is a socket pair the driver never blocks on (``_Channel``).

Failure rule: a worker that dies, reports an error, or does not answer within
``worker_timeout_s`` makes the step raise ``WorkerError`` naming it -- rank, stage, tp rank, pid
and what the OS says happened to it (killed by a signal, exit code, stopped, or running but
silent); only the culprits are named, found by inspecting the processes, not by which pipe broke
first. Every worker is then killed (its peers may be blocked on it) and the executor refuses
further steps, so the engine must be restarted. Workers end on ``shutdown()``, on garbage
collection (``weakref.finalize``), at interpreter exit, and by themselves when the driver
process disappears.

Interrupts: a Ctrl-C (KeyboardInterrupt) is held for the few microseconds in which a pipe's
bytes and the executor's record of them change together (``_DeferInterrupt``), so it never
leaves a pipe off a message boundary: a batch is queued for every worker or for none, and what
is not yet written (or read) when the interrupt lands is written (read) by the next call. An
interrupted step therefore rolls back and the workers go on.
"""
from __future__ import annotations

import itertools
import os
import pickle
import queue
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from types import FrameType, TracebackType
from typing import Any, NoReturn

import torch

from engine.core.batch import BatchStage, SingleBatch
from engine.core.config import EngineConfig
from engine.core.kv_cache import KVCacheManager
from engine.model.forward_batch import decode_group_overhead
from engine.model.runner import batch_inputs, kv_cache_bytes_per_token
from engine.model.llama import LlamaModel, Observer
from engine.parallel.batch_queue import BatchQueue, InFlightBatch
from engine.parallel.layout import build_layout
from engine.core.request import Request
from engine.core.scheduler import ScheduledRequest, SchedulerOutput
from engine.core.trace import ParallelLayout, PipelineTimeline, PipelineUnit, WorkEvent
from engine.parallel.worker import WORKER_PRELUDE, Failed, Ready, RunStep, StepDone, Unit, WorkerSpec, clock_ns

START_TIMEOUT_S = 120.0  # spawn + import torch + load the model, per worker, on a busy 2-core machine
STOP_GRACE_S = 3.0
POLL_S = 0.1  # how often a waiting driver looks at its workers' processes
DYING_GRACE_S = 0.5  # a worker whose pipe closed is given this long to be reapable (it is exiting)
CHUNK = 1 << 20  # bytes read from a pipe at once

Progress = Callable[[str], None]
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class WorkerError(RuntimeError):
    """A worker died, failed or hung; the executor has stopped every worker."""


class _DeferInterrupt:
    """Within the block a SIGINT (Ctrl-C) is held and raised again at its end, so the block's
    few statements happen all or none. Python runs signal handlers in the main thread only, so
    elsewhere a KeyboardInterrupt cannot land and there is nothing to hold."""

    def __init__(self) -> None:
        self._previous: Any = None
        self._caught = False

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._caught = True

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not None:  # None: a handler not set from Python, left alone
                signal.signal(signal.SIGINT, self._hold)
                self._previous, self._caught = previous, False

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
            if self._caught:
                signal.raise_signal(signal.SIGINT)  # delivered now, to the handler it was meant for


def _encode(message: object) -> bytes:
    """One message as multiprocessing.Connection frames it (the worker reads it with
    Connection.recv): its length, then its pickle."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    n = len(payload)
    header = struct.pack("!i", n) if n < 0x7FFFFFFF else struct.pack("!i", -1) + struct.pack("!Q", n)
    return header + payload


class _Channel:
    """The driver's end of one worker's socket pair, never blocking: ``send`` queues a whole
    message, ``write`` and ``read`` move what the socket takes or has now. Every change to the
    socket and to this record of it happens with interrupts held (``_DeferInterrupt``), so the
    stream is always at a message boundary as far as the worker is concerned: a message queued
    is written in full by later calls, one half read is completed by them."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.outgoing = bytearray()
        self.incoming = bytearray()
        self.inbox: deque[object] = deque()  # whole messages read, oldest first
        self.closed = False  # the worker's end is gone (EOF or a broken pipe)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: object) -> None:
        payload = _encode(message)
        with _DeferInterrupt():
            self.outgoing += payload
        self.write()

    def write(self) -> None:
        while self.outgoing and not self.closed:
            with _DeferInterrupt():
                try:
                    n = self.sock.send(self.outgoing)
                except BlockingIOError:
                    return
                except OSError:
                    self.closed = True
                    return
                del self.outgoing[:n]

    def read(self) -> None:
        """Read what the socket holds; whole messages go to ``inbox``."""
        while not self.closed:
            with _DeferInterrupt():
                try:
                    data = self.sock.recv(CHUNK)
                except BlockingIOError:
                    return
                except OSError:
                    data = b""
                if not data:
                    self.closed = True
                    return
                self.incoming += data
                self._unframe()

    def _unframe(self) -> None:
        while len(self.incoming) >= 4:
            (n,), header = struct.unpack("!i", self.incoming[:4]), 4
            if n == -1:
                if len(self.incoming) < 12:
                    return
                (n,), header = struct.unpack("!Q", self.incoming[4:12]), 12
            if len(self.incoming) < header + n:
                return
            self.inbox.append(pickle.loads(self.incoming[header:header + n]))
            del self.incoming[:header + n]

    def close(self) -> None:
        self.closed = True
        self.sock.close()


class WorkerProcess:
    """One worker's OS process (a ``subprocess.Popen`` the driver reaps)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        """None while running; -N when signal N ended it (subprocess's convention)."""
        return self.popen.poll()

    def state(self) -> str:
        """The process's state letter in /proc/<pid>/stat (R, S, D, T, t, Z...), "" if gone."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                text = f.read()
        except OSError:
            return ""
        return text[text.rindex(")") + 2:].split()[0]

    def fate(self) -> str | None:
        """What the OS says went wrong with it, or None while it runs (or sleeps) normally."""
        code = self.popen.poll()
        if code is not None:
            if code < 0:
                try:
                    name = signal.Signals(-code).name
                except ValueError:
                    name = "unknown"
                return f"was killed by signal {-code} ({name})"
            return f"exited with code {code}"
        state = self.state()
        if state in ("T", "t"):
            return f"is stopped (state {state} in /proc/{self.pid}/stat: SIGSTOP or a debugger), so it cannot answer"
        return None

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.kill()
            except ProcessLookupError:
                pass

    def reap(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for it to end (and reap it); -> it has ended."""
        try:
            self.popen.wait(max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return False
        return True


class _Spawner:
    """Starts worker processes from one daemon thread that lives as long as the driver process:
    the parent-death signal a worker asks for fires when the *thread* that forked it ends, and
    engines are built from threads that end (Streamlit's script threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Future[WorkerProcess], list[str], int]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = -1

    def spawn(self, args: list[str], fd: int) -> WorkerProcess:
        """Start ``args`` with the file descriptor ``fd`` passed on; interrupts are held until it
        has started (so a started worker is never lost)."""
        with self._lock:
            if self._thread is None or self._pid != os.getpid():  # (a forked driver has no such thread)
                self._thread = threading.Thread(target=self._serve, name="inferscope-spawner", daemon=True)
                self._pid = os.getpid()
                self._thread.start()
        future: Future[WorkerProcess] = Future()
        with _DeferInterrupt():
            self._queue.put((future, args, fd))
            return future.result()

    def _serve(self) -> None:
        while True:
            future, args, fd = self._queue.get()
            try:
                future.set_result(WorkerProcess(subprocess.Popen(args, pass_fds=(fd,), stdin=subprocess.DEVNULL)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                future.set_exception(e)


_spawner = _Spawner()


class ParallelExecutor:
    """p x t worker processes and the pipes to them (rank = stage * t + tp_rank)."""

    def __init__(self, model: str, config: EngineConfig, layout: ParallelLayout,
                 progress: Progress | None = None) -> None:
        import torch.distributed as dist

        self.layout = layout
        self.timeout_s = config.parallel_config.worker_timeout_s
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
        # (the ignore: torch.distributed re-exports TCPStore from torch._C without listing it)
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
        threads = max(1, (os.cpu_count() or 1) // n)
        self.processes: list[WorkerProcess] = []
        self.channels: list[_Channel] = []
        # Registered before the first spawn: whatever has started is stopped on any failure.
        self._finalizer = weakref.finalize(self, _stop, self.processes, self.channels, STOP_GRACE_S)
        self.pids: tuple[int, ...] = ()
        say(f"starting {n} worker processes (p = {layout.pipeline_parallel_size}, "
            f"t = {layout.tensor_parallel_size})")
        try:
            for rank in range(n):
                ours, theirs = socket.socketpair()
                try:
                    self.channels.append(_Channel(ours))
                    self.processes.append(_spawner.spawn(
                        [sys.executable, "-S", "-c", WORKER_PRELUDE, str(os.getpid()), str(theirs.fileno()),
                         _PROJECT_ROOT, f"inferscope-worker-{rank}"], theirs.fileno()))
                finally:
                    theirs.close()
                self.channels[rank].send(WorkerSpec(rank, model, config, layout, self._store.port, threads))
            self._collect(START_TIMEOUT_S + self.timeout_s, "start-up",
                          on_each=lambda k: say(f"worker {k} of {n} ready"))
        except BaseException:
            self.error = self.error or "start-up did not finish"
            self.shutdown()
            raise
        self.pids = tuple(p.pid for p in self.processes)

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
        """Queue one batch for every worker (it queues behind earlier ones in their pipes) and
        write what the pipes take now, without waiting: the rest goes out while the driver waits
        in ``receive``. The batch is queued for all workers or, on an interrupt, for none."""
        if not self.alive:
            raise WorkerError(f"the worker processes were stopped ({self.error or 'shut down'}); "
                              f"restart the engine")
        payload = _encode(step)
        with _DeferInterrupt():
            for channel in self.channels:
                channel.outgoing += payload
            self._outstanding.append(step.batch_id)
        for channel in self.channels:
            channel.write()
        if any(channel.closed for channel in self.channels):
            self._blame("a step", closed=[r for r, c in enumerate(self.channels) if c.closed])

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
        return [r for r in (done[k] for k in range(len(self.channels))) if isinstance(r, StepDone)]

    def forget(self, keep: Iterable[int]) -> None:
        """Drop the results of every fully read batch not in ``keep`` (those a step has taken, and
        those of rolled-back steps)."""
        kept = set(keep) | set(self._outstanding)
        for batch_id in [b for b in self._results if b not in kept]:
            del self._results[batch_id]

    def _collect(self, timeout_s: float, what: str, results: dict[int, object] | None = None,
                 on_each: Callable[[int], None] | None = None) -> list[object]:
        """The next message from every worker not yet in ``results`` (stored there as it is
        taken), writing what is queued for the workers meanwhile. Fails (``_blame``) when a
        worker reports an error or its pipe closes, when one is seen stopped for
        ``worker_timeout_s`` (start-up's deadline is longer), or at the deadline ``timeout_s``
        from now; -> the messages by rank."""
        results = {} if results is None else results
        now = clock_ns()
        deadline = now + int(timeout_s * 1e9)
        stopped_since: dict[int, int] = {}
        n = len(self.channels)
        while True:
            for r in range(n):
                channel = self.channels[r]
                if r not in results and channel.inbox:
                    with _DeferInterrupt():
                        message = results[r] = channel.inbox.popleft()
                    if isinstance(message, Failed):
                        self._blame(what, failed={r: message.message})
                    if on_each is not None:
                        on_each(len(results))
            if len(results) == n:
                return [results[r] for r in range(n)]
            closed = [r for r in range(n) if self.channels[r].closed]
            if closed:
                self._blame(what, closed=closed)
            now = clock_ns()
            waiting = [r for r in range(n) if r not in results]
            for r in waiting:
                if self.processes[r].state() in ("T", "t"):
                    stopped_since.setdefault(r, now)
                else:
                    stopped_since.pop(r, None)
            if now >= deadline:
                self._blame(what, late=waiting, timeout_s=timeout_s)
            if any(now - t >= self.timeout_s * 1e9 for t in stopped_since.values()):
                self._blame(what, late=waiting, timeout_s=self.timeout_s)
            self._wait(min(POLL_S, (deadline - now) / 1e9))

    def _wait(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for any pipe to have something to read or room for what is
        queued, and move those bytes."""
        poller = select.poll()
        for channel in self.channels:
            if not channel.closed:
                poller.register(channel.fileno(), select.POLLIN | (select.POLLOUT if channel.outgoing else 0))
        by_fd = {c.fileno(): c for c in self.channels if not c.closed}
        for fd, _ in poller.poll(max(0, int(timeout_s * 1000))):
            by_fd[fd].read()
            by_fd[fd].write()

    def _blame(self, what: str, failed: dict[int, str] | None = None, closed: Sequence[int] = (),
               late: Sequence[int] = (), timeout_s: float = 0.0) -> NoReturn:
        """Fail naming the culprits, which the OS tells: workers that are dead (by signal or exit
        code) or stopped, except those that reported an error themselves (a peer's death shows
        first as its neighbours' communication errors). Only without such a culprit is the worker
        whose error failed the step named (else those whose errors are on their way, else the workers that
        closed their pipe, else those that did not answer: running but silent). A worker whose
        pipe closed, or whose peer reported an error, is given DYING_GRACE_S to become reapable."""
        failed = failed or {}
        reported = dict(failed)
        grace_end = clock_ns() + int(DYING_GRACE_S * 1e9)
        while True:
            # The OS first, then the pipes: a worker seen ended has sent whatever error it
            # reported before, so it is read now (and that worker counts as reported, not dead).
            fates = {r: f for r, process in enumerate(self.processes) if (f := process.fate()) is not None}
            for r, channel in enumerate(self.channels):
                channel.read()
                for m in channel.inbox:
                    if isinstance(m, Failed):
                        reported.setdefault(r, m.message)
            fates = {r: f for r, f in fates.items() if r not in reported}
            if fates or not (closed or reported) or clock_ns() >= grace_end:
                break
            time.sleep(0.02)  # a killed worker's pipe closes a moment before it can be reaped
        if fates:
            reason = "; ".join(f"{self._describe(r)} {fate}" for r, fate in fates.items())
        elif failed or reported:  # the error that made the step fail; else those on their way
            reason = "; ".join(f"{self._describe(r)} failed: {m}" for r, m in (failed or reported).items())
        elif closed:
            reason = "; ".join(f"{self._describe(r)} closed its pipe" for r in closed)
        else:
            reason = ", ".join(self._describe(r) for r in late) + " running but silent (hung?)"
        if late and not reported and not closed:
            reason += f"; did not answer within {timeout_s:g} s"
        self._fail(f"{reason} (during {what})")

    def _describe(self, rank: int) -> str:
        stage, tp = divmod(rank, self.layout.tensor_parallel_size)
        return f"worker {rank} (stage {stage}, tp rank {tp}, pid {self.processes[rank].pid})"

    def _fail(self, reason: str) -> NoReturn:
        self.error = reason
        _stop(self.processes, self.channels, 0.0)  # the group is broken: no grace
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


def _stop(processes: list[WorkerProcess], channels: list[_Channel], grace_s: float) -> None:
    """Ask each worker to stop and give them ``grace_s`` together (reading and dropping what
    they still send), then terminate, then kill what is left, and reap them all. A stopped (hung) worker ignores the first two, so it is
    killed at once; SIGKILL always works."""
    if grace_s > 0:
        for channel in channels:
            channel.send(None)
        deadline = clock_ns() + int(grace_s * 1e9)
        for process in processes:
            while not process.reap(min(POLL_S, (deadline - clock_ns()) / 1e9)) and clock_ns() < deadline:
                if process.state() in ("T", "t"):
                    break
                for channel in channels:  # a worker still answering must not block on a full pipe
                    channel.read()
                    channel.inbox.clear()
        for process in processes:
            if process.is_alive() and process.state() not in ("T", "t"):
                process.popen.terminate()
                process.reap(0.5)
    for process in processes:
        process.kill()
    for process in processes:
        process.reap(STOP_GRACE_S)
    for channel in channels:
        channel.close()


class ParallelRunner:
    """The engine's model runner over worker processes (same ``forward`` as ModelRunner)."""

    def __init__(self, model_name: str, model: LlamaModel, config: EngineConfig,
                 progress: Progress | None = None) -> None:
        c = model.config
        self.config = config
        self.model_config = c
        self.layout = build_layout(c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                                   c.intermediate_size, config.parallel_config.pipeline_parallel_size,
                                   config.parallel_config.tensor_parallel_size, config.parallel_config.pipeline_schedule,
                                   config.parallel_config.num_microbatches, config.parallel_config.pipeline_layer_split)
        self.kv_cache_dtype = config.kv_cache_dtype
        self.model: LlamaModel | None = None  # the layers run in the workers, none here
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
        return self.kv_cache_bytes_per_token * self.config.cache_config.pool_tokens

    @property
    def max_batches(self) -> int:
        """Batches in flight at once: p for "batch_queue", else one per step."""
        return self.layout.pipeline_parallel_size if self.layout.schedule == "batch_queue" else 1

    def batch_stage(self) -> BatchStage:
        """How steps feed the workers: the batch queue for "batch_queue" (p batches in flight), else
        one batch per step; either way the workers drop stale results when a step commits."""
        if self.max_batches > 1:
            return BatchQueue(self)
        return SingleBatch(self.forward, lambda: self.retain(()))

    def set_observer(self, observer: Observer | None) -> None:
        raise ValueError("activations: this run's model is split over worker processes (pipeline/tensor "
                         "parallel); activation statistics need the single-process engine "
                         "(pipeline_parallel_size = tensor_parallel_size = 1)")

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
            units.append(Unit(copies, batch_inputs(group, requests, kv,
                                                    decode_group_overhead(self.config.decode_grouping))))
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
