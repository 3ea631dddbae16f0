"""Demo scenarios: a named workload (prompts, arrival steps, output lengths) plus engine knobs.

A scenario is data in ``presets/scenarios/<name>.json``::

    {"name": "chat-burst", "title": "...", "description": "...", "model": "smollm2-135m",
     "chat_template": true,
     "knobs": {"block_size": 16, "num_blocks": 96, "max_num_batched_tokens": 256, ...,
               "speculative_config": {"method": "ngram", "num_speculative_tokens": 4}},
     "requests": [{"prompt": "...", "arrival_step": 0, "max_tokens": 32,
                   "temperature": 0, "seed": null, "ignore_eos": false, "n": 1}, ...]}

Requests are greedy by default (or seeded), so a scenario replays identically every time:
the same knobs give the same batches, the same blocks and the same tokens.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from engine.core.config import EngineConfig, SamplingParams
from engine.core.trace import StepTrace
from engine.serving.intake import format_prompt

if TYPE_CHECKING:
    from engine.serving.engine import LLMEngine

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "presets" / "scenarios"
_REQUEST_FIELDS = {"prompt", "arrival_step", "max_tokens", "temperature", "seed", "ignore_eos", "top_k", "top_p", "n"}


@dataclass(frozen=True)
class ScenarioRequest:
    """One request of a scenario: what it asks and when it arrives."""

    prompt: str
    arrival_step: int = 0
    max_tokens: int = 32
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    top_k: int = 0
    top_p: float = 1.0
    n: int = 1  # parallel sampling: sequences drawn from the one prompt

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed,
                              ignore_eos=self.ignore_eos, top_k=self.top_k, top_p=self.top_p, n=self.n)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    description: str
    model: str
    knobs: Mapping[str, Any]
    requests: tuple[ScenarioRequest, ...]
    chat_template: bool = False
    source: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def engine_config(self, **overrides: Any) -> EngineConfig:
        """The scenario's knobs with ``overrides`` on top; ValueError names a bad knob.

        An override of None keeps the scenario's value (the page passes unset controls as None);
        to switch speculation off use ``without_speculation``. ``speculative_config`` is vLLM's
        dict, validated by EngineConfig (a bad key or value names ``speculative_config.<key>``).
        """
        return EngineConfig.from_knobs(**{**self.knobs, **{k: v for k, v in overrides.items() if v is not None}})


def list_scenarios(folder: Path = SCENARIO_DIR) -> list[str]:
    """Scenario names (file stems), sorted."""
    return sorted(p.stem for p in folder.glob("*.json"))


def load_scenario(name_or_path: str | Path, folder: Path = SCENARIO_DIR) -> Scenario:
    """Load a scenario by name (``chat-burst``) or by path to a JSON file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = folder / f"{name_or_path}.json"
    if not path.is_file():
        raise ValueError(f"scenario: unknown scenario {str(name_or_path)!r}; "
                         f"choose one of {list_scenarios(folder)}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"scenario: {path.name} is not valid JSON ({e})") from None
    return parse_scenario(data, default_name=path.stem)


def parse_scenario(data: Mapping[str, Any], default_name: str = "scenario") -> Scenario:
    """Validate a scenario dict; every problem is a ValueError naming the field."""
    if not isinstance(data, Mapping):
        raise ValueError("scenario: must be a JSON object")
    requests = data.get("requests")
    if not isinstance(requests, list) or not requests:
        raise ValueError("scenario.requests: must be a non-empty list")
    parsed = tuple(_parse_request(i, r) for i, r in enumerate(requests))
    knobs = data.get("knobs", {})
    if not isinstance(knobs, Mapping):
        raise ValueError("scenario.knobs: must be an object")
    scenario = Scenario(
        name=str(data.get("name", default_name)),
        title=str(data.get("title", data.get("name", default_name))),
        description=str(data.get("description", "")),
        model=str(data.get("model", "smollm2-135m")),
        knobs=dict(knobs),
        requests=parsed,
        chat_template=bool(data.get("chat_template", False)),
        source=str(data.get("source", "")),
        extra={k: v for k, v in data.items() if k not in {
            "name", "title", "description", "model", "knobs", "requests", "chat_template", "source"}},
    )
    scenario.engine_config()  # validates the knobs
    return scenario


def _parse_request(index: int, raw: Any) -> ScenarioRequest:
    where = f"scenario.requests[{index}]"
    if isinstance(raw, str):
        raw = {"prompt": raw}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: must be an object or a prompt string")
    unknown = set(raw) - _REQUEST_FIELDS
    if unknown:
        raise ValueError(f"{where}.{sorted(unknown)[0]}: unknown field")
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"{where}.prompt: must be a non-empty string")
    arrival = raw.get("arrival_step", 0)
    if isinstance(arrival, bool) or not isinstance(arrival, int) or arrival < 0:
        raise ValueError(f"{where}.arrival_step: must be an integer >= 0, got {arrival!r}")
    request = ScenarioRequest(**{k: v for k, v in raw.items()})
    try:
        request.sampling_params()
    except ValueError as e:
        raise ValueError(f"{where}.{e}") from None
    return request


def build_engine(scenario: Scenario, model: Any, progress: Callable[[str], None] | None = None,
                 **knob_overrides: Any) -> "LLMEngine":
    """A fresh LLMEngine with the scenario's requests queued (ids "0", "1", ... in file order).

    ``progress`` hears how far a parallel engine's worker start-up got (LLMEngine's argument).
    If queuing a request fails, a parallel engine's workers are stopped before the error leaves.

    ``model`` is a model name or a SharedModel. Validation is all-or-nothing: a request the
    engine rejects (e.g. a prompt larger than the KV pool) raises ValueError naming the request.
    """
    from engine.serving.engine import LLMEngine

    config = scenario.engine_config(**knob_overrides)
    engine = LLMEngine(model, config=config, progress=progress)
    for i, r in enumerate(scenario.requests):
        text = format_prompt(engine.tokenizer, r.prompt, scenario.chat_template)
        try:
            engine.add_request(text, r.sampling_params(), arrival_step=r.arrival_step)
        except ValueError as e:
            engine.shutdown()
            raise ValueError(f"{e} (scenario {scenario.name!r}, request {i})") from None
    return engine


def run_to_end(engine: Any, max_steps: int = 100_000,
               on_step: Callable[[int], None] | None = None) -> list[StepTrace]:
    """Step until every request has finished; returns the StepTraces."""
    traces = []
    while engine.has_unfinished_requests():
        traces.append(engine.step())
        if on_step is not None:
            on_step(len(traces))
        if len(traces) >= max_steps:
            raise RuntimeError(f"scenario did not finish within {max_steps} steps")
    return traces


def without_speculation(scenario: Scenario) -> Scenario:
    """A copy of the scenario with ``speculative_config`` removed (plain decoding)."""
    return replace(scenario, knobs={k: v for k, v in scenario.knobs.items() if k != "speculative_config"})


def with_knobs(scenario: Scenario, **knobs: Any) -> Scenario:
    """A copy of the scenario with some knobs replaced (validated)."""
    out = replace(scenario, knobs={**scenario.knobs, **knobs})
    out.engine_config()
    return out
