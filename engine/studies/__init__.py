"""The studies behind the pages: measurements that run an engine's model on the side.

    architectures.py  real attention architectures side by side on one device (the calculator's answers)
    attention_layouts.py  MHA / GQA / MQA tiny-random engines on one workload and one KV budget
    evaluation.py     perplexity and activation statistics of an LLM's model
    flash_attention.py  one request's q/K/V at one layer, the Triton kernel's trace on them, HBM traffic
    quant_inspect.py  one weight matrix through each quantization scheme (error, histograms)
    quant_tradeoff.py memory / quality / speed of each quantization choice on this machine
"""
