"""Host time of Scheduler.schedule() at 256 running decodes with ~1k-token contexts (no model, no runner).

    PYTHONPATH=<tree> python benchmarks/scheduler_step.py <label>    # one JSON line: min and median ms

Run it from two checkouts alternately to compare them (the min is the figure least moved by a loaded
machine).
"""

import json
import statistics
import sys
import time

from engine.config import SchedulerConfig
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import RunnerOutput
from engine.sampling_params import SamplingParams

sched = Scheduler(
    SchedulerConfig(
        num_blocks=256 * 80,
        block_size=16,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=8192,
        enable_prefix_caching=False,
    ),
    [2],
)
for i in range(256):
    sched.add_request(
        Request(
            f"r{i}",
            [100 + (i * 7 + j) % 30000 for j in range(1000)],
            SamplingParams(max_tokens=4000, ignore_eos=True, temperature=0),
            0.0,
        )
    )


def step():
    out = sched.schedule()
    t1 = time.perf_counter()
    sched.update_from_output(out, RunnerOutput({s.request_id: 7 for s in out.sequences if s.sample}))
    return out, t1


while any(r.num_output_tokens == 0 for r in sched.running) or len(sched.waiting):
    step()
ts = []
for _ in range(300):
    t0 = time.perf_counter()
    _, t1 = step()
    ts.append(t1 - t0)
print(
    json.dumps(
        {
            "tree": sys.argv[1],
            "schedule_min_ms": min(ts) * 1e3,
            "schedule_median_ms": statistics.median(ts) * 1e3,
        }
    )
)
