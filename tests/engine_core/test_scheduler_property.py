"""Random arrivals, aborts and forced preemptions: invariants hold every step, nothing leaks."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.scheduler_output import RunnerOutput
from engine.errors import RequestRejected
from tests.helpers.engine_core_utils import EOS, make_group, make_request, make_scheduler

configs = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 2, 4]),
        "num_blocks": st.integers(3, 12),
        "max_num_seqs": st.integers(1, 4),
        "max_num_batched_tokens": st.integers(1, 12),
        "max_model_len": st.integers(4, 24),
        "enable_prefix_caching": st.booleans(),
        "scheduling": st.sampled_from(["continuous", "static"]),
        "policy": st.sampled_from(["fcfs", "priority"]),
        "kv_allocation": st.sampled_from(["paged", "reserve_max"]),
    }
)


@settings(max_examples=150, deadline=None)
@given(config=configs, seed=st.integers(0, 2**32 - 1))
def test_random_streams_leak_nothing(config, seed):
    rng = random.Random(seed)
    sched = make_scheduler(**config)
    live: list[str] = []
    all_requests = []
    num_steps = rng.randint(1, 40)
    num_preemptions = 0
    for step in range(10_000):
        arriving = step < num_steps
        if arriving and rng.random() < 0.5:
            # A small vocabulary so prompts share prefixes and hit the cache.
            prompt = [rng.choice([3, 4, 5]) for _ in range(rng.randint(1, 10))]
            max_tokens = rng.randint(1, 8)
            kw = dict(arrival=step, priority=rng.randint(0, 2), min_tokens=rng.choice([0, 0, 1]))
            if rng.random() < 0.3:
                reqs = make_group(f"g{step}", prompt, rng.randint(2, 3), max_tokens, **kw)
            else:
                reqs = [make_request(f"r{step}", prompt, max_tokens, **kw)]
            try:
                for r in reqs:
                    sched.check_request(r)
            except RequestRejected:
                # reserve_max holds max_model_len tokens of blocks for every request.
                held = config["max_model_len"] if config["kv_allocation"] == "reserve_max" else 0
                assert (
                    len(prompt) + max_tokens > config["max_model_len"]
                    or -(-max(held, len(prompt) + max_tokens) // config["block_size"]) > config["num_blocks"]
                )
                reqs = []
            for r in reqs:
                sched.add_request(r)
                live.append(r.request_id)
                all_requests.append(r)
        if arriving and live and rng.random() < 0.1:
            sched.abort_request(rng.choice(live))
        sched.check_invariants()
        if not sched.has_unfinished_requests():
            if arriving:
                continue
            break
        out = sched.schedule()
        num_preemptions += len(out.preempted_ids)
        # Progress: with work pending a step always schedules something.
        assert out.sequences
        assert all(s.num_new_tokens > 0 or s.fork_of for s in out.sequences)
        assert out.num_batched_tokens <= config["max_num_batched_tokens"]
        assert len(out.sequences) <= config["max_num_seqs"]
        sampled = {s.request_id: rng.choice([EOS, 6, 7, 8]) for s in out.sequences if s.sample}
        sched.update_from_output(out, RunnerOutput(sampled))
        sched.check_invariants()
        live = [rid for rid in live if sched.get_request(rid) is not None]
    else:
        raise AssertionError("requests never finished")
    assert all(r.is_finished for r in all_requests)
    assert sched.kv.num_used_blocks == 0
    assert all(b.ref_cnt == 0 for b in sched.kv.pool.blocks)
    assert sched.stats().num_preemptions == num_preemptions
