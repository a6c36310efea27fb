"""The judge's case runner: runs inside the sandbox, one exec for all of a completion's test cases.

Stdlib only, Python 3.8+; the driver sends this file's text as ``python3 -c`` (or the local agent's
warm interpreter) with the job on stdin. Never imported by the driver.

Job (stdin): one JSON line (``argv``, ``cwd``, ``env``, ``sizes`` of the inputs, limits), then the
inputs' bytes back to back. stdin is read completely and replaced by ``/dev/null`` before the first
case runs, so the inputs live only in this process's memory.

Per case: a **fresh process** (``fork`` + ``execvpe``) in its own process group, its input in a
memfd on fd 0, stdout and stderr on pipes, nothing else open. While it runs, the runner samples the
case's process tree every ``sample`` seconds: CPU time past ``time`` kills it (``time``), resident
memory past ``memory`` kills it (``memory``), output past ``output`` bytes kills it (``output``),
the wall clock past ``wall`` kills it (``wall``; the tree's run-queue wait is measured then, for
the driver to tell a starved case from a slow one). When the case's main process ends, everything
it left (the runner is a child subreaper: every descendant is re-parented to it) is killed and
reaped, so nothing of one case survives into the next. CPU and peak memory come from ``wait4`` of
every process of the tree (and the samples).

Protection of the runner itself: it makes itself non-dumpable before anything else, so a case
(same uid) can neither ptrace it nor open ``/proc/<runner>/fd/*`` or ``/proc/<runner>/mem``: the
other cases' inputs and the report stream stay out of its reach. A case can still signal the
runner; then the report stops short, which the driver scores as the program's failure.

Clean-up (``clean`` in the job; ``sweep.py``, sent in front of this file): after the compile and
before the first case, the runner records what the sandbox's writable places hold (and reports
``{"t0": ...}``, the file system's clock then); after the last case, when every process of the
completion is dead, it removes the job's own directories and everything the program created or
changed, and reports ``{"clean": ...}``. A job with ``sweep_only`` does only the sweep by time (the
driver's follow-up when a program killed the runner before its sweep).

Report (stdout): the compile's line, ``t0``, one JSON line per case, in order, ``clean``, then
``{"done": true}``. Exit 0 after the last case; exit 3 with ``runner: ...`` on stderr if it could
not start (before any case ran).
"""

import base64
import json
import os
import select
import signal
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
TCK = os.sysconf("SC_CLK_TCK")
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36


def fail(text):
    sys.stderr.write("runner: " + text + "\n")
    sys.stderr.flush()
    os._exit(3)


def protect():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            fail("prctl failed (errno %d)" % ctypes.get_errno())
    except (ImportError, OSError, AttributeError) as exc:
        fail("cannot protect the runner: %r" % (exc,))


def read_job():
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    data = b"".join(chunks)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    head, sep, rest = data.partition(b"\n")
    if not sep:
        fail("no job header on stdin")
    job = json.loads(head.decode("utf-8"))
    inputs, at = [], 0
    for sizes in job["sizes"]:
        parts = []
        for n in sizes:
            parts.append(rest[at : at + n])
            at += n
        inputs.append(parts)
    if at != len(rest):
        fail("the job's sizes do not match its data")
    return job, inputs


def children(pid):
    out = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                out.extend(int(p) for p in f.read().split())
        except OSError:
            pass
    return out


def tree(root):
    """``root`` and its descendants, plus the runner's other children (orphans re-parented to it)."""
    seen, todo = [], [root]
    todo.extend(p for p in children(os.getpid()) if p != root)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        todo.extend(children(pid))
    return seen


def sample(pids):
    """(CPU seconds of the live processes, resident bytes, run-queue wait seconds) of ``pids``."""
    cpu = rss = wait = 0
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open("/proc/%d/statm" % pid, "rb") as f:
                rss += int(f.read().split()[1]) * PAGE
            cpu += sum(int(v) for v in fields[11:15])
            for tid in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/schedstat" % (pid, tid), "rb") as f:
                    wait += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return cpu / TCK, rss, wait / 1e9


def oom_kills():
    for path, key in (
        ("/sys/fs/cgroup/memory.events", "oom_kill"),
        ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
    ):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except (OSError, ValueError):
            pass
    return None


def start(job, data):
    fd = os.memfd_create("input", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            import resource

            for name, value in job["rlimits"].items():
                limit = getattr(resource, "RLIMIT_" + name.upper())
                resource.setrlimit(limit, (value, value))
            os.dup2(fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, 1 << 16)
            os.chdir(job["cwd"])
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.execvpe(job["argv"][0], job["argv"], job["env"])
        except BaseException as exc:
            try:
                os.write(2, ("runner: cannot start %r: %r\n" % (job["argv"][0], exc)).encode())
            finally:
                os._exit(127)
    os.close(fd)
    os.close(out_w)
    os.close(err_w)
    return pid, out_r, err_r


def kill_all(root):
    """SIGKILL the case's group and every process below the runner, and reap them all.

    Returns (CPU seconds, largest ``ru_maxrss`` in bytes, the wait status of ``root`` if it was reaped here)."""
    cpu, maxrss, status = 0.0, 0, None
    own = os.getpgrp()
    for _ in range(2000):
        # A whole process group at once (the kernel does not let a member fork past it), then every
        # process found below the runner, and the groups of those that left the case's group.
        try:
            os.killpg(root, signal.SIGKILL)
        except OSError:
            pass
        groups = {root}
        for pid in tree(root):
            try:
                os.kill(pid, signal.SIGKILL)
                groups.add(os.getpgid(pid))
            except OSError:
                pass
        for group in groups - {own}:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass
        reaped = False
        while True:
            try:
                pid, st, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return cpu, maxrss, status
            if pid == 0:
                break
            reaped = True
            cpu += ru.ru_utime + ru.ru_stime
            maxrss = max(maxrss, ru.ru_maxrss * 1024)
            if pid == root:
                status = st
        if not reaped:
            time.sleep(0.001)
    return cpu, maxrss, status


def exit_code(status):
    if status is None:
        return -signal.SIGKILL
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def run_case(job, data):
    limit_cpu, wall, memory, cap, tail = job["time"], job["wall"], job["memory"], job["output"], job["stderr"]
    every = job["sample"]
    oom_before = oom_kills()
    began = time.monotonic()
    pid, out_r, err_r = start(job, data)
    deadline = began + wall
    out, err = bytearray(), bytearray()
    killed = None
    ended = False
    status = None
    cpu = wait = 0.0
    peak = 0
    usage_cpu, usage_rss = 0.0, 0
    open_fds = {out_r, err_r}
    poller = select.poll()
    for fd in open_fds:
        poller.register(fd, select.POLLIN)
    exited = -1  # a pidfd wakes the loop the moment the case's main process ends
    if hasattr(os, "pidfd_open"):
        try:
            exited = os.pidfd_open(pid)
            poller.register(exited, select.POLLIN)
        except OSError:
            exited = -1
    next_sample = began + every

    def finish(st=None):
        more_cpu, more_rss, root_status = kill_all(pid)
        return (st if st is not None else root_status), more_cpu, more_rss

    while not ended or open_fds:
        now = time.monotonic()
        if not ended:
            done, st, ru = os.wait4(pid, os.WNOHANG)
            if done:
                usage_cpu += ru.ru_utime + ru.ru_stime
                usage_rss = max(usage_rss, ru.ru_maxrss * 1024)
                status, more_cpu, more_rss = finish(st)
                usage_cpu, usage_rss, ended = usage_cpu + more_cpu, max(usage_rss, more_rss), True
                drain_until = time.monotonic() + 1.0
                continue
            if now >= next_sample or now >= deadline:
                live_cpu, rss, wait = sample(tree(pid))
                cpu, peak = max(cpu, live_cpu), max(peak, rss)
                next_sample = now + every
                if now >= deadline:
                    killed = "wall"
                elif cpu > limit_cpu:
                    killed = "time"
                elif memory and rss > memory:
                    killed = "memory"
                if killed is not None:
                    status, more_cpu, more_rss = finish()
                    usage_cpu, usage_rss, ended = usage_cpu + more_cpu, max(usage_rss, more_rss), True
                    drain_until = time.monotonic() + 1.0
                    continue
            timeout = max(0.0, min(next_sample, deadline) - now)
        else:
            if now >= drain_until:
                break  # something outside the tree holds a pipe: stop reading
            timeout = min(0.05, drain_until - now)
        for fd, _ev in poller.poll(timeout * 1000):
            if fd == exited:
                poller.unregister(fd)
                os.close(fd)
                exited = -1
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
                os.close(fd)
            elif fd == out_r:
                out += chunk
                if len(out) > cap and killed is None and not ended:
                    killed = "output"
                    status, more_cpu, more_rss = finish()
                    usage_cpu, usage_rss, ended = usage_cpu + more_cpu, max(usage_rss, more_rss), True
                    drain_until = time.monotonic() + 1.0
            else:
                err += chunk
                if len(err) > 2 * tail:
                    del err[:-tail]
    for fd in open_fds:
        os.close(fd)
    if exited >= 0:
        os.close(exited)
    wall_used = time.monotonic() - began
    truncated = len(out) > cap
    del out[cap:]
    oom_after = oom_kills()
    return {
        "exit": exit_code(status),
        "cpu": max(cpu, usage_cpu),
        "wall": wall_used,
        "rss": max(peak, usage_rss),
        "killed": killed or ("output" if truncated else None),
        "wait": wait,
        "oom": oom_before is not None and oom_after is not None and oom_after > oom_before,
        "out": base64.b64encode(bytes(out)).decode("ascii"),
        "err": base64.b64encode(bytes(err[-tail:])).decode("ascii"),
    }


def prepare(job, files):
    """Make the job's directories and write its files (the source) before anything runs."""
    try:
        for path in job.get("mkdirs", ()):
            os.makedirs(path, exist_ok=True)
        for path, data in zip(job.get("write", ()), files):
            with open(path, "wb") as f:
                f.write(data)
    except OSError as exc:
        fail("cannot prepare %r" % (exc,))


def starved(job, result):
    """The driver's ``suspect_starved``: out of wall time with little CPU, having waited for one (a rerun)."""
    cpu_share, wait_share = job.get("starved", (0.5, 0.25))
    wall = result["wall"]
    return result["killed"] == "wall" and result["cpu"] < cpu_share * wall and result["wait"] >= wait_share * wall


def write_line(line):
    out = sys.stdout.buffer
    out.write(json.dumps(line).encode("ascii") + b"\n")
    out.flush()


def finish(clean, roots, known, t0):
    """Sweep (when the job asks: see ``sweep``), report it, end the report and exit 0."""
    if clean is not None:
        removed, errors = sweep(roots, known, clean.get("remove", ()), t0)  # noqa: F821  (sweep.py)
        write_line({"clean": errors == 0, "removed": removed, "errors": errors})
    write_line({"done": True})
    os._exit(0)


def main():
    protect()
    job, inputs = read_job()
    clean = job.get("clean")
    if job.get("sweep_only"):  # a follow-up: the runner that judged was killed before its sweep
        t0 = clean.get("t0")
        finish(clean, writable_roots() if t0 is not None else [], None, t0)  # noqa: F821
    prepare(job, inputs.pop(0) if job.get("write") else [])
    step = job.get("compile")
    roots, known, t0 = [], None, None
    if step is not None:
        result = run_case(step, b"")
        result["i"] = -1
        write_line(result)
        if result["exit"] != 0 or result["killed"]:
            finish(clean, roots, {}, None)
    if clean is not None:
        roots = writable_roots()  # noqa: F821  (sweep.py, sent in front of this file)
        known = snapshot(roots, clean["limit"])  # noqa: F821
        try:
            t0 = probe_time(job["cwd"])  # noqa: F821
        except OSError:
            t0 = None
        write_line({"t0": t0})
    names = job.get("files", ())
    for i, parts in enumerate(inputs):
        for name, data in zip(names, parts[1:]):
            with open(os.path.join(job["cwd"], name), "wb") as f:
                f.write(data)
        result = run_case(job, parts[0])
        result["i"] = i
        write_line(result)
        if job["stop_on_failure"] and (result["exit"] != 0 or result["killed"]) and not starved(job, result):
            break
    if known is None and t0 is None:
        roots = []  # nothing to tell the program's files by: only the job's own directories go
    finish(clean, roots, known, t0)


try:
    main()
except Exception:
    import traceback

    sys.stderr.write("runner: internal error\n" + traceback.format_exc())
    sys.stderr.flush()
    os._exit(4)
