"""Models: the Llama-family decoder and everything that turns a name into checked weights.

    model_config.py  the one parse of a HF config.json into the frozen ModelConfig
    weights.py       safetensors headers and tensors checked against a ModelConfig
    convert.py       GGUF -> HF folder (metadata, tensors and tokenizer checked first)
    cache.py         the converted-model cache, keyed by content, written atomically
    loader.py        name or path -> LoadedModel (config, fp32 weights, tokenizer)
    llama.py         the decoder's forward over one flattened batch

Every bad input is a ValueError naming the file and the field, raised at load time.
"""
