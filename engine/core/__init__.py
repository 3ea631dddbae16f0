"""The serving core: the state the engine loop steps and the records it emits.

    config.py        EngineConfig / SamplingParams / SpeculativeConfig and every knob's hard cap
    hf_config.py     reading a HF config.json's fields (torch-free; the calculator uses it too)
    request.py       one request's lifecycle state, checkpoint and restore
    block_pool.py    KV blocks, ref counts, the free queue
    prefix_cache.py  the radix tree of cached full blocks (SGLang's RadixCache)
    kv_cache.py      KVCacheManager: block tables over the pool and the prefix cache, with a journal
    scheduler.py     continuous batching, chunked prefill, preemption; postprocess owns the lifecycle
    stop.py          stop rules (EOS, stop strings and tokens, lengths)
    sampling.py      logits -> tokens (temperature, top-k, top-p), per request generators
    trace.py         the frozen records a step emits (StepTrace, Snapshot, ...): the replay format
    schema.py        the records' own schema: annotations -> validation of loaded JSON

Nothing here imports the model, the runners or anything above (see docs/architecture.md).
"""
