"""The split test harness, as it runs in the sandbox (``python3 -c``); never imported by the library.

``_split`` sends this file's text as the program and the candidate, the tests and a
fresh nonce on stdin. Two processes:

- **T** (the tests' process; the one the exec started) makes itself non-dumpable,
  forks C *before* it reads stdin, then reads stdin, strips the working directory
  from ``sys.path`` and sends the candidate's source to C over a pipe. It runs the
  tests in its own interpreter, with every top-level name of the candidate as a
  proxy: a call sends its arguments to C as plain data (tagged JSON) and gets the
  result back as plain data, which T compares with its own ``==``. It writes the
  verdict, with the nonce, as the last line of stdout, and exits.
- **C** (the candidate's process) has ``/dev/null`` as stdin and the exec's stderr
  as its stdout; it never held the nonce or the tests. It runs the candidate, then
  serves T's calls until T says ``end`` (or dies with it).

What crosses the pipe is data: ``None``, bools, ints, floats, str, bytes, lists,
tuples, dicts, sets, complex (subclasses are sent as their base value), or a
handle to one of C's objects (calls, attributes, items, ``len``, ``bool``, ``str``,
iteration are forwarded; ``==`` on a handle is identity, so an object "equal to
everything" equals nothing). T's callables passed as arguments are handles C can
only call. Arguments that are lists, dicts, sets or bytearrays and that the
candidate mutated are copied back into T's objects.
"""

from __future__ import annotations

import contextlib
from typing import Any


def _cwsandbox_split() -> None:
    import builtins
    import json
    import os
    import signal
    import sys

    read, write, exit_, err = os.read, os.write, os._exit, sys.stderr
    max_frame = 64 << 20

    class Ended(BaseException):
        """The other process is gone (the pipe closed): in T, the candidate ended its process."""

    class ProgramError(Exception):
        """An exception the candidate raised whose class has no builtin base T can raise."""

    def take(fd: int, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = read(fd, n - len(data))
            if not chunk:
                break
            data += chunk
        return data

    class Peer:
        """One end of the pipe pair. ``mine``/``theirs``: the tags of handles each side exports."""

        def __init__(self, rfd: int, wfd: int, mine: str, serves: bool) -> None:
            self.rfd, self.wfd, self.mine, self.theirs = rfd, wfd, mine, "K" if mine == "H" else "H"
            self.serves_all = serves  # C serves every operation on its objects; T only calls its callables
            self.exports: dict[int, object] = {}
            self.remotes: dict[int, object] = {}
            self.next_id = 0
            self.ended = False

        def send(self, msg: object) -> None:
            data = json.dumps(msg, separators=(",", ":")).encode()
            data = len(data).to_bytes(4, "big") + data
            try:
                while data:
                    data = data[write(self.wfd, data) :]
            except OSError as exc:
                self.ended = True
                raise Ended("the pipe to the other process broke") from exc

        def receive(self) -> dict[str, Any]:
            head = take(self.rfd, 4)
            size = int.from_bytes(head, "big") if len(head) == 4 else -1
            if size < 0 or size > max_frame:
                self.ended = True
                raise Ended("the other process closed the pipe" if size < 0 else "a message over 64 MiB")
            body = take(self.rfd, size)
            if len(body) != size:
                self.ended = True
                raise Ended("the other process closed the pipe mid-message")
            msg = json.loads(body)
            if not isinstance(msg, dict):
                raise ValueError("a message that is not an object")
            return msg

        # -- values ---------------------------------------------------------------------
        def encode(self, v: object, depth: int = 0) -> object:
            if depth > 200:
                raise ValueError("a value nested more than 200 levels deep")
            d = depth + 1
            if v is None or type(v) is bool:
                return v
            if isinstance(v, Remote) and v._peer is self:
                return {self.theirs: v._id}
            if isinstance(v, bool):
                return bool(v)
            if isinstance(v, int):
                return int.__index__(v)
            if isinstance(v, float):
                return {"f": float.__repr__(v)}
            if isinstance(v, str):
                return str.__str__(v)
            if isinstance(v, (bytes, bytearray)):
                return {"Y" if isinstance(v, bytearray) else "B": bytes.hex(bytes(memoryview(v)))}
            if isinstance(v, complex):
                return {"C": [complex.__getattribute__(v, "real"), complex.__getattribute__(v, "imag")]}
            if isinstance(v, list):
                return [self.encode(x, d) for x in list.__iter__(v)]
            if isinstance(v, tuple):
                return {"T": [self.encode(x, d) for x in tuple.__iter__(v)]}
            if isinstance(v, dict):
                return {"D": [[self.encode(k, d), self.encode(x, d)] for k, x in dict.items(v)]}
            if isinstance(v, (set, frozenset)):
                items = set.__iter__(v) if isinstance(v, set) else frozenset.__iter__(v)
                return {"F" if isinstance(v, frozenset) else "S": [self.encode(x, d) for x in items]}
            if not self.serves_all and not callable(v):
                raise TypeError(f"a {type(v).__name__} cannot be passed to the program (only data and callables)")
            self.next_id += 1
            self.exports[self.next_id] = v
            return {self.mine: self.next_id}

        def decode(self, v: object) -> object:
            if v is None or isinstance(v, (bool, int, str)):
                return v
            if isinstance(v, list):
                return [self.decode(x) for x in v]
            if not isinstance(v, dict) or len(v) != 1:
                raise ValueError("a malformed value")
            ((tag, x),) = v.items()
            if tag == "f" and isinstance(x, str):
                return float(x)
            if tag in ("B", "Y") and isinstance(x, str):
                return bytes.fromhex(x) if tag == "B" else bytearray.fromhex(x)
            if tag == "C" and isinstance(x, list) and len(x) == 2:
                return complex(float(x[0]), float(x[1]))
            if tag == "T" and isinstance(x, list):
                return tuple(self.decode(i) for i in x)
            if tag == "D" and isinstance(x, list):
                return {self.decode(k): self.decode(i) for k, i in x}
            if tag in ("S", "F") and isinstance(x, list):
                items = [self.decode(i) for i in x]
                return set(items) if tag == "S" else frozenset(items)
            if tag == self.mine and type(x) is int and x in self.exports:
                return self.exports[x]
            if tag == self.theirs and type(x) is int:
                if x not in self.remotes:
                    self.remotes[x] = Remote(self, x)
                return self.remotes[x]
            raise ValueError(f"a malformed value (tag {tag!r})")

        # -- requests ---------------------------------------------------------------------
        def request(
            self, op: str, target: int, args: tuple[Any, ...] = (), kwargs: dict[str, object] | None = None
        ) -> object:
            if self.ended:
                raise Ended("the program's process has ended")
            enc_args = [self.encode(a) for a in args]
            enc_kw = [[k, self.encode(x)] for k, x in (kwargs or {}).items()]
            self.send({"op": op, "h": target, "a": enc_args, "k": enc_kw})
            while True:
                msg = self.receive()
                if "op" in msg:
                    self.serve(msg)
                    continue
                if "exit" in msg:
                    self.ended = True
                    raise Ended(f"the program ended the process (SystemExit({msg['exit']})) before its tests finished")
                if "x" in msg:
                    raise self.exception(msg["x"])
                for index, value in msg.get("m", []):  # arguments the callee mutated
                    mine: Any = args[index]
                    new: Any = self.decode(value)
                    if type(mine) in (list, bytearray) and type(new) is type(mine):
                        mine[:] = new
                    elif type(mine) in (dict, set) and type(new) is type(mine):
                        mine.clear()
                        mine.update(new)
                return self.decode(msg.get("r"))

        def exception(self, x: object) -> BaseException:
            info = x if isinstance(x, dict) else {}
            name, base, text = str(info.get("name")), str(info.get("base")), str(info.get("msg"))
            cls = getattr(builtins, base, None)
            if isinstance(cls, type) and issubclass(cls, Exception):
                try:
                    exc = cls(text)
                except Exception:
                    exc = ProgramError(f"{name}: {text}")
            else:
                exc = ProgramError(f"{name}: {text}")
            exc.__cwsandbox_program__ = str(info.get("tb", ""))  # type: ignore[attr-defined]
            return exc

        def serve(self, msg: dict[str, Any]) -> None:
            op, target = msg.get("op"), msg.get("h")
            if op == "end":
                exit_(0)
            obj = self.exports.get(target) if type(target) is int else None
            try:
                if obj is None or (not self.serves_all and op != "call"):
                    raise TypeError(f"no such object or operation: {op!r}")
                args = [self.decode(a) for a in msg.get("a", [])]
                kwargs = {str(k): self.decode(v) for k, v in msg.get("k", [])}
                before = [self.encode(a) if type(a) in (list, dict, set, bytearray) else None for a in args]
                result = operate(obj, str(op), args, kwargs)
                reply: dict[str, object] = {"r": self.encode(result)}
                if op == "call":
                    after = [(i, self.encode(a)) for i, a in enumerate(args) if before[i] is not None]
                    reply["m"] = [[i, e] for i, e in after if e != before[i]]
            except SystemExit as exc:
                self.send({"exit": repr(exc.code)})
                exit_(0)
            except Ended:
                raise
            except BaseException as exc:
                reply = {"x": describe(exc)}
            self.send(reply)

    def operate(obj: Any, op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if op == "call":
            return obj(*args, **kwargs)
        if op == "getattr":
            return getattr(obj, str(args[0]))
        if op == "setattr":
            setattr(obj, str(args[0]), args[1])
            return None
        if op == "getitem":
            return obj[args[0]]
        if op == "setitem":
            obj[args[0]] = args[1]
            return None
        ops: dict[str, Any] = {"len": len, "bool": bool, "str": str, "repr": repr, "iter": iter, "next": next}
        if op in ops:
            return ops[op](obj)
        raise TypeError(f"unknown operation {op!r}")

    def describe(exc: BaseException) -> dict[str, str]:
        base = next((c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"), "Exception")
        text = ""
        try:
            import traceback

            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-2000:]
            message = str(exc)
        except BaseException:
            message = "?"
        return {"name": type(exc).__name__, "base": base, "msg": message[:2000], "tb": text}

    class Remote:
        """T's view of one of C's objects; ``==`` and ``hash`` are identity, never the program's."""

        __slots__ = ("_id", "_peer")
        _peer: Peer
        _id: int

        def __init__(self, peer: Peer, ident: int) -> None:
            object.__setattr__(self, "_peer", peer)
            object.__setattr__(self, "_id", ident)

        def __call__(self, *args: object, **kwargs: object) -> object:
            return self._peer.request("call", self._id, args, kwargs)

        def __getattr__(self, name: str) -> object:
            return self._peer.request("getattr", self._id, (name,))

        def __setattr__(self, name: str, value: object) -> None:
            self._peer.request("setattr", self._id, (name, value))

        def __getitem__(self, key: object) -> object:
            return self._peer.request("getitem", self._id, (key,))

        def __setitem__(self, key: object, value: object) -> None:
            self._peer.request("setitem", self._id, (key, value))

        def __len__(self) -> int:
            n = self._peer.request("len", self._id)
            if type(n) is not int:
                raise TypeError("len() of a program object did not return an int")
            return n

        def __bool__(self) -> bool:
            b = self._peer.request("bool", self._id)
            if type(b) is not bool:
                raise TypeError("bool() of a program object did not return a bool")
            return b

        def __str__(self) -> str:
            return str(self._peer.request("str", self._id))

        def __repr__(self) -> str:
            return str(self._peer.request("repr", self._id))

        def __iter__(self) -> Any:
            it = self._peer.request("iter", self._id)
            if not isinstance(it, Remote):
                raise TypeError("iter() of a program object did not return an iterator")
            return it

        def __next__(self) -> Any:
            return self._peer.request("next", self._id)

        def __contains__(self, item: object) -> bool:
            return any(x is item or x == item for x in self)  # compared here, never by the program

    # -- the candidate's process ---------------------------------------------------------
    def candidate(peer: Peer) -> None:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)  # its prints go to stderr: the exec's stdout is T's alone
        try:
            import ctypes

            ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # an ordinary process again (PR_SET_DUMPABLE)
        except BaseException:
            pass
        msg = peer.receive()
        source = msg.get("source")
        main = type(sys)("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        try:
            unit = compile(str(source), "solution.py", "exec")
            exec(unit, main.__dict__)
            names: list[list[object]] = []
            for name, value in list(main.__dict__.items()):
                if name.startswith("__"):
                    continue
                if isinstance(value, type(sys)):
                    names.append([name, {"M": str(getattr(value, "__name__", ""))}])
                    continue
                try:
                    names.append([name, peer.encode(value)])
                except Exception:
                    continue
            reply: dict[str, object] = {"ready": names}
        except SystemExit as exc:
            reply = {"exit": repr(exc.code)}
        except BaseException as exc:
            reply = {"x": describe(exc)}
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        peer.send(reply)
        if "ready" not in reply:
            exit_(1)
        while True:
            peer.serve(peer.receive())

    # -- the tests' process --------------------------------------------------------------
    def verdict(kind: str, reason: str) -> None:
        line = json.dumps({"kind": kind, "reason": reason[-2000:]})
        data = b"\ncwsandbox-verdict " + nonce + b" " + line.encode() + b"\n"
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        while data:
            data = data[write(1, data) :]

    try:
        import ctypes

        if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0: no /proc/<pid>/mem, no fds
            raise OSError(ctypes.get_errno(), "prctl")
    except BaseException as exc:
        err.write(f"cwsandbox: the harness cannot protect its process ({exc!r})\n")
        exit_(3)
    c_reads, t_writes = os.pipe()
    t_reads, c_writes = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(t_reads)
            os.close(t_writes)
            candidate(Peer(c_reads, c_writes, "H", True))
        except BaseException:
            pass
        exit_(1)
    os.close(c_reads)
    os.close(c_writes)
    head = take(0, 57)
    parts = head[:-1].split(b" ")
    ok = len(head) == 57 and len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit()
    size = int(parts[1]) + int(parts[2]) if ok else 0
    body = take(0, size)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if not ok or len(body) != size:
        err.write("cwsandbox: the harness got incomplete input\n")
        exit_(2)
    nonce, split, has_tests = parts[0], int(parts[1]), parts[3] == b"1"
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]  # nothing the program writes is imported here
    peer = Peer(t_reads, t_writes, "K", False)

    def ended_how() -> str:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        try:
            _, status = os.waitpid(pid, 0)
        except OSError:
            return ""
        if os.WIFSIGNALED(status):
            return f" (killed by signal {os.WTERMSIG(status)})"
        return f" (exit status {os.WEXITSTATUS(status)})"

    kind, reason, tests = "passed", "", ""
    try:
        peer.send({"source": body[:split].decode("utf-8")})
        tests = body[split:].decode("utf-8")
        del body
        first = peer.receive()
        if "exit" in first:
            raise Ended(f"the program ended the process (SystemExit({first['exit']})) before its tests finished")
        if "x" in first:
            raise peer.exception(first["x"])
        namespace: dict[str, object] = {"__builtins__": builtins, "__name__": "__main__"}
        stdlib = getattr(sys, "stdlib_module_names", None)
        for name, value in first.get("ready", []):
            if isinstance(value, dict) and "M" in value:
                module = str(value["M"])
                if stdlib is None or (module.split(".")[0] in stdlib and module not in ("antigravity", "this")):
                    with contextlib.suppress(BaseException):
                        namespace[str(name)] = __import__(module, fromlist=["_"])
                continue
            namespace[str(name)] = peer.decode(value)
        if has_tests:
            exec(compile(tests, "tests.py", "exec"), namespace)
        if peer.ended:
            raise Ended("the program ended its process while its tests ran")
    except Ended as exc:
        how = ended_how()
        kind, reason = "early_exit", f"the program ended its process{how} before its tests finished"
        if "SystemExit" in str(exc):
            reason = str(exc)
        if "64 MiB" in str(exc):
            kind, reason = "error_exit", f"the program sent {exc}"
    except BaseException as exc:
        program = getattr(exc, "__cwsandbox_program__", None)
        kind = "error_exit" if program is not None else "wrong_answer"
        if isinstance(exc, AssertionError):
            kind = "wrong_answer"
        try:
            import traceback

            below = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
            shown = "".join(traceback.format_exception(type(exc), exc, below))
            err.write(shown + (f"raised in the program:\n{program}" if program else ""))
            last = shown.strip().splitlines()[-1] if shown.strip() else type(exc).__name__
            where, tb = "", exc.__traceback__
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == "tests.py":
                    lines = tests.splitlines()
                    text = lines[tb.tb_lineno - 1].strip() if 0 < tb.tb_lineno <= len(lines) else ""
                    where = f" at tests.py line {tb.tb_lineno}: {text}"[:300]
                tb = tb.tb_next
            reason = (last if not program else f"the program raised {last}") + where
        except BaseException:
            reason = type(exc).__name__
    if kind != "early_exit":
        with contextlib.suppress(Ended):
            peer.send({"op": "end", "h": 0})
        ended_how()
    verdict(kind, reason)
    exit_(0 if kind == "passed" else 1)


if __name__ == "__main__":
    _cwsandbox_split()
