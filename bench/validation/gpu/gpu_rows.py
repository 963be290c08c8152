"""What the GPU measurement scripts beside it share: a row appended to a jsonl file (and printed), and a
call's seconds by CUDA events after warm-up."""
import json

import torch


def emit(path, part, row):
    with open(path, "a") as f:
        f.write(json.dumps(dict(part=part, **row)) + "\n")
    print(part, json.dumps(row), flush=True)


def timed(fn, target_s=0.03, min_reps=3, max_reps=200):
    """Per call: two warm-up calls, one timed to size the run, then enough calls for target_s
    (min_reps to max_reps), timed together with CUDA events."""
    fn(); fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); fn(); e.record(); torch.cuda.synchronize()
    one = max(s.elapsed_time(e) / 1e3, 1e-6)
    reps = int(min(max_reps, max(min_reps, target_s / one)))
    s.record()
    for _ in range(reps):
        fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / 1e3 / reps
