"""Request intake: what a prompt must be before it is queued, and how it becomes token ids."""
from __future__ import annotations

from typing import Any


def format_prompt(tokenizer: Any, prompt: str, chat_template: bool) -> str:
    """Wrap a user message in the model's chat template when asked and the tokenizer has one."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    return prompt
