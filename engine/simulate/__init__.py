"""The serving simulator (issue #22): the real engine on simulated hardware, in time (docs/simulator.md).

    workload.py    who arrives when, with how long a prompt (generated, published statistics, a file)
    simulator.py   the loop in time: arrivals, steps, the clock; simulate() and run_real()
    cluster.py     several instances on one timeline: disaggregated prefill/decode, colocation
    result.py      RunResult, RequestRecord, StepSample
    metrics.py     percentiles, throughput, goodput, SLO attainment
    capacity.py    the highest rate meeting the SLOs
    calibrate.py   this machine's measured cost model (the real engine, profiled)
    __main__.py    python -m engine.simulate
"""
