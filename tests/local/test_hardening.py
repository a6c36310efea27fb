"""The hardening applied when a sandbox is born: seccomp, a fresh keyring, bounded SysV IPC, HOME.

Each test attacks from inside a sandbox and asserts what the protection changes: without it,
the attack would succeed (see SECURITY.md for which test stands for which protection).
"""

from __future__ import annotations

import ctypes
import errno
import json
import platform

import anyio
import pytest
from guards import HANG_GUARD_SECONDS

import cwsandbox_async as cwa
from cwsandbox_async.backends.local.agent import harden, seccomp

from .conftest import local_session, requires_isolation

pytestmark = requires_isolation

MACHINE = platform.machine()
COL = 0 if MACHINE == "x86_64" else 1
SYSCALLS = {name: nrs[COL] for name, nrs in seccomp.DENIED.items() if nrs[COL] is not None}

#: Calls whose zero-argument form would fail with EPERM anyway (no capability), get arguments that
#: succeed without the filter: the probe then shows the filter, not the missing capability.
PROBE = """
import ctypes, errno, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
M = json.loads(sys.argv[1])
def call(nr, *args):
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if rc >= 0 else ctypes.get_errno()
out = {}
for name, nr in M["denied"].items():
    out[name] = call(nr, 0, 0, 0, 0, 0, 0)
kid = os.fork()
if kid == 0:
    time.sleep(5)
    os._exit(0)
out["ptrace"] = call(M["denied"]["ptrace"], 0x4206, kid, 0, 0)  # PTRACE_SEIZE of our own child
os.kill(kid, 9)
os.waitpid(kid, 0)
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
out["process_vm_readv"] = call(M["denied"]["process_vm_readv"], os.getpid(), ctypes.addressof(iov), 1,
                               ctypes.addressof(iov), 1, 0)
out["keyctl"] = call(M["denied"]["keyctl"], 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of @s
out["userfaultfd"] = call(M["denied"]["userfaultfd"], 1)  # UFFD_USER_MODE_ONLY: allowed unprivileged
params = ctypes.create_string_buffer(120)
out["io_uring_setup"] = call(M["denied"]["io_uring_setup"], 1, ctypes.addressof(params))
for flag in ("NEWUSER", "NEWNS", "NEWNET", "NEWPID"):
    out["unshare " + flag] = call(M["unshare"], M["flags"][flag])
    out["clone " + flag] = call(M["clone"], M["flags"][flag] | 17, 0, 0, 0, 0)
out["clone3"] = call(M["clone3"], 0, 0)
rc = libc.syscall(ctypes.c_long(M["clone"]), ctypes.c_long(0x8000 | 17), 0, 0, 0, 0)  # CLONE_PARENT
if rc == 0:
    os._exit(0)  # a sibling outside this exec's tree (the filter let it through)
out["clone CLONE_PARENT"] = 0 if rc > 0 else ctypes.get_errno()
out["subreaper on"] = call(M["prctl"], 36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: narrowing is fine
out["prctl PR_SET_CHILD_SUBREAPER 0"] = call(M["prctl"], 36, 0, 0, 0, 0)  # leaving: denied
out["personality 0x0040000"] = call(M["personality"], 0x0040000)  # READ_IMPLIES_EXEC
import threading, subprocess
t = threading.Thread(target=lambda: None)
t.start(); t.join()
out["thread"] = 0
out["subprocess"] = subprocess.run(["true"]).returncode
out["fork"] = 0 if os.waitpid(os.fork() or os._exit(0), 0) else 1
with open("/proc/self/status") as f:
    out["mode"] = [int(l.split()[1]) for l in f if l.startswith("Seccomp:")][0]
print(json.dumps(out))
"""
FLAGS = {"NEWUSER": 0x10000000, "NEWNS": 0x20000, "NEWNET": 0x40000000, "NEWPID": 0x20000000}


def probe_args() -> str:
    return json.dumps(
        {
            "denied": SYSCALLS,
            "unshare": seccomp.UNSHARE[COL],
            "clone": seccomp.CLONE[COL],
            "clone3": seccomp.CLONE3[COL],
            "personality": seccomp.PERSONALITY[COL],
            "prctl": seccomp.PRCTL[COL],
            "flags": FLAGS,
        }
    )


@pytest.mark.skipif(MACHINE not in seccomp.AUDIT_ARCH, reason=f"no seccomp filter for {MACHINE}")
@pytest.mark.parametrize("how", ["exec", "run_python"])
async def test_seccomp_denies_the_documented_calls_and_nothing_ordinary(tag: str, how: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        if how == "exec":
            r = await sb.exec(["python3", "-I", "-c", PROBE, probe_args()], timeout_seconds=HANG_GUARD_SECONDS)
        else:
            r = await sb.run_python("import sys\nsys.argv[1:] = [" + repr(probe_args()) + "]\n" + PROBE)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out.pop("mode") == 2
        assert (out.pop("thread"), out.pop("subprocess"), out.pop("fork"), out.pop("subreaper on")) == (0, 0, 0, 0)
        assert out.pop("clone3") == errno.ENOSYS  # the C library then falls back to clone, checked by flags
        wrong = {name: errno.errorcode.get(e, e) for name, e in out.items() if e != errno.EPERM}
        assert not wrong, f"not denied with EPERM: {wrong}"


@pytest.mark.skipif(MACHINE != "x86_64", reason="modify_ldt exists on x86 only")
async def test_modify_ldt_is_refused(tag: str) -> None:
    """Docker's profile blocks it too: the LDT is kernel attack surface no program needs."""
    probe = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(16)\n"
        "rc = libc.syscall(154, 0, buf, 16)\nprint(rc, ctypes.get_errno())\n"  # read the LDT
    )
    async with local_session(tag) as s:
        sb = await s.sandbox()
        r = await sb.exec(["python3", "-I", "-c", probe], timeout_seconds=HANG_GUARD_SECONDS)
        assert r.stdout.split() == ["-1", str(errno.EPERM)], r


SOCKETS = """
import errno, json, socket
out = {}
for name, family, kind in (("vsock", 40, socket.SOCK_STREAM), ("packet", 17, socket.SOCK_DGRAM),
                           ("alg", 38, socket.SOCK_SEQPACKET), ("unix", 1, socket.SOCK_STREAM),
                           ("inet", 2, socket.SOCK_STREAM), ("inet6", 10, socket.SOCK_DGRAM),
                           ("netlink", 16, socket.SOCK_RAW)):
    try:
        socket.socket(family, kind).close()
        out[name] = "ok"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, e.errno)
try:
    a, b = socket.socketpair(40, socket.SOCK_STREAM)
    out["vsock pair"] = "ok"
except OSError as e:
    out["vsock pair"] = errno.errorcode.get(e.errno, e.errno)
print(json.dumps(out))
"""


@pytest.mark.skipif(MACHINE not in seccomp.AUDIT_ARCH, reason=f"no seccomp filter for {MACHINE}")
async def test_only_the_allowed_socket_families_can_be_created(tag: str) -> None:
    """AF_VSOCK (which no network namespace isolates: on a VM it reaches the host) and every family
    but Unix, IPv4, IPv6 and netlink are refused; those four still work."""
    async with local_session(tag) as s:
        sb = await s.sandbox()
        r = await sb.exec(["python3", "-I", "-c", SOCKETS], timeout_seconds=HANG_GUARD_SECONDS)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {
            "vsock": "EAFNOSUPPORT",
            "packet": "EAFNOSUPPORT",
            "alg": "EAFNOSUPPORT",
            "unix": "ok",
            "inet": "ok",
            "inet6": "ok",
            "netlink": "ok",
            "vsock pair": "EAFNOSUPPORT",
        }


STOPS = """
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nrs, mark = json.loads(sys.argv[1]), sys.argv[2]
def call(nr, *args):
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if rc >= 0 else ctypes.get_errno()
def find():
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if f.read() == b"sleep\\0" + mark.encode() + b"\\0":
                    return int(p)
        except OSError:
            pass
while (pid := find()) is None:  # the bystander's exec may not have started yet (the exec's timeout bounds this)
    time.sleep(0.01)
fd = os.pidfd_open(pid)
def info(sig):  # a siginfo_t with si_code SI_QUEUE (what sigqueue sends): allowed to another process
    buf = ctypes.create_string_buffer(128)
    ctypes.c_int.from_buffer(buf, 0).value, ctypes.c_int.from_buffer(buf, 8).value = sig, -1
    return buf
def every(sig):
    return {
        "kill": call(nrs["kill"], pid, sig),
        "kill -1": call(nrs["kill"], -1, sig),
        "tkill": call(nrs["tkill"], pid, sig),
        "tgkill": call(nrs["tgkill"], pid, pid, sig),
        "rt_sigqueueinfo": call(nrs["rt_sigqueueinfo"], pid, sig, ctypes.addressof(info(sig))),
        "rt_tgsigqueueinfo": call(nrs["rt_tgsigqueueinfo"], pid, pid, sig, ctypes.addressof(info(sig))),
        "pidfd_send_signal": call(nrs["pidfd_send_signal"], fd, sig, 0, 0),
    }
out = {sig: every(sig) for sig in (19, 20, 21, 22)}
with open(f"/proc/{pid}/stat") as f:
    out["state"] = f.read().rsplit(")", 1)[1].split()[0]
out["cont"] = every(18)  # SIGCONT: every call still works for a signal that stops nothing
out["kill 9"] = call(nrs["kill"], pid, 9)
print(json.dumps(out))
"""


@pytest.mark.skipif(MACHINE not in seccomp.AUDIT_ARCH, reason=f"no seccomp filter for {MACHINE}")
async def test_no_process_can_stop_another(tag: str) -> None:
    """Every call that sends a signal refuses the four stop signals (EPERM), to another exec's
    process and to every process (-1); the target keeps running and every
    call still sends SIGCONT and SIGKILL. Without it a command could stop the vfork child of PID 1
    that becomes the next command, and PID 1 with it (``seccomp`` item 6)."""
    mark = f"{HANG_GUARD_SECONDS * 10}.{abs(hash(tag)) % 10_000:04d}"
    nrs = json.dumps({name: numbers[COL] for name, (numbers, _arg) in seccomp.SIGNAL_SENDERS.items()})
    async with local_session(tag) as s:
        sb = await s.sandbox()
        results: list[cwa.ExecResult] = []

        async def bystander() -> None:
            results.append(await sb.exec(["sleep", mark], timeout_seconds=HANG_GUARD_SECONDS))

        with anyio.fail_after(HANG_GUARD_SECONDS):
            async with anyio.create_task_group() as tg:
                tg.start_soon(bystander)
                r = await sb.exec(["python3", "-I", "-c", STOPS, nrs, mark], timeout_seconds=HANG_GUARD_SECONDS)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        for sig in ("19", "20", "21", "22"):
            wrong = {name: errno.errorcode.get(e, e) for name, e in out[sig].items() if e != errno.EPERM}
            assert not wrong, f"signal {sig} not denied with EPERM: {wrong}"
        assert out["state"] == "S"  # asleep, never stopped (T)
        assert out["cont"] == dict.fromkeys(out["cont"], 0)
        assert out["kill 9"] == 0
        assert [x.returncode for x in results] == [-9]


@pytest.mark.skipif(MACHINE != "x86_64", reason="the i386 and x32 entries exist on x86_64 only")
async def test_seccomp_kills_calls_through_another_abi(tag: str) -> None:
    """The deny list is by x86_64 number: ``int 0x80`` (i386 numbers) and x32 would step around it."""
    int80 = (
        "import ctypes, mmap\n"
        "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "m.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')  # mov eax, 20 (getpid); int 0x80; ret\n"
        "f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n"
        "print('int 0x80 returned', f())\n"
    )
    x32 = "import ctypes\nprint('x32 returned', ctypes.CDLL(None).syscall(0x40000000 | 39))\n"
    async with local_session(tag) as s:
        sb = await s.sandbox()
        for source in (int80, x32):
            r = await sb.exec(["python3", "-I", "-c", source], timeout_seconds=HANG_GUARD_SECONDS)
            assert r.returncode == -31, (r.returncode, r.stdout, r.stderr)  # SIGSYS
            assert "returned" not in r.stdout


def driver_session_keyring() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.syscall(250 if MACHINE == "x86_64" else 219, 0, -3, 1))  # KEYCTL_GET_KEYRING_ID, @s, create


async def test_a_sandbox_cannot_reach_its_creators_session_keyring(tag: str) -> None:
    mine = driver_session_keyring()
    if mine < 0:
        pytest.skip("this kernel has no session keyrings")
    async with local_session(tag) as s:
        sb = await s.sandbox()
        r = await sb.exec(["cat", "/proc/keys"])
        serials = {int(line.split()[0], 16) for line in r.stdout.splitlines() if line.strip()}
        assert mine not in serials, f"the driver's session keyring {mine:08x} is visible inside:\n{r.stdout}"
        assert any("_ses" in line for line in r.stdout.splitlines())  # a session keyring of its own


async def test_sysv_ipc_is_bounded_and_its_sysctls_are_read_only(tag: str) -> None:
    names = " ".join(harden.IPC_LIMITS)
    script = (
        f"cd /proc/sys/kernel && for n in {names}; do printf '%s=' $n; tr '\\t' ' ' < $n; done; "
        "(echo 0 > shm_rmid_forced) 2>/dev/null && echo writable-shm_rmid_forced; "
        "(echo 1 > /proc/sys/kernel/msgmni) 2>/dev/null && echo writable-msgmni; true"
    )
    async with local_session(tag) as s:
        sb = await s.sandbox()
        r = await sb.exec(["sh", "-c", script])
        values = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        assert values == {k: v.strip().replace("\t", " ") for k, v in harden.IPC_LIMITS.items()}, r.stdout
        assert "writable" not in r.stdout
        mounts = (await sb.exec(["cat", "/proc/self/mountinfo"])).stdout
        assert any(
            line.split()[4] == "/proc/sys" and "ro" in line.split()[5].split(",") for line in mounts.splitlines()
        )


PTH = "import os; os._exit(0)\n"


async def test_home_is_read_only_and_empty_and_user_site_is_off(tag: str) -> None:
    """One exec must not be able to make every later ``python3`` exit 0 (a ``.pth`` in the user site)."""
    async with local_session(tag) as s:
        sb = await s.sandbox()
        r = await sb.exec(
            [
                "sh",
                "-c",
                'echo "$HOME $PYTHONNOUSERSITE"; ls -A "$HOME" | wc -l; [ -d "$HOME" ] && [ ! -w "$HOME" ] && echo ro',
            ]
        )
        home, nousersite, count, ro = r.stdout.split()
        assert (home, nousersite, count, ro) == (harden.HOME, "1", "0", "ro")
        site = await sb.exec(["python3", "-c", "import site; print(site.getusersitepackages())"])
        r = await sb.exec(
            ["sh", "-c", f"mkdir -p {site.stdout.strip()} && printf '{PTH}' > {site.stdout.strip()}/evil.pth"]
        )
        assert r.returncode != 0  # HOME is read-only
        # Even with a writable HOME of its own choosing, later pythons ignore the user site:
        await sb.exec(["sh", "-c", f"mkdir -p /tmp/h/{site.stdout.strip()[len(home) + 1 :]}"])
        r = await sb.exec(["python3", "-c", "import site; print(site.ENABLE_USER_SITE)"], env={"HOME": "/tmp/h"})
        assert r.stdout.strip() == "False"
        assert (await sb.exec(["python3", "-c", "raise SystemExit(3)"])).returncode == 3


async def test_hardening_is_reported_by_the_agent(tag: str) -> None:
    async with local_session(tag) as s:
        sb = await s.sandbox()
        hello = s.backend._boxes[sb.sandbox_id].runner.channel.hello  # type: ignore[attr-defined]
        want = "installed" if MACHINE in seccomp.AUDIT_ARCH else "none: no seccomp filter for " + MACHINE
        assert hello["hardening"] == {"keyring": "fresh", "seccomp": want}


def test_a_sandbox_without_the_filter_forks_pid_1_for_every_exec() -> None:
    """The native spawner is a vfork of PID 1: only the filter keeps a command from stopping it."""
    from cwsandbox_async.backends.local.agent import main

    config = {"spawner": "/.cwsandbox/spawn"}
    assert main.usable_spawner(config, {"keyring": "fresh", "seccomp": "installed"}) == "/.cwsandbox/spawn"
    for why in ("off (by configuration)", "none: no seccomp filter for riscv64", "none: EINVAL"):
        assert main.usable_spawner(config, {"keyring": "fresh", "seccomp": why}) is None
    assert main.usable_spawner({}, {"seccomp": "installed"}) is None


def test_the_filter_program_is_well_formed() -> None:
    """Every jump lands inside the program and it ends in a return, for both machines."""
    for machine in seccomp.AUDIT_ARCH:
        prog = seccomp.program(machine)
        assert len(prog) < 4096  # the kernel's BPF_MAXINSNS
        for i, (code, jt, jf, _) in enumerate(prog):
            if code & 0x07 == 0x05:  # BPF_JMP
                assert i + 1 + max(jt, jf) < len(prog)
        assert prog[-1] == (0x06, 0, 0, seccomp.RET_ALLOW)
    with pytest.raises(ValueError, match="no seccomp filter"):
        seccomp.program("riscv64")


def test_a_bad_setting_is_refused_at_boot() -> None:
    from cwsandbox_async.backends.local.agent.settings import Settings

    assert Settings({"leftover_grace": 2}).leftover_grace == 2.0
    for bad in ({"nope": 1}, {"leftover_grace": 0}, {"exclusive_wait": float("nan")}, {"sample_interval": True}):
        with pytest.raises(ValueError, match="setting"):
            Settings(bad)


async def test_the_doctor_probes_report_every_protection(tag: str) -> None:
    from cwsandbox_async.backends.local._hardening_probes import hardening_checks

    async with local_session(tag, resources=cwa.Resources(memory_mib=256)) as s:
        checks = await hardening_checks(await s.sandbox())
    names = [name for name, *_ in checks]
    assert names == [
        "seccomp filter",
        "fresh session keyring",
        "SysV IPC bounded",
        "read-only empty HOME",
        "clean run_python memory",
        "timeout holds against its supervisor",
        "supervisor out of reach",
    ]
    bad = [(name, status, detail) for name, status, detail, _ in checks if status != "ok"]
    assert not bad, bad
