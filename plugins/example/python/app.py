# The example plugin in Python: plugins/example/SPEC.md, byte for byte.
# build.sh builds this module with sdk/python/herald_plugin.py into
# plugins/target/example/python.wasm (componentize-py).
import os
import re
import time

import herald_plugin as herald

THROWN = "herald-example: thrown on request"
PX = re.compile(r"-?[0-9]{1,12}(?:\.[0-9]{1,8})?")
AUD = re.compile(r"[a-z0-9]{1,64}")


def forever():
    while True:
        pass


def bomb():
    # Every allocation stays reachable until one fails (MemoryError).
    kept = []
    while True:
        kept.append(bytearray(1 << 20))


class Example(herald.Plugin):
    name = "herald-example-python"
    version = "1.0.0"

    def __init__(self):
        c = herald.config()
        ok = isinstance(c, dict)
        tokens = c.get("tokens") if ok else None
        # A config that is not JSON, or has no `tokens` object: no token is valid.
        self.tokens = tokens if isinstance(tokens, dict) else {}
        self.hostile = ok and c.get("hostile") is True

    def authorize_connect(self, req):
        cred = req.credentials
        if self.hostile and cred is not None:
            if cred == "hostile-throw":
                raise RuntimeError(THROWN)
            if cred == "hostile-loop":
                forever()
            if cred == "hostile-print":
                print("herald-example: connect printed", flush=True)
        if cred is None:
            raise herald.Deny("missing_token", "a token is required")
        entry = self.tokens.get(cred)
        if not isinstance(entry, dict):
            raise herald.Deny("invalid_token", "unknown token")
        subject = entry.get("subject")
        audience = entry.get("audience")
        # SPEC.md leaves an entry without a string subject (or with a
        # non-string audience) open; like the C version, it is an unknown token.
        if not isinstance(subject, str) or not (audience is None or isinstance(audience, str)):
            raise herald.Deny("invalid_token", "unknown token")
        return herald.Session(subject, audience, [("transport", req.transport)])

    def authorize_subscribe(self, session, channel):
        if channel.startswith("public.") or channel.startswith("ticks."):
            return
        own = "user." + session.subject
        if channel == own or channel.startswith(own + "."):
            return
        if channel.startswith("user."):
            raise herald.Deny("forbidden", "not your channel")
        raise herald.Deny("unknown_channel", "no such channel")

    def transform(self, records):
        out = []
        hot = self.hostile
        parse = herald.parse_json
        for i, r in enumerate(records):
            v = parse(r.value)
            if type(v) is not dict:
                continue
            sym = v.get("sym")
            if type(sym) is not str or not (0 < len(sym) <= 12 and sym.isascii() and sym.isalnum()):
                continue
            px = v.get("px")
            # TIME and RAND replace px and skip step 4's pattern: RAND's 16 hex
            # digits (and TIME's 13 digits on a real clock) never match it, yet
            # the host's suite compares RAND's px across instances. As the JS
            # and C versions.
            computed = False
            if hot:
                if sym == "LOOP":
                    forever()
                elif sym == "BOMB":
                    bomb()
                elif sym == "THROW":
                    raise RuntimeError(THROWN)
                elif sym == "BADKEY":
                    out.append(herald.Outgoing("ticks.BADKEY", b"{}", conflation_key="k" * 200, source_index=i))
                    continue
                elif sym == "BADCHAN":
                    out.append(herald.Outgoing("bad channel!", b"{}", source_index=i))
                    continue
                elif sym == "PRINT":
                    print("herald-example: transform printed %d" % i, flush=True)
                elif sym == "TIME":
                    px = str(time.time_ns() // 1_000_000)
                    computed = True
                elif sym == "RAND":
                    px = os.urandom(8).hex()
                    computed = True
            if not computed and (type(px) is not str or not PX.fullmatch(px)):
                continue
            aud = v.get("aud")
            if aud is not None and (type(aud) is not str or not AUD.fullmatch(aud)):
                continue
            s = sym.upper()
            out.append(herald.Outgoing(
                # An empty channel counts as none, as in the flat encoding (length 0).
                r.channel or "ticks." + s,
                ('{"sym":"%s","px":"%s"}' % (s, px)).encode(),
                conflation_key=s,
                audience=aud,
                source_index=i,
            ))
        return out


Guest = herald.export(Example)
