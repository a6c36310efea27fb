"""Doctor probes for the hardening a local sandbox gets at birth, each an attack run inside one.

``hardening_checks(sandbox)`` returns one ``(name, status, detail, probe)`` per claim, for the
local backend's ``_doctor`` to add to its section:

- **seccomp filter**: mode 2 in ``/proc/self/status``; ``keyctl``, ``ptrace`` of its own child,
  ``unshare(CLONE_NEWUSER)``, ``mount`` and ``process_vm_readv`` fail with EPERM; fork still works;
- **fresh session keyring**: the driver's session keyring is not among the keys the sandbox sees;
- **SysV IPC bounded**: the IPC sysctls hold ``agent.harden.IPC_LIMITS``, cannot be written, and
  ``/proc/sys`` is mounted read-only;
- **read-only empty HOME**: ``HOME`` is ``agent.harden.HOME``, exists, is empty and not writable, and
  the Python user site is off;
- **clean run_python memory**: a marker planted by earlier requests (a file, an exec's environment)
  is not in the memory of a later ``run_python`` program, which does find a control marker;
- **timeout holds against its supervisor**: a command that stops and kills the sandbox's PID 1 (the
  process enforcing its timeout) and stops itself still ends at its timeout, and the next exec runs;
- **supervisor out of reach**: a command's ``prlimit`` of PID 1's limits, ``setpriority`` and
  ``sched_setaffinity`` of PID 1, and ``SIGSTOP`` to its own child fail with EPERM, an ``AF_VSOCK``
  socket with EAFNOSUPPORT, ``io_setup`` with ENOSYS, and the sandbox's own inotify bound
  (``agent.harden.USER_LIMITS``), pending-signal and file limits (``agent._birth.SIGPENDING``,
  ``files_bound``), pty bound (``agent._birth.PTYS``) and POSIX message queues' default message size
  (``agent._birth.MQ_MSGSIZE_DEFAULT``) are in place.

A probe never raises for a protection that does not hold (that is a ``FAIL``); an exception escaping
a sandbox call propagates to the doctor, which reports the probe itself as failed.
"""

from __future__ import annotations

import ctypes
import errno
import json
import platform
import resource
import time
import uuid
from typing import Any

from ..._errors import SandboxTimeoutError
from ..probes import FAIL, OK, WARN, Status
from .agent import _birth, harden, seccomp

__all__ = ["hardening_checks"]

Check = tuple[str, Status, str, str]

_MACHINE = platform.machine()
_COL = 0 if _MACHINE == "x86_64" else 1

SECCOMP_PROBE = """
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = json.loads(sys.argv[1])
def call(n, *args):
    rc = libc.syscall(ctypes.c_long(n), *[ctypes.c_long(a) for a in args])
    return 0 if rc >= 0 else ctypes.get_errno()
out = {}
kid = os.fork()
if kid == 0:
    time.sleep(5)
    os._exit(0)
out["ptrace"] = call(nr["ptrace"], 0x4206, kid, 0, 0)
os.kill(kid, 9)
os.waitpid(kid, 0)
out["keyctl"] = call(nr["keyctl"], 0, -3, 0)
out["unshare"] = call(nr["unshare"], 0x10000000)
out["mount"] = call(nr["mount"], 0, 0, 0, 0, 0)
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
out["process_vm_readv"] = call(nr["process_vm_readv"], os.getpid(), ctypes.addressof(iov), 1,
                               ctypes.addressof(iov), 1, 0)
with open("/proc/self/status") as f:
    out["mode"] = [int(line.split()[1]) for line in f if line.startswith("Seccomp:")][0]
print(json.dumps(out))
"""
SCAN_PROBE = """
import os, re, sys
needle = sys.argv[1].encode()
found = set()
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if "r" not in parts[1] or (len(parts) > 5 and parts[5].startswith("/") and "w" not in parts[1]):
            continue
        try:
            data = os.pread(mem.fileno(), hi - lo, lo)
        except OSError:
            continue
        found.update(m.group(1).decode() for m in re.finditer(re.escape(needle) + rb"([0-9a-f]{16})", data))
print(" ".join(sorted(found)))
"""


async def _seccomp(sb: Any) -> Check:
    how = "keyctl, ptrace of its own child, unshare(CLONE_NEWUSER), mount, process_vm_readv from inside"
    if _MACHINE not in seccomp.AUDIT_ARCH:
        return "seccomp filter", WARN, f"no filter for {_MACHINE}: only namespaces and capabilities apply", how
    names = ("ptrace", "keyctl", "mount", "process_vm_readv")
    nrs = {n: seccomp.DENIED[n][_COL] for n in names} | {"unshare": seccomp.UNSHARE[_COL]}
    r = await sb.exec(["python3", "-I", "-c", SECCOMP_PROBE, json.dumps(nrs)], timeout_seconds=30)
    try:
        out = json.loads(r.stdout)
    except ValueError:
        return "seccomp filter", FAIL, f"the probe did not run: {r.stderr.strip()[-200:]}", how
    mode = out.pop("mode")
    allowed = sorted(name for name, e in out.items() if e != errno.EPERM)
    if mode != 2 or allowed:
        return "seccomp filter", FAIL, f"seccomp mode {mode}; not denied: {', '.join(allowed) or 'none'}", how
    return "seccomp filter", OK, f"installed (mode 2); denied with EPERM: {', '.join(sorted(out))}", how


def _driver_keyring() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.syscall(seccomp.DENIED["keyctl"][_COL], 0, -3, 1))  # KEYCTL_GET_KEYRING_ID, @s, create


async def _keyring(sb: Any) -> Check:
    how = "compare the driver's session keyring with /proc/keys inside"
    mine = _driver_keyring()
    if mine < 0:
        return "fresh session keyring", WARN, "this kernel has no session keyrings", how
    r = await sb.exec(["cat", "/proc/keys"])
    serials = {line.split()[0] for line in r.stdout.splitlines() if line.strip()}
    if f"{mine:08x}" in serials:
        return "fresh session keyring", FAIL, f"the driver's session keyring {mine:08x} is reachable inside", how
    return "fresh session keyring", OK, "the sandbox has its own session keyring, not the driver's", how


async def _ipc(sb: Any) -> Check:
    how = "read and try to write /proc/sys/kernel IPC sysctls; look for a read-only /proc/sys mount"
    names = " ".join(harden.IPC_LIMITS)
    script = (
        f"cd /proc/sys/kernel && for n in {names}; do printf '%s=' $n; tr '\\t' ' ' < $n; done; "
        "(echo 0 > shm_rmid_forced) 2>/dev/null && echo WRITABLE; grep ' /proc/sys ' /proc/self/mountinfo; true"
    )
    r = await sb.exec(["sh", "-c", script])
    values = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    wrong = sorted(k for k, v in harden.IPC_LIMITS.items() if values.get(k, "").strip() != v)
    ro = any(" /proc/sys " in line and "ro" in line.split()[5].split(",") for line in r.stdout.splitlines())
    if wrong or "WRITABLE" in r.stdout or not ro:
        detail = f"unbounded: {', '.join(wrong) or 'none'}; writable: {'WRITABLE' in r.stdout}; /proc/sys ro: {ro}"
        return "SysV IPC bounded", FAIL, detail, how
    shm = int(harden.IPC_LIMITS["shmall"]) * 4096 >> 20
    return "SysV IPC bounded", OK, f"shm_rmid_forced=1, shm <= {shm} MiB; /proc/sys read-only", how


async def _home(sb: Any) -> Check:
    how = "inspect $HOME, try to write to it, ask Python whether the user site is enabled"
    script = 'echo "$HOME|$PYTHONNOUSERSITE|$(ls -A "$HOME" | wc -l)"; [ -d "$HOME" ] && [ ! -w "$HOME" ] && echo ro'
    r = await sb.exec(["sh", "-c", script])
    site = await sb.exec(["python3", "-c", "import site; print(site.ENABLE_USER_SITE)"])
    lines = r.stdout.split()
    home, flag, count = [*lines[0].split("|"), "", "", ""][:3] if lines else ["", "", ""]
    ok = home == harden.HOME and flag == "1" and count == "0" and "ro" in lines and site.stdout.strip() == "False"
    detail = f"HOME={home} empty={count == '0'} read-only={'ro' in lines}; user site: {site.stdout.strip()}"
    return "read-only empty HOME", OK if ok else FAIL, detail, how


async def _memory(sb: Any) -> Check:
    how = "plant markers (a file, an exec's environment), then scan a run_python program's own memory"
    prefix = "cwsdoc" + uuid.uuid4().hex[:6] + "-"
    planted = {uuid.uuid4().hex[:16] for _ in range(3)}
    a, b, control = sorted(planted)
    planted.discard(control)
    await sb.write_file("/tmp/.cwsandbox-doctor", " ".join([prefix + a] * 500).encode())
    await sb.exec(["sh", "-c", "rm -f /tmp/.cwsandbox-doctor"], env={"SECRET": " ".join([prefix + b] * 500)})
    source = f"import sys\nsys.argv[1:] = [{prefix!r}]\n" + SCAN_PROBE
    r = await sb.run_python(source, env={"CONTROL": prefix + control}, timeout_seconds=60)
    found = set(r.stdout.split())
    if control not in found:
        return "clean run_python memory", FAIL, f"the scan did not work: {r.stderr.strip()[-200:]}", how
    if found & planted:
        return "clean run_python memory", FAIL, "an earlier request's data is in a run_python program's memory", how
    return "clean run_python memory", OK, "no earlier request's data found (the control marker was)", how


async def _supervisor(sb: Any) -> Check:
    how = "a command stops and kills its supervisor (PID 1) and stops itself, 1 s timeout; then the next exec"
    start = time.monotonic()
    try:
        r = await sb.exec("kill -STOP 1; kill -KILL 1; kill -STOP $$; sleep 30", timeout_seconds=1)
        ended = f"ended by itself with {r.returncode}"
    except SandboxTimeoutError:
        ended = "timed out"
    took = time.monotonic() - start
    nxt = await sb.exec(["echo", "next"], timeout_seconds=5)
    ok = ended == "timed out" and took < 5 and nxt.stdout == "next\n"
    detail = f"{ended} after {took:.2f} s; next exec: {nxt.stdout.strip() or nxt.returncode}"
    return "timeout holds against its supervisor", OK if ok else FAIL, detail, how


REACH_PROBE = """
import ctypes, errno, json, os, resource, signal, socket, sys, time
IO_SETUP = int(sys.argv[1])
out = {}
def attempt(name, f):
    try:
        f()
        out[name] = "ok"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
hard = resource.prlimit(1, resource.RLIMIT_NOFILE)[1]
attempt("prlimit", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (3, hard)))
attempt("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19))
attempt("sched_setaffinity", lambda: os.sched_setaffinity(1, {min(os.sched_getaffinity(0))}))
attempt("vsock", lambda: socket.socket(40, socket.SOCK_STREAM).close())
kid = os.fork()
if kid == 0:
    time.sleep(30)
    os._exit(0)
attempt("stop a process", lambda: os.kill(kid, signal.SIGSTOP))
os.kill(kid, signal.SIGKILL)
os.waitpid(kid, 0)
with open("/proc/sys/user/max_inotify_instances") as f:
    out["inotify"] = f.read().strip()
out["sigpending"] = resource.getrlimit(resource.RLIMIT_SIGPENDING)[1]
out["nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
with open("/proc/sys/fs/mqueue/msgsize_default") as f:
    out["mq_msgsize"] = int(f.read())
with open("/proc/self/mountinfo") as f:
    pts = [line.split(" - ")[1].split()[2] for line in f if line.split()[4] == "/dev/pts"]
out["ptys"] = [o.split("=")[1] for o in ",".join(pts).split(",") if o.startswith("max=")]
libc = ctypes.CDLL(None, use_errno=True)
ctx = ctypes.c_ulong(0)
rc = libc.syscall(ctypes.c_long(IO_SETUP), ctypes.c_long(1), ctypes.byref(ctx))
out["io_setup"] = "ok" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
print(json.dumps(out))
"""


async def _reach(sb: Any) -> Check:
    how = (
        "prlimit, setpriority and sched_setaffinity of PID 1, SIGSTOP to a process, an AF_VSOCK socket,"
        " the inotify, pending-signal, file and pty bounds, io_setup, from inside"
    )
    if _MACHINE not in seccomp.AUDIT_ARCH:
        return "supervisor out of reach", WARN, f"no filter for {_MACHINE}: PID 1 can be re-limited", how
    io_setup = str(seccomp.NOT_IMPLEMENTED["io_setup"][_COL])
    r = await sb.exec(["python3", "-I", "-c", REACH_PROBE, io_setup], timeout_seconds=30)
    try:
        out = json.loads(r.stdout)
    except ValueError:
        return "supervisor out of reach", FAIL, f"the probe did not run: {r.stderr.strip()[-200:]}", how
    want = {
        "prlimit": "EPERM",
        "setpriority": "EPERM",
        "sched_setaffinity": "EPERM",
        "stop a process": "EPERM",
        "vsock": "EAFNOSUPPORT",
        "inotify": harden.USER_LIMITS["max_inotify_instances"],
        "sigpending": _birth.SIGPENDING,
        "nofile": _birth.files_bound(resource.getrlimit(resource.RLIMIT_NOFILE)[0]),  # the driver's: inherited
        "ptys": [str(_birth.PTYS)],
        "mq_msgsize": _birth.MQ_MSGSIZE_DEFAULT,
        "io_setup": "ENOSYS",
    }
    wrong = sorted(f"{k}: {out.get(k)}" for k, v in want.items() if out.get(k) != v)
    if wrong:
        return "supervisor out of reach", FAIL, f"not held: {', '.join(wrong)}", how
    return (
        "supervisor out of reach",
        OK,
        "PID 1 cannot be re-limited, reniced or pinned; no process can be stopped; no vsock; own inotify,"
        f" pending-signal ({_birth.SIGPENDING}), file ({out['nofile']}) and pty ({_birth.PTYS}) bounds;"
        " no AIO context (ENOSYS)",
        how,
    )


async def hardening_checks(sandbox: Any) -> list[Check]:
    """Run every hardening probe against ``sandbox`` (a running local ``Sandbox``); see the module docstring."""
    out = []
    for probe in (_seccomp, _keyring, _ipc, _home, _memory, _supervisor, _reach):
        out.append(await probe(sandbox))
    return out
