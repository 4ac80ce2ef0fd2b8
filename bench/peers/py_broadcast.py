#!/usr/bin/env python3
"""Peer push server: idiomatic asyncio + `websockets` (15.x) broadcast.

    python3 py_broadcast.py --ws-port P --http-port Q     (both on 127.0.0.1)

Prints "ready" once both ports listen; exits cleanly on SIGTERM / SIGINT.

WebSocket (port P):
    GET /sub?ch=c0,c1   subscribe this connection to channels c0 and c1.
                        Missing/empty channel list -> HTTP 400.
    Messages from clients are read and ignored. No pings, no compression.
HTTP/1.1 (port Q; keep-alive, pipelining, Content-Length bodies only):
    POST /pub/<ch>      body (UTF-8) is sent as one text frame to every
                        subscriber of <ch>; answers 200 application/json
                        {"delivered": N}, N = subscribers it was sent to.
                        Body not valid UTF-8 -> 400.
    GET /readyz         200 "ok"
    anything else       404
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import signal
import sys
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, broadcast, serve

# channel name -> set of subscribed connections
CHANNELS: dict[str, set[ServerConnection]] = {}

# open HTTP connections (closed on shutdown)
HTTP_CONNS: set[asyncio.StreamWriter] = set()

MAX_HEADER = 64 * 1024
MAX_BODY = 16 * 1024 * 1024


def parse_channels(path: str) -> list[str] | None:
    parts = urlsplit(path)
    if parts.path != "/sub":
        return None
    values = parse_qs(parts.query).get("ch")
    if not values:
        return None
    chans = [c for v in values for c in v.split(",") if c]
    return list(dict.fromkeys(chans)) or None  # dedupe, keep order


def process_request(connection: ServerConnection, request):
    chans = parse_channels(request.path)
    if chans is None:
        return connection.respond(
            HTTPStatus.BAD_REQUEST, "expected GET /sub?ch=<channel>[,<channel>...]\n"
        )
    connection.channels = chans  # stash for the handler (no re-parse)
    return None


async def ws_handler(ws: ServerConnection) -> None:
    chans: list[str] = ws.channels
    for ch in chans:
        subs = CHANNELS.get(ch)
        if subs is None:
            subs = CHANNELS[ch] = set()
        subs.add(ws)
    try:
        # Drain (and ignore) anything the client sends; returns on close.
        async for _ in ws:
            pass
    except Exception:
        pass
    finally:
        for ch in chans:
            subs = CHANNELS.get(ch)
            if subs is not None:
                subs.discard(ws)
                if not subs:
                    del CHANNELS[ch]


def publish(ch: str, payload: str) -> int:
    subs = CHANNELS.get(ch)
    if not subs:
        return 0
    # Connections leave the set when their handler returns (connection closed),
    # so len(subs) is the number of open connections broadcast writes to.
    broadcast(subs, payload)
    return len(subs)


def response(status: int, reason: str, body: bytes, ctype: bytes, close: bool) -> bytes:
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
        status,
        reason.encode(),
        ctype,
        len(body),
    )
    if close:
        head += b"Connection: close\r\n"
    return head + b"\r\n" + body


TEXT = b"text/plain; charset=utf-8"
JSON = b"application/json"


async def http_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    HTTP_CONNS.add(writer)
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # peer closed (possibly mid-request)
            except asyncio.LimitOverrunError:
                writer.write(response(431, "Request Header Fields Too Large", b"", TEXT, True))
                return
            lines = head[:-4].split(b"\r\n")
            try:
                method, target, version = lines[0].split(b" ", 2)
            except ValueError:
                writer.write(response(400, "Bad Request", b"bad request line\n", TEXT, True))
                return
            length = 0
            conn_hdr = b""
            chunked = False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    try:
                        length = int(value.strip())
                    except ValueError:
                        length = -1
                elif name == b"connection":
                    conn_hdr = value.strip().lower()
                elif name == b"transfer-encoding":
                    chunked = True
            if chunked or length < 0 or length > MAX_BODY:
                writer.write(response(400, "Bad Request", b"need a Content-Length body\n", TEXT, True))
                return
            body = await reader.readexactly(length) if length else b""
            if version == b"HTTP/1.0":
                close = b"keep-alive" not in conn_hdr
            else:
                close = b"close" in conn_hdr

            if method == b"POST" and target.startswith(b"/pub/") and len(target) > 5:
                ch = target[5:].decode("utf-8", "replace")
                try:
                    payload = body.decode("utf-8")
                except UnicodeDecodeError:
                    out = response(400, "Bad Request", b"body is not UTF-8\n", TEXT, close)
                else:
                    n = publish(ch, payload)
                    out = response(200, "OK", b'{"delivered": %d}' % n, JSON, close)
            elif method == b"GET" and target == b"/readyz":
                out = response(200, "OK", b"ok", TEXT, close)
            else:
                out = response(404, "Not Found", b"not found\n", TEXT, close)
            writer.write(out)
            if close:
                return
            # Only waits when the client doesn't read its responses.
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
        # CancelledError: shutdown; end normally (3.11's start_server callback
        # would otherwise log a spurious traceback for a cancelled task).
        pass
    finally:
        HTTP_CONNS.discard(writer)
        try:
            if not writer.is_closing():
                await writer.drain()
        except Exception:
            pass
        writer.close()


def raise_nofile_limit() -> None:
    """Soft open-files limit up to the hard one: like Herald and nginx's
    worker_rlimit_nofile, so the peer is not capped at 1,024 connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def main() -> int:
    raise_nofile_limit()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ws-port", type=int, required=True)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args()

    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))

    ws_server = await serve(
        ws_handler,
        args.host,
        args.ws_port,
        process_request=process_request,
        compression=None,
        ping_interval=None,  # no keepalive pings (and no keepalive task)
        max_size=64 * 1024,  # clients aren't supposed to send anything
        max_queue=4,  # incoming frames buffered before reading pauses
        write_limit=32 * 1024,
        server_header=None,
        backlog=4096,
    )
    http_server = await asyncio.start_server(
        http_handler, args.host, args.http_port, limit=MAX_HEADER, backlog=1024
    )
    print("ready", flush=True)

    await stop

    http_server.close()
    for w in list(HTTP_CONNS):
        w.close()
    ws_server.close()  # sends 1001 going away to every open connection
    try:
        # Don't wait long for clients that never answer the close handshake.
        await asyncio.wait_for(ws_server.wait_closed(), timeout=2)
    except asyncio.TimeoutError:
        pass
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        sys.exit(0)
