"""The Generate page: one streamed answer on the shared weights, the last one kept in the session."""
from __future__ import annotations

from typing import TYPE_CHECKING

from app import session
from app.models import shared_model

if TYPE_CHECKING:
    from engine.serving.generation import GenerateRequest, GenerateResult, GenerationSession


def requested(prompt: str) -> GenerateRequest:
    """``prompt`` with the page's other widgets as a request; ValueError names a bad value."""
    from engine.serving.generation import GenerateRequest

    return GenerateRequest(prompt=prompt, model=session.gen_model.get(),
                           max_tokens=int(session.gen_max_tokens.get()),
                           temperature=float(session.gen_temperature.get()),
                           chat_template=bool(session.gen_chat.get()))


def start(request: GenerateRequest) -> GenerationSession:
    """A streaming generation of ``request`` on the process-wide weights."""
    from engine.serving import generation

    return generation.start(shared_model(request.model), request)


def last_result() -> GenerateResult | None:
    return session.generate.get()


def keep_result(result: GenerateResult) -> None:
    session.generate.set(result)
