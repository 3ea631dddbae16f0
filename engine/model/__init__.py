"""The model and its kernels: a name -> checked weights -> the Llama forward over one flattened batch.

    model_config.py   the one parse of a HF config.json into the frozen ModelConfig
    weights.py        safetensors headers and tensors checked against a ModelConfig
    convert.py        GGUF -> HF folder (``python -m engine.model.convert smollm2-135m``)
    cache.py          the converted-model cache, keyed by content, written atomically
    loader.py         name or path -> LoadedModel (config, fp32 weights, tokenizer)
    shared.py         the process-wide SharedModel cache (dtype, quantization, smoothing, sparsity)
    llama.py          the decoder's forward over one flattened batch
    attention.py      the attention-backend seam and its torch backend (paged attention, KV writes)
    forward_batch.py  the flattened batch's metadata (positions, slots, per-sequence KV spans)
    kv_quant.py       int8 / fp8 KV cache with per-token scales
    quantization.py   weight quantization (int8, fp8, int4 groups; LLM.int8 outliers)
    quant_cache.py    quantized weights cached on disk
    smoothing.py      SmoothQuant's fold of activation scales into weights
    sparsity.py       2:4 structured pruning
    activations.py    activation statistics of every linear input (the observer seam)
    private_prefill.py  a forward in its own KV pool (studies and statistics; the engine's is untouched)
    runner.py         ModelRunner: the in-process Runner (one forward per step)

Every bad input is a ValueError naming the file and the field, raised at load time.
"""
