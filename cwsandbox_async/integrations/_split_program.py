"""The split test harness, as it runs in the sandbox (``python3 -c``); never imported by the library.

``_split`` sends this file's text as the program and the candidate, the tests and a
fresh nonce on stdin. Two processes:

- **T** (the tests' process; the one the exec started) first drops from ``sys.path``
  every entry the program could write (relative ones, the working directory and
  below, writable directories outside the interpreter's own prefixes), *before* it
  imports anything; ignores ``SIGPIPE`` (a write to a closed pipe is an error it
  handles, never its death); makes itself non-dumpable, forks C *before* it reads
  stdin, then reads stdin and sends the candidate's source to C over a pipe. It
  compiles the tests (a ``SyntaxError`` there is the caller's: ``tests_error``) and
  runs them in its own interpreter, with the candidate's top-level names as
  proxies: a call sends its arguments to C as plain data and gets the result back
  as plain data, which T compares with its own ``==``. Names the tests' namespace
  never takes: one that is a builtin's name (the tests always see Python's
  builtins), one bound to a module that is not on ``SAFE_MODULES`` (T imports only
  those, by its own fixed names; never a name the candidate chose); and a name that
  is a ``SAFE_MODULES`` module's own (``math``) is always that module, whatever the
  candidate bound to it (tests that use ``math`` without importing it, as MBPP's do,
  get the real one). T notes on stderr each such name the tests use. It writes the
  verdict, with the nonce, as the last line of stdout, and exits.
- **C** (the candidate's process) has ``/dev/null`` as stdin and the exec's stderr
  as its stdout; it never held the nonce or the tests. It compiles the candidate
  (a failure: ``compile_error`` with file, line and message), runs it, then serves
  T's calls until T says ``end`` (or dies with it).

What crosses the pipe is data (``_cwsandbox_codec``): ``None``, bools, ints of any
size (hexadecimal past 2**53), floats bit for bit (``-0.0``, NaN, inf; ``math.nan``
stays ``math.nan``), str, bytes, bytearray, complex, lists, tuples, dicts (in their
order), sets, frozensets, nested to any depth, shared and cyclic references kept
(subclasses are sent as their base value); or a handle to one of C's objects
(calls, attributes, items, ``len``, ``bool``, ``str``, iteration are forwarded; ``==``
on a handle is identity, so an object "equal to everything" equals nothing). The
wire form is flat (a list of nodes; a container's items are literals or the index of
another node): encoding and decoding are loops, with no recursion, so no depth limit
applies. The candidate's top-level names cross by value up to about 1 MiB each; a
bigger one (a sieve, a cache) reaches the tests as a handle. One message is at most
``MAX_FRAME`` bytes; a bigger answer is C's ``ValueError`` (T never reads more).
T's callables passed as arguments are handles C can only call. Arguments that are
lists, dicts, sets or bytearrays and that the candidate mutated are copied back
into T's objects.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: The largest message either process reads (bytes). Past it, the answer is an ``error_exit``.
MAX_FRAME = 256 << 20

#: The only modules T binds for a candidate name bound to a module (by these names, never the candidate's):
#: standard, importing them runs nothing from the working directory or the environment.
_SAFE = (
    "abc array base64 binascii bisect calendar cmath collections collections.abc copy dataclasses datetime "
    "decimal enum fractions functools hashlib heapq io itertools json keyword math numbers operator os "
    "os.path posixpath pprint queue random re statistics string struct sys textwrap time types typing "
    "unicodedata zlib contextlib csv difflib fnmatch graphlib html ipaddress secrets shlex urllib.parse weakref"
)
SAFE_MODULES = frozenset(_SAFE.split())


def _cwsandbox_codec() -> tuple[Callable[..., list[Any]], Callable[..., Any]]:
    """``(encode, decode)``: a value to a flat JSON-able node list and back, with loops only.

    The wire form: a list of nodes, the value's own first. A node is a literal (``None``, a bool,
    an int under 2**53, a str) or a tagged list; a container's items are literals or ``[k]``, a
    reference to node ``k``. So nothing is nested deeper than three levels, whatever the value.
    ``encode(value, other, limit)``: ``other(obj)`` gives the node of a non-data object (a handle)
    or raises ``TypeError``; ``limit`` (0: none): ``OverflowError`` past about that many nodes (a
    node per 8 characters of a leaf). ``decode(nodes, handle)``: ``handle(tag, ident)`` gives the
    object of a handle node; raises ``ValueError`` for anything malformed, in time linear in its size.
    """
    import math
    import struct

    nan, safe, double = math.nan, 1 << 53, struct.Struct(">d")
    plain, literal = (type(None), bool, str), (bool, int, str)
    leaf_tags, built_tags = ("i", "f", "n", "b", "y", "c", "H", "K"), ("t", "z")

    def bits(x: float) -> str:
        return double.pack(x).hex()

    def node(v: Any, item: Callable[[object], object], other: Callable[[object], list[Any]]) -> Any:
        t = type(v)
        if t in plain:
            return v
        if t is list or t is tuple:  # the common exact types first: iterating them runs no program code
            return ["l" if t is list else "t", *[item(x) for x in v]]
        if t is float:
            return ["n"] if v is nan else ["f", bits(v)]
        if t is dict:
            out: list[object] = ["d"]
            for k, x in v.items():
                out += (item(k), item(x))
            return out
        if issubclass(t, int):
            n = int.__index__(v)
            return n if -safe < n < safe else ["i", int.__format__(n, "x")]
        if issubclass(t, float):
            return ["n"] if v is nan else ["f", bits(v)]
        if issubclass(t, str):
            return str.__str__(v)
        if issubclass(t, (bytes, bytearray)):
            return ["y" if issubclass(t, bytearray) else "b", bytes(memoryview(v)).hex()]
        if issubclass(t, complex):
            return ["c", bits(complex.real.__get__(v)), bits(complex.imag.__get__(v))]
        if issubclass(t, list):
            return ["l", *[item(x) for x in list.__iter__(v)]]
        if issubclass(t, tuple):
            return ["t", *[item(x) for x in tuple.__iter__(v)]]
        if issubclass(t, dict):
            return node(dict(dict.items(v)), item, other)
        if issubclass(t, frozenset):
            return ["z", *[item(x) for x in frozenset.__iter__(v)]]
        if issubclass(t, set):
            return ["s", *[item(x) for x in set.__iter__(v)]]
        return other(v)

    def encode(value: object, other: Callable[[object], list[Any]], limit: int = 0) -> list[Any]:
        t = type(value)
        if value is None or t is bool or (t is int and -safe < value < safe):  # type: ignore[operator]
            return [value]
        nodes: list[Any] = [None]
        memo: dict[int, int] = {id(value): 0}
        keep: list[object] = [value]  # every object referenced stays alive, so no id is reused meanwhile
        work: list[tuple[int, object]] = [(0, value)]
        weight = 0

        def item(x: object) -> object:  # an item of a container: a literal, or [k]
            t = type(x)
            if t in plain or (t is int and -safe < x < safe):  # type: ignore[operator]
                if limit and t is str:
                    nonlocal weight
                    weight += str.__len__(x) // 8  # type: ignore[arg-type]
                return x
            i = memo.get(id(x))
            if i is None:
                i = memo[id(x)] = len(nodes)
                nodes.append(None)
                keep.append(x)
                work.append((i, x))
            return [i]

        while work:
            i, v = work.pop()
            if limit:
                size = 0  # characters on the wire
                if isinstance(v, (str, list, tuple, dict, set, frozenset)):
                    size = 8 * len(v) if not isinstance(v, str) else str.__len__(v)
                elif isinstance(v, (bytes, bytearray)):
                    size = 2 * len(memoryview(v))
                elif isinstance(v, int):
                    size = int.bit_length(v) // 4
                weight += 1 + size // 8
                if weight > limit:
                    raise OverflowError("a value over the size sent by value")
            nodes[i] = node(v, item, other)
        if limit and weight > limit:
            raise OverflowError("a value over the size sent by value")
        return nodes

    def decode(nodes: object, handle: Callable[[str, int], object]) -> Any:
        if type(nodes) is not list or not nodes:
            raise ValueError("a malformed value")
        n = len(nodes)
        if n == 1 and (nodes[0] is None or type(nodes[0]) in (bool, int, str)):
            return nodes[0]
        out: list[Any] = [None] * n
        pending: list[int] = []  # tuples and frozensets: built once their items are
        fill: list[int] = []  # lists, dicts, sets: made empty first, filled last (they may hold cycles)
        for i, x in enumerate(nodes):
            if x is None or type(x) in (bool, int, str):
                out[i] = x
                continue
            if type(x) is not list or not x or type(x[0]) is not str:
                raise ValueError("a malformed value")
            tag = x[0]
            if tag in leaf_tags or len(tag) != 1:
                out[i] = leaf(tag, x, handle)
                continue
            for c in x[1:]:
                if type(c) is list:
                    if len(c) != 1 or type(c[0]) is not int or not 0 <= c[0] < n:
                        raise ValueError("a malformed value (a reference out of range)")
                elif c is not None and type(c) not in literal:
                    raise ValueError("a malformed item")
            if tag in built_tags:
                pending.append(i)
            elif tag in ("l", "d", "s"):
                if tag == "d" and len(x) % 2 != 1:
                    raise ValueError("a malformed dict")
                out[i] = [] if tag == "l" else {} if tag == "d" else set()
                fill.append(i)
            else:
                raise ValueError(f"a malformed value (tag {tag!r})")
        state = [0] * n  # of tuples and frozensets: 0 not built, 1 building, 2 built
        for start in pending:
            stack = [start]
            while stack:
                j = stack[-1]
                if state[j] == 2:
                    stack.pop()
                    continue
                x = nodes[j]
                if state[j] == 0:
                    state[j] = 1
                    for c in x[1:]:
                        if type(c) is list and type(nodes[c[0]]) is list and nodes[c[0]][0] in built_tags:
                            if state[c[0]] == 1:
                                raise ValueError("a malformed value (an immutable cycle)")
                            if state[c[0]] == 0:
                                stack.append(c[0])
                    continue
                items = [out[c[0]] if type(c) is list else c for c in x[1:]]
                out[j] = tuple(items) if x[0] == "t" else frozenset(items)
                state[j] = 2
                stack.pop()
        for i in fill:
            target, items = out[i], [out[c[0]] if type(c) is list else c for c in nodes[i][1:]]
            if type(target) is list:
                target.extend(items)
            elif type(target) is set:
                target.update(items)
            else:
                for k in range(0, len(items), 2):
                    target[items[k]] = items[k + 1]
        return out[0]

    def leaf(tag: str, x: list[Any], handle: Callable[[str, int], object]) -> object:
        arg = x[1] if len(x) == 2 else None
        if tag == "n" and len(x) == 1:
            return nan
        if type(arg) is str and tag == "i":
            return int(arg, 16)
        if type(arg) is str and tag == "f" and len(arg) == 16:
            return double.unpack(bytes.fromhex(arg))[0]
        if type(arg) is str and tag in ("b", "y"):
            return bytes.fromhex(arg) if tag == "b" else bytearray.fromhex(arg)
        if tag == "c" and len(x) == 3 and all(type(p) is str and len(p) == 16 for p in x[1:]):
            return complex(double.unpack(bytes.fromhex(x[1]))[0], double.unpack(bytes.fromhex(x[2]))[0])
        if type(arg) is int and tag in ("H", "K"):
            return handle(tag, arg)
        raise ValueError(f"a malformed value (tag {tag!r})")

    return encode, decode


def _cwsandbox_split() -> None:
    import os
    import sys

    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # a working directory removed under it: no entry can be in it
        cwd = "//"
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}

    def trusted(entry: object) -> bool:  # a sys.path entry the program (or an earlier tool call) cannot write
        if type(entry) is not str or not os.path.isabs(entry):
            return False
        real = os.path.realpath(entry)
        if real == cwd or real.startswith(cwd.rstrip("/") + "/"):
            return False
        if any(real == p or real.startswith(p.rstrip("/") + "/") for p in prefixes):
            return True
        return os.path.isdir(real) and not os.access(real, os.W_OK)

    path = list(sys.path)  # the candidate's (C restores it): as in python3 -c
    sys.path[:] = [p for p in path if trusted(p)]  # before any import below
    import builtins
    import contextlib
    import json
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a closed pipe is EPIPE (handled), never T's death
    read, write, exit_, err = os.read, os.write, os._exit, sys.stderr
    encode_value, decode_value = _cwsandbox_codec()

    class Ended(BaseException):
        """The other process is gone (the pipe closed), or sent what T refuses (``why``)."""

        def __init__(self, message: str, why: str = "") -> None:
            super().__init__(message)
            self.why = why

    class ProgramError(Exception):
        """An exception the candidate raised whose class has no builtin base T can raise."""

    def take(fd: int, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = read(fd, min(n - len(data), 1 << 20))
            if not chunk:
                break
            data += chunk
        return bytes(data)

    class Peer:
        """One end of the pipe pair. ``mine``/``theirs``: the tags of handles each side exports."""

        def __init__(self, rfd: int, wfd: int, mine: str, serves: bool) -> None:
            self.rfd, self.wfd, self.mine, self.theirs = rfd, wfd, mine, "K" if mine == "H" else "H"
            self.serves_all = serves  # C serves every operation on its objects; T only calls its callables
            self.exports: dict[int, object] = {}
            self.remotes: dict[int, object] = {}
            self.next_id = 0
            self.ended = False

        def send(self, msg: dict[str, object]) -> None:
            data = json.dumps(msg, separators=(",", ":")).encode()
            if len(data) > MAX_FRAME:
                size = len(data)
                too_big = ValueError(
                    f"a value of {size} bytes encoded, over the {MAX_FRAME >> 20} MiB the pipe carries"
                )
                if not self.serves_all:
                    raise too_big  # T's own call: raised in the tests
                data = json.dumps({"x": describe(too_big)}).encode()
            try:
                for view in (memoryview(len(data).to_bytes(4, "big")), memoryview(data)):
                    while view:
                        view = view[write(self.wfd, view) :]
            except OSError as exc:
                self.ended = True
                raise Ended("the pipe to the other process broke") from exc

        def receive(self) -> dict[str, Any]:
            head = take(self.rfd, 4)
            size = int.from_bytes(head, "big") if len(head) == 4 else -1
            if size < 0 or size > MAX_FRAME:
                self.ended = True
                too_big = f"a message of {size} bytes, over the {MAX_FRAME >> 20} MiB the harness reads"
                raise Ended("the other process closed the pipe", "" if size < 0 else too_big)
            body = take(self.rfd, size)
            if len(body) != size:
                self.ended = True
                raise Ended("the other process closed the pipe mid-message")
            msg = json.loads(body)
            if not isinstance(msg, dict):
                raise ValueError("a message that is not an object")
            return msg

        def encode(self, v: object, limit: int = 0) -> list[Any]:
            return encode_value(v, self.other, limit)

        def other(self, v: object) -> list[Any]:
            if type(v) is Remote and v._peer is self:
                return [self.theirs, v._id]
            if not self.serves_all and not callable(v):
                raise TypeError(f"a {type(v).__name__} cannot be passed to the program (only data and callables)")
            self.next_id += 1
            self.exports[self.next_id] = v
            return [self.mine, self.next_id]

        def decode(self, v: object) -> Any:
            return decode_value(v, self.handle)

        def handle(self, tag: str, x: int) -> object:
            if tag == self.mine and x in self.exports:
                return self.exports[x]
            if tag == self.theirs:
                if x not in self.remotes:
                    self.remotes[x] = Remote(self, x)
                return self.remotes[x]
            raise ValueError(f"a malformed value (handle {tag}{x})")

        def request(
            self, op: str, target: int, args: tuple[Any, ...] = (), kwargs: dict[str, object] | None = None
        ) -> object:
            if self.ended:
                raise Ended("the program's process has ended")
            self.send({"op": op, "h": target, "a": self.encode([list(args), dict(kwargs or {})])})
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
                    mine: Any = args[index] if type(index) is int and 0 <= index < len(args) else None
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
                call = self.decode(msg.get("a"))
                if type(call) is not list or len(call) != 2 or type(call[0]) is not list or type(call[1]) is not dict:
                    raise ValueError("a malformed call")
                args, kwargs = call[0], {str(k): v for k, v in call[1].items()}
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

    def unparsed(exc: BaseException, file: str) -> str:
        """A compile failure in one line: ``SyntaxError at solution.py line 3: expected ':': def f(x)``."""
        if isinstance(exc, SyntaxError):
            where = f" at {exc.filename or file} line {exc.lineno}" if exc.lineno else f" in {file}"
            text = " ".join((exc.text or "").split())
            return f"{type(exc).__name__}{where}: {exc.msg}" + (f": {text}" if text else "")
        return f"{type(exc).__name__} in {file}: {exc}"

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
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as in any Python program
        sys.path[:] = path
        try:
            import ctypes

            ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # an ordinary process again (PR_SET_DUMPABLE)
        except BaseException:
            pass
        source = str(peer.receive().get("source"))
        main = type(sys)("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        reply: dict[str, object]
        try:
            unit = compile(source, "solution.py", "exec")
        except BaseException as exc:  # nothing of the program ran: this report is the harness's own
            peer.send({"compile": unparsed(exc, "solution.py")})
            exit_(1)
        try:
            exec(unit, main.__dict__)
            names: list[list[object]] = []
            for name, value in list(main.__dict__.items()):
                if name.startswith("__"):
                    continue
                if isinstance(value, type(sys)):
                    names.append([name, "M", str(getattr(value, "__name__", ""))])
                    continue
                try:
                    names.append([name, "V", peer.encode(value, 1 << 17)])
                except OverflowError:  # a big table (a sieve, a cache): a handle, not megabytes on the pipe
                    names.append([name, "V", [peer.other(value)]])
                except Exception:
                    continue
            reply = {"ready": names}
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
        line = json.dumps({"kind": kind, "reason": " ".join(reason.split("\n"))[-2000:]})
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

    def used(unit: Any) -> set[str]:  # every name the tests' code refers to (nested code included)
        names, todo = set(), [unit]
        while todo:
            code = todo.pop()
            names.update(code.co_names)
            todo.extend(c for c in code.co_consts if isinstance(c, type(unit)))
        return names

    kind, reason, tests = "passed", "", ""
    try:
        peer.send({"source": body[:split].decode("utf-8")})
        tests = body[split:].decode("utf-8")
        del body
        try:
            checks = compile(tests, "tests.py", "exec")
        except BaseException as exc:
            kind, reason = "tests_error", unparsed(exc, "tests.py")
            raise
        first = peer.receive()
        if "compile" in first:
            kind, reason = "compile_error", str(first["compile"])
            raise SyntaxError(reason)
        if "exit" in first:
            raise Ended(f"the program ended the process (SystemExit({first['exit']})) before its tests finished")
        if "x" in first:
            raise peer.exception(first["x"])
        namespace: dict[str, object] = {"__builtins__": builtins, "__name__": "__main__"}
        refused: list[str] = []
        for entry in first.get("ready", []):
            name, what, value = (str(entry[0]), entry[1], entry[2]) if len(entry) == 3 else ("__", "", None)
            module = {"posixpath": "os.path"}.get(str(value), str(value)) if what == "M" else ""
            if name.startswith("__") or name in builtins.__dict__:
                refused.append(f"{name} (a builtin's name: the tests see the builtin)")
            elif name in SAFE_MODULES:  # a standard module's own name (MBPP's `math.isclose`): only that module
                with contextlib.suppress(ImportError):  # one this Python lacks: the name stays unbound
                    __import__(name)
                    namespace[name] = sys.modules[name]
                if module != name:
                    refused.append(f"{name} (the program's is not the module {name}: the tests get the module)")
            elif what == "M":
                if module in SAFE_MODULES:
                    with contextlib.suppress(ImportError):
                        __import__(module)
                        namespace[name] = sys.modules[module]
                else:
                    refused.append(f"{name} (module {module!r} is not one the harness imports)")
            else:
                namespace[name] = peer.decode(value)
        seen = used(checks)
        shown = [r for r in refused if r.split(" ", 1)[0] in seen]
        if shown:
            err.write("cwsandbox: names of the program the tests use but do not get: " + "; ".join(shown) + "\n")
        if has_tests:
            exec(checks, namespace)
        if peer.ended:
            raise Ended("the program ended its process while its tests ran")
    except Ended as exc:
        how = ended_how()
        kind, reason = "early_exit", f"the program ended its process{how} before its tests finished"
        if "SystemExit" in str(exc):
            reason = str(exc)
        if exc.why:
            kind, reason = "error_exit", f"the program sent {exc.why}"
    except BaseException as exc:
        if kind == "passed":
            program = getattr(exc, "__cwsandbox_program__", None)
            kind = "error_exit" if program is not None else "wrong_answer"
            if isinstance(exc, AssertionError):
                kind = "wrong_answer"
            try:
                import traceback

                below = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
                shown_tb = "".join(traceback.format_exception(type(exc), exc, below))
                err.write(shown_tb + (f"raised in the program:\n{program}" if program else ""))
                last = shown_tb.strip().splitlines()[-1] if shown_tb.strip() else type(exc).__name__
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
        else:
            err.write(f"cwsandbox: {reason}\n")
    if kind != "early_exit":
        with contextlib.suppress(Ended):
            peer.send({"op": "end", "h": 0})
        ended_how()
    verdict(kind, reason)
    exit_(0 if kind == "passed" else 1)


if __name__ == "__main__":
    _cwsandbox_split()
