"""The clients bench_coreweave compares, each run in its own process (so getrusage sees only it).

    python -m benchmarks._coreweave_clients CLIENT URL N_SANDBOXES EXECS_EACH [IN_FLIGHT_PER_SANDBOX [BURSTS]]
    python -m benchmarks._coreweave_clients {calls-ours,calls-sdk} N_SANDBOXES START_DELAY

CLIENT is one of ours, ours-stream, bare, bare-stream, backend, bare-sync-stream, the aio-* rows of
AIO_VARIANTS, grpclib-stream, grpclib-cancel, sdk ("backend": the backend's own ``exec``, wrapper
included, without the Session layers). The first form prints ``{"cpu_seconds", "wall_seconds", "execs",
"user_seconds", "system_seconds"}``: client CPU (user + system, every thread of this process) spent on
``EXECS_EACH`` execs of ``true`` in each of N sandboxes at once, ``IN_FLIGHT_PER_SANDBOX`` (default 1: one
after another) in flight in each, after the sandboxes are running and a warm-up of the same shape;
``BURSTS`` (default 1) such bursts are measured together. The URL is any server of the protocol (the test
server or ``benchmarks/_plain_server``). The second form starts a test server in this process (it counts
calls; no CPU is measured) and prints the calls it received per method during one lifecycle (create,
ready, exec, write, read, destroy) of N sandboxes.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


SNAPSHOTS: list[tuple[float, float]] = []  # (user, system) at each cpu() call: main() reports the last interval's split


#: Execs in flight per sandbox (the optional fifth argument): 1 runs each sandbox's execs one after another.
PARALLEL = 1
#: How many times the measured burst runs (the optional sixth argument): more CPU per sample, less noise.
REPEAT = 1


async def spread(run: Any, targets: Any, each: int, times: int = 1) -> None:
    """``each`` execs per target, ``PARALLEL`` of them in flight per target (each worker runs its share in
    turn); ``times`` such bursts, one after another."""
    share = max(1, each // PARALLEL)
    for _ in range(times):
        await asyncio.gather(*(run(t, share) for t in targets for _ in range(min(PARALLEL, each))))


def cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    SNAPSHOTS.append((ru.ru_utime, ru.ru_stime))
    return ru.ru_utime + ru.ru_stime


async def ours(url: str, n: int, each: int, exec_rpc: str) -> dict[str, float]:
    import cwsandbox_async as cwa

    options = {"base_url": url, "exec_rpc": exec_rpc}
    # pids/tmp_mib are not enforced by the service (the backend warns once): leave them unset here
    defaults = cwa.SandboxDefaults(tags=("bench",), resources=cwa.Resources(pids=None, tmp_mib=None))
    async with cwa.Session(defaults, backend="coreweave", backend_options=options) as s:
        sandboxes = await asyncio.gather(*(s.sandbox() for _ in range(n)))

        async def run(sb: Any, k: int) -> None:
            for _ in range(k):
                r = await sb.exec(["true"])
                assert r.returncode == 0

        await spread(run, sandboxes, 3 * PARALLEL)  # warm-up
        c0, t0 = cpu(), time.perf_counter()
        await spread(run, sandboxes, each, REPEAT)
        c1, t1 = cpu(), time.perf_counter()
    return {"cpu_seconds": c1 - c0, "wall_seconds": t1 - t0, "execs": n * each * REPEAT}


async def bare(url: str, n: int, each: int, rpc: str) -> dict[str, float]:
    """Diagnostic: this library's channel sending the SDK's exec (argv ``true``, no wrapper, no Session
    layers), over unary ``Exec`` or ``StreamExec``, so the server does the same work per exec as for the SDK;
    the difference to ``ours`` is the wrapper's server-side time and the library's layers."""
    import cwsandbox_async as cwa
    from cwsandbox_async._types import ExecRequest
    from cwsandbox_async.backends.coreweave._exec import run_stream, run_unary

    async with cwa.Session(
        cwa.SandboxDefaults(tags=("bench",)), backend="coreweave", backend_options={"base_url": url}
    ) as s:
        sandboxes = await asyncio.gather(*(s.sandbox() for _ in range(n)))
        backend: Any = s.backend
        channel = backend.channel
        ids = [backend._ids[sb.sandbox_id] if rpc != "backend" else sb.sandbox_id for sb in sandboxes]
        request = ExecRequest(("true",), "/", {}, None, 60.0, 1 << 20)

        async def run(service_id: str, k: int) -> None:
            for _ in range(k):
                if rpc == "backend":  # the backend's whole exec (wrapper, judge), no Session layers
                    assert (await backend.exec(service_id, request)).returncode == 0
                    continue
                if rpc == "stream":
                    out = await run_stream(channel, service_id, request, ["true"], 5.0, None)
                else:
                    out = await run_unary(channel, service_id, request, ["true"], 5.0)
                assert out.exit_code == 0, out

        await spread(run, ids, 3 * PARALLEL)
        c0, t0 = cpu(), time.perf_counter()
        await spread(run, ids, each, REPEAT)
        c1, t1 = cpu(), time.perf_counter()
    return {"cpu_seconds": c1 - c0, "wall_seconds": t1 - t0, "execs": n * each * REPEAT}


async def bare_sync(url: str, n: int, each: int) -> dict[str, float]:
    """Diagnostic: the SDK's exec (argv ``true``) over ``StreamExec`` on grpc's sync (C-core, non-aio) stack:
    a separate ``grpc.insecure_channel`` with ``SingleThreadedUnaryStream`` (each call's events are taken
    in the calling thread, no channel spin thread), every exec in a worker thread
    (``loop.run_in_executor``), so the loop wakes once per exec where grpc.aio wakes it per message."""
    import concurrent.futures

    import grpc
    import grpc.experimental
    from cwsandbox._proto import sandbox_pb2 as pb

    import cwsandbox_async as cwa

    defaults = cwa.SandboxDefaults(tags=("bench",), resources=cwa.Resources(pids=None, tmp_mib=None))
    async with cwa.Session(defaults, backend="coreweave", backend_options={"base_url": url}) as s:
        sandboxes = await asyncio.gather(*(s.sandbox() for _ in range(n)))
        backend: Any = s.backend
        ids = [backend._ids[sb.sandbox_id] for sb in sandboxes]
        single = (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)
        channel = grpc.insecure_channel(backend.channel.endpoint.target, options=[("grpc.enable_retries", 0), single])
        call = channel.unary_stream(
            "/coreweave.sandbox.v1.SandboxService/StreamExec",
            request_serializer=pb.ExecStreamRequest.SerializeToString,
            response_deserializer=pb.ExecStreamResponse.FromString,
        )
        metadata = backend.channel.metadata
        pool = concurrent.futures.ThreadPoolExecutor(n)
        loop = asyncio.get_running_loop()

        def one(service_id: str) -> int:
            init = pb.ExecStreamRequest(init=pb.ExecStreamInit(sandbox_id=service_id, command=["true"]))
            responses = call(init, timeout=60, metadata=metadata)
            try:
                for r in responses:
                    if r.WhichOneof("message") == "exit":
                        return int(r.exit.exit_code)
            finally:
                responses.cancel()
            raise RuntimeError("no exit frame")

        async def run(service_id: str, k: int) -> None:
            for _ in range(k):
                assert await loop.run_in_executor(pool, one, service_id) == 0

        await spread(run, ids, 3 * PARALLEL)
        c0, t0 = cpu(), time.perf_counter()
        await spread(run, ids, each, REPEAT)
        c1, t1 = cpu(), time.perf_counter()
        pool.shutdown()
        channel.close()
    return {"cpu_seconds": c1 - c0, "wall_seconds": t1 - t0, "execs": n * each * REPEAT}


STREAM_EXEC = "/coreweave.sandbox.v1.SandboxService/StreamExec"


async def _measured(url: str, n: int, each: int, make: Any) -> dict[str, float]:
    """Start ``n`` sandboxes through this library (its grpc.aio channel, idle afterwards), then
    ``one = await make(target, metadata)`` builds a transport of its own and returns the coroutine
    function ``one(service_id) -> exit code`` (one StreamExec of argv ``true``); 3 warm-up execs in
    each sandbox, then ``each`` sequential ones in each, all sandboxes at once, timed."""
    import cwsandbox_async as cwa

    defaults = cwa.SandboxDefaults(tags=("bench",), resources=cwa.Resources(pids=None, tmp_mib=None))
    async with cwa.Session(defaults, backend="coreweave", backend_options={"base_url": url}) as s:
        sandboxes = await asyncio.gather(*(s.sandbox() for _ in range(n)))
        backend: Any = s.backend
        ids = [backend._ids[sb.sandbox_id] for sb in sandboxes]
        one, close = await make(backend.channel.endpoint.target, backend.channel.metadata)

        async def run(service_id: str, k: int) -> None:
            for _ in range(k):
                assert await one(service_id) == 0  # each call carries its own 60 s deadline

        await spread(run, ids, 3 * PARALLEL)
        c0, t0 = cpu(), time.perf_counter()
        await spread(run, ids, each, REPEAT)
        c1, t1 = cpu(), time.perf_counter()
        await close()
    return {"cpu_seconds": c1 - c0, "wall_seconds": t1 - t0, "execs": n * each * REPEAT}


async def grpclib_stream(url: str, n: int, each: int, cancel: bool) -> dict[str, float]:
    """Diagnostic: the SDK's exec (argv ``true``) over ``StreamExec`` on grpclib (pure-Python asyncio gRPC on
    ``h2``), no generated stubs: ``Channel.request(path, STREAM_STREAM, ExecStreamRequest, ExecStreamResponse)``,
    the init sent with the half-close, messages read up to ``exit``; then the call ends normally (grpclib
    waits for the status trailers) or, with ``cancel``, is reset at once (RST_STREAM, as the backend ends
    its call at ``exit``). Needs grpclib importable (bench_coreweave puts it on PYTHONPATH)."""
    from cwsandbox._proto import sandbox_pb2 as pb
    from grpclib.client import Channel
    from grpclib.const import Cardinality

    async def make(target: str, metadata: Any) -> Any:
        host, _, port = target.rpartition(":")
        channel = Channel(host, int(port))
        Request, Response = pb.ExecStreamRequest, pb.ExecStreamResponse
        md = list(metadata)

        async def one(service_id: str) -> int:
            init = Request(init=pb.ExecStreamInit(sandbox_id=service_id, command=["true"]))
            code: int | None = None
            async with channel.request(
                STREAM_EXEC, Cardinality.STREAM_STREAM, Request, Response, timeout=60, metadata=md
            ) as stream:
                await stream.send_message(init, end=True)
                while (r := await stream.recv_message()) is not None:
                    if r.WhichOneof("message") == "exit":
                        code = int(r.exit.exit_code)
                        if cancel and stream._stream.closable:  # not if the server's stream ended already
                            await stream.cancel()
                        break
            assert code is not None, "no exit frame"
            return code

        async def close() -> None:
            channel.close()

        return one, close

    return await _measured(url, n, each, make)


# grpc.aio channel options tried as bare rows: name -> (channel options, compression off on the call).
# "aio-raw" is grpc's defaults; each other row changes one thing from "aio-noretry" (the backend's
# setting), "aio-tuned" all of them at once.
NO_RETRY = ("grpc.enable_retries", 0)
AIO_VARIANTS: dict[str, tuple[list[tuple[str, Any]], bool]] = {
    "aio-raw": ([], False),
    "aio-noretry": ([NO_RETRY], False),
    "aio-throughput": ([NO_RETRY, ("grpc.optimization_target", "throughput")], False),
    "aio-latency": ([NO_RETRY, ("grpc.optimization_target", "latency")], False),
    "aio-noreuseport": ([NO_RETRY, ("grpc.so_reuseport", 0)], False),
    "aio-nocompress": ([NO_RETRY, ("grpc.default_compression_algorithm", 0)], True),
    "aio-tuned": (
        [
            NO_RETRY,
            ("grpc.optimization_target", "throughput"),
            ("grpc.so_reuseport", 0),
            ("grpc.default_compression_algorithm", 0),
            ("grpc.enable_channelz", 0),
            ("grpc.enable_http_proxy", 0),
        ],
        True,
    ),
}


async def aio_stream(url: str, n: int, each: int, variant: str) -> dict[str, float]:
    """Diagnostic: the SDK's exec (argv ``true``) over ``StreamExec`` on a grpc.aio channel of its own, built
    with the options of ``AIO_VARIANTS[variant]`` (and compression off on each call where it says so), called
    as the backend does (server-streaming multicallable: the init goes with the headers and the half-close),
    read to ``exit``, then cancelled: no library layers at all, so the variants differ only in options."""
    import grpc
    from cwsandbox._proto import sandbox_pb2 as pb

    async def make(target: str, metadata: Any) -> Any:
        options, no_compression = AIO_VARIANTS[variant]
        channel = grpc.aio.insecure_channel(target, options=options)
        call = channel.unary_stream(
            STREAM_EXEC,
            request_serializer=pb.ExecStreamRequest.SerializeToString,
            response_deserializer=pb.ExecStreamResponse.FromString,
        )
        compression = grpc.Compression.NoCompression if no_compression else None

        async def one(service_id: str) -> int:
            init = pb.ExecStreamRequest(init=pb.ExecStreamInit(sandbox_id=service_id, command=["true"]))
            responses = call(init, timeout=60, metadata=metadata, compression=compression)
            try:
                while (r := await responses.read()) is not grpc.aio.EOF:
                    if r.WhichOneof("message") == "exit":
                        return int(r.exit.exit_code)
            finally:
                responses.cancel()
            raise RuntimeError("no exit frame")

        async def close() -> None:
            await channel.close(grace=None)

        return one, close

    return await _measured(url, n, each, make)


async def sdk(url: str, n: int, each: int) -> dict[str, float]:
    os.environ.update(CWSANDBOX_BASE_URL=url, CWSANDBOX_API_KEY="bench", CWSANDBOX_DISABLE_SIGNAL_HANDLERS="1")
    from cwsandbox import SandboxDefaults, Session

    async with Session(SandboxDefaults(container_image="python:3.11", tags=("bench",)), report_to=[]) as s:
        sandboxes = [s.sandbox() for _ in range(n)]
        await asyncio.gather(*(sb for sb in sandboxes))  # start and wait for RUNNING

        async def run(sb: Any, k: int) -> None:
            for _ in range(k):
                r = await sb.exec(["true"], timeout_seconds=60)
                assert r.returncode == 0

        await spread(run, sandboxes, 3 * PARALLEL)
        c0, t0 = cpu(), time.perf_counter()
        await spread(run, sandboxes, each, REPEAT)
        c1, t1 = cpu(), time.perf_counter()
    return {"cpu_seconds": c1 - c0, "wall_seconds": t1 - t0, "execs": n * each * REPEAT}


def _server(start_delay: float) -> Any:
    from cwsandbox_async.testing.coreweave import CoreWeaveTestServer

    server = CoreWeaveTestServer(rpcs="all")
    server.service.faults.start_delay = start_delay
    return server


async def calls_ours(n: int, start_delay: float) -> dict[str, int]:
    import cwsandbox_async as cwa

    async with _server(start_delay) as server:
        async with cwa.Session(backend="coreweave", backend_options={"base_url": server.url}) as s:
            await s.list(["warm-up"])
            server.service.requests.clear()

            async def one() -> None:
                sb = await s.sandbox()  # create + ready
                await sb.exec(["true"])
                await sb.write_file("/workspace/f.txt", b"x" * 1000)
                assert await sb.read_file("/workspace/f.txt") == b"x" * 1000
                await sb.stop()

            await asyncio.gather(*(one() for _ in range(n)))
        return dict(Counter(r.method for r in server.service.requests if "." not in r.method))


async def calls_sdk(n: int, start_delay: float) -> dict[str, int]:
    async with _server(start_delay) as server:
        os.environ.update(CWSANDBOX_BASE_URL=server.url, CWSANDBOX_API_KEY="b", CWSANDBOX_DISABLE_SIGNAL_HANDLERS="1")
        from cwsandbox import SandboxDefaults, Session

        async with Session(SandboxDefaults(container_image="python:3.11"), report_to=[]) as s:

            async def one() -> None:
                sb = s.sandbox()
                await sb  # create + ready
                await sb.exec(["true"], timeout_seconds=60)
                await sb.write_file("/workspace/f.txt", b"x" * 1000)
                assert await sb.read_file("/workspace/f.txt") == b"x" * 1000
                await sb.stop()

            await asyncio.gather(*(one() for _ in range(n)))
        return dict(Counter(r.method for r in server.service.requests if "." not in r.method))


def main() -> None:
    global PARALLEL, REPEAT
    mode, *args = sys.argv[1:]
    if len(args) == 5:
        REPEAT = int(args.pop())
    if len(args) == 4:
        PARALLEL = int(args.pop())
    if mode in ("ours", "ours-stream"):
        out: Any = asyncio.run(ours(args[0], int(args[1]), int(args[2]), "stream" if mode == "ours-stream" else "auto"))
    elif mode in ("bare", "bare-stream", "backend"):
        rpc = {"bare": "unary", "bare-stream": "stream", "backend": "backend"}[mode]
        out = asyncio.run(bare(args[0], int(args[1]), int(args[2]), rpc))
    elif mode == "bare-sync-stream":
        out = asyncio.run(bare_sync(args[0], int(args[1]), int(args[2])))
    elif mode in ("grpclib-stream", "grpclib-cancel"):
        out = asyncio.run(grpclib_stream(args[0], int(args[1]), int(args[2]), mode == "grpclib-cancel"))
    elif mode in AIO_VARIANTS:
        out = asyncio.run(aio_stream(args[0], int(args[1]), int(args[2]), mode))
    elif mode == "sdk":
        out = asyncio.run(sdk(args[0], int(args[1]), int(args[2])))
    elif mode == "calls-ours":
        out = asyncio.run(calls_ours(int(args[0]), float(args[1])))
    elif mode == "calls-sdk":
        out = asyncio.run(calls_sdk(int(args[0]), float(args[1])))
    else:
        raise SystemExit(f"unknown mode {mode}")
    if "cpu_seconds" in out and len(SNAPSHOTS) >= 2:
        (u0, s0), (u1, s1) = SNAPSHOTS[-2:]
        out.update(user_seconds=u1 - u0, system_seconds=s1 - s0)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
