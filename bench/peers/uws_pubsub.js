#!/usr/bin/env node
/* Peer push server: idiomatic uWebSockets.js (v20.30) pub/sub.

    node uws_pubsub.js --port P [--deflate]       (127.0.0.1, WebSocket + HTTP)

Prints "ready" once listening; exits cleanly on SIGTERM / SIGINT.
The module is the one bench/peers/install.sh puts in $HERALD_UWS_DIR
(default ${XDG_CACHE_HOME:-~/.cache}/herald/uws).

WebSocket:
    GET /sub/c0,c1      subscribe this connection to topics c0 and c1.
                        Empty channel list -> HTTP 400.
    Client messages are ignored. No pings, no idle timeout. No compression,
    or with --deflate permessage-deflate with uWS.SHARED_COMPRESSOR (no context
    takeover). Per-socket backpressure limit 1 MiB: past it, messages to that
    socket are dropped (not buffered, the socket is not closed).
HTTP/1.1:
    POST /pub/<ch>      body is published as one text frame to topic <ch>;
                        200 application/json {"delivered": N},
                        N = app.numSubscribers(<ch>) at publish time.
    POST /pub           body [{"ch":"c0","data":<JSON>}, ...] (Herald's batch
                        body): each JSON.stringify(data) is one text frame to
                        its topic, all published in this one handler call
                        (uWS merges them into one write per socket);
                        {"delivered": sum of N}. Bad JSON or shape -> 400.
    GET /readyz         200 "ok"
    anything else       404
*/
'use strict';

const os = require('os');
const path = require('path');

const UWS_DIR = process.env.HERALD_UWS_DIR ||
    path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'herald', 'uws');

function die(msg) {
    process.stderr.write(`uws_pubsub.js: ${msg}\n`);
    process.exit(1);
}

let uWS;
try {
    // The package falls back to a slow pure-JS emulation when asked to (or
    // when its prebuilt binary doesn't load): refuse to run on that.
    delete process.env.UWS_USE_FALLBACK;
    uWS = require(path.join(UWS_DIR, 'node_modules', '@trufflesuite', 'uws-js-unofficial'));
} catch (e) {
    die(`cannot load uWebSockets.js from ${UWS_DIR} (run bench/peers/install.sh): ${e.message}`);
}
if (typeof uWS.SHARED_COMPRESSOR !== 'number') {
    die(`the native uWebSockets.js binary did not load (node ${process.version}, ABI ${process.versions.modules})`);
}

function parseArgs(argv) {
    const args = { port: null, deflate: false };
    for (let i = 0; i < argv.length; i++) {
        if (argv[i] === '--port') args.port = Number(argv[++i]);
        else if (argv[i] === '--deflate') args.deflate = true;
        else die(`unknown argument ${argv[i]}; usage: uws_pubsub.js --port P [--deflate]`);
    }
    if (!Number.isInteger(args.port) || args.port <= 0 || args.port > 65535) {
        die('usage: uws_pubsub.js --port P [--deflate]');
    }
    return args;
}

const args = parseArgs(process.argv.slice(2));

// Reads the whole request body, then calls done(Buffer) (not if aborted).
function readBody(res, done) {
    let buffer = null;
    res.aborted = false;
    res.onAborted(() => { res.aborted = true; });
    res.onData((ab, isLast) => {
        // `ab` is neutered when this callback returns: copy unless last.
        const chunk = Buffer.from(ab);
        if (isLast) {
            done(buffer ? Buffer.concat([buffer, chunk]) : chunk);
        } else {
            buffer = Buffer.concat(buffer ? [buffer, chunk] : [chunk]);
        }
    });
}

function reply(res, status, type, body) {
    if (res.aborted) return;
    res.cork(() => {
        res.writeStatus(status).writeHeader('Content-Type', type).end(body);
    });
}

const JSON_TYPE = 'application/json';
const TEXT_TYPE = 'text/plain; charset=utf-8';

const app = uWS.App();

app.ws('/sub/*', {
    compression: args.deflate ? uWS.SHARED_COMPRESSOR : uWS.DISABLED,
    maxPayloadLength: 16 * 1024,
    idleTimeout: 0,                  // 0 disables the idle timeout
    sendPingsAutomatically: false,
    maxBackpressure: 1024 * 1024,    // past this, messages to the socket are dropped
    closeOnBackpressureLimit: false,

    upgrade: (res, req, context) => {
        const chans = [...new Set(req.getUrl().slice('/sub/'.length).split(',').filter(Boolean))];
        if (chans.length === 0) {
            res.writeStatus('400 Bad Request').writeHeader('Content-Type', TEXT_TYPE)
                .end('expected GET /sub/<channel>[,<channel>...]\n');
            return;
        }
        res.upgrade(
            { chans },
            req.getHeader('sec-websocket-key'),
            req.getHeader('sec-websocket-protocol'),
            req.getHeader('sec-websocket-extensions'),
            context,
        );
    },
    open: (ws) => {
        for (const ch of ws.getUserData().chans) ws.subscribe(ch);
    },
    message: () => {},               // ignored
});

// Messages are published as text (isBinary false); with --deflate, compress.
function publish(ch, message) {
    const n = app.numSubscribers(ch);
    app.publish(ch, message, false, args.deflate);
    return n;
}

app.post('/pub/*', (res, req) => {
    const ch = req.getUrl().slice('/pub/'.length);
    if (ch === '') {
        res.writeStatus('404 Not Found').writeHeader('Content-Type', TEXT_TYPE).end('not found\n');
        return;
    }
    readBody(res, (body) => {
        reply(res, '200 OK', JSON_TYPE, `{"delivered": ${publish(ch, body)}}`);
    });
});

app.post('/pub', (res) => {
    readBody(res, (body) => {
        let items;
        try {
            items = JSON.parse(body.toString('utf8'));
        } catch (e) {
            return reply(res, '400 Bad Request', TEXT_TYPE, 'body is not JSON\n');
        }
        const ok = Array.isArray(items) && items.every((it) =>
            it !== null && typeof it === 'object' && typeof it.ch === 'string' && it.ch !== '' &&
            'data' in it);
        if (!ok) {
            return reply(res, '400 Bad Request', TEXT_TYPE,
                'expected [{"ch":"<channel>","data":<JSON>}, ...]\n');
        }
        let delivered = 0;
        for (const it of items) delivered += publish(it.ch, JSON.stringify(it.data));
        reply(res, '200 OK', JSON_TYPE, `{"delivered": ${delivered}}`);
    });
});

app.get('/readyz', (res) => {
    res.writeStatus('200 OK').writeHeader('Content-Type', TEXT_TYPE).end('ok');
});

app.any('/*', (res) => {
    res.writeStatus('404 Not Found').writeHeader('Content-Type', TEXT_TYPE).end('not found\n');
});

let listenSocket = null;

// Exclusive: uSockets otherwise sets SO_REUSEPORT, and a second server (a
// stale peer) on the same port would silently share the connections.
app.listen('127.0.0.1', args.port, uWS.LIBUS_LISTEN_EXCLUSIVE_PORT, (token) => {
    if (!token) die(`cannot listen on 127.0.0.1:${args.port} (in use?)`);
    listenSocket = token;
    process.stdout.write('ready\n');
});

function shutdown() {
    if (listenSocket) uWS.us_listen_socket_close(listenSocket);
    listenSocket = null;
    process.exit(0);
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
