"""The fuzz suite's one rule book: every bad or extreme input gets its documented outcome.

Each case calls one of the ``expect_*`` functions below. They run the input under a time limit
and classify what happened:

    documented outcome        -> ok            (ValueError naming the problem, exit 2 with one
                                                line, a message on the page, or a documented
                                                acceptance such as "tiny temperature = greedy")
    any other exception       -> traceback     (TypeError, AttributeError, OSError, ...)
    ran past the time limit   -> hang
    no error where one is due -> silent acceptance

The tallies are printed at the end of the run (``tests/fuzz/conftest.py``) so the count the
issue asks for is read off the test output, not claimed.
"""
from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

T = TypeVar("T")
DEFAULT_SECONDS = 20.0


@dataclass
class Tally:
    cases: int = 0
    ok: int = 0
    tracebacks: int = 0
    hangs: int = 0
    silent: int = 0

    def line(self) -> str:
        return (f"fuzz: {self.cases} cases, {self.ok} documented outcomes, {self.tracebacks} tracebacks, "
                f"{self.hangs} hangs, {self.silent} silent acceptances")


TALLY = Tally()


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException so code under test cannot swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """SIGALRM-based limit (pytest runs tests in the main thread); interrupts Python loops."""
    def _raise(signum: int, frame: Any) -> None:
        raise CaseTimeout()

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _fail(kind: str, message: str) -> None:
    setattr(TALLY, kind, getattr(TALLY, kind) + 1)
    pytest.fail(message, pytrace=False)


def _check_message(message: str, match: str | None) -> None:
    if not message.strip():
        _fail("silent", "the error carries no message")
    if match is not None and not re.search(match, message, re.IGNORECASE):
        _fail("silent", f"the message {message!r} does not match {match!r}")


def expect_rejected(call: Callable[[], object], match: str | None = None, *,
                    exc: type[BaseException] | tuple[type[BaseException], ...] = ValueError,
                    seconds: float = DEFAULT_SECONDS) -> BaseException:
    """``call()`` must raise ``exc`` (ValueError by default) whose message matches ``match``
    (a regex, case-insensitive; name the field), within ``seconds``."""
    TALLY.cases += 1
    try:
        with time_limit(seconds):
            call()
    except CaseTimeout:
        _fail("hangs", f"no answer within {seconds} s")
    except exc as e:
        _check_message(str(e), match)
        TALLY.ok += 1
        return e
    except Exception as e:  # noqa: BLE001 - classifying is the point
        _fail("tracebacks", f"{type(e).__name__} instead of {exc}: {e}")
    _fail("silent", "accepted without an error")
    raise AssertionError("unreachable")


def expect_accepted(call: Callable[[], T], *, seconds: float = DEFAULT_SECONDS) -> T:
    """A documented acceptance (e.g. an extreme but valid value): must return within ``seconds``.
    The caller asserts on the result (e.g. "tiny temperature behaves as greedy")."""
    TALLY.cases += 1
    try:
        with time_limit(seconds):
            result = call()
    except CaseTimeout:
        _fail("hangs", f"no answer within {seconds} s")
    except Exception as e:  # noqa: BLE001
        _fail("tracebacks", f"{type(e).__name__}: {e}")
    TALLY.ok += 1
    return result


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(module: str, args: Sequence[str], seconds: float = 30.0) -> CliResult:
    """``python -m module args`` in a real process (what a user runs)."""
    try:
        p = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                           timeout=seconds)
    except subprocess.TimeoutExpired:
        TALLY.cases += 1
        _fail("hangs", f"{module} {' '.join(args)}: no answer within {seconds} s")
    return CliResult(p.returncode, p.stdout, p.stderr)


def expect_cli_error(result: CliResult, match: str | None = None, code: int = 2) -> None:
    """A CLI refusal: exit ``code``, exactly one non-empty line on stderr, no traceback."""
    TALLY.cases += 1
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    if "Traceback" in result.stderr:
        _fail("tracebacks", result.stderr[-2000:])
    if result.returncode == 0:
        _fail("silent", f"exit 0; stdout: {result.stdout[:500]}")
    if result.returncode != code or len(lines) != 1:
        _fail("tracebacks", f"exit {result.returncode}, stderr {len(lines)} lines: {result.stderr[-1000:]}")
    _check_message(lines[0], match)
    TALLY.ok += 1


def expect_page_message(at: Any, match: str | None = None) -> None:
    """A Streamlit AppTest after the bad input: no exception element, and an error or warning
    message (or the given text) on the page."""
    TALLY.cases += 1
    if len(at.exception):
        _fail("tracebacks", f"exception on the page: {at.exception[0].value}")
    shown = [e.value for e in (*at.error, *at.warning)]
    if not shown:
        _fail("silent", "no message on the page")
    if match is not None and not any(re.search(match, str(s), re.IGNORECASE) for s in shown):
        _fail("silent", f"no message matches {match!r}: {shown}")
    TALLY.ok += 1
