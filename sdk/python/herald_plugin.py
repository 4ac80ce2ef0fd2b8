"""herald_plugin: the Python SDK for Herald plugins (herald:plugin@0.2.0,
world `plugin`, sdk/wit/herald.wit). One module, no dependencies beyond the
bindings componentize-py generates while it builds the component.

A plugin is a class with plain methods, exported as `Guest`:

    import herald_plugin as herald

    class MyPlugin(herald.Plugin):
        name = "my-plugin"            # 1-64 bytes
        version = "1.0.0"

        def authorize_connect(self, req):              # -> Session, or raise Deny
            if req.credentials != "secret":
                raise herald.Deny("invalid_token", "unknown token")
            return herald.Session("alice", attributes={"transport": req.transport})

        def authorize_subscribe(self, session, channel):   # return = allow
            if not channel.startswith("public."):
                raise herald.Deny("forbidden", "not your channel")

        def transform(self, records):                  # -> list of Outgoing
            return [herald.Outgoing(r.channel or "default", r.value, source_index=i)
                    for i, r in enumerate(records)]

        # def merge(self, key, older, newer): -> bytes (or str)

    Guest = herald.export(MyPlugin)

`describe` declares exactly the hooks the class defines (a hook written is
declared, one not written is not); every hook not defined still exists as
an export (componentize-py needs them all) that raises if called, which the
host never does.

The class is instantiated once per instance, on the first hook call (never
at build time), so `__init__` may read `config()`. Module top level runs at
build time (componentize-py snapshots the interpreter), where the host does
not exist: do not call `config`, `log` or `now_ms` there.

Bindings conventions (componentize-py 0.25): WIT names are snake_case
(`remote-addr` -> `remote_addr`), records are dataclasses, `option<T>` is a
value or None, `list<u8>` is `bytes`, `string` is `str`, `u64`/`u32` are
`int`, `tuple<a, b>` a tuple, `list<T>` a list, a `result`'s error is the
exception `Err(value)` (this SDK raises it for you from `Deny`; any other
exception traps the call, and the host fails closed with the traceback in
its error), `flags` an `enum.Flag`, `enum` an `enum.Enum`.
"""

import json as _json
import re as _re
import sys as _sys

from componentize_py_types import Err as _Err
from wit_world.imports import host as _host
from wit_world.imports import types as _types

__all__ = [
    "Plugin", "export", "Deny", "Session", "Outgoing", "ConnectRequest",
    "SourceRecord", "config", "config_text", "now_ms", "log", "parse_json",
    "text", "header", "query", "attribute", "record_header",
]

# stdout is block-buffered in the component (not a terminal), so a print
# would stay in Python's buffer, out of the host's capture, when the call
# fails. Line buffering writes each line out during the call. This runs at
# build time and is kept in the snapshot.
try:
    _sys.stdout.reconfigure(line_buffering=True)
except Exception:  # pragma: no cover - stdout replaced or missing
    pass

ConnectRequest = _types.ConnectRequest
SourceRecord = _types.SourceRecord
Level = _types.Level


class Deny(Exception):
    """Raised from `authorize_connect` or `authorize_subscribe` to refuse.
    The client sees `code` (`[A-Za-z0-9_]`, at most 48: the host strips the
    rest; empty is sent as "denied") and `message` (at most 256 bytes)."""

    def __init__(self, code, message=""):
        super().__init__(code, message)
        self.code = str(code)
        self.message = str(message)

    def __str__(self):
        return "%s: %s" % (self.code, self.message)


class Session(_types.Session):
    """Who a connection is: `Session(subject, audience=None, attributes=())`.
    `attributes` is a list of (name, value) string pairs or a dict (at most
    32 pairs of at most 256 bytes each). `authorize_subscribe` receives the
    bindings' own session record, with the same fields."""

    def __init__(self, subject, audience=None, attributes=()):
        self.subject = subject
        self.audience = audience
        if isinstance(attributes, dict):
            self.attributes = list(attributes.items())
        else:
            self.attributes = list(attributes)


class Outgoing(_types.Outgoing):
    """A message to publish:
    `Outgoing(channel, payload, source_index=i, conflation_key=None, audience=None)`.
    `payload` is bytes (a `str` is encoded as UTF-8); `source_index` is the
    index, in the call's list, of the record it came from."""

    def __init__(self, channel, payload, *, source_index, conflation_key=None, audience=None):
        self.channel = channel
        t = type(payload)
        self.payload = payload if t is bytes else _bytes(payload, "payload")
        self.conflation_key = conflation_key
        self.audience = audience
        self.source_index = source_index


def _bytes(v, what):
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError("herald_plugin: %s must be bytes or str, not %s" % (what, type(v).__name__))


class Plugin:
    """Base class of a plugin. Set `name` (1-64 bytes) and `version`, and
    define any of these methods; `describe` declares the ones defined:

    - `authorize_connect(self, req: ConnectRequest) -> Session`, or raise Deny
    - `authorize_subscribe(self, session, channel: str) -> None`, or raise Deny
    - `transform(self, records: list[SourceRecord]) -> list[Outgoing]`
    - `merge(self, key: str, older: bytes, newer: bytes) -> bytes | str`
    """

    name = ""
    version = "0.0.0"


_HOOKS = ("authorize_connect", "authorize_subscribe", "transform", "merge")
_FLAGS = {
    "authorize_connect": _types.Hooks.AUTHORIZE_CONNECT,
    "authorize_subscribe": _types.Hooks.AUTHORIZE_SUBSCRIBE,
    "transform": _types.Hooks.TRANSFORM,
    "merge": _types.Hooks.MERGE,
}


def _not_declared(hook):
    def call(self, *args):
        raise RuntimeError(
            "herald_plugin: %s is not implemented (describe does not declare it)" % hook
        )

    call.__name__ = hook
    return call


def export(cls):
    """The `Guest` class componentize-py binds to the `guest` exports, made
    from a `Plugin` subclass: `Guest = herald_plugin.export(MyPlugin)` at the
    top level of the app module."""
    if not isinstance(cls, type):
        raise TypeError("herald_plugin.export takes the plugin class, not an instance")
    name, version = cls.name, cls.version
    if not isinstance(name, str) or not 1 <= len(name.encode()) <= 64:
        raise TypeError("herald_plugin: %s.name must be a string of 1-64 bytes" % cls.__name__)
    if not isinstance(version, str):
        raise TypeError("herald_plugin: %s.version must be a string" % cls.__name__)
    if hasattr(cls, "transform_flat"):
        raise TypeError("herald_plugin: transform_flat is not supported in Python; define transform")
    has = {h: callable(getattr(cls, h, None)) for h in _HOOKS}
    hooks = _types.Hooks(0)
    for h in _HOOKS:
        if has[h]:
            hooks |= _FLAGS[h]
    info = _types.Info(name, version, hooks)
    one = []  # the plugin's one instance, made on the first hook call

    def plugin():
        if not one:
            _live.append(True)
            one.append(cls())
        return one[0]

    def describe(self):
        if not _live:
            _live.append(True)
        return info

    ns = {"describe": describe, "transform_flat": _not_declared("transform_flat")}

    if has["authorize_connect"]:
        def authorize_connect(self, req):
            p = one[0] if one else plugin()
            try:
                s = p.authorize_connect(req)
            except Deny as d:
                raise _Err(_types.Denial(d.code, d.message)) from None
            if not isinstance(s, _types.Session):
                raise TypeError(
                    "herald_plugin: authorize_connect must return a Session or raise Deny, not %r" % (s,)
                )
            return s
        ns["authorize_connect"] = authorize_connect

    if has["authorize_subscribe"]:
        def authorize_subscribe(self, session, channel):
            p = one[0] if one else plugin()
            try:
                p.authorize_subscribe(session, channel)
            except Deny as d:
                raise _Err(_types.Denial(d.code, d.message)) from None
            return None
        ns["authorize_subscribe"] = authorize_subscribe

    if has["transform"]:
        def transform(self, records):
            p = one[0] if one else plugin()
            out = p.transform(records)
            return out if type(out) is list else list(out)
        ns["transform"] = transform

    if has["merge"]:
        def merge(self, key, older, newer):
            p = one[0] if one else plugin()
            b = p.merge(key, older, newer)
            return b if type(b) is bytes else _bytes(b, "merge's result")
        ns["merge"] = merge

    for h in _HOOKS:
        ns.setdefault(h, _not_declared(h))
    return type("Guest", (), ns)


# ---- host ----------------------------------------------------------------

_config = []  # [parsed, text] once read
_live = []  # non-empty once the host called: the module's top level ran at build time


def _no_host(what):
    raise RuntimeError(
        "herald_plugin.%s() called at build time (the module's top level runs while "
        "componentize-py builds, without a host): call it inside a hook or __init__" % what
    )


def config(default=None):
    """The tenant's config (host `config()`), parsed as JSON; `default` when
    it is not valid JSON. Read once per instance (the host makes new
    instances when the config changes). Do not mutate the result."""
    if not _config:
        if not _live:
            _no_host("config")
        t = _host.config()
        _config.extend((parse_json(t, _BAD), t))
    v = _config[0]
    return default if v is _BAD else v


def config_text():
    """The tenant's config as the host gave it (JSON text, "{}" if none)."""
    config()
    return _config[1]


def now_ms():
    """Wall-clock milliseconds since the Unix epoch: the one real clock
    (WASI's, so `time.time()`, are frozen at 0). For token expiry in the
    authorize hooks; a transform or merge must not depend on it."""
    if not _live:
        _no_host("now_ms")
    return _host.now_ms()


class _Log:
    """To the host's log under the tenant's name (16 lines a call, each cut
    at 1 KiB): `log.info("x", 1)` or `log("warn", "x")`. `print` goes to
    stdout instead, which the host keeps only for a failed call's error."""

    __slots__ = ()
    _levels = {"trace": Level.TRACE, "debug": Level.DEBUG, "info": Level.INFO,
               "warn": Level.WARN, "warning": Level.WARN, "error": Level.ERROR}

    def __call__(self, level, *parts):
        if not _live:
            _no_host("log")
        lv = level if isinstance(level, Level) else self._levels[str(level).lower()]
        _host.log(lv, " ".join(p if type(p) is str else str(p) for p in parts))

    def trace(self, *parts):
        self(Level.TRACE, *parts)

    def debug(self, *parts):
        self(Level.DEBUG, *parts)

    def info(self, *parts):
        self(Level.INFO, *parts)

    def warn(self, *parts):
        self(Level.WARN, *parts)

    def error(self, *parts):
        self(Level.ERROR, *parts)


log = _Log()


# ---- JSON and text ---------------------------------------------------------

_BAD = object()
_MAX_DEPTH = 128  # as serde_json (the Rust SDK) and the C SDK


def _constant(s):
    raise ValueError("%s is not JSON" % s)


def _int(s):
    # Python refuses to convert more than 4300 digits; JSON has no limit.
    return int(s) if len(s) <= 4000 else float(s)


_decode = _json.JSONDecoder(parse_constant=_constant, parse_int=_int).decode
_TOKEN = _re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', _re.S)
_SURROGATE = _re.compile(r"\\u[dD][89abcdefABCDEF]")


def _too_deep(s):
    depth = 0
    for m in _TOKEN.finditer(s):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > _MAX_DEPTH:
                return True
        elif c in "]}":
            depth -= 1
    return False


def _lone_surrogate(v):
    try:
        _json.dumps(v, ensure_ascii=False).encode()
        return False
    except UnicodeEncodeError:
        return True


def parse_json(data, default=None):
    """The JSON value of `data` (bytes as UTF-8, or str), or `default` when it
    is not JSON: not UTF-8, a byte-order mark, NaN/Infinity, an unpaired
    surrogate escape, nesting deeper than 128, trailing data. Same answers as
    the Rust and C SDKs' parsers. Objects are dicts, arrays lists."""
    if type(data) is not str:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            return default
        try:
            data = bytes(data).decode()
        except UnicodeDecodeError:
            return default
    if data.count("[") + data.count("{") > _MAX_DEPTH and _too_deep(data):
        return default
    try:
        v = _decode(data)
    except (ValueError, RecursionError):
        return default
    if "\\u" in data and _SURROGATE.search(data) and _lone_surrogate(v):
        return default
    return v


def text(data, default=None):
    """The UTF-8 text of bytes, or `default` when they are not valid UTF-8."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return default
    try:
        return bytes(data).decode()
    except UnicodeDecodeError:
        return default


def _lookup(pairs, name):
    for k, v in pairs:
        if k == name:
            return v
    return None


def header(req, name):
    """The first value of a connect request's header (names are lower case), or None."""
    return _lookup(req.headers, name.lower())


def query(req, name):
    """The first value of a connect request's query parameter, or None."""
    return _lookup(req.query, name)


def attribute(session, name):
    """The value of a session's attribute, or None."""
    return _lookup(session.attributes, name)


def record_header(record, name):
    """The first value (bytes) of a source record's header, or None."""
    return _lookup(record.headers, name)
