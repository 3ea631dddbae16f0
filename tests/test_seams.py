"""The engine's seams, used the way a new runner or attention backend would use them: one class,
one registry entry, one config value (docs/architecture.md). Nothing here touches the loop.

- A runner that wraps the in-process one and counts its forwards gives the same tokens.
- A runner that never runs the model (fixed logits, the shape of a cost-model runner) drives
  every stage of the step loop: scheduling, sampling, stop rules, the KV cache.
- An attention backend that wraps the torch one and counts its calls gives the same tokens.
- check_integrity() holds after every step; unknown names are ValueErrors naming the knob.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from engine import LLMEngine, SamplingParams
from engine.core.batch import BatchStage, SingleBatch
from engine.core.kv_cache import KVCacheManager
from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from engine.core.trace import ParallelLayout, PipelineTimeline
from engine.model.attention import ATTENTION_BACKENDS, TorchAttention
from engine.model.kv_quant import KVCache
from engine.model.forward_batch import ForwardBatch
from engine.model.llama import LlamaModel, Observer
from engine.model.runner import ModelRunner
from engine.serving.runners import RUNNERS, RunnerContext

ROOT = Path(__file__).resolve().parents[1]
TINY = "tiny-random"
KNOBS = {"block_size": 4, "num_blocks": 48, "max_num_batched_tokens": 16, "max_num_seqs": 4}
PROMPTS = ["the quick brown fox", "jumps over the lazy dog and", "a b a b a b a b"]


def run(engine: LLMEngine, max_tokens: int = 6) -> list[tuple[int, ...]]:
    """Greedy outputs of PROMPTS, stepping to the end with check_integrity() after every step."""
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=max_tokens)) for p in PROMPTS]
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()
    return [engine.get_output(i).outputs[0].token_ids for i in ids]


class CountingRunner:
    """The in-process runner, wrapped: every forward is counted and passed on."""

    forwards = 0

    def __init__(self, ctx: RunnerContext) -> None:
        c = ctx.config
        self.inner = ModelRunner(ctx.shared.model, c.cache_config.num_blocks, c.cache_config.block_size, c.kv_cache_dtype)

    @property
    def model(self) -> LlamaModel | None:
        return self.inner.model

    @property
    def kv_cache_dtype(self) -> str:
        return self.inner.kv_cache_dtype

    @property
    def kv_cache_bytes_per_token(self) -> int:
        return self.inner.kv_cache_bytes_per_token

    @property
    def kv_cache_total_bytes(self) -> int:
        return self.inner.kv_cache_total_bytes

    @property
    def layout(self) -> ParallelLayout | None:
        return None

    @property
    def timeline(self) -> PipelineTimeline | None:
        return None

    def forward(self, output: SchedulerOutput, requests: dict[str, Request], kv: KVCacheManager) -> torch.Tensor:
        CountingRunner.forwards += 1
        return self.inner.forward(output, requests, kv)

    def batch_stage(self) -> BatchStage:
        return SingleBatch(self.forward)

    def set_observer(self, observer: Observer | None) -> None:
        self.inner.set_observer(observer)

    def check_integrity(self) -> None:
        self.inner.check_integrity()

    def shutdown(self) -> None:
        self.inner.shutdown()


FAVOURITE = 7  # the token the fixed-logits runner always prefers


class FixedLogitsRunner(CountingRunner):
    """Runs no model: every sampling row prefers token FAVOURITE (a cost-model runner would
    predict the step's duration here instead)."""

    def forward(self, output: SchedulerOutput, requests: dict[str, Request], kv: KVCacheManager) -> torch.Tensor:
        CountingRunner.forwards += 1
        rows = sum(1 + s.num_spec_tokens for s in output.scheduled if not s.is_prefill)
        logits = torch.zeros(rows, self.inner.model.config.vocab_size)  # [rows, V]
        logits[:, FAVOURITE] = 10.0
        return logits


class CountingAttention(TorchAttention):
    """The torch backend, wrapped: every attention call is counted."""

    name = "counting"
    calls = 0

    def attention(self, q: torch.Tensor, k_cache: KVCache, v_cache: KVCache, batch: ForwardBatch,
                  scale: float) -> torch.Tensor:
        CountingAttention.calls += 1
        return super().attention(q, k_cache, v_cache, batch, scale)


def test_a_runner_plugged_in_through_the_registry_runs_every_step(tiny, monkeypatch):
    monkeypatch.setitem(RUNNERS, "counting", CountingRunner)
    CountingRunner.forwards = 0
    reference = run(LLMEngine(tiny, **KNOBS))
    engine = LLMEngine(tiny, runner="counting", **KNOBS)
    assert isinstance(engine.runner, CountingRunner)
    assert run(engine) == reference
    assert 0 < CountingRunner.forwards <= engine.step_count  # a step that schedules nothing runs nothing


def test_a_runner_that_runs_no_model_drives_the_whole_loop(tiny, monkeypatch):
    monkeypatch.setitem(RUNNERS, "fixed", FixedLogitsRunner)
    engine = LLMEngine(tiny, runner="fixed", **KNOBS)
    outputs = run(engine, max_tokens=5)
    assert outputs == [(FAVOURITE,) * 5] * len(PROMPTS)
    assert engine.kv.pool.num_used == 0  # every request finished and freed its blocks
    snap = engine.snapshot()
    assert all(m.num_output_tokens == 5 for m in snap.metrics)


def test_an_attention_backend_plugged_in_through_the_registry(tiny, monkeypatch):
    monkeypatch.setitem(ATTENTION_BACKENDS, "counting", lambda device: CountingAttention())
    CountingAttention.calls = 0
    reference = run(LLMEngine(tiny, **KNOBS))
    engine = LLMEngine(tiny, attention_backend="counting", **KNOBS)
    assert run(engine) == reference
    # one call per layer per forward
    assert CountingAttention.calls > 0 and CountingAttention.calls % engine.shared.model.config.num_hidden_layers == 0


@pytest.mark.parametrize("knob", ["runner", "attention_backend"])
def test_unknown_names_are_refused_naming_the_knob(tiny, knob):
    with pytest.raises(ValueError, match=rf"^{knob}: "):
        LLMEngine(tiny, **{knob: "no-such-thing"}, **KNOBS)
    with pytest.raises(ValueError, match=rf"^{knob}: "):
        LLMEngine(tiny, **{knob: ""}, **KNOBS)


def test_in_process_runner_refuses_a_parallel_config(tiny):
    with pytest.raises(ValueError, match=r"^runner: 'in_process'"):
        LLMEngine(tiny, runner="in_process", pipeline_parallel_size=2, **KNOBS)


def test_the_engine_loop_never_tells_runners_apart():
    """No isinstance on a runner, and no concrete runner class named, in the engine loop."""
    for path in (ROOT / "engine" / "serving").glob("*.py"):
        if path.name == "runners.py":  # the registry names them, once
            continue
        text = path.read_text("utf-8")
        assert not re.search(r"isinstance\([^)]*runner", text), path
        assert "ParallelRunner" not in text and "ModelRunner" not in text, path
