"""The optimisation audit (issue #23): which known optimisations a deployment applies on its
hardware, the gap to the roofline, and what to change (docs/audit.md).

    evidence.py   Setting, Benchmark, Evidence: what is known of a deployment, and from where
    readers/      one reader per log format (vLLM, SGLang, llama.cpp, benchmark blocks, commands)
"""
