"""One prompt through a fresh engine, streamed token by token, with the steps that made it.

    session = start(get_shared_model("smollm2-135m"), GenerateRequest("What is the capital of France?"))
    for piece in session.stream():   # one engine step per iteration, text deltas
        print(piece, end="")
    session.result()                 # text, finish reason, every StepTrace

The Generate page uses this; each call builds its own engine (its own KV pool), so browser
sessions never share state beyond the read-only weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from engine.core.config import SamplingParams
from engine.serving.intake import format_prompt
from engine.core.trace import StepTrace

GENERATE_KNOBS = {"block_size": 16, "num_blocks": 128, "max_num_batched_tokens": 512, "max_num_seqs": 1}


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str
    model: str = "smollm2-135m"
    max_tokens: int = 64
    temperature: float = 0.0
    seed: int | None = 0
    chat_template: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ValueError("prompt: type a prompt first")


@dataclass(frozen=True)
class GenerateResult:
    prompt: str
    formatted_prompt: str
    text: str
    finish_reason: str | None
    prompt_tokens: int
    output_tokens: int
    traces: tuple[StepTrace, ...]


class GenerationSession:
    """A fresh engine holding one request; ``stream`` steps it to the end."""

    def __init__(self, engine: Any, request: GenerateRequest, formatted: str, request_id: str) -> None:
        self.engine = engine
        self.request = request
        self.formatted = formatted
        self.request_id = request_id
        self.traces: list[StepTrace] = []

    def stream(self) -> Iterator[str]:
        """Yield the new text after each engine step (nothing for steps that only prefill).

        Never spins: a step that makes no progress raises RuntimeError (LLMEngine.made_no_progress)."""
        shown = ""
        while True:
            with self.engine.lock:
                if not self.engine.has_unfinished_requests():
                    break
                trace = self.engine.step()
                self.traces.append(trace)
                if self.engine.made_no_progress(trace):
                    raise RuntimeError(f"generate: no progress at step {trace.step}; the engine is stuck")
                text = self.engine.get_output(self.request_id).outputs[0].text
            # Byte-level BPE can end mid-character ("\ufffd"); wait until the text is stable.
            if text.startswith(shown) and not text.endswith("\ufffd") and len(text) > len(shown):
                yield text[len(shown):]
                shown = text
        final = self.engine.get_output(self.request_id).outputs[0].text
        if final.startswith(shown) and len(final) > len(shown):
            yield final[len(shown):]

    def result(self) -> GenerateResult:
        out = self.engine.get_output(self.request_id)
        return GenerateResult(self.request.prompt, self.formatted, out.outputs[0].text, out.outputs[0].finish_reason,
                              len(out.prompt_token_ids), len(out.outputs[0].token_ids), tuple(self.traces))


def start(shared_model: Any, request: GenerateRequest, **knobs: Any) -> GenerationSession:
    """Build an engine on the shared weights and queue the request (ValueError if it cannot run)."""
    from engine.serving.engine import LLMEngine

    engine = LLMEngine(shared_model, **{**GENERATE_KNOBS, **knobs})
    formatted = format_prompt(engine.tokenizer, request.prompt, request.chat_template)
    params = SamplingParams(temperature=request.temperature, max_tokens=request.max_tokens,
                            seed=None if request.temperature == 0 else request.seed)
    rid = engine.add_request(formatted, params)
    return GenerationSession(engine, request, formatted, rid)
