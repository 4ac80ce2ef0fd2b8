# A Herald plugin in Python. Build: bash build.sh -> target/plugin.wasm
#
# The tenant's config (set with the admin API) is read as JSON, e.g.
#   {"tokens": {"secret-1": "alice", "secret-2": "bob"}}
# A client connects with one of those tokens; it may subscribe to `public.*`
# and to its own `user.<name>.*` channels. Every published record goes out
# unchanged on its channel, conflated per record key when it has one.
import herald_plugin as herald


class MyPlugin(herald.Plugin):
    name = "my-plugin"
    version = "0.1.0"

    def __init__(self):
        # Runs once per instance, on the first call (not at build time).
        c = herald.config({})
        tokens = c.get("tokens") if isinstance(c, dict) else None
        self.tokens = tokens if isinstance(tokens, dict) else {}
        herald.log.info("my-plugin: %d tokens" % len(self.tokens))

    def authorize_connect(self, req):
        if req.credentials is None:
            raise herald.Deny("missing_token", "a token is required")
        subject = self.tokens.get(req.credentials)
        if not isinstance(subject, str):
            raise herald.Deny("invalid_token", "unknown token")
        # The host's log, under the tenant's name (`herald plugin test` shows it).
        herald.log.info("connect: %s" % subject)
        return herald.Session(subject, attributes={"transport": req.transport})

    def authorize_subscribe(self, session, channel):
        own = "user." + session.subject
        if channel.startswith("public.") or channel == own or channel.startswith(own + "."):
            return
        raise herald.Deny("forbidden", "not your channel")

    def transform(self, records):
        out = []
        for i, r in enumerate(records):
            key = herald.text(r.key)  # None without a key (or if it is not UTF-8)
            if key is not None and not 1 <= len(key.encode()) <= 128:
                key = None  # a conflation key is 1-128 bytes
            out.append(herald.Outgoing(
                r.channel or "public.default",
                r.value,
                conflation_key=key,
                source_index=i,
            ))
        return out


Guest = herald.export(MyPlugin)
