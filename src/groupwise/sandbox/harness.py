"""What runs inside a sandbox once the launcher has built it: a program as ``__main__`` (``io``),
a solution that answers calls (``serve``), or the tests that make those calls (``judge``).

Assert tests never run in the solution's process. The solution runs in one sandbox and serves
requests on a pipe; the tests run in a second sandbox (the judge), where every name the solution
defines is a proxy that forwards calls, attribute reads and item reads to the solution and gets
back *values*: plain data (numbers, strings, bytes, containers of them, a few standard library
types) serialised and rebuilt in the judge, so ``==``, ``abs`` and ``math.isclose`` are the
judge's own, and an object the solution made (an instance of its class, say) comes back as an
opaque handle that equals nothing but itself. The tests, and so the expected values, never
enter the solution's sandbox: a solution that walks frames, patches builtins or modules, rigs
``__eq__`` or writes on its pipe can only change the answers it gives, never the verdict on them.

The launcher loads this file by its path before it drops privileges: standard library only, no
syntax newer than CPython 3.6, nothing from groupwise.
"""

import builtins
import collections
import os
import struct
import sys

MAX_DEPTH = 64
MAX_ITEMS = 1000000


# ------------------------------------------------------------------------------------------------
# Values on the wire: one JSON document per message, containers tagged


class Unencodable(TypeError):
    pass


def encode(value, handle_of=None, depth=0):
    """A JSON-ready form of ``value``; objects that are not plain data become handles
    (``handle_of``) or raise :class:`Unencodable` when there is no handle table."""
    if depth > MAX_DEPTH:
        raise Unencodable("value nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if -(2**53) < value < 2**53 else {"int": format(value, "x")}
    if kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            return {"float": repr(value)}
        return value
    inner = depth + 1
    if kind is list:
        return [encode(item, handle_of, inner) for item in value]
    if kind is tuple:
        return {"tuple": [encode(item, handle_of, inner) for item in value]}
    if kind in (dict, collections.OrderedDict, collections.Counter, collections.defaultdict):
        pairs = [[encode(k, handle_of, inner), encode(v, handle_of, inner)]
                 for k, v in value.items()]
        name = {dict: "dict", collections.OrderedDict: "ordereddict",
                collections.Counter: "counter", collections.defaultdict: "dict"}[kind]
        return {name: pairs}
    if kind in (set, frozenset):
        return {kind.__name__: [encode(item, handle_of, inner) for item in value]}
    if kind is bytes or kind is bytearray:
        return {kind.__name__: value.hex()}
    if kind is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    if kind is range:
        return {"range": [value.start, value.stop, value.step]}
    if kind is collections.deque:
        return {"deque": [encode(item, handle_of, inner) for item in value]}
    if kind.__module__ == "fractions" and kind.__name__ == "Fraction":
        return {"fraction": [format(value.numerator, "x"), format(value.denominator, "x")]}
    if kind.__module__ == "decimal" and kind.__name__ == "Decimal":
        return {"decimal": str(value)}
    if isinstance(value, tuple) and hasattr(kind, "_fields") and kind.__bases__ == (tuple,):
        fields = [f for f in kind._fields if type(f) is str]
        return {"namedtuple": [str(kind.__name__), fields,
                               [encode(item, handle_of, inner) for item in value]]}
    if handle_of is None:
        raise Unencodable(f"cannot pass a {kind.__name__} into the sandbox")
    return {"handle": handle_of(value)}


def decode(data, resolve=None):
    """The value ``data`` encodes, built from scratch (handles through ``resolve``)."""
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode(item, resolve) for item in data]
    if type(data) is not dict or len(data) != 1:
        raise ValueError("malformed value on the wire")
    (tag, body), = data.items()
    if tag == "int":
        return int(body, 16)
    if tag == "float":
        return float(body)
    if tag == "tuple":
        return tuple(decode(item, resolve) for item in body)
    if tag in ("dict", "ordereddict", "counter"):
        kind = {"dict": dict, "ordereddict": collections.OrderedDict,
                "counter": collections.Counter}[tag]
        out = kind()
        for key, item in body:
            out[decode(key, resolve)] = decode(item, resolve)
        return out
    if tag in ("set", "frozenset"):
        items = [decode(item, resolve) for item in body]
        return set(items) if tag == "set" else frozenset(items)
    if tag in ("bytes", "bytearray"):
        raw = bytes.fromhex(body)
        return raw if tag == "bytes" else bytearray(raw)
    if tag == "complex":
        return complex(float(body[0]), float(body[1]))
    if tag == "range":
        return range(int(body[0]), int(body[1]), int(body[2]))
    if tag == "deque":
        return collections.deque(decode(item, resolve) for item in body)
    if tag == "fraction":
        import fractions
        return fractions.Fraction(int(body[0], 16), int(body[1], 16))
    if tag == "decimal":
        import decimal
        return decimal.Decimal(str(body))
    if tag == "namedtuple":
        name, fields, items = body
        kind = collections.namedtuple(str(name), [str(f) for f in fields], rename=True)
        return kind(*[decode(item, resolve) for item in items])
    if tag == "handle" and resolve is not None:
        return resolve(body)
    raise ValueError("malformed value on the wire")


# The frame: a 4-byte length, then the message in a small tagged format (no ``json``: its
# ``re`` import costs more than the rest of a sandbox's start-up). Parsing is pure Python, so a
# hostile frame can make the judge fail but never run anything.
MAX_FRAME = 1 << 28


def dumps(obj, out):
    kind = type(obj)
    if obj is None:
        out.append(b"n")
    elif obj is True:
        out.append(b"t")
    elif obj is False:
        out.append(b"f")
    elif kind is int:
        out.append(b"i%d;" % obj)
    elif kind is float:
        out.append(b"d" + repr(obj).encode("ascii") + b";")
    elif kind is str:
        data = obj.encode("utf-8", "surrogatepass")
        out.append(b"s%d:" % len(data))
        out.append(data)
    elif kind is list:
        out.append(b"l")
        for item in obj:
            dumps(item, out)
        out.append(b"e")
    elif kind is dict:
        out.append(b"m")
        for key, item in obj.items():
            dumps(str(key), out)
            dumps(item, out)
        out.append(b"e")
    else:
        raise Unencodable(f"cannot frame a {kind.__name__}")


def loads(data, at=0, depth=0):
    """(value, next offset) of the message at ``at``; ValueError on anything malformed."""
    if depth > 2 * MAX_DEPTH + 8:
        raise ValueError("message nested too deeply")
    tag = data[at:at + 1]
    at += 1
    if tag == b"n":
        return None, at
    if tag == b"t":
        return True, at
    if tag == b"f":
        return False, at
    if tag in (b"i", b"d"):
        end = data.index(b";", at)
        text = data[at:end].decode("ascii")
        return (int(text) if tag == b"i" else float(text)), end + 1
    if tag == b"s":
        colon = data.index(b":", at)
        size = int(data[at:colon].decode("ascii"))
        end = colon + 1 + size
        if size < 0 or end > len(data):
            raise ValueError("truncated string")
        return data[colon + 1:end].decode("utf-8", "surrogatepass"), end
    if tag in (b"l", b"m"):
        items = []
        while data[at:at + 1] != b"e":
            if at >= len(data):
                raise ValueError("unterminated container")
            item, at = loads(data, at, depth + 1)
            items.append(item)
        if tag == b"l":
            return items, at + 1
        if len(items) % 2:
            raise ValueError("odd map")
        return {str(items[i]): items[i + 1] for i in range(0, len(items), 2)}, at + 1
    raise ValueError("malformed message")


def send(stream, message):
    parts = []
    dumps(message, parts)
    body = b"".join(parts)
    stream.write(struct.pack(">I", len(body)) + body)
    stream.flush()


def read_exactly(stream, size):
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(stream):
    size = struct.unpack(">I", read_exactly(stream, 4))[0]
    if size > MAX_FRAME:
        raise ValueError("message too large")
    data = read_exactly(stream, size)
    value, end = loads(data)
    if end != len(data):
        raise ValueError("trailing bytes in a message")
    return value


def flush_and_exit():
    """Flush what the code printed and exit at once (no interpreter shutdown for the code's
    threads or atexit hooks to run in)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(0)


def describe(exc):
    try:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except BaseException:
        text = "exception"
    return " ".join(text.split())[:300]


# ------------------------------------------------------------------------------------------------
# The solution's side


def exported(namespace):
    """The solution's names as the judge sees them: modules and names imported from elsewhere
    are re-imported by the judge (its own, unpatched copies), plain data travels as values,
    everything else as handles. Names that shadow a builtin are not exported."""
    table = {}
    for name, value in list(namespace.items()):
        if name.startswith("__") or hasattr(builtins, name):
            continue
        if type(value) is type(sys):
            table[name] = {"module": str(getattr(value, "__name__", ""))}
            continue
        origin = getattr(value, "__module__", None)
        qualname = getattr(value, "__qualname__", None)
        if (callable(value) and type(origin) is str and type(qualname) is str
                and origin not in ("solution", "__main__")):
            table[name] = {"import": [origin, qualname]}
            continue
        table[name] = {"value": None}
    return table


def serve(cfg):
    """Run the solution as module ``solution``, then answer the judge's requests until it hangs
    up. The solution's stdout goes to stderr: its pipes are the only answer channel."""
    requests = os.fdopen(cfg["rpc_in"], "rb")
    replies = os.fdopen(cfg["rpc_out"], "wb")
    os.dup2(2, 1)
    module = type(sys)("solution")
    module.__file__ = "solution.py"
    module.__builtins__ = builtins
    sys.modules["solution"] = module
    namespace = module.__dict__
    objects, ids = [], {}

    def handle_of(value):
        key = id(value)
        if key not in ids:
            ids[key] = len(objects)
            objects.append(value)
        return ids[key]

    def resolve(number):
        return objects[number]

    setup_error = None
    try:
        exec(compile(cfg["code"], "solution.py", "exec", dont_inherit=True), namespace)
    except BaseException as exc:
        setup_error = describe(exc)
    table = exported(namespace)
    for name, entry in table.items():
        if "value" in entry:
            entry["value"] = encode(namespace[name], handle_of)
    send(replies, {"names": table, "setup_error": setup_error})
    while True:
        try:
            request = receive(requests)
        except EOFError:
            break
        try:
            send(replies, answer(request, resolve, handle_of))
        except BaseException as exc:
            send(replies, {"err": [type(exc).__name__, describe(exc)]})
    flush_and_exit()


MUTABLE = (list, dict, set, bytearray, collections.deque)


def answer(request, resolve, handle_of):
    op, target = request["op"], resolve(request["h"])
    if op == "call":
        args = [decode(item, resolve) for item in request["args"]]
        kwargs = {str(k): decode(v, resolve) for k, v in request["kwargs"]}
        result = target(*args, **kwargs)
        changed = [[i, encode(a, handle_of)] for i, a in enumerate(args) if type(a) in MUTABLE]
        changed += [[k, encode(v, handle_of)] for k, v in kwargs.items() if type(v) in MUTABLE]
        return {"ok": encode(result, handle_of), "mut": changed}
    if op == "getattr":
        return {"ok": encode(getattr(target, str(request["name"])), handle_of)}
    if op == "setattr":
        setattr(target, str(request["name"]), decode(request["value"], resolve))
        return {"ok": None}
    if op == "getitem":
        return {"ok": encode(target[decode(request["key"], resolve)], handle_of)}
    if op == "setitem":
        target[decode(request["key"], resolve)] = decode(request["value"], resolve)
        return {"ok": None}
    if op == "iter":
        return {"ok": {"handle": handle_of(iter(target))}}
    if op == "next":
        try:
            return {"ok": encode(next(target), handle_of)}
        except StopIteration:
            return {"stop": True}
    if op in ("len", "bool", "str", "repr"):
        function = {"len": len, "bool": bool, "str": str, "repr": repr}[op]
        result = function(target)
        if type(result) is not (bool if op == "bool" else int if op == "len" else str):
            raise TypeError(f"{op}() returned {type(result).__name__}")
        return {"ok": result}
    if op == "eq":  # two of the solution's own objects: no value of the judge's is involved
        return {"ok": bool(target == resolve(request["other"]))}
    raise ValueError("unknown request")


# ------------------------------------------------------------------------------------------------
# The judge's side


class RemoteError(Exception):
    """An exception raised in the solution's process whose type is not a builtin one."""


class Remote:
    """The judge's stand-in for an object of the solution's: operations that take no value of
    the judge's are forwarded; comparison with a judge value is identity (never asked of the
    solution, which would learn the expected value)."""

    __slots__ = ("_link", "_handle", "__weakref__")

    def __init__(self, link, handle):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_handle", handle)

    def __call__(self, *args, **kwargs):
        return self._link.call(self._handle, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._link.request({"op": "getattr", "h": self._handle, "name": name})

    def __setattr__(self, name, value):
        self._link.request({"op": "setattr", "h": self._handle, "name": name,
                            "value": self._link.encode(value)})

    def __getitem__(self, key):
        return self._link.request({"op": "getitem", "h": self._handle,
                                   "key": self._link.encode(key)})

    def __setitem__(self, key, value):
        self._link.request({"op": "setitem", "h": self._handle, "key": self._link.encode(key),
                            "value": self._link.encode(value)})

    def __iter__(self):
        iterator = self._link.request({"op": "iter", "h": self._handle})
        return RemoteIterator(self._link, iterator._handle)

    def __len__(self):
        return self._link.request({"op": "len", "h": self._handle})

    def __bool__(self):
        return self._link.request({"op": "bool", "h": self._handle})

    def __str__(self):
        return self._link.request({"op": "str", "h": self._handle})

    def __repr__(self):
        return self._link.request({"op": "repr", "h": self._handle})

    def __eq__(self, other):
        if type(other) is Remote:
            return self._link.request({"op": "eq", "h": self._handle, "other": other._handle})
        return NotImplemented

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self):
        return hash(("remote", self._handle))


class RemoteIterator:
    def __init__(self, link, handle):
        self._link, self._handle = link, handle

    def __iter__(self):
        return self

    def __next__(self):
        reply = self._link.exchange({"op": "next", "h": self._handle})
        if reply.get("stop"):
            raise StopIteration
        return self._link.unwrap(reply)


class Link:
    """The judge's end of the pipe pair to the solution."""

    def __init__(self, requests, replies):
        self.requests, self.replies, self.remotes = requests, replies, {}

    def remote(self, handle):
        if type(handle) is not int or handle < 0:
            raise ValueError("malformed handle")
        if handle not in self.remotes:
            self.remotes[handle] = Remote(self, handle)
        return self.remotes[handle]

    def encode(self, value):
        def handle_of(obj):
            if type(obj) is Remote:
                return obj._handle
            raise Unencodable(f"cannot pass a {type(obj).__name__} into the sandbox")

        return encode(value, handle_of)

    def exchange(self, message):
        send(self.requests, message)
        try:
            reply = receive(self.replies)
        except (EOFError, OSError):
            raise RuntimeError("the solution's process died") from None
        if type(reply) is not dict:
            raise ValueError("malformed reply")
        if "err" in reply:
            name, text = str(reply["err"][0]), str(reply["err"][1])
            kind = getattr(builtins, name, None)
            if isinstance(kind, type) and issubclass(kind, Exception):
                message_text = text[len(name) + 2:] if text.startswith(name + ": ") else ""
                try:
                    error = kind(message_text) if message_text else kind()
                except BaseException:
                    error = RemoteError(text)
                raise error
            raise RemoteError(text)
        return reply

    def unwrap(self, reply):
        return decode(reply.get("ok"), self.remote)

    def request(self, message):
        return self.unwrap(self.exchange(message))

    def call(self, handle, args, kwargs):
        sent_args = [self.encode(a) for a in args]
        sent_kwargs = [[k, self.encode(v)] for k, v in kwargs.items()]
        reply = self.exchange({"op": "call", "h": handle, "args": sent_args,
                               "kwargs": sent_kwargs})
        for key, data in reply.get("mut", []):  # in-place changes to list/dict/set arguments
            original = args[key] if type(key) is int and 0 <= key < len(args) else kwargs.get(key)
            if type(original) in MUTABLE and not isinstance(original, Remote):
                update_in_place(original, decode(data, self.remote))
        return self.unwrap(reply)


def update_in_place(original, new):
    if type(original) is not type(new) and not (
            isinstance(original, dict) and isinstance(new, dict)):
        return
    if isinstance(original, dict):
        original.clear()
        original.update(new)
    elif isinstance(original, set):
        original.clear()
        original.update(new)
    elif isinstance(original, collections.deque):
        original.clear()
        original.extend(new)
    else:
        original[:] = new


def judge_namespace(link, table):
    import importlib
    namespace = {"__name__": "__judge__", "__builtins__": builtins}
    for name, entry in table.items():
        name = str(name)
        if name.startswith("__") or hasattr(builtins, name) or type(entry) is not dict:
            continue
        try:
            if "module" in entry:
                namespace[name] = importlib.import_module(str(entry["module"]))
            elif "import" in entry:
                value = importlib.import_module(str(entry["import"][0]))
                for part in str(entry["import"][1]).split("."):
                    value = getattr(value, part)
                namespace[name] = value
            elif "value" in entry:
                namespace[name] = decode(entry["value"], link.remote)
        except Exception:
            continue  # a name the judge cannot rebuild stays undefined (NameError in a test)
    return namespace


def judge(cfg):
    """Run the tests against the solution's names; verdicts go to the trainer on fd 1."""
    nonce, write = cfg["nonce"], os.write
    results = os.dup(1)
    os.dup2(2, 1)  # the tests' own prints go to stderr

    def emit(line):
        try:
            write(results, f"{nonce} {line}\n".encode("utf-8", "replace"))
        except OSError:
            pass

    link = Link(os.fdopen(cfg["rpc_out"], "wb"), os.fdopen(cfg["rpc_in"], "rb"))
    try:
        hello = receive(link.replies)
        table, setup_error = hello["names"], hello.get("setup_error")
        if type(table) is not dict:
            raise ValueError("malformed name table")
    except BaseException as exc:
        emit("SETUP the solution did not start: " + describe(exc))
        emit("DONE")
        os._exit(0)
    if setup_error:
        emit("SETUP " + " ".join(str(setup_error).split())[:300])
    namespace = judge_namespace(link, table)
    index = 0
    for kind, source in cfg["tests"]:
        name = f"<test {index}>" if kind == "test" else "<setup>"
        try:
            exec(compile(source, name, "exec", dont_inherit=True), namespace)
        except BaseException as exc:
            emit((f"{index} F " if kind == "test" else "SETUP ") + describe(exc))
        else:
            if kind == "test":
                emit(f"{index} P")
        if kind == "test":
            index += 1
    emit("DONE")
    flush_and_exit()


# ------------------------------------------------------------------------------------------------
# A program as __main__ (stdin/stdout tests, the python tool)


def run_io(cfg):
    sys.argv = ["solution.py"]
    module = type(sys)("__main__")
    module.__file__ = "solution.py"
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    namespace = module.__dict__
    status = 0
    try:
        exec(compile(cfg["code"], "solution.py", "exec", dont_inherit=True, optimize=0), namespace)
    except SystemExit as exc:
        status = exc.code
    except BaseException as exc:
        import traceback
        # From the solution's frames on: the harness's frame (and its path) is not the program's.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        status = 1
    sys.exit(status)  # normal interpreter shutdown: joins threads, flushes stdout
