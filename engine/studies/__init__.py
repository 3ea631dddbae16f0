"""The studies behind the pages: measurements that run an engine's model on the side.

    evaluation.py     perplexity and activation statistics of an LLM's model
    quant_inspect.py  one weight matrix through each quantization scheme (error, histograms)
    quant_tradeoff.py memory / quality / speed of each quantization choice on this machine
"""
