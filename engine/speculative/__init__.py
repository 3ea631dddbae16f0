"""Speculative decoding: drafters propose, the target verifies in one forward.

    drafter.py       the Drafter protocol and the n-gram (prompt lookup) drafter
    draft_runner.py  model drafters (early exit, a draft model) with their own KV pool
    spec_decode.py   rejection sampling (Leviathan et al.) and the n-gram proposer
    verify.py        the engine loop's stages: propose drafts, verify them against the target's rows
    theory.py        torch-free expected-speedup math (the Speculative page's curves)
"""
