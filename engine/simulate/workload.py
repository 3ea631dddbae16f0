"""Serving workloads: who arrives when, with how long a prompt, asking for how many tokens.

Two sources, one record (``Workload``):
    generated   Poisson arrivals at a rate (or all at t = 0: a burst), prompt and output lengths
                drawn from a ``Lengths`` (fixed, uniform, lognormal, or published statistics:
                presets/workloads/lengths.json), optionally with shared prefixes
    a file      a JSON list of {arrival_s, prompt | prompt_tokens, max_tokens, priority?}
                (``parse_workload``: every bad field is a ValueError naming the request and field)

Prompts are real token ids (random ones, seeded), so the prefix cache sees exactly the sharing
the workload has: none by chance, all of a shared prefix.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

#: most requests one workload may hold (the page and the CLI stay responsive below it)
MAX_REQUESTS = 100_000
MAX_PROMPT_TOKENS = 1 << 20
MAX_OUTPUT_TOKENS = 1 << 20
MAX_ARRIVAL_S = 1e7
MAX_PRIORITY = 1 << 30
#: token ids of generated prompts are drawn from [0, PROMPT_VOCAB): below every model's vocabulary
PROMPT_VOCAB = 256
_LENGTHS_FILE = Path(__file__).resolve().parents[2] / "presets" / "workloads" / "lengths.json"

LengthKind = Literal["fixed", "uniform", "lognormal"]


@dataclass(frozen=True)
class WorkloadRequest:
    arrival_s: float
    prompt_token_ids: tuple[int, ...] | None  # exactly one of the two is set
    prompt: str | None
    max_tokens: int
    priority: int = 0


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[WorkloadRequest, ...]  # in arrival order

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: fixed a; uniform a..b; lognormal with log-mean a, log-sd b;
    every draw rounded and clipped to [lo, hi]."""

    kind: LengthKind
    a: float
    b: float = 0.0
    lo: int = 1
    hi: int = MAX_PROMPT_TOKENS
    label: str = ""

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            x = self.a
        elif self.kind == "uniform":
            x = rng.uniform(self.a, self.b)
        else:
            x = rng.lognormvariate(self.a, self.b)
        return int(min(self.hi, max(self.lo, round(x))))

    @property
    def mean(self) -> float:
        """The mean before clipping."""
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return math.exp(self.a + self.b ** 2 / 2)

    @property
    def words(self) -> str:
        if self.label:
            return self.label
        if self.kind == "fixed":
            return f"{self.a:g}"
        if self.kind == "uniform":
            return f"uniform {self.a:g}..{self.b:g}"
        return f"lognormal (mean {self.mean:,.0f})"


@lru_cache(maxsize=1)
def _published() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_LENGTHS_FILE.read_text())["distributions"]
    return data


def published_lengths() -> list[str]:
    """Names of the published length statistics (``lengths('sharegpt', 'prompt')``)."""
    return sorted(_published())


def _lognormal(d: dict[str, Any], label: str) -> Lengths:
    """mu, sigma from (mean, median) or (mean, sigma)."""
    mean = float(d["mean"])
    sigma = float(d["sigma"]) if "sigma" in d else math.sqrt(2 * math.log(mean / float(d["median"])))
    mu = math.log(float(d["median"])) if "median" in d else math.log(mean) - sigma ** 2 / 2
    return Lengths("lognormal", mu, sigma, int(d.get("min", 1)), int(d.get("max", MAX_PROMPT_TOKENS)), label)


def published(name: str, part: Literal["prompt", "output"]) -> Lengths:
    entry = _published().get(name)
    if entry is None:
        raise ValueError(f"lengths: unknown statistics {name[:40]!r}; known: {', '.join(published_lengths())}")
    return _lognormal(entry[part], str(entry["label"]))


def parse_lengths(text: str, field: str, part: Literal["prompt", "output"] = "prompt") -> Lengths:
    """'128' (fixed) | 'uniform:64-512' | 'lognormal:MEAN,SIGMA' | a published name ('sharegpt')."""
    t = str(text).strip().lower()
    try:
        if t in _published():
            return published(t, part)
        if t.startswith("uniform:"):
            lo, hi = (int(x) for x in t.split(":", 1)[1].split("-"))
            if not 1 <= lo <= hi <= MAX_PROMPT_TOKENS:
                raise ValueError
            return Lengths("uniform", lo, hi)
        if t.startswith("lognormal:"):
            mean, sigma = (float(x) for x in t.split(":", 1)[1].split(","))
            if not (1 <= mean <= MAX_PROMPT_TOKENS and 0 < sigma <= 4):
                raise ValueError
            return Lengths("lognormal", math.log(mean) - sigma ** 2 / 2, sigma)
        n = int(t)
        if not 1 <= n <= MAX_PROMPT_TOKENS:
            raise ValueError
        return Lengths("fixed", n)
    except ValueError:
        raise ValueError(f"{field}: expected N, 'uniform:LO-HI', 'lognormal:MEAN,SIGMA' or one of "
                         f"{', '.join(published_lengths())} (N between 1 and {MAX_PROMPT_TOKENS:,}), "
                         f"got {str(text)[:40]!r}") from None


def _check_count(num_requests: int) -> None:
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or not 1 <= num_requests <= MAX_REQUESTS:
        raise ValueError(f"num_requests: must be a whole number 1 .. {MAX_REQUESTS:,}, got {num_requests!r}")


def check_rate(rate: float) -> float:
    """A request rate in requests/s: finite and > 0 (math.inf: a burst, all at t = 0)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or math.isnan(rate) or rate <= 0:
        raise ValueError(f"rate: must be a number of requests per second > 0 (inf: all at once), got {rate!r}")
    return float(rate)


def generate(num_requests: int, rate: float, prompt: Lengths, output: Lengths, *, seed: int = 0,
             prefix_groups: int = 0, prefix_tokens: int = 0, name: str = "") -> Workload:
    """Poisson arrivals at ``rate`` requests/s (inf: a burst at t = 0); with ``prefix_groups`` > 0,
    request i's prompt starts with group (i mod groups)'s ``prefix_tokens`` shared tokens (the
    groups interleave, as users of several system prompts do)."""
    _check_count(num_requests)
    rate = check_rate(rate)
    if prefix_groups < 0 or prefix_tokens < 0 or (prefix_groups > 0) != (prefix_tokens > 0):
        raise ValueError("prefix_groups, prefix_tokens: both > 0 for shared prefixes, or both 0")
    rng = random.Random(seed)
    prefixes = [[rng.randrange(PROMPT_VOCAB) for _ in range(prefix_tokens)] for _ in range(prefix_groups)]
    t, requests = 0.0, []
    for i in range(num_requests):
        if math.isfinite(rate):
            t += rng.expovariate(rate)
        n_prompt, n_out = prompt.sample(rng), output.sample(rng)
        head = prefixes[i % prefix_groups] if prefix_groups else []
        tail = [rng.randrange(PROMPT_VOCAB) for _ in range(max(1, n_prompt - len(head)))]
        requests.append(WorkloadRequest(t, tuple(head + tail), None, n_out))
    label = name or (f"{num_requests} requests, " + ("burst" if not math.isfinite(rate) else f"Poisson {rate:g}/s")
                     + f", prompts {prompt.words}, outputs {output.words}")
    return Workload(label, tuple(requests))


# -- the workload file ------------------------------------------------------------------------------
def _number(where: str, key: str, value: object, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not lo <= value <= hi:
        raise ValueError(f"{where}: {key} must be a number {lo:g} .. {hi:g}, got {str(value)[:40]!r}")
    return float(value)


def _whole(where: str, key: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{where}: {key} must be a whole number {lo:,} .. {hi:,}, got {str(value)[:40]!r}")
    return value


def _prompt(where: str, d: dict[str, Any], rng: random.Random) -> tuple[tuple[int, ...] | None, str | None]:
    if ("prompt" in d) == ("prompt_tokens" in d):
        raise ValueError(f"{where}: give exactly one of 'prompt' (text) and 'prompt_tokens' (a count or token ids)")
    if "prompt" in d:
        text = d["prompt"]
        if not isinstance(text, str) or not text:
            raise ValueError(f"{where}: prompt must be non-empty text")
        return None, text
    tokens = d["prompt_tokens"]
    if isinstance(tokens, list):
        if not tokens or len(tokens) > MAX_PROMPT_TOKENS:
            raise ValueError(f"{where}: prompt_tokens must list 1 .. {MAX_PROMPT_TOKENS:,} token ids")
        return tuple(_whole(where, "prompt_tokens[]", t, 0, PROMPT_VOCAB - 1) for t in tokens), None
    n = _whole(where, "prompt_tokens", tokens, 1, MAX_PROMPT_TOKENS)
    return tuple(rng.randrange(PROMPT_VOCAB) for _ in range(n)), None


def parse_workload(text: str | bytes, name: str = "workload file", seed: int = 0) -> Workload:
    """A JSON list of {arrival_s, prompt | prompt_tokens, max_tokens, priority?} -> Workload (sorted by
    arrival; stable). ``prompt_tokens`` is a count (random ids, seeded) or a list of token ids."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"workload: not valid JSON ({str(e)[:80]})") from None
    if not isinstance(data, list) or not data:
        raise ValueError("workload: must be a non-empty JSON list of requests")
    if len(data) > MAX_REQUESTS:
        raise ValueError(f"workload: at most {MAX_REQUESTS:,} requests, got {len(data):,}")
    rng = random.Random(seed)
    out = []
    known = {"arrival_s", "prompt", "prompt_tokens", "max_tokens", "priority"}
    for i, d in enumerate(data):
        where = f"workload request {i}"
        if not isinstance(d, dict):
            raise ValueError(f"{where}: must be an object with arrival_s, prompt or prompt_tokens, max_tokens")
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0][:40]!r} (fields: {', '.join(sorted(known))})")
        for key in ("arrival_s", "max_tokens"):
            if key not in d:
                raise ValueError(f"{where}: {key} is missing")
        arrival = _number(where, "arrival_s", d["arrival_s"], 0.0, MAX_ARRIVAL_S)
        ids, prompt = _prompt(where, d, rng)
        out.append(WorkloadRequest(arrival, ids, prompt, _whole(where, "max_tokens", d["max_tokens"], 1, MAX_OUTPUT_TOKENS),
                                   _whole(where, "priority", d.get("priority", 0), -MAX_PRIORITY, MAX_PRIORITY)))
    return Workload(name, tuple(sorted(out, key=lambda r: r.arrival_s)))
