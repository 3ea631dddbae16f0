"""Issue #11, must show 2: worker processes never outlive their engine. After ``shutdown()``,
leaving ``with LLM(...)``, garbage collection, a failing worker, a killed worker, a hung worker
and a killed driver, the OS (``/proc``) shows no worker left, and a failure surfaced as a
``WorkerError`` naming the worker within ``worker_timeout_s``. The engine's requests survive a
failed step intact (the step rolls back).

Timing is asserted only as generous "within the timeout" bounds.
"""
from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from engine import LLM, LLMEngine, SamplingParams
from engine.parallel.executor import STOP_GRACE_S, WorkerError
from engine.model.runner import BatchInputs
from engine.parallel.worker import RunStep, Unit, clock_ns
from tests.parity import PROMPTS, assert_matches_hf, run_engine
from tests.test_robustness import engine_state

TIMEOUT_S = 3.0  # worker_timeout_s for the failure cases
# the deadline, the stop (ask, terminate, kill: 2 x STOP_GRACE_S + 0.5 s at worst), and slack for
# a busy 2-core machine
BOUND_S = TIMEOUT_S + 2 * STOP_GRACE_S + 10.0
GREEDY = SamplingParams(temperature=0, max_tokens=8)


# -- what the OS says ------------------------------------------------------------------------

def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process from /proc, None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return fields[0], int(fields[1])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def children(parent: int | None = None) -> set[int]:
    """Processes (zombies included: an unreaped child counts) whose parent is ``parent``,
    except multiprocessing's resource tracker (one per interpreter, not a worker)."""
    parent = os.getpid() if parent is None else parent
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st[1] == parent and "resource_tracker" not in _cmdline(int(name)):
                out.add(int(name))
    return out


def _pause(pid: int) -> None:
    """SIGSTOP a process and wait until the OS shows it stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5.0
    while (_stat(pid) or ("?",))[0] != "T":
        assert time.monotonic() < deadline, f"process {pid} did not stop: {_stat(pid)}"
        time.sleep(0.005)


@contextlib.contextmanager
def _ctrl_c_after(delay_s: float) -> Iterator[None]:
    """A real Ctrl-C (SIGINT to this process) ``delay_s`` into the block unless it has ended by
    then: a call that did not wait fails its test, not the whole pytest session."""
    ended = threading.Event()

    def interrupt() -> None:
        if not ended.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(delay_s, interrupt)
    timer.start()
    try:
        yield
    finally:
        ended.set()
        timer.cancel()
        timer.join()


def exists(pid: int) -> bool:
    """The process exists, zombies included (a zombie is a child nobody reaped)."""
    return _stat(pid) is not None


def assert_no_workers(pids: tuple[int, ...], before: set[int]) -> None:
    assert pids, "no worker pids recorded"
    alive = [p for p in pids if exists(p)]
    assert not alive, f"worker processes still exist: {alive} ({[_stat(p) for p in alive]})"
    extra = children() - before
    assert not extra, f"child processes remain: {extra} {[_cmdline(p) for p in extra]}"


@pytest.fixture
def baseline() -> Iterator[set[int]]:
    """The test process's children before the test (none is expected; they are not ours)."""
    before = children()
    yield before
    gc.collect()
    assert children() - before == set(), "a test left child processes behind"


def new_engine(**knobs: object) -> LLMEngine:
    return LLMEngine("tiny-random", **{"pipeline_parallel_size": 2, "block_size": 4, **knobs})


# -- ending normally -------------------------------------------------------------------------

def test_shutdown_ends_every_worker_and_later_steps_ask_for_a_restart(baseline: set[int]) -> None:
    engine = new_engine()
    pids = engine.runner.executor.pids
    assert len(pids) == 2 and all(exists(p) for p in pids)
    assert set(pids) <= children()
    engine.add_request(PROMPTS[0], GREEDY)
    engine.step()
    engine.check_integrity()
    engine.shutdown()
    assert_no_workers(pids, baseline)
    engine.shutdown()  # idempotent
    before = engine_state(engine)
    with pytest.raises(WorkerError, match="restart"):
        engine.step()
    assert engine_state(engine) == before  # the failed step rolled back
    engine.check_integrity()


def test_leaving_with_llm_ends_every_worker(baseline: set[int]) -> None:
    with LLM("tiny-random", pipeline_parallel_size=2) as llm:
        pids = llm.llm_engine.runner.executor.pids
        assert len(pids) == 2
        out = llm.generate(PROMPTS[:2], GREEDY)
        assert_matches_hf("tiny-random", PROMPTS[:2], [o.outputs[0].token_ids for o in out], 8)
    assert_no_workers(pids, baseline)


def test_dropping_the_last_reference_ends_every_worker(baseline: set[int]) -> None:
    """An ``LLM`` or a bare ``LLMEngine`` ends its workers as soon as its last reference goes,
    with no garbage collection (the engine is in no reference cycle; its executor's
    weakref.finalize stops them) -- also with a batch still in flight."""
    gc.disable()
    try:
        llm = LLM("tiny-random", pipeline_parallel_size=2)
        pids = llm.llm_engine.runner.executor.pids
        llm.generate(PROMPTS[:1], GREEDY)
        del llm
        assert_no_workers(pids, baseline)
        engine = new_engine(pipeline_schedule="batch_queue")
        pids = engine.runner.executor.pids
        for prompt in PROMPTS[:3]:
            engine.add_request(prompt, GREEDY)
        engine.step()
        assert engine.batches.in_flight
        del engine
        assert_no_workers(pids, baseline)
    finally:
        gc.enable()


def _pending_engine(**knobs: object) -> tuple[LLMEngine, tuple[int, ...]]:
    engine = new_engine(**{"worker_timeout_s": TIMEOUT_S, **knobs})
    for prompt in PROMPTS[:3]:
        engine.add_request(prompt, GREEDY)
    engine.step()
    engine.check_integrity()
    return engine, engine.runner.executor.pids


def _failing_step(engine: LLMEngine, match: str) -> WorkerError:
    """The next step raises WorkerError within the bound and rolls back."""
    before = engine_state(engine)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=match) as info:
        engine.step()
    assert time.monotonic() - t0 < BOUND_S
    assert "restart" in str(info.value)
    assert engine_state(engine) == before
    engine.check_integrity()  # every worker is dead and every request where it was
    with pytest.raises(WorkerError, match="restart"):
        engine.step()
    return info.value


def test_an_error_inside_a_worker_raises_worker_error_naming_it(baseline: set[int]) -> None:
    engine, pids = _pending_engine()
    executor = engine.runner.executor
    # A real fault in the worker: a KV slot far beyond the worker's cache (index out of range).
    bad = Unit([], BatchInputs([[1, 2, 3]], [0], [[10**7, 10**7 + 1, 10**7 + 2]], [1]))
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=rf"worker 0 \(stage 0, tp rank 0, pid {pids[0]}\) failed") as info:
        executor.run(RunStep(10**6, clock_ns(), [bad]))
    assert time.monotonic() - t0 < BOUND_S
    assert "Error" in str(info.value)  # the worker's exception travels with it
    assert_no_workers(pids, baseline)
    assert not executor.alive
    _failing_step(engine, "restart")


def test_a_killed_worker_makes_the_next_step_raise(baseline: set[int]) -> None:
    engine, pids = _pending_engine()
    os.kill(pids[1], signal.SIGKILL)
    _failing_step(engine, rf"worker 1 \(stage 1, tp rank 0, pid {pids[1]}\)")
    assert_no_workers(pids, baseline)


def test_a_hung_worker_makes_the_next_step_raise_within_the_timeout(baseline: set[int]) -> None:
    engine, pids = _pending_engine()
    _pause(pids[1])
    try:
        error = _failing_step(engine, rf"did not answer within {TIMEOUT_S:g} s")
        assert f"pid {pids[1]}" in str(error)
        assert_no_workers(pids, baseline)
    finally:
        if exists(pids[1]):
            os.kill(pids[1], signal.SIGCONT)


@pytest.mark.parametrize("schedule", ["gpipe", "batch_queue"])
def test_an_interrupt_in_the_driver_mid_step_rolls_back_and_the_workers_keep_working(
        baseline: set[int], schedule: str) -> None:
    """A real Ctrl-C (SIGINT) reaching the driver while it waits for the workers: the step
    rolls back, the workers are left running, and the next steps are exact. The last stage is
    paused (SIGSTOP) so that the interrupt lands while the step is in flight, then resumed.
    With the batch queue a batch from the step before is in flight and the interrupted step
    has sent another: the retry takes the first one's results, the other's are dropped."""
    prompts = PROMPTS[:3]
    engine, pids = _pending_engine(worker_timeout_s=60.0, pipeline_schedule=schedule)
    try:
        if schedule == "batch_queue":
            # The batch in flight now may be finished already (tiny-random takes milliseconds),
            # and then the step would not wait. So: read its results (the executor keeps them),
            # pause the last stage, and let one step retire it and send the next, which the
            # paused stage cannot finish: the interrupted step must wait for that one.
            engine.runner.executor.receive(engine.batches.in_flight[0].batch_id)
            _pause(pids[1])
            engine.step()
            engine.check_integrity()
            assert engine.batches.in_flight, "nothing in flight before the interrupted step"
        else:
            _pause(pids[1])
        before = engine_state(engine)
        try:
            with pytest.raises(KeyboardInterrupt), _ctrl_c_after(0.5):
                engine.step()
        finally:
            os.kill(pids[1], signal.SIGCONT)
        assert engine_state(engine) == before
        engine.check_integrity()
        assert engine.runner.executor.alive and all(exists(p) for p in pids)
        ids = list(engine.requests)
        while engine.has_unfinished_requests():
            engine.step()
            engine.check_integrity()
        outputs = [engine.get_output(i).outputs[0].token_ids for i in ids]
        assert_matches_hf("tiny-random", prompts, outputs, 8)
        # and a fresh request afterwards, too
        more, _ = run_engine(engine, PROMPTS[3:5], 8)
        assert_matches_hf("tiny-random", PROMPTS[3:5], more, 8)
    finally:
        engine.shutdown()
    assert_no_workers(pids, baseline)



def test_an_interrupt_part_way_through_a_workers_answer_leaves_the_workers_working(baseline: set[int]) -> None:
    """Ctrl-C while the driver reads an answer the worker has only half sent: what was read is
    kept (the driver's record of a pipe changes with its bytes, interrupts held), so the retry
    reads the rest and the workers go on; the engine's next steps are exact."""
    engine, pids = _pending_engine(worker_timeout_s=60.0)
    executor = engine.runner.executor
    # Logits of 4 x 2000 rows x 320 float32 = 10 MB, far over a socket's send buffer (Linux's
    # default is 208 KiB): the last stage blocks part-way through its answer.
    # Every row writes the pool's last slot, which no request holds.
    rows, last = 2000, engine.config.cache_config.num_blocks * engine.config.cache_config.block_size - 1
    big = Unit([], BatchInputs([[1]] * rows, [0] * rows, [[last]] * rows, [1] * rows))
    try:
        executor.submit(RunStep(10**6, clock_ns(), [big] * 4))
        readable, _, _ = select.select([executor.channels[1].fileno()], [], [], 30)
        assert readable, "the last stage did not begin its answer"
        time.sleep(0.2)  # it fills the socket and blocks part-way through the message
        _pause(pids[1])
        try:
            with pytest.raises(KeyboardInterrupt), _ctrl_c_after(0.5):
                executor.receive(10**6)
            assert executor.channels[1].incoming, "nothing of the answer was read before the Ctrl-C"
        finally:
            os.kill(pids[1], signal.SIGCONT)
        assert executor.alive and all(exists(p) for p in pids)
        results = executor.receive(10**6)
        assert [len(r.logits) for r in results] == [0, 4] and results[1].logits[0].shape[0] == rows
        executor.forget(keep=())
        ids = list(engine.requests)
        while engine.has_unfinished_requests():
            engine.step()
            engine.check_integrity()
        outputs = [engine.get_output(i).outputs[0].token_ids for i in ids]
        assert_matches_hf("tiny-random", PROMPTS[:3], outputs, 8)
    finally:
        engine.shutdown()
    assert_no_workers(pids, baseline)


DRIVER = textwrap.dedent("""
    import sys, time
    from engine import LLM

    if __name__ == "__main__":
        llm = LLM("tiny-random", pipeline_parallel_size=2)
        print(" ".join(map(str, llm.llm_engine.runner.executor.pids)), flush=True)
        time.sleep(600)
""")


def test_workers_exit_when_their_driver_is_killed(tmp_path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert driver.stdout is not None
        line = driver.stdout.readline()
        pids = tuple(int(p) for p in line.split())
        assert len(pids) == 2, f"driver printed {line!r}"
        assert children(driver.pid) >= set(pids)
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 15.0  # the watchdog polls every 0.5 s
        def running() -> list[tuple[int, tuple[str, int] | None]]:
            # Orphans are re-parented (to init or a subreaper), which reaps them -- or, in a
            # container whose init does not, leaves a zombie: exited either way.
            return [(p, st) for p in pids if (st := _stat(p)) is not None and st[0] != "Z"]
        while time.monotonic() < deadline and running():
            time.sleep(0.1)
        left = running()
        assert not left, f"workers outlived their killed driver: {left}"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
