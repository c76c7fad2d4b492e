"""The GPU check's last step: every figure of its work folder in one summary.json, and a one-screen summary.

    python benchmarks/gpu_summary.py WORK DRY_RUN(0|1) TOTAL_SECONDS

Exit 1 unless every step is ok or skipped by rule. What each figure means: docs/kernels.md, "The GPU check".
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def cuda_test_counts(xml: Path) -> dict | None:
    """The pytest counts of the CUDA tests, and what was skipped and why."""
    if not xml.exists():
        return None
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    counts: dict = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["skipped_because"] = sorted(
        {f"{c.get('name')}: {s.get('message')}" for c in suite.iter("testcase") for s in c.iter("skipped")}
    )
    return counts


def figures(work: Path) -> dict:
    """The headline numbers, each None where its step did not produce it."""
    kernels = load(work / "kernels.json") or {}
    decode = kernels.get("decode", {})
    best = max(
        (k for k in decode.values() if "fraction_of_copy" in k),
        key=lambda k: k["fraction_of_copy"],
        default=None,
    )
    speed = load(work / "speed.json") or {}
    out: dict = {
        "copy_gb_per_s": kernels.get("copy_gb_per_s"),
        "decode_attention_fraction_of_copy": {n: k.get("fraction_of_copy") for n, k in decode.items()},
        "decode_attention_best_fraction": best and best["fraction_of_copy"],
        "tokens_per_s": {
            n: r.get("tokens_per_s") for n, r in speed.items() if isinstance(r, dict) and "tokens_per_s" in r
        },
    }
    for mode in ("eager", "cuda_graphs", "async"):
        r = speed.get(mode)
        if isinstance(r, dict):
            out[mode] = {
                k: r.get(k)
                for k in (
                    "step_ms",
                    "forward_ms",
                    "first_token_idle_ms",
                    "first_token_p50_ms",
                    "first_token_p99_ms",
                )
            }
    for name in ("tokens", "tokens_real"):
        r = load(work / f"{name}.json")
        if r:
            out[name] = {
                m: f"{v['agree']}/{v['sequences']} agree, {v['exact']} exact"
                for m, v in r.items()
                if isinstance(v, dict) and "agree" in v
            }
    return out


def screen(summary: dict) -> str:
    lines = [f"{s['step']:<14} {s['status']:<52} {s['seconds']:>4}s" for s in summary["steps"]]
    f = summary["figures"]
    for name in ("tokens", "tokens_real"):
        for mode, text in (f.get(name) or {}).items():
            lines.append(f"{name} {mode}: {text} (vs transformers generate)")
    if f.get("copy_gb_per_s"):
        lines.append(
            f"copy {f['copy_gb_per_s']:.0f} GB/s; decode attention best {f['decode_attention_best_fraction'] or 0:.2f} of copy"
        )
    for name, tps in f.get("tokens_per_s", {}).items():
        lines.append(f"{name:<18} {tps or 0:10.0f} tok/s")
    for mode in ("eager", "cuda_graphs", "async"):
        if mode in f:
            m = f[mode]
            fwd = "-" if m["forward_ms"] is None else f"{m['forward_ms']:.2f}"
            lines.append(
                f"{mode:<12} step {m['step_ms']:.2f} ms, forward {fwd} ms, first token idle "
                f"{m['first_token_idle_ms']:.1f} ms, under load p50 {m['first_token_p50_ms']:.0f} / p99 {m['first_token_p99_ms']:.0f} ms"
            )
    return "\n".join(lines)


def main() -> None:
    work, dry, total = Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
    steps = []
    for line in (work / "steps.tsv").read_text().splitlines():
        name, status, seconds = line.split("\t")
        steps.append({"step": name, "status": status, "seconds": int(seconds)})
    bad = [s["step"] for s in steps if not (s["status"] == "ok" or s["status"].startswith("skipped"))]
    summary = {
        "dry_run": dry,
        "total_seconds": total,
        "all_ok": not bad,
        "not_ok": bad,
        "environment": load(work / "environment.json") or {},
        "steps": steps,
        "cuda_tests": cuda_test_counts(work / "cuda_tests.xml"),
        "figures": figures(work),
        "details": {
            n: load(work / f"{n}.json") for n in ("tokens", "tokens_real", "kernels", "speed", "tp2")
        },
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    print("-" * 100)
    print(screen(summary))
    print(f"{'every step ok' if not bad else 'NOT ok: ' + ', '.join(bad)}; {total} s; {work}/summary.json")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
