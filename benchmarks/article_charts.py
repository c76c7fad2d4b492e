"""The PNG charts of benchmarks/article.py: one per experiment, written beside its JSON."""

from __future__ import annotations

from pathlib import Path


def draw_all(results: dict, out_dir: Path, tag: str, subtitle: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    drawn = []
    for name, draw in (
        ("static_vs_continuous", _batching),
        ("paged_vs_contiguous", _paging),
        ("max_num_seqs", _max_num_seqs),
        ("max_wait_ms", _max_wait),
        ("block_size", _block_size),
    ):
        fig = draw(results[_KEYS[name]])
        fig.suptitle(f"{_TITLES[name]}\n{subtitle}", fontsize=9)
        fig.tight_layout()
        path = out_dir / f"{name}-{tag}.png"
        fig.savefig(path, dpi=90)
        drawn.append(path)
        import matplotlib.pyplot as plt

        plt.close(fig)
    return drawn


_KEYS = {
    "static_vs_continuous": "batching",
    "paged_vs_contiguous": "paging",
    "max_num_seqs": "max_num_seqs",
    "max_wait_ms": "max_wait_ms",
    "block_size": "block_size",
}
_TITLES = {
    "static_vs_continuous": "Static vs continuous batching, Poisson arrivals (last: all at once)",
    "paged_vs_contiguous": "Reserving max_model_len per request vs paged blocks, one KV budget",
    "max_num_seqs": "max_num_seqs: throughput against latency (all requests at once)",
    "max_wait_ms": "max_wait_ms: a lone user's first token against throughput under load",
    "block_size": "block_size: step time against KV waste (all requests at once)",
}


def _figure(ncols: int):
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(4 * ncols, 3.4))


def _batching(rows: list[dict]):
    fig, axes = _figure(4)
    for scheduling, color in (("continuous", "#2a7"), ("static", "#c63")):
        mine = [r for r in rows if r["scheduling"] == scheduling]
        x = range(len(mine))
        axes[0].plot(x, [r["tokens_per_s"] for r in mine], "o-", color=color, label=scheduling)
        # Steps for the same tokens: what throughput would be at one step cost, whatever the machine's load.
        axes[3].plot(x, [r["steps"] for r in mine], "o-", color=color, label=scheduling)
        for ax, metric in ((axes[1], "ttft"), (axes[2], "e2e")):
            ax.plot(x, [r[f"{metric}_p50_s"] for r in mine], "o-", color=color, label=f"{scheduling} p50")
            ax.plot(x, [r[f"{metric}_p99_s"] for r in mine], "s--", color=color, label=f"{scheduling} p99")
    labels = [_rate_label(r["rate"]) for r in rows if r["scheduling"] == "continuous"]
    ylabels = ("output tokens/s", "time to first token (s)", "end-to-end latency (s)", "steps (same tokens)")
    for ax, ylabel in zip(axes, ylabels, strict=True):
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel("arrivals per second")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    return fig


def _paging(rows: list[dict]):
    fig, axes = _figure(4)
    names = [r["kv_allocation"] for r in rows]
    colors = ["#c63", "#2a7"][: len(rows)]
    axes[0].bar(names, [100 * r["kv_waste_mean"] for r in rows], color=colors)
    axes[0].set_ylabel("KV held but unwritten (%)")
    axes[1].bar(names, [r["most_concurrent_seqs"] for r in rows], color=colors)
    axes[1].set_ylabel("most sequences at once")
    axes[2].bar(names, [r["tokens_per_s"] for r in rows], color=colors)
    axes[2].set_ylabel("output tokens/s")
    axes[3].bar(names, [r["steps"] for r in rows], color=colors)
    axes[3].set_ylabel("steps (same tokens)")
    return fig


def _max_num_seqs(rows: list[dict]):
    fig, axes = _figure(3)
    x = [r["max_num_seqs"] for r in rows]
    axes[0].plot(x, [r["tokens_per_s"] for r in rows], "o-", color="#2a7")
    axes[0].set_ylabel("output tokens/s")
    axes[1].plot(x, [r["e2e_p50_s"] for r in rows], "o-", label="p50")
    axes[1].plot(x, [r["e2e_p99_s"] for r in rows], "s--", label="p99")
    axes[1].set_ylabel("end-to-end latency (s)")
    axes[2].plot(x, [1000 * r["itl_p50_s"] for r in rows], "o-", label="p50")
    axes[2].plot(x, [1000 * r["itl_p99_s"] for r in rows], "s--", label="p99")
    axes[2].set_ylabel("time between tokens (ms)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(n) for n in x])
        ax.set_xlabel("max_num_seqs")
    for ax in axes[1:]:
        ax.legend(fontsize=7)
    return fig


def _max_wait(rows: list[dict]):
    fig, axes = _figure(2)
    x = range(len(rows))
    labels = [str(r["max_wait_ms"]) for r in rows]
    axes[0].plot(x, [1000 * r["lone"]["ttft_p50_s"] for r in rows], "o-", color="#36c")
    axes[0].set_ylabel("lone user: time to first token (ms)")
    axes[1].plot(x, [r["loaded"]["tokens_per_s"] for r in rows], "o-", color="#2a7", label="tokens/s")
    axes[1].set_ylabel("under load: output tokens/s")
    twin = axes[1].twinx()
    twin.plot(x, [r["loaded"]["ttft_p50_s"] for r in rows], "s--", color="#c63", label="ttft p50")
    twin.set_ylabel("under load: time to first token p50 (s)")
    for ax in axes:
        ax.set_xticks(x, labels)
        ax.set_xlabel("max_wait_ms")
    return fig


def _block_size(rows: list[dict]):
    fig, axes = _figure(2)
    x = [r["block_size"] for r in rows]
    axes[0].plot(x, [1000 * r["mean_step_s"] for r in rows], "o-", color="#36c")
    axes[0].set_ylabel("mean step time (ms)")
    axes[1].plot(x, [100 * r["kv_waste_mean"] for r in rows], "o-", color="#c63")
    axes[1].set_ylabel("KV held but unwritten (%)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(n) for n in x])
        ax.set_xlabel("block_size")
    return fig


def _rate_label(rate: float | str) -> str:
    return "all" if isinstance(rate, str) else f"{rate:g}"


def main(argv: list[str] | None = None) -> None:
    """Redraw the charts of an article JSON beside it: python -m benchmarks.article_charts <json>."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("json", type=Path)
    args = parser.parse_args(argv)
    report = json.loads(args.json.read_text())
    tag = args.json.stem.removeprefix("article-")
    for path in draw_all(report["results"], args.json.parent, tag, describe(report)):
        print(f"wrote {path}")


def describe(report: dict) -> str:
    """The charts' subtitle: model, weight dtypes, CPU, threads."""
    dtypes = ",".join((report.get("served") or {}).get("weight_bytes_by_dtype", {})) or "?"
    return f"{report['model']} ({dtypes} weights), {report['cpu']}, {report['torch_threads']} torch threads"


if __name__ == "__main__":
    main()
