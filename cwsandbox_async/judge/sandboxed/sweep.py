"""The runner's clean-up: after every process of a completion is dead, remove everything it wrote.

Stdlib only, Python 3.8+; its text is sent to the sandbox in front of ``runner.py`` (one script).
Never imported by the driver.

**Where.** ``writable_roots()``: every mount of the sandbox that is mounted read-write, is a real
file system (not ``proc``, ``sysfs``, ``cgroup``, ``devpts``, device nodes, ...) and whose top is
writable by this user (on the local backend: ``/tmp``, the working directory, ``/dev/shm``). A
writable directory deeper inside a mount whose top is not writable is not swept (documented).

**What.** ``snapshot(roots)`` records every entry's ``(device, inode) -> (ctime, mode)`` before
the program's first process starts (after the compile, so a compiler's cache stays). After the
program, ``sweep`` walks the same roots without following a symbolic link or crossing into another
mount, and:

- removes every non-directory that is new or whose ``ctime`` changed (written, truncated,
  renamed, linked, chmodded: the kernel moves ``ctime`` on each, and a program cannot set it);
- removes every directory that is new, with everything below it (at any depth: a directory
  deeper than ``FLAT_DEPTH`` is moved up to the root first, so no path or descriptor count grows
  with the depth), and every old directory the program moved under a new one;
- gives an old directory back its mode (a program that made ``/tmp`` unwritable);
- removes the System V IPC objects (shared memory, message queues, semaphores) made since.

What the program deleted of what was there before is gone (nothing restores it). The sweep by time
(``sweep`` with ``known=None``) is the fallback when the snapshot is lost (the program killed the
runner): the same walk with "its ``ctime`` is at or after ``t0``" (the ``ctime`` of a file made
just before the first case) as "changed", for directories too: a directory changed since ``t0``
(an entry added or removed) is removed whole, and a root gets at least ``u+rwx`` back.
"""

import os
import stat

#: File system types that are not storage a program can leave files in.
NOT_STORAGE = frozenset(
    [
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "devpts",
        "devtmpfs",
        "mqueue",
        "debugfs",
        "tracefs",
        "securityfs",
        "bpf",
        "fusectl",
        "configfs",
        "pstore",
        "binfmt_misc",
        "autofs",
        "hugetlbfs",
        "efivarfs",
        "nsfs",
        "rpc_pipefs",
        "selinuxfs",
    ]
)
#: Directories below this depth are moved up to their root before they are emptied.
FLAT_DEPTH = 48
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _unescape(field):
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def writable_roots():
    """The mount points a program of this user can write files under (see the module docstring)."""
    roots = set()
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()
        if "-" not in parts:
            continue
        sep = parts.index("-")
        point, options, fstype = _unescape(parts[4]), parts[5].split(","), parts[sep + 1]
        if "rw" not in options or fstype in NOT_STORAGE:
            continue
        try:
            if stat.S_ISDIR(os.lstat(point).st_mode) and os.access(point, os.W_OK):
                roots.add(point)
        except OSError:
            pass
    return sorted(roots)


def snapshot(roots, limit):
    """``(dev, ino) -> (ctime_ns, mode)`` of everything under ``roots``; ``None`` past ``limit`` entries."""
    known = {}
    for root in roots:
        try:
            top = os.lstat(root)
        except OSError:
            continue
        known[(top.st_dev, top.st_ino)] = (top.st_ctime_ns, top.st_mode)
        todo = [root]
        while todo:
            path = todo.pop()
            try:
                with os.scandir(path) as entries:
                    for entry in entries:
                        st = entry.stat(follow_symlinks=False)
                        if st.st_dev != top.st_dev:
                            continue
                        known[(st.st_dev, st.st_ino)] = (st.st_ctime_ns, st.st_mode)
                        if stat.S_ISDIR(st.st_mode):
                            todo.append(entry.path)
            except OSError:
                pass
            if len(known) > limit:
                return None
    known["ipc"] = ipc_objects()
    return known


class _Sweep:
    """One walk of one root; ``errors`` counts what could not be removed."""

    def __init__(self, root_fd, known, t0):
        self.top = root_fd
        self.dev = os.fstat(root_fd).st_dev
        self.known, self.t0 = known, t0
        self.removed = self.errors = 0
        self.moved = 0
        self.later = []  # (parent fd, name) of deep directories moved up to the root

    def changed(self, st):
        if self.known is None:
            return st.st_ctime_ns >= self.t0
        old = self.known.get((st.st_dev, st.st_ino))
        return old is None or old[0] != st.st_ctime_ns

    def old_dir(self, st):
        if self.known is None:
            return st.st_ctime_ns < self.t0
        return (st.st_dev, st.st_ino) in self.known

    def unlink(self, fd, name):
        try:
            os.unlink(name, dir_fd=fd)
            self.removed += 1
        except FileNotFoundError:
            pass
        except OSError:
            self.errors += 1

    def open_dir(self, fd, name):
        """``name`` (a directory in ``fd``) opened, made readable and writable first; ``None`` if it cannot be."""
        try:
            os.chmod(name, 0o700, dir_fd=fd)
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            self.errors += 1
            return None

    def remove_tree(self, parent, name):
        """Remove directory ``name`` of ``parent`` and everything below it, without recursion."""
        child = self.open_dir(parent, name)
        if child is None:
            return
        frames = [(parent, name, child, _names(child))]
        while frames:
            pfd, pname, fd, names = frames[-1]
            if not names:
                frames.pop()
                os.close(fd)
                try:
                    os.rmdir(pname, dir_fd=pfd)
                    self.removed += 1
                except FileNotFoundError:
                    pass
                except OSError:
                    self.errors += 1
                continue
            entry = names.pop()
            try:
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                self.unlink(fd, entry)
            elif st.st_dev != self.dev:
                self.errors += 1  # a mount below a new directory: cannot happen unprivileged
            elif len(frames) >= FLAT_DEPTH:
                self.moved += 1
                flat = ".cwsandbox-sweep-%d-%d" % (os.getpid(), self.moved)
                try:
                    os.rename(entry, flat, src_dir_fd=fd, dst_dir_fd=self.top)
                    self.later.append(flat)
                except OSError:
                    self.errors += 1
            else:
                grand = self.open_dir(fd, entry)
                if grand is not None:
                    frames.append((fd, entry, grand, _names(grand)))

    def walk(self):
        """Sweep the root: old directories are walked, new ones removed whole."""
        top_st = os.fstat(self.top)
        frames = [(os.dup(self.top), _names(self.top), top_st)]
        while frames:
            fd, names, st_dir = frames[-1]
            if not names:
                frames.pop()
                self.restore(fd, st_dir)
                os.close(fd)
                continue
            name = names.pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if st.st_dev != self.dev:
                continue  # another mount: swept on its own if it is writable
            if not stat.S_ISDIR(st.st_mode):
                if self.changed(st):
                    self.unlink(fd, name)
            elif not self.old_dir(st):
                self.remove_tree(fd, name)
            else:
                child = self.open_dir(fd, name)
                if child is not None:
                    frames.append((child, _names(child), st))
        while self.later:
            self.remove_tree(self.top, self.later.pop())

    def restore(self, fd, st):
        """An old directory's mode as it was (the fallback: at least u+rwx, and removed when emptied)."""
        old = None if self.known is None else self.known.get((st.st_dev, st.st_ino))
        mode = stat.S_IMODE(old[1] if old is not None else st.st_mode | 0o700)
        try:
            os.chmod(fd, mode)
        except OSError:
            self.errors += 1


def _names(fd):
    try:
        return os.listdir(fd)
    except OSError:
        return []


def remove_path(path):
    """Remove ``path`` (a directory tree or a file) entirely; the number of errors."""
    parent, name = os.path.split(path.rstrip("/"))
    try:
        pfd = os.open(parent or "/", _DIR_FLAGS)
    except OSError:
        return 0
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except OSError:
        os.close(pfd)
        return 0
    sweeper = _Sweep(pfd, {}, 0)
    if stat.S_ISDIR(st.st_mode):
        sweeper.remove_tree(pfd, name)
        while sweeper.later:
            sweeper.remove_tree(pfd, sweeper.later.pop())
    else:
        sweeper.unlink(pfd, name)
    os.close(pfd)
    return sweeper.errors


def sweep(roots, known, remove, t0=None):
    """Remove ``remove`` (the job's own directories), then what changed under ``roots``.

    ``known`` is the snapshot (with the IPC objects under the key ``"ipc"``); ``None`` sweeps by
    ``t0`` instead. Returns (entries removed, errors)."""
    errors = sum(remove_path(path) for path in remove)
    if roots or t0 is not None:
        errors += remove_ipc(None if known is None else known.get("ipc", {}), t0)
    removed = 0
    for root in roots:
        try:
            os.chmod(root, stat.S_IMODE(os.lstat(root).st_mode) | 0o700)
            fd = os.open(root, _DIR_FLAGS)
        except OSError:
            errors += 1
            continue
        sweeper = _Sweep(fd, known, t0)
        try:
            sweeper.walk()
        finally:
            os.close(fd)
        removed += sweeper.removed
        errors += sweeper.errors
    return removed, errors


#: System V IPC objects by kind: (the /proc/sysvipc file, the column of their ctime).
IPC_KINDS = {"shm": 13, "msg": 13, "sem": 9}


def ipc_objects():
    """``{(kind, id): ctime seconds}`` of the System V IPC objects of the sandbox's IPC namespace."""
    found = {}
    for kind, at in IPC_KINDS.items():
        try:
            with open("/proc/sysvipc/" + kind) as f:
                rows = [line.split() for line in f.read().splitlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if len(row) > at:
                found[(kind, int(row[1]))] = int(row[at])
    return found


def remove_ipc(before, t0):
    """Remove the IPC objects not in ``before`` (or, without it, changed since ``t0``): the errors."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    errors = 0
    for (kind, ident), ctime in ipc_objects().items():
        if before is not None and (kind, ident) in before:
            continue
        if before is None and (t0 is None or ctime < t0 // 1_000_000_000):
            continue
        if kind == "shm":
            done = libc.shmctl(ident, 0, None)  # IPC_RMID
        elif kind == "msg":
            done = libc.msgctl(ident, 0, None)
        else:
            done = libc.semctl(ident, 0, 0)
        errors += done != 0 and ctypes.get_errno() not in (22, 43)  # EINVAL, EIDRM: gone already
    return errors


def probe_time(directory):
    """The file system's clock now: the ``ctime`` of a file made (and removed) in ``directory``."""
    path = os.path.join(directory, ".cwsandbox-t0-%d" % os.getpid())
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        return os.fstat(fd).st_ctime_ns
    finally:
        os.close(fd)
        os.unlink(path)
