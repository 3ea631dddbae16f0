"""Parallel execution: pipeline x tensor parallelism in worker processes.

    layout.py       the stage / shard layout of the layers (torch-free)
    shard.py        one worker's slice of the model
    worker.py       one worker process: its stage x rank of the model, KV cache, step loop
    executor.py     ParallelRunner: starts the workers, sends steps, collects logits and timings
    batch_queue.py  the pipeline's batch queue (vLLM's step_with_batch_queue)
    stats.py        pipeline statistics from the timelines (bubble, utilisation)
"""
