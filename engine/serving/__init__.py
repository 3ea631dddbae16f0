"""The engine loop and the offline API: LLMEngine.step and LLM.generate (docs/architecture.md).

    engine.py      LLMEngine: arrivals -> propose drafts -> schedule and run the batch ->
                   sample and verify -> postprocess -> trace
    llm.py         LLM: offline batch generation (vLLM's LLM)
    intake.py      request intake: validation, tokenization, ids, the pending queue
    sampler.py     the sample-and-verify stage
    runners.py     the Runner protocol and RUNNERS, the one place a runner is chosen
    outputs.py     RequestOutput / CompletionOutput
    progress.py    the no-progress backstop
    limits.py      memory and size limits checked before anything is allocated
    generation.py  one prompt through a fresh engine, streamed (the Generate page)
"""
