"""The CoreWeave backend against two servers, next to the unmodified ``cwsandbox`` SDK in the same run.

Every server runs in its own process on 127.0.0.1 and every client in a process of its own
(``benchmarks/_coreweave_clients.py``), so ``getrusage`` counts only that client, the driver (user +
system CPU, all its threads: the SDK's loop thread and grpc's poller included).

The two servers:

- "test": the project's test server (``python -m cwsandbox_async.testing.coreweave --rpcs sdk``): the
  real protocol over real local sandboxes, serving only the RPCs the SDK calls (no unary ``Exec``, so
  this library's default path is ``StreamExec``, as on the service).
- "plain": ``benchmarks/_plain_server.py``, an independent implementation that shares no code with the
  project (only ``grpc`` and the ``cwsandbox`` wheel's protocol modules): the SDK's RPCs over in-memory
  records, every ``StreamExec`` answered at once with ready, one output frame, exit, then its status.
  It favours neither client: no command runs, so the in-sandbox wrapper costs nothing there.

1. Driver CPU per exec of ``true``, warm: 192 execs over 8 sandboxes, at 8 in flight (each sandbox runs
   its 24 one after another) and at 192 in flight (all at once), after start-up and a warm-up of the
   same shape; each client process measures 3 such bursts together (``BURSTS``). Rows: "ours"
   (``Sandbox.exec`` through a Session, the default ``exec_rpc="auto"``: ``StreamExec`` once the
   service has answered UNIMPLEMENTED to one ``Exec``), "sdk" (``await sb.exec``, its ``StreamExec``),
   and a diagnostic "bare-stream" (this library's channel sending the SDK's exec, argv ``true``, with
   no wrapper and no Session layers: grpc.aio's own streaming call). Each cell (server x in-flight)
   runs its rows in turn, the order reversed every round (A B B A), the cells interleaved; figures are
   medians of the rounds and each ratio compares rows of the same cell in the same run. Target
   (issue 42): ours <= 0.8x the SDK in every cell.
2. API calls per sandbox lifecycle (create, ready, exec, write, read, destroy) of 8 sandboxes at once
   with a 1 s start (CREATING -> RUNNING), counted by a test server in the client's process: this
   library (readiness from one ListSandboxes per round for all) against the SDK (GetSandbox polling).
3. ``--transports``: the older issue-26 table (test server with ``--rpcs all``, 8 in flight): unary
   ``Exec``, the grpc.aio option rows, grpc's sync stack and grpclib (when importable: ``pip install
   --target /tmp/grpclib_pkgs grpclib`` and ``PYTHONPATH=/tmp/grpclib_pkgs``), next to the SDK.

Writes benchmarks/out/coreweave.json and benchmarks/img/coreweave.png.

    python -m benchmarks.bench_coreweave [--quick] [--rounds N] [--transports]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ._common import write_json

ROOT = Path(__file__).resolve().parent.parent
#: server name -> the argv that serves it (each prints its URL first, stops when its stdin closes)
SERVERS = {
    "test": [sys.executable, "-m", "cwsandbox_async.testing.coreweave", "--rpcs", "sdk", "--until-stdin-closes"],
    "plain": [sys.executable, "-m", "benchmarks._plain_server"],
}
#: execs in flight -> execs in flight per sandbox (8 sandboxes, 24 execs each)
IN_FLIGHT = {8: 1, 192: 24}
SANDBOXES, EACH = 8, 24
#: bursts of 192 measured together in each client process (one burst is ~0.1 s of CPU: too short to
#: stand out of a loaded machine's noise)
BURSTS = 3
ROWS = ("ours", "bare-stream", "sdk")
TARGET = 0.8
CORE = ("ours", "ours-stream", "bare", "bare-stream", "bare-sync-stream")
AIO = ("aio-raw", "aio-noretry", "aio-throughput", "aio-latency", "aio-noreuseport", "aio-nocompress", "aio-tuned")
GRPCLIB = ("grpclib-stream", "grpclib-cancel")


def transport_rows() -> tuple[tuple[str, ...], str | None]:
    """The ``--transports`` rows, and why the grpclib rows are skipped (None when they run)."""
    if importlib.util.find_spec("grpclib") is None:
        return (*CORE, *AIO, "sdk"), "grpclib is not importable (pip install --target DIR grpclib; PYTHONPATH=DIR)"
    return (*CORE, *AIO, *GRPCLIB, "sdk"), None


def start_server(argv: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit(f"the server did not start: {argv}")
    return proc, url


def stop_server(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def client(*args: str) -> dict[str, Any]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks._coreweave_clients", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"client {args[0]} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def per_exec(r: dict[str, Any]) -> tuple[float, float]:
    """(CPU, of which kernel) in ms per exec."""
    return r["cpu_seconds"] / r["execs"] * 1e3, r["system_seconds"] / r["execs"] * 1e3


def matrix(urls: dict[str, str], rounds: int) -> dict[str, Any]:
    """Driver CPU per exec for every server x in-flight cell, rows A B B A, cells interleaved."""
    cells = [(server, flight) for server in urls for flight in IN_FLIGHT]
    samples: dict[str, dict[str, list[float]]] = {f"{s}/{f}": {r: [] for r in ROWS} for s, f in cells}
    kernel: dict[str, dict[str, list[float]]] = {f"{s}/{f}": {r: [] for r in ROWS} for s, f in cells}
    walls: dict[str, dict[str, list[float]]] = {f"{s}/{f}": {r: [] for r in ROWS} for s, f in cells}
    loads = []
    for k in range(rounds):
        order = ROWS if k % 2 == 0 else ROWS[::-1]
        for server, flight in cells:
            cell = f"{server}/{flight}"
            for row in order:
                loads.append(os.getloadavg()[0])
                r = client(row, urls[server], str(SANDBOXES), str(EACH), str(IN_FLIGHT[flight]), str(BURSTS))
                cpu, sys_ = per_exec(r)
                samples[cell][row].append(cpu)
                kernel[cell][row].append(sys_)
                walls[cell][row].append(r["wall_seconds"] / r["execs"] * flight * 1e3)  # per exec, start to end
    out: dict[str, Any] = {}
    for cell, rows in samples.items():
        med = {r: statistics.median(v) for r, v in rows.items()}
        # a ratio per round too (rows of one round ran minutes apart at most): its spread says how firm the median is
        per_round = [o / s for o, s in zip(rows["ours"], rows["sdk"], strict=True)]
        out[cell] = {
            "cpu_ms_per_exec": med,
            "kernel_ms_per_exec": {r: statistics.median(v) for r, v in kernel[cell].items()},
            # how long one exec took, start to end (the server's latency plus the client's)
            "wall_ms_per_exec": {r: statistics.median(v) for r, v in walls[cell].items()},
            "samples_ms": rows,
            "ratio_ours_to_sdk": med["ours"] / med["sdk"],
            "ratio_bare_stream_to_sdk": med["bare-stream"] / med["sdk"],
            "ratio_ours_to_sdk_per_round": per_round,
            "meets_target": med["ours"] / med["sdk"] <= TARGET,
        }
    return {"cells": out, "rounds": rounds, "load_1min": {"min": min(loads), "max": max(loads)}}


def transports(url: str, rounds: int, names: tuple[str, ...]) -> dict[str, Any]:
    """The issue-26 table (test server with unary Exec, 8 in flight), rounds starting one row later each."""
    samples: dict[str, list[float]] = {c: [] for c in names}
    for k in range(rounds):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            samples[name].append(per_exec(client(name, url, str(SANDBOXES), str(EACH)))[0])
    med = {c: statistics.median(v) for c, v in samples.items()}
    return {"cpu_ms_per_exec": med, "samples_ms": samples, "ratio_to_sdk": {c: v / med["sdk"] for c, v in med.items()}}


def lifecycle_calls(sandboxes: int, start_delay: float) -> dict[str, Any]:
    ours = client("calls-ours", str(sandboxes), str(start_delay))
    sdk = client("calls-sdk", str(sandboxes), str(start_delay))
    return {
        "sandboxes": sandboxes,
        "start_delay_seconds": start_delay,
        "ours_per_sandbox": {k: v / sandboxes for k, v in sorted(ours.items())},
        "sdk_per_sandbox": {k: v / sandboxes for k, v in sorted(sdk.items())},
        "ours_total_per_sandbox": sum(ours.values()) / sandboxes,
        "sdk_total_per_sandbox": sum(sdk.values()) / sandboxes,
    }


def chart(data: dict[str, Any]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 4.2), gridspec_kw={"width_ratios": [2.2, 1]})
    cells = data["cpu"]["cells"]
    names = list(cells)
    width = 0.27
    for i, (row, colour) in enumerate((("ours", "C0"), ("bare-stream", "C7"), ("sdk", "C3"))):
        xs = [j + (i - 1) * width for j in range(len(names))]
        a.bar(xs, [cells[c]["cpu_ms_per_exec"][row] for c in names], width, color=colour, label=row)
    a.set_xticks(range(len(names)), [f"{c.split('/')[0]} server, {c.split('/')[1]} in flight" for c in names])
    a.tick_params(axis="x", labelsize=8)
    a.legend(fontsize=8)
    a.set_ylabel("driver CPU per exec of `true` (ms)")
    a.set_title(f"192 execs over 8 sandboxes, warm (median of {data['cpu']['rounds']} rounds)")
    calls = data["calls"]
    a_ours, a_sdk = calls["ours_per_sandbox"], calls["sdk_per_sandbox"]
    methods = sorted(set(a_ours) | set(a_sdk))
    bottom_o = bottom_s = 0.0
    for m in methods:
        o, s = a_ours.get(m, 0.0), a_sdk.get(m, 0.0)
        b.bar(["cwsandbox_async", "cwsandbox SDK"], [o, s], bottom=[bottom_o, bottom_s], label=m)
        bottom_o, bottom_s = bottom_o + o, bottom_s + s
    b.set_ylabel("API calls per sandbox lifecycle")
    b.set_title(f"create..destroy, {calls['sandboxes']} at once, {calls['start_delay_seconds']:g} s start")
    b.legend(fontsize=7)
    fig.tight_layout()
    path = ROOT / "benchmarks" / "img" / "coreweave.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, no lifecycle count")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per cell (even: A B B A), default 4")
    parser.add_argument("--transports", action="store_true", help="also the issue-26 transport table")
    return parser.parse_args()


def main() -> None:
    args = parse()
    rounds = 2 if args.quick else args.rounds
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    servers = {name: start_server(argv) for name, argv in SERVERS.items()}
    try:
        cpu = matrix({name: url for name, (_, url) in servers.items()}, rounds)
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    data: dict[str, Any] = {"started": started, "cpu": cpu, "load_after": os.getloadavg()}
    if args.transports:
        names, skipped = transport_rows()
        if skipped:
            print("grpclib rows skipped:", skipped)
        proc, url = start_server([*SERVERS["test"][:4], "all", "--until-stdin-closes"])
        try:
            data["transports"] = transports(url, rounds, names)
        finally:
            stop_server(proc)
    if not args.quick:
        data["calls"] = lifecycle_calls(8, 1.0)
    cells = cpu["cells"]
    data["headline"] = {
        cell: {
            "ours_ms": round(c["cpu_ms_per_exec"]["ours"], 3),
            "sdk_ms": round(c["cpu_ms_per_exec"]["sdk"], 3),
            "bare_stream_ms": round(c["cpu_ms_per_exec"]["bare-stream"], 3),
            "ratio_ours_to_sdk": round(c["ratio_ours_to_sdk"], 3),
            "meets_target": c["meets_target"],
        }
        for cell, c in cells.items()
    }
    write_json("coreweave", data)
    if "calls" in data:
        chart(data)
    print(json.dumps(data["headline"], indent=2))
    for cell, c in cells.items():
        print(cell, "samples ms:", {r: [round(x, 3) for x in v] for r, v in c["samples_ms"].items()})
    print("load (1 min) during the runs:", cpu["load_1min"], "after:", data["load_after"])
    if "transports" in data:
        print("transports ms/exec:", {k: round(v, 3) for k, v in data["transports"]["cpu_ms_per_exec"].items()})
    if "calls" in data:
        print("calls per sandbox, ours:", data["calls"]["ours_per_sandbox"])
        print("calls per sandbox, sdk: ", data["calls"]["sdk_per_sandbox"])


if __name__ == "__main__":
    main()
