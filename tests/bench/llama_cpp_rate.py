"""llama.cpp's batch-1 decode rate, in a process of its own (bench_speed.py runs this file):
``python tests/bench/llama_cpp_rate.py LLAMA_CPP_DIR GGUF PROMPT STEPS`` prints one JSON line,
[tok/s or null, what ran].

Why a process of its own: a crash in llama.cpp (one was seen: ``_without_extra_buffers``) ends
this measurement with a row that says so, not the whole benchmark with every row measured before.
This file imports nothing but the standard library and ``llama_cpp``.

Decode rate = (tokens of a long answer - 1) / (its time - a 1-token answer's time): the prefill
cancels out; EOS is banned (as ``ignore_eos`` in our runs), and the tokens are the ones llama.cpp
reports.
"""
from __future__ import annotations

import json
import sys
import time


def _without_extra_buffers(llama_cpp: object) -> None:
    """Load weights without llama.cpp's "extra buffer types": on CPUs with AMX these hold the
    weights for its AMX matmul, which crashed (SIGSEGV at ``ldtilecfg`` in a worker thread, under
    gdb) on the first multi-token prompt on an AMX machine of this project. Batch-1 decodes do not
    use AMX, and Q4_1 has no CPU repacking, so the decode rate is llama.cpp's own either way."""
    low = llama_cpp.llama_cpp  # type: ignore[attr-defined]
    default = low.llama_model_default_params

    def params() -> object:
        p = default()
        p.use_extra_bufts = False
        return p
    low.llama_model_default_params = params


def rate(gguf: str, prompt: str, steps: int) -> tuple[float | None, str]:
    import llama_cpp

    _without_extra_buffers(llama_cpp)
    llm = llama_cpp.Llama(model_path=gguf, n_threads=2, n_ctx=512, verbose=False)

    def gen(n: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        out = llm.create_completion(prompt, max_tokens=n, temperature=0.0,
                                    logit_bias={llm.token_eos(): -1e9})  # EOS ignored, as our runs do
        return time.perf_counter() - t0, int(out["usage"]["completion_tokens"])
    gen(4)  # warm
    one = min(gen(1)[0] for _ in range(3))
    full, tokens = min(gen(steps) for _ in range(2))
    if tokens < 2:
        return None, f"llama.cpp answered {tokens} token(s): no decode rate"
    return (tokens - 1) / (full - one), \
        f"llama-cpp-python {llama_cpp.__version__}, Q4_1 GGUF, 2 threads, no extra buffer types"


if __name__ == "__main__":
    where, gguf, prompt, steps = sys.argv[1:5]
    sys.path.append(where)  # never ahead of the venv's own packages
    print(json.dumps(rate(gguf, prompt, int(steps))))
