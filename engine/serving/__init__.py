"""The engine loop and the offline API: LLMEngine.step and LLM.generate.

    engine.py      LLMEngine: schedule -> propose drafts -> run the batch -> sample and verify ->
                   postprocess -> trace
    llm.py         LLM: offline batch generation (vLLM's LLM)
    intake.py      request intake: validation, tokenization, ids, the pending queue
    runners.py     the Runner protocol and the registry that picks one from the config
    outputs.py     RequestOutput / CompletionOutput and request metrics
    limits.py      memory and size limits checked before anything is allocated
    generation.py  one prompt through a fresh engine, streamed (the Generate page)
"""
