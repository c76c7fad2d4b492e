"""Before/after in one run: benchmarks/redis_e2e.py from two source trees, interleaved.

    python benchmarks/trees_ab.py --before /tmp/base --after . --runs 3 -- --model tiny --quick

Each run is redis_e2e.py started from one tree (its own code on the path first), A, B, A, B, ...; the
arguments after `--` go to every run. Each run measures Redis against the engine alone in the same
process, so its ratio is what compares across a loaded machine; tok/s is printed too. Reports the median
of each tree's runs and after/before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Both trees' workers log as `conveyor worker` does (structlog filtered at INFO): an old tree's benchmark
# may leave structlog unconfigured, and then every debug line of its worker is rendered and printed.
AS_THE_WORKER_LOGS = (
    "import logging, runpy, sys, structlog; "
    "structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO)); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def run(tree: Path, extra: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    script = str(tree / "benchmarks" / "redis_e2e.py")
    cmd = [sys.executable, "-c", AS_THE_WORKER_LOGS, script, *extra, "--out", str(out)]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    wrote = [line.split("wrote ", 1)[1] for line in done.stdout.splitlines() if line.startswith("wrote ")]
    return json.loads(Path(wrote[-1]).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, help="source tree of the old code")
    parser.add_argument("--after", type=Path, default=Path("."), help="source tree of the new code")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree, interleaved")
    parser.add_argument("extra", nargs="*", help="arguments for redis_e2e.py (after --)")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    results: dict[str, list[dict]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.runs):
            for name, tree in trees.items():
                report = run(tree, args.extra, Path(tmp))
                results[name].append(report)
                print(
                    f"run {k + 1} {name:6}  ratio {report['throughput_ratio']:.3f}  "
                    f"redis {report['redis']['tokens_per_s']:.1f} tok/s  "
                    f"direct {report['direct']['tokens_per_s']:.1f} tok/s  "
                    f"sample->client p99 {report['redis']['sample_to_client_ms']['p99']:.2f} ms",
                    flush=True,
                )
    summary = {}
    for name, reports in results.items():
        summary[name] = {
            "ratio": statistics.median(r["throughput_ratio"] for r in reports),
            "redis_tok_s": statistics.median(r["redis"]["tokens_per_s"] for r in reports),
            "p99_ms": statistics.median(r["redis"]["sample_to_client_ms"]["p99"] for r in reports),
            "runs": [r["throughput_ratio"] for r in reports],
        }
    change = summary["after"]["ratio"] / summary["before"]["ratio"]
    print(json.dumps({**summary, "after_over_before_ratio": change}, indent=2))


if __name__ == "__main__":
    main()
