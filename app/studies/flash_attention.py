"""The FlashAttention page's study: the Triton kernel's trace of one request of the session's
live run (engine/studies/flash_attention.py), cached per (run, step, request, layer, head,
segments, tile width) for the session — Triton's interpreter takes seconds per trace.

Where the kernel can run: on a GPU, or on CPU under Triton's interpreter, which Triton reads
from TRITON_INTERPRET when ``engine.kernels`` is first imported; with no GPU this module sets
it (unless the environment says otherwise) before that import. Nothing here is computed unless
the page is open.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from app import session
from app.current_run import live_run
from app.models import configure_torch

if TYPE_CHECKING:
    from engine.studies.flash_attention import Candidate, FlashStudy
    from engine.replay.run import RunView

#: Kernel traces kept per session (each a few hundred kB at most).
MAX_TRACES = 24


def kernel_problem() -> str | None:
    """None when the kernels can run here (a GPU, or the interpreter), else why not."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first import of engine.kernels
    from engine.studies.flash_attention import kernels

    try:
        kernels()
    except ValueError as e:
        return str(e)
    return None


def unavailable(view: RunView) -> str | None:
    """Why this view's run has no model to recompute attention with (None: it has one)."""
    if view.is_replay:
        return ("A recording holds the steps, not the model's tensors: this page reruns the kernel on the live "
                "engine's own q, K and V. Start a live run (sidebar) to trace it.")
    current = live_run()
    if current is None:
        return "No live run: pick a scenario and a model in the sidebar."
    if current.engine.runner.model is None:
        return ("This run's layers live in worker processes (pipeline / tensor parallel): the page needs the "
                "single-process engine (pipeline_parallel_size = tensor_parallel_size = 1).")
    return None


def num_layers_heads() -> tuple[int, int, int]:
    """(layers, query heads, KV heads) of the live run's model."""
    current = live_run()
    assert current is not None and current.engine.runner.model is not None
    c = current.engine.runner.model.config
    return c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads


def dtype_bytes() -> int:
    """Bytes per element of the live model's compute dtype (fp32: 4)."""
    current = live_run()
    assert current is not None and current.engine.runner.model is not None
    return int(current.engine.runner.model.dtype.itemsize)


def trace(view: RunView, cand: Candidate, layer: int, head: int, segments: int, block_n: int) -> FlashStudy:
    """The kernel's trace for the live run at the view's step (cached for the session)."""
    from engine.model.runner import ModelRunner
    from engine.studies.flash_attention import flash_study, layer_tensors, live_cache_difference

    current = live_run()
    assert current is not None
    model = current.engine.runner.model
    assert model is not None
    key = (view.step, cand.request_id, layer, head, segments, block_n)
    held = session.flash_traces.get()
    cache = held[1] if held is not None and held[0] is current else {}
    if key in cache:  # least recently used first: a hit moves to the end
        cache[key] = cache.pop(key)
        return cache[key]
    configure_torch()
    snap = view.snapshot
    tensors = layer_tensors(model, cand.token_ids, layer, snap.block_size, current.engine.runner.kv_cache_dtype)
    live_diff = None
    runner = current.engine.runner
    with current.lock:  # read only; the latest step only: later steps may have reused its blocks
        if not view.behind and isinstance(runner, ModelRunner) \
                and tuple(current.engine.kv.block_tables.get(cand.request_id, ())) == cand.block_table:
            live_diff = live_cache_difference(runner.kv_caches[layer], cand.block_table, snap.block_size, tensors)
    result = flash_study(cand, tensors, snap.num_blocks, snap.block_size, layer, head, view.step,
                         num_segments=segments, block_n=block_n, live_difference=live_diff)
    if len(cache) >= MAX_TRACES:
        cache.pop(next(iter(cache)))
    cache[key] = result
    session.flash_traces.set((current, cache))
    return result
