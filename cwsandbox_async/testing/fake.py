"""FakeBackend: sandboxes in memory, no processes. For orchestration tests and benchmarks.

Latency comes from seeded distributions (``Latency``) and faults from seeded
probabilities (``Faults``), so a run is reproducible from its seed. Commands are
interpreted by a tiny built-in shell (``true``, ``false``, ``echo``, ``cat``,
``sleep S``, ``exit N``, ``yes``, ``printf``) or by your own ``exec_handler``.

The backend counts what a leak test needs: ``live`` (sandboxes alive or being
created), ``max_live``, ``created``, ``destroyed``, ``exec_in_flight`` and
``max_exec_in_flight``; ``lost`` holds the ids whose destroy an injected fault
dropped (``lost_delete``, ``destroy_hang``, ``destroy_failure``) and that are still
alive, so a test can check that exactly those are left for a sweep.

It reports the facts a verdict is decided on, so verdict logic can be tested
without a kernel: seeded OOM kills (``Faults.oom_kill``: ``returncode=-9``,
``oom_killed``) and starvation (``Faults.starve``: the command waits out its
timeout with little CPU and a measured run-queue wait); an ``exec_handler`` may
also return a whole ``ExecExit`` to report exact CPU, wait and OOM facts. A
request's CPU budget (``ExecRequest.cpu_seconds``) is enforced against the CPU
time reported (``cpu_exceeded``, ``returncode=-9``), and an exclusive request
(``ExecRequest.exclusive``) kills every other exec of its sandbox before it runs
(they end with ``returncode=-9``; ``exclusive_kills`` counts them).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import anyio

from .._errors import (
    SandboxCreationError,
    SandboxFileError,
    SandboxNotFoundError,
    SandboxNotRunningError,
    SandboxTransportError,
)
from .._types import ExecExit, ExecRequest, SandboxDefaults, SandboxInfo, SandboxSpec, SandboxStatus
from ..backends.base import Backend, OutputCallback

__all__ = ["ExecHandler", "FakeBackend", "Faults", "Latency"]

_BUILTINS = frozenset({"true", "false", "echo", "printf", "pwd", "printenv", "cat", "sleep", "exit", "yes", "sh"})

#: What a handler returns: ``(returncode, stdout, stderr)``, or a whole ``ExecExit`` (its own CPU/wait/OOM facts).
HandlerResult: TypeAlias = "tuple[int, bytes, bytes] | ExecExit"
#: ``(argv, stdin, files) -> HandlerResult``, sync or async, for custom commands.
ExecHandler = Callable[[tuple[str, ...], bytes, dict[str, bytes]], "HandlerResult | Awaitable[HandlerResult]"]

#: Share of the wall time a starved exec gets on a CPU, and spends waiting for one (``Faults.starve``).
STARVED_CPU_SHARE = 0.02
STARVED_WAIT_SHARE = 0.9


@dataclass(frozen=True)
class Latency:
    """A latency distribution in seconds, sampled with the backend's seeded RNG."""

    kind: str = "constant"
    a: float = 0.0
    b: float = 0.0

    @classmethod
    def constant(cls, seconds: float) -> Latency:
        return cls("constant", seconds)

    @classmethod
    def uniform(cls, low: float, high: float) -> Latency:
        return cls("uniform", low, high)

    @classmethod
    def lognormal(cls, median: float, p99: float) -> Latency:
        """Lognormal with the given median and 99th percentile (e.g. Kubernetes pod start: 1 s, 5 s)."""
        sigma = math.log(p99 / median) / 2.3263478740408408
        return cls("lognormal", math.log(median), sigma)

    def sample(self, rng: random.Random) -> float:
        if self.kind == "constant":
            return self.a
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b)
        return rng.lognormvariate(self.a, self.b)


@dataclass(frozen=True)
class Faults:
    """Probabilities of injected faults, each drawn per operation from the seeded RNG."""

    create_failure: float = 0.0  # create raises SandboxCreationError
    create_hang: float = 0.0  # create never returns (the caller's deadline must fire)
    exec_transport_error: float = 0.0  # exec raises SandboxTransportError before running
    exec_hang: float = 0.0  # exec never returns
    death_mid_exec: float = 0.0  # the sandbox dies during the exec (SandboxNotRunningError)
    truncated_stream: float = 0.0  # the stream ends without an exit status (SandboxTransportError)
    lost_delete: float = 0.0  # destroy returns but the sandbox lives on (a sweep must find it)
    idle_death: float = 0.0  # after create, the sandbox dies on its own after a short while
    destroy_hang: float = 0.0  # destroy never returns and the sandbox lives on (the caller's deadline must fire)
    destroy_failure: float = 0.0  # destroy raises SandboxTransportError and the sandbox lives on
    oom_kill: float = 0.0  # the kernel kills the command for its memory (returncode -9, oom_killed)
    starve: float = 0.0  # the command gets almost no CPU: it times out, with run-queue wait measured


@dataclass
class _FakeSandbox:
    spec: SandboxSpec
    created_at: float
    files: dict[str, bytes] = field(default_factory=dict)
    alive: bool = True
    ready: bool = False
    #: Execs running now, each with the scope that kills it (an exclusive exec kills the others).
    running: dict[object, anyio.CancelScope] = field(default_factory=dict)
    #: ``id()`` of the backend instance that owns it (its creator, or the last to adopt it).
    owner: int = 0


class FakeBackend(Backend):
    """An in-memory backend with seeded latency and faults. Several instances may share ``world``."""

    name = "fake"
    asyncio_only = False  # anyio only: it runs under trio too

    def __init__(
        self,
        *,
        seed: int = 0,
        create_latency: Latency | None = None,
        exec_latency: Latency | None = None,
        destroy_latency: Latency | None = None,
        faults: Faults | None = None,
        exec_handler: ExecHandler | None = None,
        world: dict[str, _FakeSandbox] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.create_latency = create_latency or Latency()
        self.exec_latency = exec_latency or Latency()
        self.destroy_latency = destroy_latency or Latency()
        self.faults = faults or Faults()
        self.exec_handler = exec_handler
        self.world: dict[str, _FakeSandbox] = {} if world is None else world
        self.created = 0
        self.destroyed = 0
        self.max_live = 0
        self.exec_count = 0
        self.exec_in_flight = 0
        self.max_exec_in_flight = 0
        self.lost: set[str] = set()
        self._own: set[str] = set()  # created here and not destroyed since (``owns``)
        self.exclusive_kills = 0
        self.closed = False

    @property
    def isolation(self) -> str:
        return "none (in-memory fake)"

    @property
    def live(self) -> int:
        """Sandboxes alive or being created in this world."""
        return sum(1 for sb in self.world.values() if sb.alive)

    def _chance(self, p: float) -> bool:
        return p > 0 and self.rng.random() < p

    async def _sleep(self, lat: Latency) -> None:
        delay = lat.sample(self.rng)
        await anyio.sleep(delay)  # 0: a checkpoint, as any real backend call has

    def _get(self, sandbox_id: str) -> _FakeSandbox:
        sb = self.world.get(sandbox_id)
        if sb is None or not sb.alive or not sb.ready:
            raise SandboxNotRunningError(f"sandbox {sandbox_id} is not running", sandbox_id=sandbox_id)
        return sb

    # -- contract --------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> None:
        sb = _FakeSandbox(spec=spec, created_at=time.time(), owner=id(self))
        self.world[spec.sandbox_id] = sb
        self._own.add(spec.sandbox_id)
        self.created += 1
        if len(self.world) > self.max_live:  # else live (at most len(world)) cannot exceed it: skip the count
            self.max_live = max(self.max_live, self.live)
        if self._chance(self.faults.create_hang):
            await anyio.sleep_forever()
        await self._sleep(self.create_latency)
        if self._chance(self.faults.create_failure):
            sb.alive = False
            raise SandboxCreationError("injected create failure", sandbox_id=spec.sandbox_id, reason="injected")
        sb.ready = True
        if self._chance(self.faults.idle_death):
            sb.alive = False

    async def exec(self, sandbox_id: str, request: ExecRequest, on_output: OutputCallback | None = None) -> ExecExit:
        sb = self._get(sandbox_id)
        self.exec_count += 1
        n = self.exec_in_flight = self.exec_in_flight + 1
        if n > self.max_exec_in_flight:
            self.max_exec_in_flight = n
        try:
            return await self._exec(sb, request, on_output)
        finally:
            self.exec_in_flight -= 1

    async def _exec(self, sb: _FakeSandbox, req: ExecRequest, on_output: OutputCallback | None) -> ExecExit:
        sid = sb.spec.sandbox_id
        f = self.faults
        if self._chance(f.exec_transport_error):
            raise SandboxTransportError("injected transport error", sandbox_id=sid)
        if self._chance(f.exec_hang):
            await anyio.sleep_forever()
        start = time.monotonic()
        await self._sleep(self.exec_latency)
        if self._chance(f.death_mid_exec):
            sb.alive = False
            raise SandboxNotRunningError("injected: sandbox died during exec", sandbox_id=sid)
        if self._chance(f.truncated_stream):
            raise SandboxTransportError("injected: stream ended without an exit status", sandbox_id=sid)
        if req.exclusive:
            self._kill_others(sb)
        facts: ExecExit | None = None
        timed_out = False
        rc, out, err = -9, b"", b""
        token = object()
        with anyio.CancelScope() as kill:  # cancelled by a later exclusive exec of this sandbox
            sb.running[token] = kill
            try:
                if self._chance(f.starve):
                    await anyio.sleep(req.timeout_seconds)
                    return self._starved(start)
                with anyio.move_on_after(req.timeout_seconds) as scope:
                    res = await self._interpret(req, sb)
                if scope.cancelled_caught:
                    timed_out = True
                elif isinstance(res, ExecExit):
                    facts, (rc, out, err) = res, (res.returncode, res.stdout, res.stderr)
                else:
                    rc, out, err = res
            finally:
                sb.running.pop(token, None)
        if kill.cancelled_caught:
            return ExecExit(-9, b"", b"", time.monotonic() - start)  # killed by an exclusive exec
        oom = not timed_out and self._chance(f.oom_kill)
        if oom:
            rc, err = -9, b""
        cap = req.max_output_bytes
        truncated = len(out) > cap or len(err) > cap
        if truncated:  # output past the cap is dropped and the command counted as killed
            out, err, rc = out[:cap], err[:cap], -9
        if on_output is not None:
            if out:
                await on_output("stdout", out)
            if err:
                await on_output("stderr", err)
        ex = ExecExit(rc, out, err, time.monotonic() - start, 0.0, timed_out, truncated, oom_killed=oom)
        if facts is not None:
            ex = dataclasses.replace(
                ex,
                cpu_seconds=facts.cpu_seconds,
                oom_killed=oom or facts.oom_killed,
                cpu_exceeded=facts.cpu_exceeded,
                cpu_wait_seconds=facts.cpu_wait_seconds,
                sandbox_cpu_seconds=facts.sandbox_cpu_seconds,
                others_cpu_seconds=facts.others_cpu_seconds,
            )
        budget = req.cpu_seconds
        if budget is not None and ex.cpu_seconds > budget and not ex.timed_out:
            ex = dataclasses.replace(ex, returncode=-9, cpu_seconds=budget, cpu_exceeded=True)
        return ex

    def _kill_others(self, sb: _FakeSandbox) -> None:
        """Before an exclusive exec: kill every other exec of the sandbox."""
        for scope in list(sb.running.values()):
            scope.cancel()
            self.exclusive_kills += 1
        sb.running.clear()

    @staticmethod
    def _starved(start: float) -> ExecExit:
        """A command that got almost no CPU until its timeout, while its processes waited for one."""
        wall = time.monotonic() - start
        cpu = STARVED_CPU_SHARE * wall
        wait = STARVED_WAIT_SHARE * wall
        others = (os.cpu_count() or 1) * wall  # the rest of the machine kept every CPU busy
        return ExecExit(
            -9,
            b"",
            b"",
            wall,
            cpu,
            timed_out=True,
            cpu_wait_seconds=wait,
            sandbox_cpu_seconds=cpu,
            others_cpu_seconds=others,
        )

    async def _interpret(self, req: ExecRequest, sb: _FakeSandbox) -> tuple[int, bytes, bytes] | ExecExit:
        if self.exec_handler is not None:
            res = self.exec_handler(req.argv, req.stdin or b"", sb.files)
            if not isinstance(res, (tuple, ExecExit)):
                res = await res
            return res
        if req.argv[:2] == ("/bin/sh", "-c") or req.argv[:2] == ("sh", "-c"):
            rc, out, err = 0, b"", b""
            for part in req.argv[2].split(";"):
                words = shlex.split(part)
                to_err = bool(words) and words[-1] == ">&2"
                if to_err:
                    words = words[:-1]
                if not words:
                    continue
                rc, o, e = await self._command(tuple(words), req, sb)
                out, err = (out, err + o + e) if to_err else (out + o, err + e)
                if words[0] == "exit":
                    break
            return rc, out, err
        return await self._command(req.argv, req, sb)

    async def _command(self, argv: tuple[str, ...], req: ExecRequest, sb: _FakeSandbox) -> tuple[int, bytes, bytes]:
        """A tiny shell: enough commands for the contract suite and orchestration tests."""
        cmd, args = argv[0], argv[1:]
        if "/" in cmd and cmd.rsplit("/", 1)[-1] not in _BUILTINS:
            return 127, b"", f"{cmd}: No such file or directory\n".encode()
        cmd = cmd.rsplit("/", 1)[-1]
        if cmd == "true":
            return 0, b"", b""
        if cmd == "false":
            return 1, b"", b""
        if cmd == "echo":
            return 0, (" ".join(args) + "\n").encode(), b""
        if cmd == "printf":
            return 0, " ".join(args).encode(), b""
        if cmd == "pwd":
            return 0, (req.cwd + "\n").encode(), b""
        if cmd == "printenv":
            value = req.env.get(args[0]) if args else None
            return (0, (value + "\n").encode(), b"") if value is not None else (1, b"", b"")
        if cmd == "cat":
            if args:
                data = sb.files.get(args[0])
                if data is None:
                    return 1, b"", f"cat: {args[0]}: No such file or directory\n".encode()
                return 0, data, b""
            return 0, req.stdin or b"", b""
        if cmd == "sleep":
            await anyio.sleep(float(args[0]) if args else 0)
            return 0, b"", b""
        if cmd == "exit":
            return int(args[0]) if args else 0, b"", b""
        if cmd == "yes":
            return 0, b"y\n" * (req.max_output_bytes // 2 + 1), b""
        return 127, b"", f"{cmd}: command not found\n".encode()

    async def read_file(self, sandbox_id: str, path: str, max_bytes: int) -> bytes:
        sb = self._get(sandbox_id)
        await self._sleep(self.exec_latency)
        if path not in sb.files:
            raise SandboxFileError(f"no such file: {path}", sandbox_id=sandbox_id, path=path)
        data = sb.files[path]
        if len(data) > max_bytes:
            raise SandboxFileError(f"{path} is larger than {max_bytes} bytes", sandbox_id=sandbox_id, path=path)
        return data

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> None:
        sb = self._get(sandbox_id)
        await self._sleep(self.exec_latency)
        sb.files[path] = data

    async def attach(
        self, sandbox_id: str, defaults: SandboxDefaults, *, session_id: str, adopt: bool = False
    ) -> SandboxDefaults:
        """A sandbox of this world another instance created (``Backend.attach``); ``SandboxNotFoundError``
        for one that is not alive and ready here. ``adopt``: this instance owns it, and its creator's
        ``destroy`` only lets go of it."""
        await self._sleep(self.exec_latency)
        sb = self.world.get(sandbox_id)
        if sb is None or not sb.alive or not sb.ready:
            raise SandboxNotFoundError(f"no sandbox {sandbox_id}", sandbox_id=sandbox_id, infrastructure=False)
        if adopt:
            sb.owner = id(self)
            self._own.add(sandbox_id)
        d = sb.spec.defaults
        return dataclasses.replace(defaults, tags=d.tags, working_dir=d.working_dir, env=dict(d.env))

    async def destroy(self, sandbox_id: str) -> None:
        created_here = sandbox_id in self._own
        self._own.discard(sandbox_id)
        sb = self.world.get(sandbox_id)
        if sb is None or not sb.alive:
            self.world.pop(sandbox_id, None)
            return
        if created_here and sb.owner != id(self):
            return  # another instance adopted it: let go of it
        await self._sleep(self.destroy_latency)
        f = self.faults
        if self._chance(f.lost_delete):
            self.lost.add(sandbox_id)
            return
        if self._chance(f.destroy_hang):
            self.lost.add(sandbox_id)
            await anyio.sleep_forever()
        if self._chance(f.destroy_failure):
            self.lost.add(sandbox_id)
            raise SandboxTransportError("injected destroy failure", sandbox_id=sandbox_id)
        sb.alive = False
        self.world.pop(sandbox_id, None)
        self.lost.discard(sandbox_id)
        self.destroyed += 1

    def owns(self, sandbox_id: str) -> bool:
        return sandbox_id in self._own

    async def status(self, sandbox_id: str) -> SandboxStatus:
        sb = self.world.get(sandbox_id)
        if sb is None or not sb.alive:
            return SandboxStatus.FAILED
        return SandboxStatus.RUNNING if sb.ready else SandboxStatus.CREATING

    async def list(self, tags: Sequence[str] = ()) -> list[SandboxInfo]:
        await anyio.lowlevel.checkpoint()
        wanted = set(tags)
        return [
            SandboxInfo(
                sandbox_id=sid,
                tags=sb.spec.defaults.tags,
                status=SandboxStatus.RUNNING if sb.ready else SandboxStatus.CREATING,
                created_at=sb.created_at,
                session_id=sb.spec.session_id,
                backend=self.name,
            )
            for sid, sb in list(self.world.items())
            if sb.alive and wanted.issubset(sb.spec.defaults.tags)
        ]

    async def aclose(self) -> None:
        self.closed = True
