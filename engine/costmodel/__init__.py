"""A step's duration predicted instead of measured: the simulated runner (issue #22).

The serving simulator runs the real engine (scheduler, block pool, KV manager, prefix cache,
preemption) with a runner that runs no model: each forward asks a cost model how long the
scheduled batch would take on the target hardware and advances a virtual clock by that much.

    shape.py      StepShape: what a scheduler output asks of the hardware (chunks: new tokens, context)
    cost.py       CostModel (the interface) and StepCost (the breakdown of one step)
    roofline.py   RooflineCost: per operator roofline x efficiency, for any calculator model and preset
    measured.py   MeasuredCost: curves measured on this machine (engine/simulate/calibrate.py)
    clock.py      VirtualClock (a simulated run's seconds) and WallClock (a real run's)
    model.py      SimulatedModel: a model + deployment the engine serves without weights
    runner.py     SimulatedRunner: the Runner (engine/serving/runners.py) that predicts instead of runs
"""
