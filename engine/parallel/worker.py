"""One worker process: a pipeline stage x tensor-parallel rank of the model, its KV cache, and
the loop that runs the driver's steps (engine/parallel/executor.py starts and stops it).

A batch (one step's micro-batches for "gpipe", one in-flight batch for "batch_queue") is a list
of units that every worker gets in the same order; batches queue in each worker's pipe, so stage
0 starts the next batch while later stages still run the last one.
Rank (stage s, tp r) runs, for each unit:

    s == 0:  embed --------------------> layers [a, b) --> isend to (s + 1, r)
    s > 0:   recv from (s - 1, r) -----> layers [a, b) --> isend to (s + 1, r), or on the last
                                                           stage: final norm + LM head (tp 0 only)

so stage 0 starts unit 1 while stage 1 still runs unit 0: the pipeline fills, then drains.
With t > 1 every layer all-reduces twice within its stage's group. Every piece of work is
timestamped on CLOCK_MONOTONIC, the clock every process on the machine shares with the driver.

The worker exits when the driver says stop, when its pipe closes, after any error (reported
first: its peers may be blocked on it, so the driver stops them all), and when its driver
disappears: the process is started by ``WORKER_PRELUDE``, whose first statement asks the kernel
for SIGKILL when the driver's thread that spawned it ends (``prctl(PR_SET_PDEATHSIG)``; SIGKILL
ends even a stopped process, which no thread of its own could), and a watchdog thread polls the
parent's pid as well. It ignores SIGINT: a Ctrl-C in the terminal is the driver's to handle.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import NamedTuple

import torch
import torch.distributed as dist

from engine.core.config import EngineConfig
from engine.model.forward_batch import build_forward_batch
from engine.model.attention import attention_backend
from engine.model.runner import BatchInputs, ModelRunner
from engine.model.shared import clear_shared_models, shared_model_for
from engine.parallel.shard import shard_model
from engine.core.trace import ParallelLayout, WorkKind

PARENT_POLL_S = 0.5
# The worker process's program: ``python -S -c WORKER_PRELUDE <driver pid> <pipe fd> <root> <name>``.
# Before anything else (even ``site``), the parent-death signal: with it the kernel ends the
# worker when the driver's spawning thread ends, however the driver ends and even while the
# worker is stopped; then the race where the driver died before that line. No multiprocessing
# machinery (and so no resource tracker process) is involved.
WORKER_PRELUDE = """\
import ctypes, os, signal, sys
if sys.platform == "linux":
    ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
if os.getppid() != int(sys.argv[1]):
    os._exit(3)
signal.signal(signal.SIGINT, signal.SIG_IGN)
import site
site.main()
sys.path.insert(0, sys.argv[3])
from engine.parallel.worker import serve
serve(int(sys.argv[2]), int(sys.argv[1]))
"""
# gloo gives up on a silent peer after this many worker_timeout_s: later than the driver's
# deadline, so that the driver, not a peer's timeout, reports a hung worker (and names it).
COMM_TIMEOUT_FACTOR = 2


def clock_ns() -> int:
    """The clock the driver and every worker read: system-wide, monotonic."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build its shard (sent once, at spawn)."""

    rank: int
    model: str
    config: EngineConfig
    layout: ParallelLayout
    store_port: int
    num_threads: int


class Unit(NamedTuple):
    """One micro-batch / batch: the copy-on-write block copies to make before it, and its
    inputs as plain lists."""

    copies: list[tuple[int, int]]
    inputs: BatchInputs


class RunStep(NamedTuple):
    batch_id: int  # the driver's number for this batch (echoed in StepDone)
    t0_ns: int  # the driver's clock when it sent the batch; events are timed from it
    units: list[Unit]


class Ready(NamedTuple):
    rank: int
    pid: int


class StepDone(NamedTuple):
    batch_id: int
    rank: int
    logits: list[object]  # numpy [S_u, V] float32 per unit (last stage, tp 0), else []
    events: list[tuple[int, str, float, float]]  # (unit, kind, start_ms, end_ms)


class Failed(NamedTuple):
    rank: int
    message: str


def serve(fd: int, parent_pid: int) -> None:
    """The process's entry point (after WORKER_PRELUDE): read the spec from the pipe ``fd``,
    run ``worker_main``, and leave with ``os._exit`` as multiprocessing's children do: the
    interpreter's own teardown of torch and gloo takes seconds, and nothing is left to save."""
    os.set_inheritable(fd, False)
    _watch_parent(parent_pid)
    conn = Connection(fd)
    code = 0
    try:
        worker_main(conn.recv(), conn)
    except (EOFError, OSError):
        pass  # the driver went away before it sent the spec
    except BaseException:  # noqa: BLE001 - worker_main reports its own; this is the rest
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Set up, say Ready, then serve steps."""
    try:
        worker = _Worker(spec)
    except BaseException as e:  # noqa: BLE001 - reported to the driver, which raises it
        _report(conn, Failed(spec.rank, f"start-up failed: {type(e).__name__}: {e}"))
        return
    conn.send(Ready(spec.rank, os.getpid()))
    try:
        while True:
            message = conn.recv()
            if message is None:
                break
            conn.send(worker.run(message))
    except EOFError:
        pass  # the driver went away
    except BaseException as e:  # noqa: BLE001
        _report(conn, Failed(spec.rank, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))
    finally:
        worker.close()


def _report(conn: Connection, failure: Failed) -> None:
    try:
        conn.send(failure)
    except OSError:
        pass  # the driver is gone; nothing to tell


def _watch_parent(parent_pid: int) -> None:
    """Exit as soon as the driver process is gone (re-parented), even mid-collective."""
    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(PARENT_POLL_S)
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


class _Worker:
    def __init__(self, spec: WorkerSpec) -> None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo on 127.0.0.1 only
        torch.set_num_threads(spec.num_threads)
        layout, c = spec.layout, spec.config
        t = layout.tensor_parallel_size
        self.stage, self.tp_rank = divmod(spec.rank, t)
        self.rank, self.t, self.p = spec.rank, t, layout.pipeline_parallel_size
        # (the ignore: torch.distributed re-exports TCPStore from torch._C without listing it)
        store = dist.TCPStore("127.0.0.1", spec.store_port, is_master=False,  # type: ignore[attr-defined]
                              timeout=timedelta(seconds=COMM_TIMEOUT_FACTOR * c.parallel_config.worker_timeout_s))
        dist.init_process_group("gloo", store=store, rank=spec.rank, world_size=layout.num_workers,
                                timeout=timedelta(seconds=COMM_TIMEOUT_FACTOR * c.parallel_config.worker_timeout_s))
        # Every rank creates every stage's group, in the same order (torch.distributed's rule).
        groups = [dist.new_group([s * t + r for r in range(t)]) for s in range(self.p)] if t > 1 else []
        shared = shared_model_for(spec.model, c)
        stage_layout = layout.stages[self.stage]
        self.model = shard_model(shared.model, stage_layout, layout.shards[self.tp_rank], self.p, t)
        del shared
        clear_shared_models()  # the full model is no longer referenced: free it
        self.start, self.end = stage_layout.start_layer, stage_layout.end_layer
        self.hidden_size = self.model.config.hidden_size
        self.events: list[tuple[int, str, float, float]] = []
        self.unit = 0
        self.t0_ns = 0
        if t > 1:
            group = groups[self.stage]

            def all_reduce(x: torch.Tensor) -> torch.Tensor:
                a = clock_ns()
                dist.all_reduce(x, group=group)
                self._event("all_reduce", a)
                return x
            self.model.all_reduce = all_reduce
        self.attention = attention_backend(c.attention_backend)
        self.runner = ModelRunner(self.model, c.cache_config.num_blocks, c.cache_config.block_size, c.kv_cache_dtype, self.attention)

    def _event(self, kind: WorkKind, start_ns: int) -> None:
        end = clock_ns()
        self.events.append((self.unit, kind, (start_ns - self.t0_ns) / 1e6, (end - self.t0_ns) / 1e6))

    def run(self, step: RunStep) -> StepDone:
        self.events, self.t0_ns = [], step.t0_ns
        logits: list[object] = []
        sends: list[tuple[object, torch.Tensor]] = []  # (work handle, the tensor it reads)
        last = self.stage == self.p - 1
        with torch.inference_mode():
            for unit_index, unit in enumerate(step.units):
                self.unit = unit_index
                self.runner.copy_blocks(unit.copies)
                batch = build_forward_batch(*unit.inputs)
                if self.stage == 0:
                    a = clock_ns()
                    hidden = self.model.embed(batch)
                else:
                    hidden = torch.empty(len(batch.input_ids), self.hidden_size, dtype=self.model.dtype)
                    r = clock_ns()
                    dist.recv(hidden, src=self.rank - self.t)
                    self._event("recv", r)
                    a = clock_ns()
                hidden = self.model.run_layers(hidden, batch, self.runner.kv_caches, self.start, self.end,
                                               attention=self.attention)
                if last and self.tp_rank == 0:
                    logits.append(self.model.compute_logits(hidden, batch).numpy())
                self._event("forward", a)
                if not last:
                    s = clock_ns()
                    hidden = hidden.contiguous()
                    sends.append((dist.isend(hidden, dst=self.rank + self.t), hidden))
                    self._event("send", s)
        for work, _ in sends:
            work.wait()  # type: ignore[attr-defined]
        return StepDone(step.batch_id, self.rank, logits, self.events)

    def close(self) -> None:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group cannot be torn down cleanly; we exit anyway
            pass
