// Herald browser client: one dependency-free ES module (no build step).
//
//   import { Herald } from "/herald.js";
//   const c = new Herald({ url: "http://127.0.0.1:8080", tenant: "demo" });
//   const off = c.subscribe("ticks.AAPL", (data, m) => console.log(m.seq, data));
//   c.on("gap", (g) => console.warn("lost", g.ch, g.from, g.to));
//
// Speaks Herald's client protocol v1 over WebSocket (`/v1/t/{tenant}/ws`) and
// falls back to Server-Sent Events read with fetch() (`/v1/t/{tenant}/sse`).
// It remembers the last (epoch, seq) of every channel and resumes from it on
// every reconnect (WebSocket: `since`/`epoch`; SSE: `Last-Event-ID`), drops
// duplicates, reports every hole it can see as a `gap` event (the server's
// `gap` frames, a `prev` that is not the last position seen, a changed
// epoch), and reconnects with full-jitter exponential backoff that honours
// the server (Retry-After, close codes). See README.md next to this file.

/** WebSocket close codes Herald sends (host/src/proto/ws.rs, `close`). */
export const CloseCodes = Object.freeze({
  NORMAL: 1000,
  GOING_AWAY: 1001,
  PROTOCOL: 1002,
  UNSUPPORTED: 1003,
  ABNORMAL: 1006,
  BAD_DATA: 1007,
  POLICY: 1008,
  TOO_BIG: 1009,
  SERVICE_RESTART: 1012,
  TRY_AGAIN_LATER: 1013,
  TENANT_GONE: 4000,
  SLOW_CONSUMER: 4001,
  HEARTBEAT_TIMEOUT: 4002,
  DISCONNECTED: 4003,
  REAUTHORIZE: 4004,
});

/** The WebSocket subprotocol Herald speaks. */
export const PROTOCOL = "herald.v1";
/** Prefix of the subprotocol carrying a token (base64url of its UTF-8, no padding). */
export const TOKEN_PROTOCOL = "herald.token.";

const RECONNECT_CODES = new Set([
  CloseCodes.SLOW_CONSUMER,
  CloseCodes.HEARTBEAT_TIMEOUT,
  CloseCodes.DISCONNECTED,
  CloseCodes.REAUTHORIZE,
]);
const SOON_CODES = new Set([CloseCodes.GOING_AWAY, CloseCodes.SERVICE_RESTART]);
// Subscription refusals that a retry would not change.
const FINAL_SUB_ERRORS = new Set(["forbidden", "bad_channel", "bad_request", "too_many_subscriptions"]);
// HTTP statuses that mean "do not come back": the request itself is refused.
const FATAL_STATUS = new Set([400, 401, 403, 404, 410]);

const ORIGIN_REFUSED = Object.freeze({
  code: "origin_not_allowed",
  message: "the server refused this page's origin (its answer carries no CORS permission for it)",
  status: 403,
  inferred: true,
});

const DEFAULTS = {
  transport: "auto",
  tokenVia: "protocol",
  backoff: { baseMs: 500, maxMs: 30000 },
  connectTimeoutMs: 10000,
  pingIntervalMs: 20000,
  idleTimeoutMs: 60000,
  stableMs: 3000,
  autoConnect: true,
};

/** base64url (RFC 4648 §5) of a string's UTF-8 bytes, without padding. */
export function base64url(text) {
  const bytes = new TextEncoder().encode(String(text));
  let bin = "";
  for (let i = 0; i < bytes.length; i++) bin += String.fromCharCode(bytes[i]);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function decodeBase64(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** Seconds or an HTTP date, in milliseconds from now; null when absent or unreadable. */
function retryAfterMs(value) {
  if (value == null || value === "") return null;
  const s = Number(value);
  if (Number.isFinite(s) && s >= 0) return Math.min(s, 3600) * 1000;
  const t = Date.parse(value);
  return Number.isFinite(t) ? Math.max(0, Math.min(t - Date.now(), 3600e3)) : null;
}

/** Parses an SSE `id:` written by Herald: `epoch:seq,epoch:seq` in channel order. */
export function parseEventId(id) {
  if (typeof id !== "string" || id === "") return null;
  const out = [];
  for (const part of id.split(",")) {
    const m = /^\s*(\d+):(\d+)\s*$/.exec(part);
    if (!m) return null;
    out.push([Number(m[1]), Number(m[2])]);
  }
  return out;
}

function report(err) {
  if (typeof reportError === "function") reportError(err);
  else setTimeout(() => { throw err; });
}

/**
 * Incremental `text/event-stream` parser (WHATWG HTML §9.2.6): feed it
 * decoded text, it calls `onEvent({type, data, id})` for each dispatched
 * event and `onComment()` for comment lines (Herald's heartbeats).
 */
export class SseParser {
  constructor(onEvent, onComment) {
    this.onEvent = onEvent;
    this.onComment = onComment || (() => {});
    this.buf = "";
    this.type = "";
    this.data = [];
    this.lastId = "";
    this.retry = null;
    this.sawCr = false;
  }

  feed(text) {
    let s = this.buf + text;
    // A "\r\n" may arrive split across chunks: drop the "\n" half of a pair
    // whose "\r" already ended a line.
    if (this.sawCr && s.startsWith("\n")) s = s.slice(1);
    this.sawCr = false;
    let start = 0;
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      this.line(s.slice(start, i));
      if (c === 13) {
        if (i + 1 < s.length) {
          if (s.charCodeAt(i + 1) === 10) i++;
        } else {
          this.sawCr = true;
        }
      }
      start = i + 1;
    }
    this.buf = s.slice(start);
    if (this.buf.length > 1 << 24) throw new Error("SSE line longer than 16 MiB");
  }

  line(l) {
    if (l === "") return this.dispatch();
    if (l.charCodeAt(0) === 58) return this.onComment(l.slice(1));
    const colon = l.indexOf(":");
    let field = l;
    let value = "";
    if (colon >= 0) {
      field = l.slice(0, colon);
      value = l.slice(colon + 1);
      if (value.charCodeAt(0) === 32) value = value.slice(1);
    }
    switch (field) {
      case "event": this.type = value; break;
      case "data": this.data.push(value); break;
      case "id": if (!value.includes("\0")) this.lastId = value; break;
      case "retry": if (/^\d+$/.test(value)) this.retry = Number(value); break;
      default: break;
    }
  }

  dispatch() {
    if (this.data.length === 0) {
      this.type = "";
      return;
    }
    const ev = { type: this.type || "message", data: this.data.join("\n"), id: this.lastId };
    this.type = "";
    this.data = [];
    this.onEvent(ev);
  }
}

/**
 * A Herald connection: one WebSocket (or SSE stream) carrying any number of
 * channel subscriptions, kept alive and resumed across reconnects.
 *
 * Events (`on(type, fn)` calls `fn(detail, event)`; or `addEventListener`
 * and read `event.detail`): `message`, `status`, `gap`, `error`, `open`,
 * `close`, `state`, `ack`.
 */
export class Herald extends EventTarget {
  constructor(options = {}) {
    super();
    const given = Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined));
    const o = { ...DEFAULTS, ...given, backoff: { ...DEFAULTS.backoff, ...(given.backoff || {}) } };
    if (!o.tenant) throw new TypeError("Herald: `tenant` is required");
    if (!["auto", "ws", "sse"].includes(o.transport)) {
      throw new TypeError(`Herald: transport must be auto, ws or sse, not ${o.transport}`);
    }
    if (!["query", "cookie", "protocol"].includes(o.tokenVia)) {
      throw new TypeError(`Herald: tokenVia must be query, cookie or protocol, not ${o.tokenVia}`);
    }
    const fallback = typeof location !== "undefined" && /^https?:$/.test(location.protocol) ? location.href : undefined;
    const base = new URL(o.url || fallback || "http://127.0.0.1:8080", fallback);
    if (base.protocol === "ws:") base.protocol = "http:";
    if (base.protocol === "wss:") base.protocol = "https:";
    this.options = o;
    this._base = base.origin + base.pathname.replace(/\/+$/, "");
    this._crossOrigin = typeof location === "undefined" || location.origin !== base.origin;
    /** @type {Map<string, {handlers: Set<Function>, initial: {since?: number, epoch?: number}|null, refused: boolean}>} */
    this._subs = new Map();
    /** @type {Map<string, {epoch: number|null, seq: number}>} */
    this._pos = new Map();
    this._state = "idle";
    this._transport = null;
    this._gen = 0;
    this._conn = null;
    this._timer = null;
    this._attempt = 0;
    this._wsFallbacks = 0;
    this._closed = false;
    this._started = false;
    this._nextId = 1;
    this._pending = new Map();
    this._listeners = new Map();
    this._lastError = null;
    this.stats = { messages: 0, duplicates: 0, gaps: 0, reconnects: 0, opens: 0 };
    this._onOnline = () => {
      if (this._timer && !this._conn) this._reconnectNow();
    };
    if (typeof addEventListener === "function" && typeof window !== "undefined") {
      window.addEventListener("online", this._onOnline);
    }
  }

  /** `idle`, `connecting`, `open`, `reconnecting` or `closed`. */
  get state() { return this._state; }
  /** `ws` or `sse` while open (or being opened), else null. */
  get transport() { return this._transport; }
  /** The last error event's detail, if any. */
  get lastError() { return this._lastError; }
  /** The channels asked for. */
  get channels() { return [...this._subs.keys()]; }

  /** The last position seen on `ch`: `{epoch, seq}` or null. */
  position(ch) {
    const p = this._pos.get(ch);
    return p ? { epoch: p.epoch, seq: p.seq } : null;
  }

  /** Every channel's last position, `{ch: {epoch, seq}}`. */
  positions() {
    const out = {};
    for (const [ch, p] of this._pos) out[ch] = { epoch: p.epoch, seq: p.seq };
    return out;
  }

  /** Listens to `type`; `fn(detail, event)`. Returns a function that stops listening. */
  on(type, fn) {
    const wrapped = (ev) => fn(ev.detail, ev);
    let m = this._listeners.get(type);
    if (!m) this._listeners.set(type, (m = new Map()));
    if (m.has(fn)) return () => this.off(type, fn);
    m.set(fn, wrapped);
    this.addEventListener(type, wrapped);
    return () => this.off(type, fn);
  }

  off(type, fn) {
    const m = this._listeners.get(type);
    const wrapped = m && m.get(fn);
    if (wrapped) {
      m.delete(fn);
      this.removeEventListener(type, wrapped);
    }
  }

  /**
   * Subscribes to `ch`; `handler(data, meta)` runs for each of its messages
   * (`meta`: ch, seq, prev, epoch, enc). `since`/`epoch` resume from a
   * position kept elsewhere (e.g. localStorage). Returns a function that
   * removes this handler (and the subscription with its last handler).
   */
  subscribe(ch, handler, opts = {}) {
    if (typeof ch !== "string" || !/^[A-Za-z0-9_.:@-]{1,128}$/.test(ch)) {
      throw new TypeError(`Herald: bad channel name ${JSON.stringify(ch)} (1-128 of A-Z a-z 0-9 _ . : @ -)`);
    }
    if (this._userClosed) throw new Error("Herald: the client is closed");
    let sub = this._subs.get(ch);
    const isNew = !sub;
    if (!sub) {
      sub = { handlers: new Set(), initial: null, refused: false };
      this._subs.set(ch, sub);
    }
    if (typeof handler === "function") sub.handlers.add(handler);
    if (opts && opts.since != null && !this._pos.has(ch)) {
      const since = Number(opts.since);
      const epoch = opts.epoch == null ? null : Number(opts.epoch);
      if (Number.isSafeInteger(since) && since >= 0) {
        sub.initial = { since, epoch };
        this._pos.set(ch, { epoch, seq: since });
      }
    }
    if (isNew || sub.refused) {
      sub.refused = false;
      this._channelsChanged([ch], []);
    }
    return () => {
      const s = this._subs.get(ch);
      if (!s) return;
      if (typeof handler === "function") s.handlers.delete(handler);
      if (s.handlers.size === 0) this.unsubscribe(ch);
    };
  }

  /** Leaves `ch` (every handler of it). */
  unsubscribe(ch) {
    if (!this._subs.delete(ch)) return;
    this._pos.delete(ch);
    this._channelsChanged([], [ch]);
  }

  /** Connects now (subscribe() does so on its own unless `autoConnect` is false). */
  connect() {
    if (this._userClosed) throw new Error("Herald: the client is closed");
    this._started = true;
    if (this._closed) {
      // Stopped by a refusal: the caller changed something (a new token?).
      this._closed = false;
      this._attempt = 0;
      this._lastError = null;
    }
    if (!this._conn && !this._timer) this._connect();
  }

  /** Closes for good: no reconnect, every timer stopped. */
  close() {
    if (this._userClosed) return;
    this._userClosed = true;
    this._closed = true;
    if (typeof window !== "undefined") window.removeEventListener("online", this._onOnline);
    const had = this._conn;
    this._teardown(CloseCodes.NORMAL, "client closed");
    clearTimeout(this._timer);
    this._timer = null;
    this._setState("closed");
    this._emit("close", { code: CloseCodes.NORMAL, reason: "client closed", transport: had ? had.kind : null, wasOpen: !!(had && had.open), willReconnect: false, byClient: true });
  }

  // ---------------------------------------------------------------- internals

  _emit(type, detail) {
    try {
      this.dispatchEvent(new CustomEvent(type, { detail }));
    } catch (e) {
      report(e);
    }
  }

  _setState(s) {
    if (s === this._state) return;
    const prev = this._state;
    this._state = s;
    this._emit("state", { state: s, prev, transport: this._transport });
  }

  _channelsChanged(added, removed) {
    if (this._closed) return;
    const c = this._conn;
    if (c && c.kind === "ws" && c.open) {
      for (const ch of added) this._sendSub(c, ch);
      for (const ch of removed) this._send(c, { op: "unsub", ch, id: this._id({ op: "unsub", ch }) });
      return;
    }
    if (this._started || this.options.autoConnect) {
      this._started = true;
      this._soon();
    }
  }

  /** After this tick's subscribe()/unsubscribe() calls: one (re)connection for all. */
  _soon() {
    if (this._soonQueued) return;
    this._soonQueued = true;
    queueMicrotask(() => {
      this._soonQueued = false;
      if (this._closed) return;
      const c = this._conn;
      // An SSE stream's channels are in its URL: restart it (positions resume).
      if (c && (c.kind === "sse" || c.kind === "sse-connecting")) return this._restartSse();
      if (!c && !this._timer) this._connect();
    });
  }

  _id(what) {
    const id = this._nextId++;
    this._pending.set(id, what);
    if (this._pending.size > 1000) this._pending.delete(this._pending.keys().next().value);
    return id;
  }

  async _token() {
    const t = this.options.token;
    if (t == null) return null;
    const v = typeof t === "function" ? await t() : t;
    return v == null || v === "" ? null : String(v);
  }

  _useSse() {
    const t = this.options.transport;
    if (t === "sse") return true;
    if (t === "ws") return false;
    return typeof WebSocket === "undefined" || this._wsFallbacks >= 2;
  }

  async _connect() {
    if (this._closed) return;
    clearTimeout(this._timer);
    this._timer = null;
    const gen = ++this._gen;
    const sse = this._useSse();
    this._transport = sse ? "sse" : "ws";
    this._setState(this.stats.opens > 0 || this._attempt > 0 ? "reconnecting" : "connecting");
    let token;
    try {
      token = await this._token();
    } catch (e) {
      if (gen !== this._gen) return;
      this._emit("error", { code: "token_failed", message: String(e && e.message || e), fatal: false });
      return this._retry({});
    }
    if (gen !== this._gen || this._closed) return;
    if (sse) this._openSse(gen, token);
    else this._openWs(gen, token);
  }

  _wsUrl(token) {
    const u = new URL(`${this._base}/v1/t/${encodeURIComponent(this.options.tenant)}/ws`);
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    if (token && this.options.tokenVia === "query") u.searchParams.set("token", token);
    return u.href;
  }

  /** The SSE URL for the current channels and the Last-Event-ID that resumes them. */
  _sseRequest(token) {
    const u = new URL(`${this._base}/v1/t/${encodeURIComponent(this.options.tenant)}/sse`);
    const channels = [...this._subs.keys()].filter((ch) => !this._subs.get(ch).refused);
    for (const ch of channels) u.searchParams.append("ch", ch);
    if (token && this.options.tokenVia === "query") u.searchParams.set("token", token);
    const known = channels.map((ch) => this._pos.get(ch));
    const fresh = new Set();
    let lastEventId = null;
    if (known.some((p) => p)) {
      // Every channel must have a position; one never seen gets epoch 0,
      // which matches no history: it starts afresh (its gaps are not ours).
      lastEventId = channels
        .map((ch, i) => {
          const p = known[i];
          if (!p) fresh.add(ch);
          return p ? `${p.epoch == null ? 0 : p.epoch}:${p.seq}` : "0:0";
        })
        .join(",");
    }
    const headers = { Accept: "text/event-stream" };
    if (lastEventId) headers["Last-Event-ID"] = lastEventId;
    if (token && this.options.tokenVia === "protocol") headers.Authorization = `Bearer ${token}`;
    return { url: u.href, channels, headers, fresh };
  }

  _credentials() {
    return this.options.tokenVia === "cookie" ? "include" : "same-origin";
  }

  // ------------------------------------------------------------- WebSocket

  _openWs(gen, token) {
    const protocols = [PROTOCOL];
    if (token && this.options.tokenVia === "protocol") protocols.push(TOKEN_PROTOCOL + base64url(token));
    let ws;
    try {
      ws = new WebSocket(this._wsUrl(token), protocols);
    } catch (e) {
      this._fatal({ code: "bad_url", message: String(e && e.message || e) });
      return;
    }
    const c = { kind: "ws", ws, open: false, openedAt: 0, lastRx: Date.now(), gotFrame: false, timers: [], token };
    this._conn = c;
    c.timers.push(setTimeout(() => {
      if (!c.open && this._conn === c) {
        try { ws.close(); } catch (_) { /* closing */ }
        this._wsEnded(gen, c, CloseCodes.ABNORMAL, "connect timeout");
      }
    }, this.options.connectTimeoutMs));
    ws.onopen = () => {
      if (this._conn !== c) return;
      c.open = true;
      c.openedAt = Date.now();
      c.lastRx = Date.now();
      this._wsFallbacks = 0;
      this._opened(c, {});
      for (const ch of this._subs.keys()) if (!this._subs.get(ch).refused) this._sendSub(c, ch);
      c.timers.push(setInterval(() => this._wsTick(c), Math.max(1000, Math.min(this.options.pingIntervalMs, this.options.idleTimeoutMs / 2))));
    };
    ws.onmessage = (ev) => {
      if (this._conn !== c) return;
      c.lastRx = Date.now();
      if (typeof ev.data !== "string") return;
      let f;
      try {
        f = JSON.parse(ev.data);
      } catch (_) {
        this._emit("error", { code: "bad_frame", message: "a frame that is not JSON", fatal: false });
        return;
      }
      c.gotFrame = true;
      this._frame(f, c, null);
    };
    ws.onerror = () => { /* a close event follows */ };
    ws.onclose = (ev) => this._wsEnded(gen, c, ev.code, ev.reason);
  }

  _wsTick(c) {
    if (this._conn !== c || !c.open) return;
    const idle = Date.now() - c.lastRx;
    if (idle >= this.options.idleTimeoutMs) {
      try { c.ws.close(4002, "no frame from the server"); } catch (_) { /* closing */ }
      this._wsEnded(this._gen, c, CloseCodes.HEARTBEAT_TIMEOUT, "client saw no frame for " + idle + " ms");
      return;
    }
    if (idle >= this.options.pingIntervalMs / 2) this._send(c, { op: "ping", id: this._id({ op: "ping" }) });
  }

  _send(c, obj) {
    try {
      c.ws.send(JSON.stringify(obj));
    } catch (_) { /* the close event follows */ }
  }

  _sendSub(c, ch) {
    const op = { op: "sub", ch, id: this._id({ op: "sub", ch }) };
    const p = this._pos.get(ch);
    if (p) {
      op.since = p.seq;
      if (p.epoch != null) op.epoch = p.epoch;
    }
    this._send(c, op);
  }

  _wsEnded(gen, c, code, reason) {
    if (this._conn !== c) return;
    const wasOpen = c.open;
    this._teardown();
    if (!wasOpen) {
      // Browsers hide a refused handshake's status: ask the SSE endpoint,
      // with the same credentials, what the server says.
      this._probe(gen, c.token, code);
      return;
    }
    this._ended(c, code, reason || "");
  }

  // ---------------------------------------------------------- probe / SSE

  async _probe(gen, token, wsCode) {
    const req = this._sseRequest(token);
    if (req.channels.length === 0) {
      // Nothing to ask about: the SSE endpoint needs a channel.
      this._emit("close", { code: wsCode, reason: "", transport: "ws", wasOpen: false, willReconnect: true });
      return this._retry({});
    }
    const ctrl = new AbortController();
    const timer = setTimeout(() => ctrl.abort(), this.options.connectTimeoutMs);
    let res;
    try {
      res = await fetch(req.url, { headers: req.headers, credentials: this._credentials(), cache: "no-store", signal: ctrl.signal });
    } catch (e) {
      clearTimeout(timer);
      if (gen !== this._gen || this._closed) return;
      if (this._crossOrigin && !ctrl.signal.aborted && (await this._corsRefused(req.url))) {
        if (gen !== this._gen || this._closed) return;
        return this._fatal(ORIGIN_REFUSED);
      }
      this._emit("close", { code: wsCode, reason: "unreachable", transport: "ws", wasOpen: false, willReconnect: true });
      return this._retry({});
    }
    clearTimeout(timer);
    if (gen !== this._gen || this._closed) {
      ctrl.abort();
      return;
    }
    if (res.ok && this.options.transport === "auto") {
      // The server takes this stream: WebSocket is blocked on the way.
      this._wsFallbacks++;
      this._transport = "sse";
      return this._adoptSse(gen, res, ctrl, req, { fallback: true });
    }
    if (res.ok) {
      ctrl.abort();
      this._emit("error", { code: "websocket_unavailable", message: "the WebSocket handshake failed but the server accepts SSE (transport is 'ws')", status: res.status, fatal: false });
      return this._retry({});
    }
    return this._refused(gen, res, ctrl, "ws");
  }

  /**
   * A cross-origin fetch failed: true when the server is up but its answer
   * is not readable from this page (Herald leaves CORS permission off only
   * when the tenant does not allow the page's origin), false when it is
   * simply unreachable. A no-cors request tells "answered" from "down"; a
   * second CORS request without custom headers rules out a server that was
   * down a moment ago and is up now.
   */
  async _corsRefused(url) {
    const u = new URL(url);
    u.searchParams.delete("token");
    const attempt = async (init) => {
      const ctrl = new AbortController();
      const timer = setTimeout(() => ctrl.abort(), 3000);
      try {
        await fetch(u.href, { ...init, cache: "no-store", signal: ctrl.signal });
        return true;
      } catch (_) {
        return false;
      } finally {
        clearTimeout(timer);
        ctrl.abort();
      }
    };
    if (!(await attempt({ mode: "no-cors", credentials: "omit" }))) return false;
    return !(await attempt({ mode: "cors", credentials: this._credentials() }));
  }

  /** A non-2xx answer to a session request: decide fatal or retry. */
  async _refused(gen, res, ctrl, transport) {
    let body = null;
    try {
      const text = await Promise.race([res.text(), new Promise((_, rej) => setTimeout(() => rej(new Error("slow body")), 3000))]);
      body = JSON.parse(text);
    } catch (_) { /* not JSON */ }
    ctrl.abort();
    if (gen !== this._gen || this._closed) return;
    const e = body && body.error ? body.error : {};
    const detail = {
      code: e.code || `http_${res.status}`,
      message: e.message || res.statusText || `HTTP ${res.status}`,
      status: res.status,
      transport,
    };
    if (FATAL_STATUS.has(res.status)) return this._fatal(detail);
    const after = retryAfterMs(res.headers.get("retry-after"));
    this._emit("error", { ...detail, fatal: false, retryAfterMs: after });
    this._emit("close", { code: null, status: res.status, reason: detail.code, transport, wasOpen: false, willReconnect: true });
    return this._retry({ retryAfterMs: after });
  }

  async _openSse(gen, token) {
    const req = this._sseRequest(token);
    if (req.channels.length === 0) {
      // Nothing to stream yet: wait for a subscribe().
      this._transport = null;
      this._setState("idle");
      return;
    }
    const ctrl = new AbortController();
    const timer = setTimeout(() => ctrl.abort(), this.options.connectTimeoutMs);
    const pending = { kind: "sse-connecting", ctrl, open: false, timers: [timer] };
    this._conn = pending;
    let res;
    try {
      res = await fetch(req.url, { headers: req.headers, credentials: this._credentials(), cache: "no-store", signal: ctrl.signal });
    } catch (e) {
      clearTimeout(timer);
      if (this._conn !== pending) return;
      this._conn = null;
      if (this._crossOrigin && !ctrl.signal.aborted && (await this._corsRefused(req.url))) {
        if (gen !== this._gen || this._closed) return;
        return this._fatal(ORIGIN_REFUSED);
      }
      if (gen !== this._gen || this._closed) return;
      this._emit("close", { code: null, reason: ctrl.signal.aborted ? "connect timeout" : "unreachable", transport: "sse", wasOpen: false, willReconnect: true });
      return this._retry({});
    }
    clearTimeout(timer);
    if (this._conn !== pending) {
      ctrl.abort();
      return;
    }
    this._conn = null;
    if (!res.ok) return this._refused(gen, res, ctrl, "sse");
    this._adoptSse(gen, res, ctrl, req, {});
  }

  _restartSse() {
    if (this._closed) return;
    const c = this._conn;
    if (c && c.kind !== "sse" && c.kind !== "sse-connecting") return;
    this._teardown();
    this._connect();
  }

  async _adoptSse(gen, res, ctrl, req, extra) {
    const c = { kind: "sse", ctrl, open: true, openedAt: Date.now(), lastRx: Date.now(), gotFrame: false, timers: [], channels: req.channels, fresh: req.fresh, serverGaps: new Map(), closeFrame: null };
    this._conn = c;
    this._opened(c, extra);
    c.timers.push(setInterval(() => {
      if (this._conn === c && Date.now() - c.lastRx >= this.options.idleTimeoutMs) {
        this._teardown();
        this._ended(c, CloseCodes.HEARTBEAT_TIMEOUT, "client saw nothing for " + (Date.now() - c.lastRx) + " ms");
      }
    }, Math.max(1000, this.options.idleTimeoutMs / 4)));
    const parser = new SseParser(
      (ev) => {
        if (this._conn !== c) return;
        c.gotFrame = true;
        this._sseEvent(c, ev);
      },
      () => { c.lastRx = Date.now(); },
    );
    const decoder = new TextDecoder();
    let reader;
    try {
      reader = res.body.getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (this._conn !== c) return;
        if (done) break;
        c.lastRx = Date.now();
        parser.feed(decoder.decode(value, { stream: true }));
        if (c.closeFrame) break;
      }
    } catch (_) {
      if (this._conn !== c) return;
    } finally {
      try { if (reader) reader.cancel().catch(() => {}); } catch (_) { /* done */ }
    }
    if (this._conn !== c) return;
    this._teardown();
    const cf = c.closeFrame;
    this._ended(c, cf ? cf.code : CloseCodes.ABNORMAL, cf ? cf.reason || "" : "stream ended");
  }

  _sseEvent(c, ev) {
    let f;
    try {
      f = JSON.parse(ev.data);
    } catch (_) {
      return;
    }
    if (!f || typeof f !== "object") return;
    if (ev.type === "close" || f.op === "close") {
      c.closeFrame = { code: Number(f.code) || CloseCodes.NORMAL, reason: f.reason || "" };
      return;
    }
    if (f.op === "msg") {
      const ids = parseEventId(ev.id);
      let epoch = null;
      if (ids && ids.length === c.channels.length) {
        const i = c.channels.indexOf(f.ch);
        if (i >= 0) epoch = ids[i][0];
        // Channels that have not spoken yet: where their stream started
        // (one added with no position replays its retained history instead).
        ids.forEach(([e, s], j) => {
          const ch = c.channels[j];
          if (j !== i && this._subs.has(ch) && !this._pos.has(ch) && !c.fresh.has(ch)) this._pos.set(ch, { epoch: e, seq: s });
        });
      }
      this._frame(f, c, epoch);
      return;
    }
    this._frame(f, c, null);
  }

  // ---------------------------------------------------------------- frames

  _frame(f, c, sseEpoch) {
    switch (f.op) {
      case "msg": return this._msg(f, c, sseEpoch);
      case "ack": return this._ack(f, c);
      case "gap": return this._serverGap(f, c);
      case "status":
        return this._emit("status", { source: f.source, state: f.state, since_ms: f.since_ms, sinceMs: f.since_ms });
      case "err": return this._err(f, c);
      case "pong":
        if (f.id != null) this._pending.delete(f.id);
        return;
      default: return;
    }
  }

  _gap(detail) {
    this.stats.gaps++;
    this._emit("gap", detail);
  }

  _ack(f, c) {
    const what = f.id != null ? this._pending.get(f.id) : null;
    if (f.id != null) this._pending.delete(f.id);
    if (!f.ch || !this._subs.has(f.ch)) return;
    const epoch = Number(f.epoch);
    const head = Number(f.seq);
    const p = this._pos.get(f.ch);
    if (!p) {
      this._pos.set(f.ch, { epoch, seq: head });
    } else if (p.epoch == null) {
      p.epoch = epoch;
    } else if (p.epoch !== epoch) {
      // The channel's history was lost (a restart, a swept channel): what
      // came after our last position in the old epoch cannot be known.
      this._gap({ ch: f.ch, from: p.seq + 1, to: null, epoch: p.epoch, newEpoch: epoch, reason: "epoch" });
      p.epoch = epoch;
      p.seq = 0; // the server replays this epoch's history from its start
    }
    const sub = this._subs.get(f.ch);
    if (sub) sub.initial = null;
    this._emit("ack", { ch: f.ch, epoch, seq: head, op: what ? what.op : "sub" });
  }

  _serverGap(f, c) {
    const ch = f.ch;
    if (!this._subs.has(ch)) return;
    if (c.fresh && c.fresh.has(ch)) return; // a fresh start lost nothing of ours
    const from = Number(f.from);
    const to = Number(f.to);
    const p = this._pos.get(ch);
    if (c.kind === "sse") c.serverGaps.set(ch, { from, to });
    this._gap({ ch, from, to, epoch: p ? p.epoch : null, reason: "server" });
    if (p && from <= p.seq + 1 && to > p.seq) p.seq = to;
  }

  _msg(f, c, sseEpoch) {
    const ch = f.ch;
    const sub = this._subs.get(ch);
    if (!sub) return;
    const seq = Number(f.seq);
    const prev = Number(f.prev);
    let p = this._pos.get(ch);
    const fresh = c.fresh && c.fresh.has(ch);
    if (sseEpoch != null) {
      if (!p) {
        p = { epoch: sseEpoch, seq: -1 };
        this._pos.set(ch, p);
      } else if (p.epoch == null) {
        p.epoch = sseEpoch;
      } else if (p.epoch !== sseEpoch) {
        if (!fresh) this._gap({ ch, from: p.seq + 1, to: null, epoch: p.epoch, newEpoch: sseEpoch, reason: "epoch" });
        // A `gap` frame the server sent for this channel on this stream
        // spoke of the new epoch's start.
        const g = c.serverGaps && c.serverGaps.get(ch);
        p.epoch = sseEpoch;
        p.seq = g && g.from === 1 ? g.to : 0;
        if (fresh) p.seq = -1;
      }
      if (fresh) c.fresh.delete(ch);
    }
    if (!p) {
      p = { epoch: null, seq: -1 };
      this._pos.set(ch, p);
    }
    if (p.seq >= 0 && seq <= p.seq) {
      this.stats.duplicates++;
      return;
    }
    if (p.seq >= 0 && prev !== p.seq && prev > p.seq) {
      this._gap({ ch, from: p.seq + 1, to: prev, epoch: p.epoch, reason: "prev" });
    }
    p.seq = seq;
    this.stats.messages++;
    let data = f.data;
    if (f.enc === "base64" && typeof data === "string") {
      try { data = decodeBase64(data); } catch (_) { /* leave as sent */ }
    }
    const meta = { ch, seq, prev, epoch: p.epoch, enc: f.enc || "json" };
    for (const h of [...sub.handlers]) {
      try {
        h(data, meta);
      } catch (e) {
        report(e);
      }
    }
    this._emit("message", { ...meta, data });
  }

  _err(f, c) {
    const what = f.id != null ? this._pending.get(f.id) : null;
    if (f.id != null) this._pending.delete(f.id);
    const detail = { code: f.code, message: f.msg, fatal: false };
    if (what && what.ch) {
      detail.ch = what.ch;
      detail.op = what.op;
      const sub = this._subs.get(what.ch);
      if (what.op === "sub" && sub) {
        if (FINAL_SUB_ERRORS.has(f.code)) {
          sub.refused = true;
        } else {
          // The plugin failed or a limit was hit for now: ask again later.
          const delay = this._delay(this.options.backoff.baseMs * 4);
          detail.retryInMs = delay;
          setTimeout(() => {
            if (this._conn === c && c.open && this._subs.get(what.ch) === sub) this._sendSub(c, what.ch);
          }, delay);
        }
      }
    }
    this._emit("error", detail);
  }

  // ------------------------------------------------------- open / close

  _opened(c, extra) {
    this.stats.opens++;
    if (this.stats.opens > 1) this.stats.reconnects++;
    this._transport = c.kind;
    this._setState("open");
    this._emit("open", { transport: c.kind, reconnect: this.stats.opens > 1, ...extra });
  }

  _teardown(code, reason) {
    const c = this._conn;
    if (!c) return;
    this._conn = null;
    for (const t of c.timers || []) {
      clearTimeout(t);
      clearInterval(t);
    }
    if (c.ws) {
      c.ws.onopen = c.ws.onmessage = c.ws.onclose = c.ws.onerror = null;
      try {
        if (c.ws.readyState === 0 || c.ws.readyState === 1) c.ws.close(code || CloseCodes.NORMAL, reason || "");
      } catch (_) {
        try { c.ws.close(); } catch (_e) { /* gone */ }
      }
    }
    if (c.ctrl) c.ctrl.abort();
  }

  /** A session that was open ended with `code`: decide what follows. */
  _ended(c, code, reason) {
    if (this._closed) return;
    if (c.openedAt && Date.now() - c.openedAt >= this.options.stableMs && c.gotFrame) this._attempt = 0;
    const fatal = code === CloseCodes.POLICY || code === CloseCodes.TENANT_GONE
      || (code >= 4000 && code <= 4999 && !RECONNECT_CODES.has(code));
    if (fatal) {
      this._emit("close", { code, reason, transport: c.kind, wasOpen: true, willReconnect: false });
      return this._fatal({
        code: code === CloseCodes.TENANT_GONE ? "tenant_gone" : code === CloseCodes.POLICY ? "policy" : `closed_${code}`,
        message: reason || `closed by the server with code ${code}`,
        closeCode: code,
        transport: c.kind,
      }, true);
    }
    const soon = SOON_CODES.has(code);
    if (soon) this._attempt = 0;
    const delay = this._retry({ soon, minMs: code === CloseCodes.TRY_AGAIN_LATER ? 1000 : 0, silent: true });
    this._emit("close", { code, reason, transport: c.kind, wasOpen: true, willReconnect: true, delayMs: delay });
  }

  _delay(cap) {
    return Math.floor(Math.random() * Math.max(0, cap));
  }

  /** Schedules the next connect: full jitter, random(0, min(max, base·2^attempt)). */
  _retry({ soon = false, retryAfterMs: after = null, minMs = 0 }) {
    if (this._closed) return 0;
    const { baseMs, maxMs } = this.options.backoff;
    const cap = soon ? baseMs : Math.min(maxMs, baseMs * 2 ** Math.min(this._attempt, 30));
    let delay = this._delay(cap);
    this._attempt = Math.min(this._attempt + 1, 31);
    if (after != null) delay = Math.max(delay, after + this._delay(Math.min(1000, after / 2 + 1)));
    delay = Math.max(delay, minMs);
    this._transport = null;
    this._setState("reconnecting");
    clearTimeout(this._timer);
    this._retryAt = Date.now() + delay;
    this._timer = setTimeout(() => {
      this._timer = null;
      this._connect();
    }, delay);
    return delay;
  }

  _reconnectNow() {
    clearTimeout(this._timer);
    this._timer = null;
    this._connect();
  }

  _fatal(detail, alreadyClosed) {
    this._teardown();
    clearTimeout(this._timer);
    this._timer = null;
    this._closed = true;
    this._transport = null;
    const d = { ...detail, fatal: true };
    this._lastError = d;
    this._emit("error", d);
    this._setState("closed");
    if (!alreadyClosed) this._emit("close", { code: detail.closeCode || null, status: detail.status, reason: detail.code, transport: detail.transport || null, wasOpen: false, willReconnect: false });
  }
}

export default Herald;
