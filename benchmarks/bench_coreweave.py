"""The CoreWeave backend against the test server, next to the unmodified ``cwsandbox`` SDK in the same run.

The test server (``python -m cwsandbox_async.testing.coreweave --rpcs all``) runs in its own process on 127.0.0.1 and
serves the real protocol over real local sandboxes; every client runs in a process of
its own (``benchmarks/_coreweave_clients.py``), so ``getrusage`` counts only that
client (user + system CPU, all its threads: the SDK's loop thread and grpc's poller).

1. Client CPU per exec of ``true``: 192 execs over 8 sandboxes (24 sequential execs in
   each, the 8 at once), after start-up and a warm-up. This library on its default path
   (unary ``Exec``, where the service serves it) and forced onto ``StreamExec`` (the RPC
   the SDK uses, and what the default falls back to when ``Exec`` is UNIMPLEMENTED),
   against the SDK (``await sb.exec``, its ``StreamExec``). Rounds alternate between the
   clients (each round starts one row later, so no row always follows the same one); the figures
   are medians. Target: <= 0.5x the SDK, on each RPC. Two diagnostic
   rows ("bare", "bare-stream") send the SDK's exec (argv ``true``, without this library's
   in-sandbox wrapper or its Session layers) through this library's channel on each RPC,
   so the server does the same work as for the SDK: client CPU grows with the server's
   latency (fewer completions share a wake-up), and the wrapper's ``sh`` and ``timeout``
   processes add latency, more so on a loaded machine. "bare-stream" is what grpc.aio's
   streaming call itself costs here: ready, exit and status each complete separately.
   "bare-sync-stream" is the same exec on grpc's sync (C-core) stack in worker threads
   (a tried alternative to grpc.aio: the loop wakes once per exec, the messages are taken
   in the worker; it costs about the same).
   Transport rows, all the SDK's bare exec (argv ``true``) on ``StreamExec`` over a transport of
   their own (the sandboxes started through this library): "aio-raw" (a plain grpc.aio channel
   with grpc's defaults, the backend's call shape, no library code at all), "aio-noretry"
   (``grpc.enable_retries=0``, as the backend sets), and from there one option each:
   "aio-throughput" / "aio-latency" (``grpc.optimization_target``), "aio-noreuseport"
   (``grpc.so_reuseport=0``), "aio-nocompress" (compression off on the channel and the call), and
   "aio-tuned" (all of those, channelz and the proxy lookup off); "grpclib-stream" and
   "grpclib-cancel" (grpclib, the pure-Python asyncio gRPC client on ``h2``: waiting for the
   status trailers, or reset at ``exit`` as the backend does). The grpclib rows run only when
   grpclib is importable (not a dependency: put it on PYTHONPATH, e.g. ``pip install --target
   /tmp/grpclib_pkgs grpclib`` and ``PYTHONPATH=/tmp/grpclib_pkgs``), else they are skipped with
   the reason printed. "grpclib full-path estimate" adds to grpclib-cancel what this library's
   wrapper and layers cost on grpc.aio in the same run (ours-stream minus bare-stream): what the
   ``StreamExec`` path might cost on grpclib, not a measurement of one.
2. API calls per sandbox lifecycle (create, ready, exec, write, read, destroy) of 8
   sandboxes at once with a 1 s start (CREATING -> RUNNING), counted by the server:
   this library (readiness from one ListSandboxes per round for all) against the SDK
   (GetSandbox polling per sandbox, and polling after its delete).

Writes benchmarks/out/coreweave.json and benchmarks/img/coreweave.png.

    python -m benchmarks.bench_coreweave [--quick]
    PYTHONPATH=/tmp/grpclib_pkgs python -m benchmarks.bench_coreweave   # with the grpclib rows
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from ._common import parse_args, write_json

ROOT = Path(__file__).resolve().parent.parent
CORE = ("ours", "ours-stream", "bare", "bare-stream", "bare-sync-stream")
AIO = ("aio-raw", "aio-noretry", "aio-throughput", "aio-latency", "aio-noreuseport", "aio-nocompress", "aio-tuned")
GRPCLIB = ("grpclib-stream", "grpclib-cancel")


def clients() -> tuple[tuple[str, ...], str | None]:
    """The rows to run, and why the grpclib rows are skipped (None when they run)."""
    if importlib.util.find_spec("grpclib") is None:
        return (*CORE, *AIO, "sdk"), "grpclib is not importable (pip install --target DIR grpclib; PYTHONPATH=DIR)"
    return (*CORE, *AIO, *GRPCLIB, "sdk"), None


def start_server() -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "cwsandbox_async.testing.coreweave", "--rpcs", "all", "--until-stdin-closes"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit("the test server did not start")
    return proc, url


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


def cpu_per_exec(url: str, rounds: int, sandboxes: int, each: int, names: tuple[str, ...]) -> dict[str, Any]:
    samples: dict[str, list[float]] = {c: [] for c in names}
    walls: dict[str, list[float]] = {c: [] for c in names}
    system: dict[str, list[float]] = {c: [] for c in names}
    for k in range(rounds):
        for name in names[k % len(names) :] + names[: k % len(names)]:  # each round starts one row later
            r = client(name, url, str(sandboxes), str(each))
            samples[name].append(r["cpu_seconds"] / r["execs"] * 1e3)
            system[name].append(r["system_seconds"] / r["execs"] * 1e3)
            walls[name].append(r["wall_seconds"] / each * 1e3)
    med = {c: statistics.median(v) for c, v in samples.items()}
    layers = med["ours-stream"] - med["bare-stream"]  # the wrapper and this library's layers, on grpc.aio
    estimate = med["grpclib-cancel"] + layers if "grpclib-cancel" in med else None
    return {
        "execs_per_round": sandboxes * each,
        "rounds": rounds,
        "cpu_ms_per_exec": med,
        "cpu_ms_samples": samples,
        "system_cpu_ms_per_exec": {c: statistics.median(v) for c, v in system.items()},  # of the total, in the kernel
        "wall_ms_per_sequential_exec": {c: statistics.median(v) for c, v in walls.items()},
        "ratio_ours_to_sdk": med["ours"] / med["sdk"],
        "ratio_stream_to_sdk": med["ours-stream"] / med["sdk"],
        "ratio_unary_to_stream": med["ours"] / med["ours-stream"],
        "ratio_bare_to_sdk": med["bare"] / med["sdk"],
        "ratio_bare_stream_to_sdk": med["bare-stream"] / med["sdk"],
        "ratio_bare_sync_stream_to_sdk": med["bare-sync-stream"] / med["sdk"],
        "ratio_to_sdk": {c: v / med["sdk"] for c, v in med.items()},
        "library_layers_ms_on_stream": layers,
        "grpclib_full_path_estimate_ms": estimate,
        "ratio_grpclib_full_path_estimate_to_sdk": None if estimate is None else estimate / med["sdk"],
    }


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
    cpu = data["cpu"]["cpu_ms_per_exec"]
    names = list(cpu)
    colours = [
        "C0" if c.startswith("ours") else "C3" if c == "sdk" else "C2" if "grpclib" in c else "C7" for c in names
    ]
    a.bar(names, [cpu[c] for c in names], color=colours)
    a.tick_params(axis="x", labelsize=7, labelrotation=35)
    a.axhline(cpu["sdk"] * 0.5, color="k", linestyle="--", linewidth=1, label="target: 0.5x SDK")
    a.legend(fontsize=8)
    a.set_ylabel("client CPU per exec of `true` (ms)")
    a.set_title(f"192 execs over 8 sandboxes (median of {data['cpu']['rounds']})")
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


def main() -> None:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    rounds = 1 if args.quick else 5
    names, skipped = clients()
    if skipped:
        print("grpclib rows skipped:", skipped)
    server, url = start_server()
    try:
        cpu = cpu_per_exec(url, rounds, 8, 24, names)
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=60)
    calls = lifecycle_calls(8, 1.0)
    data = {"cpu": cpu, "calls": calls, "load": os.getloadavg(), "grpclib_skipped": skipped}
    data["headline"] = {
        "cpu_ratio_ours_to_sdk": round(cpu["ratio_ours_to_sdk"], 3),
        "cpu_ms_per_exec_ours": round(cpu["cpu_ms_per_exec"]["ours"], 3),
        "cpu_ms_per_exec_sdk": round(cpu["cpu_ms_per_exec"]["sdk"], 3),
        "cpu_ratio_stream_to_sdk": round(cpu["ratio_stream_to_sdk"], 3),
        "cpu_ms_per_exec_ours_stream": round(cpu["cpu_ms_per_exec"]["ours-stream"], 3),
        "cpu_ratio_bare_to_sdk": round(cpu["ratio_bare_to_sdk"], 3),
        "cpu_ratio_bare_stream_to_sdk": round(cpu["ratio_bare_stream_to_sdk"], 3),
        "cpu_ratio_bare_sync_stream_to_sdk": round(cpu["ratio_bare_sync_stream_to_sdk"], 3),
        "cpu_ratio_to_sdk": {c: round(v, 3) for c, v in cpu["ratio_to_sdk"].items()},
        "cpu_ratio_grpclib_full_path_estimate_to_sdk": cpu["ratio_grpclib_full_path_estimate_to_sdk"],
        "calls_per_lifecycle_ours": calls["ours_total_per_sandbox"],
        "calls_per_lifecycle_sdk": calls["sdk_total_per_sandbox"],
    }
    write_json("coreweave", data)
    chart(data)
    print(json.dumps(data["headline"], indent=2))
    print("cpu ms/exec:", {k: round(v, 3) for k, v in cpu["cpu_ms_per_exec"].items()})
    print("calls per sandbox, ours:", calls["ours_per_sandbox"])
    print("calls per sandbox, sdk: ", calls["sdk_per_sandbox"])
    print("of which system (kernel) ms/exec:", {k: round(v, 3) for k, v in cpu["system_cpu_ms_per_exec"].items()})
    print("cpu ms/exec samples:", {k: [round(x, 3) for x in v] for k, v in cpu["cpu_ms_samples"].items()})
    print("load average:", data["load"])


if __name__ == "__main__":
    main()
