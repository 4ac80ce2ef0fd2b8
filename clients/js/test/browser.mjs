// The Herald demo page and browser client in a real browser: Debian's
// Chromium (/usr/bin/chromium) driven by playwright-core from npm (which never
// downloads a browser). Starts Herald itself on free loopback ports with
// throwaway data directories, runs the cases below, prints PASS/FAIL/SKIP per
// case, kills everything it started (by PID) and exits non-zero on a failure.
//
//   HERALD_BIN=target/debug/herald node clients/js/test/browser.mjs
//
// Cases:
//   u. unit tests of the client (unit.mjs: parser, resume, gaps, close codes)
//   a. the page served by Herald at `/` updates live, badge "live", no gaps (docs/demo.png)
//   b. an operator disconnect (WebSocket and SSE) resumes without loss
//   c. a server restart: reconnecting, then live; every missed position delivered or a gap
//   d. a silent HTTP publisher turns the badge "stalled", a publish turns it "live"
//   e. a plugin tenant: a bad token shows the server's code, a good one gets values
//   f. a page from another origin: allowed origins subscribe, others are refused
//   g. a proxy that refuses WebSocket upgrades: the client falls back to SSE and resumes
//
// Environment: HERALD_BIN (default target/debug/herald), HERALD_TEST_CASES
// (e.g. "a,b,f"), HERALD_TEST_LOCAL_ASSETS=1 (load page and client from this
// script's static server even when Herald serves stale copies — for working on
// clients/js/ without rebuilding Herald), HERALD_TEST_KEEP=1 (keep temp dirs),
// HERALD_TEST_HEADFUL=1.

import { spawn } from "node:child_process";
import { createServer, request as httpRequest } from "node:http";
import { createServer as netServer } from "node:net";
import { existsSync, mkdtempSync, readFileSync, rmSync, mkdirSync, createWriteStream } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve, extname } from "node:path";
import { fileURLToPath } from "node:url";
import { randomBytes } from "node:crypto";

const HERE = dirname(fileURLToPath(import.meta.url));
const JS_ROOT = resolve(HERE, "..");
const REPO = resolve(JS_ROOT, "../..");
const CHROMIUM = "/usr/bin/chromium";
const HERALD_BIN = resolve(REPO, process.env.HERALD_BIN || "target/debug/herald");
const ADMIN = "test-admin-" + randomBytes(16).toString("hex");
const ONLY = (process.env.HERALD_TEST_CASES || "").split(",").map((s) => s.trim()).filter(Boolean);
const LOCAL_ASSETS = process.env.HERALD_TEST_LOCAL_ASSETS === "1";
const OVERALL_MS = 180_000;
const SYMS = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA"];
const t0 = Date.now();

const say = (...a) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1).padStart(5)}s]`, ...a);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class Skip extends Error {}
function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}

// ------------------------------------------------------------ processes

const started = []; // {name, child}
const tempDirs = [];
let context = null;
let staticServer = null;

function tempDir(tag) {
  const d = mkdtempSync(join(tmpdir(), `herald-browser-${tag}-`));
  tempDirs.push(d);
  return d;
}

async function freePort() {
  return new Promise((res, rej) => {
    const s = netServer();
    s.unref();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

async function waitFor(what, fn, timeoutMs, everyMs = 100) {
  const until = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > until) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last instanceof Error ? ` (${last.message})` : ""}`);
    await sleep(everyMs);
  }
}

class HeraldProc {
  constructor(name, port, dataDir, extra = []) {
    Object.assign(this, { name, port, dataDir, extra, url: `http://127.0.0.1:${port}`, output: "" });
  }

  async start() {
    const args = ["serve", "--listen", `127.0.0.1:${this.port}`, "--data-dir", this.dataDir, "--admin-token", ADMIN, "--demo", ...this.extra];
    const log = createWriteStream(join(this.dataDir, "herald.log"), { flags: "a" });
    const child = spawn(HERALD_BIN, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, RUST_LOG: process.env.RUST_LOG || "info" } });
    this.child = child;
    this.exited = new Promise((r) => child.on("exit", (code, sig) => r({ code, sig })));
    started.push(this);
    const take = (b) => {
      const s = b.toString();
      this.output += s;
      if (this.output.length > 1 << 20) this.output = this.output.slice(-(1 << 19));
      log.write(s);
    };
    child.stdout.on("data", take);
    child.stderr.on("data", take);
    let gone = null;
    this.exited.then((x) => (gone = x));
    await waitFor(`${this.name} to answer /healthz`, async () => {
      if (gone) throw new Error(`herald exited (${JSON.stringify(gone)}):\n${this.output.slice(-2000)}`);
      const r = await fetch(`${this.url}/healthz`, { signal: AbortSignal.timeout(1000) });
      return r.ok;
    }, 30_000, 100);
    const m = /publish key \(shown once\): (pk_[A-Za-z0-9_]+)/.exec(this.output);
    if (m) this.demoKey = m[1];
    say(`${this.name}: herald pid ${child.pid} on ${this.url}`);
    return this;
  }

  async stop() {
    const c = this.child;
    if (!c || c.exitCode !== null || c.signalCode !== null) return;
    try { process.kill(c.pid, "SIGTERM"); } catch (_) { return; }
    const r = await Promise.race([this.exited, sleep(15_000).then(() => null)]);
    if (!r) {
      try { process.kill(c.pid, "SIGKILL"); } catch (_) { /* gone */ }
      await Promise.race([this.exited, sleep(5000)]);
    }
  }

  async api(method, path, body, { raw = false, type } = {}) {
    const headers = { authorization: `Bearer ${ADMIN}` };
    let payload;
    if (body instanceof Uint8Array) {
      payload = body;
      headers["content-type"] = type || "application/octet-stream";
    } else if (body !== undefined) {
      payload = JSON.stringify(body);
      headers["content-type"] = "application/json";
    }
    const r = await fetch(`${this.url}${path}`, { method, headers, body: payload, signal: AbortSignal.timeout(60_000) });
    if (raw) return r;
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch (_) { /* not json */ }
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text.slice(0, 300)}`);
    return json;
  }

  async publish(tenant, key, items) {
    const r = await fetch(`${this.url}/v1/t/${tenant}/publish`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(items),
      signal: AbortSignal.timeout(5000),
    });
    if (!r.ok) throw new Error(`publish to ${tenant}: ${r.status} ${await r.text()}`);
    return r.json().catch(() => null);
  }

  /** Publishes one tick per symbol every `everyMs` until stopped; px as a string for plugin tenants. */
  publisher(tenant, key, { everyMs = 250, pxAsString = false, syms = SYMS } = {}) {
    let i = 0;
    let on = true;
    const errors = [];
    const px = {};
    const loop = (async () => {
      while (on) {
        i++;
        const items = syms.map((sym) => {
          px[sym] = Math.max(1, (px[sym] || 100) * (1 + (Math.random() - 0.5) / 50));
          const p = Math.round(px[sym] * 100) / 100;
          return { ch: `ticks.${sym}`, key: sym, data: { sym, px: pxAsString ? p.toFixed(2) : p, i } };
        });
        try {
          await this.publish(tenant, key, items);
        } catch (e) {
          errors.push(e.message);
        }
        await sleep(everyMs);
      }
    })();
    return {
      get count() { return i; },
      errors,
      stop: async () => { on = false; await loop; },
    };
  }
}

let proxyTarget = null; // Herald base URL the static server forwards /v1/ to (case g)

/**
 * A static server for clients/js (another origin for case f) that also
 * forwards `/v1/…` HTTP requests to `proxyTarget` and refuses every
 * WebSocket upgrade: a proxy that blocks WebSocket on the way (case g).
 */
function staticAssets() {
  const types = { ".js": "text/javascript; charset=utf-8", ".html": "text/html; charset=utf-8", ".ts": "text/plain; charset=utf-8" };
  const files = { "/": "demo/index.html", "/index.html": "demo/index.html", "/demo/index.html": "demo/index.html", "/herald.js": "herald.js", "/herald.d.ts": "herald.d.ts" };
  const server = createServer((req, res) => {
    const path = new URL(req.url, "http://x").pathname;
    if (path.startsWith("/v1/") && proxyTarget) {
      const target = new URL(req.url, proxyTarget);
      const up = httpRequest(target, { method: req.method, headers: { ...req.headers, host: target.host } }, (ur) => {
        res.writeHead(ur.statusCode, ur.headers);
        ur.pipe(res);
      });
      up.on("error", () => {
        if (!res.headersSent) res.writeHead(502, { "content-type": "text/plain" });
        res.end();
      });
      res.on("close", () => up.destroy());
      req.pipe(up);
      return;
    }
    const f = files[path];
    if (!f || req.method !== "GET") {
      res.writeHead(404, { "content-type": "text/plain" });
      res.end("not found");
      return;
    }
    res.writeHead(200, { "content-type": types[extname(f)] || "application/octet-stream", "cache-control": "no-cache", "access-control-allow-origin": "*" });
    res.end(readFileSync(join(JS_ROOT, f)));
  });
  server.on("upgrade", (req, socket) => {
    socket.end("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  });
  return new Promise((r) => server.listen(0, "127.0.0.1", () => r(server)));
}

// ------------------------------------------------------------- browser

let useLocalAssets = LOCAL_ASSETS;
let staticUrl = null;

/** The demo page URL: served by Herald at `/`, or (local assets) by the static server. */
function pageUrl(h, params = {}) {
  const q = new URLSearchParams(params);
  if (useLocalAssets) {
    q.set("server", h.url);
    q.set("client", `${staticUrl}/herald.js`);
    return `${staticUrl}/?${q}`;
  }
  return `${h.url}/?${q}`;
}

async function openPage(url, { waitLoaded = true } = {}) {
  const page = await context.newPage();
  page.consoleLines = [];
  page.on("console", (m) => {
    page.consoleLines.push(`${m.type()}: ${m.text()}`);
    if (page.consoleLines.length > 200) page.consoleLines.shift();
  });
  page.on("pageerror", (e) => page.consoleLines.push(`pageerror: ${e.message}`));
  await page.goto(url, { waitUntil: "load", timeout: 15_000 });
  if (waitLoaded) {
    try {
      await page.waitForFunction(() => window.heraldDemo && window.heraldDemo.state.loaded, null, { timeout: 15_000 });
    } catch (e) {
      throw new Error(`${url} did not load the client: ${e.message.split("\n")[0]}; console: ${page.consoleLines.slice(-10).join(" | ")}`);
    }
  }
  return page;
}

const demoState = (page) => page.evaluate(() => JSON.parse(JSON.stringify({ ...window.heraldDemo.state, clientState: window.heraldDemo.client.state, transport: window.heraldDemo.client.transport, stats: window.heraldDemo.client.stats })));
const text = (page, sel) => page.evaluate((s) => document.querySelector(s).textContent.trim(), sel);
const counts = (st) => Object.fromEntries(Object.entries(st.channels).map(([ch, c]) => [ch, c.count]));

async function waitCounts(page, atLeast, timeoutMs, base = null) {
  return page.waitForFunction(([n, b]) => {
    const chs = window.heraldDemo.state.channels;
    return Object.entries(chs).every(([ch, c]) => c.count - (b ? b[ch] || 0 : 0) >= n);
  }, [atLeast, base], { timeout: timeoutMs, polling: 100 });
}

async function waitBadge(page, badge, timeoutMs) {
  await page.waitForFunction((b) => document.getElementById("status").textContent.trim() === b, badge, { timeout: timeoutMs, polling: 50 });
}

/** True when gaps cover every position from..to (inclusive). */
function covered(from, to, gaps) {
  if (from > to) return true;
  let cursor = from;
  for (const g of [...gaps].filter((g) => g.to != null).sort((a, b) => a.from - b.from)) {
    if (g.from <= cursor && g.to >= cursor) cursor = g.to + 1;
    if (cursor > to) return true;
  }
  return cursor > to;
}

/**
 * Walks one channel's log (messages and gap events, in the order the page
 * saw them): every position between two messages was delivered or reported.
 */
function auditChannel(ch, events) {
  const problems = [];
  let last = null;
  let gaps = [];
  let msgs = 0;
  let epochChanges = 0;
  for (const ev of events) {
    if (ev.t === "g") {
      gaps.push(ev);
      continue;
    }
    msgs++;
    if (last) {
      if (ev.e === last.e) {
        if (ev.s <= last.s) problems.push(`${ch}: seq ${ev.s} delivered after ${last.s} (duplicate or reorder)`);
        else if (ev.p !== last.s && !covered(last.s + 1, ev.p, gaps)) problems.push(`${ch}: silent loss: ${last.s} then ${ev.s} (prev ${ev.p}) with no gap covering ${last.s + 1}..${ev.p}`);
      } else {
        epochChanges++;
        if (!gaps.some((g) => g.reason === "epoch")) problems.push(`${ch}: epoch ${last.e} → ${ev.e} without a gap event`);
        const inNew = gaps.filter((g) => g.reason !== "epoch");
        if (ev.p > 0 && !covered(1, ev.p, inNew)) problems.push(`${ch}: new epoch starts at seq ${ev.s} (prev ${ev.p}) and nothing covers 1..${ev.p}`);
      }
    }
    last = ev;
    gaps = [];
  }
  return { problems, msgs, epochChanges };
}

function audit(st) {
  const out = { problems: [], msgs: 0, epochChanges: 0 };
  for (const [ch, c] of Object.entries(st.channels)) {
    const r = auditChannel(ch, c.events);
    out.problems.push(...r.problems);
    out.msgs += r.msgs;
    out.epochChanges += r.epochChanges;
  }
  return out;
}

async function sessionsOf(h, tenant) {
  const r = await h.api("GET", `/admin/v1/tenants/${tenant}/connections`, undefined, { raw: true });
  if (r.status === 404 || r.status === 405) return null;
  if (!r.ok) throw new Error(`connections: ${r.status} ${await r.text()}`);
  return (await r.json()).connections;
}

// ---------------------------------------------------------------- cases

const ctx = {};

/** The client's logic without a browser (unit.mjs, node --test). */
async function caseU() {
  const child = spawn(process.execPath, ["--test", "--test-reporter=tap", join(HERE, "unit.mjs")], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (b) => (out += b));
  child.stderr.on("data", (b) => (out += b));
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  const code = await new Promise((r) => child.on("exit", (c) => r(c)));
  clearTimeout(timer);
  const pass = /^# pass (\d+)/m.exec(out);
  if (code !== 0) throw new Error(`unit.mjs exited ${code}:\n${out.split("\n").filter((l) => /^not ok|error|expected|actual/i.test(l.trim())).slice(0, 20).join("\n")}`);
  return `${pass ? pass[1] : "?"} unit tests of herald.js`;
}

async function caseA() {
  const h = ctx.A;
  const served = await (await fetch(`${h.url}/herald.js`)).text();
  const page0 = await (await fetch(`${h.url}/`)).text();
  const types = await (await fetch(`${h.url}/herald.d.ts`)).text();
  const stale = served !== readFileSync(join(JS_ROOT, "herald.js"), "utf8")
    || page0 !== readFileSync(join(JS_ROOT, "demo/index.html"), "utf8")
    || types !== readFileSync(join(JS_ROOT, "herald.d.ts"), "utf8");
  let note = "";
  if (stale) {
    useLocalAssets = true;
    if (!LOCAL_ASSETS) {
      ctx.staleAssets = true;
      say("note: Herald serves stale copies of clients/js (rebuild herald); the other cases load the page from the test's static server");
    }
    note = " (page and client from the test's static server: Herald's embedded copies are stale)";
  }
  const page = await openPage(pageUrl(h));
  ctx.pageA = page;
  await waitCounts(page, 4, 10_000);
  await waitBadge(page, "live", 5000);
  const st = await demoState(page);
  assert(st.gaps === 0, `gaps ${st.gaps}: ${JSON.stringify(st.gapEvents)}`);
  assert(st.transport === "ws", `transport ${st.transport}, expected ws`);
  assert((await text(page, "#gaps")) === "0", "gap counter is not 0");
  const a = audit(st);
  assert(a.problems.length === 0, a.problems.join("; "));
  for (const sym of SYMS) {
    const px = await text(page, `#row-${sym} .px`);
    assert(/^\d+\.\d\d$/.test(px), `${sym} price cell shows ${JSON.stringify(px)}`);
    // Ticks keep coming while the cells are read: the cell shows a position
    // between the state read before and the one read after it.
    const cell = Number(await text(page, `#row-${sym} .seq`));
    const after = (await demoState(page)).channels[`ticks.${sym}`].seq;
    const before = st.channels[`ticks.${sym}`].seq;
    assert(before <= cell && cell <= after, `${sym} seq cell ${cell}, state ${before}..${after}`);
  }
  mkdirSync(join(REPO, "docs"), { recursive: true });
  await sleep(300);
  await page.screenshot({ path: join(REPO, "docs/demo.png") });
  if (stale && !LOCAL_ASSETS) throw new Error("Herald's `/`, `/herald.js` and `/herald.d.ts` are not clients/js/demo/index.html, herald.js and herald.d.ts (the binary embeds stale copies: rebuild it); the page itself worked" + note);
  return `${a.msgs} messages over ${st.transport}, badge live, 0 gaps; screenshot docs/demo.png${note}`;
}

async function resumeOnce(h, page, transport) {
  const sessions = await sessionsOf(h, "demo");
  if (sessions === null) throw new Error("GET /admin/v1/tenants/{t}/connections did not answer: the operator's connection list is missing");
  const mine = sessions.filter((s) => s.transport === transport && s.channels.includes("ticks.AAPL"));
  assert(mine.length === 1, `expected one ${transport} session of the page, saw ${JSON.stringify(sessions)}`);
  const before = await demoState(page);
  const r = await h.api("POST", "/admin/v1/tenants/demo/disconnect", { session: mine[0].session });
  assert(r.disconnected === 1, `disconnect answered ${JSON.stringify(r)}`);
  await page.waitForFunction((n) => window.heraldDemo.state.opens > n, before.opens, { timeout: 10_000, polling: 50 });
  await waitCounts(page, 4, 10_000, counts(before));
  const st = await demoState(page);
  const closes = st.closes.slice(before.closes.length);
  assert(closes.some((c) => c.code === 4003), `expected a close with 4003 (operator disconnect), saw ${JSON.stringify(closes)}`);
  assert(st.gaps === before.gaps, `gap events after the disconnect: ${JSON.stringify(st.gapEvents.slice(before.gapEvents.length))}`);
  const a = audit(st);
  assert(a.problems.length === 0, a.problems.join("; "));
  assert(a.epochChanges === 0, `epoch changed ${a.epochChanges} times`);
  assert(st.transport === transport, `reconnected over ${st.transport}, expected ${transport}`);
  return `${transport}: closed 4003, reopened, ${st.messages - before.messages} more messages, contiguous`;
}

/** The WebSocket page of case a (opened here when case a did not run). */
async function mainPage() {
  if (!ctx.pageA || ctx.pageA.isClosed()) {
    ctx.pageA = await openPage(pageUrl(ctx.A));
    await waitCounts(ctx.pageA, 2, 10_000);
  }
  return ctx.pageA;
}

async function caseB() {
  const h = ctx.A;
  const ws = await resumeOnce(h, await mainPage(), "ws");
  const page = await openPage(pageUrl(h, { transport: "sse" }));
  try {
    await waitCounts(page, 3, 10_000);
    const sse = await resumeOnce(h, page, "sse");
    return `${ws}; ${sse}`;
  } finally {
    await page.close();
  }
}

async function caseC() {
  const h = ctx.A;
  const page = await mainPage();
  // An SSE page beside the WebSocket one: epochs come from `id:` there.
  const pageS = await openPage(pageUrl(h, { transport: "sse" }));
  try {
    await waitCounts(pageS, 2, 10_000);
    const beforeS = await demoState(pageS);
    const r = await restartWith(h, page, pageS);
    await waitBadge(pageS, "live", 20_000);
    await waitCounts(pageS, 4, 15_000, counts(beforeS));
    const st = await demoState(pageS);
    const a = audit(st);
    assert(a.problems.length === 0, `sse page: ${a.problems.join("; ")}`);
    assert(st.transport === "sse", `sse page reconnected over ${st.transport}`);
    assert(a.epochChanges === 0 || st.gaps > 0, "sse page: epochs changed but no gap event");
    return `${r}; sse page: ${st.gapEvents.length} gap events, ${a.epochChanges} epoch changes, every missed position reported`;
  } finally {
    await pageS.close();
  }
}

async function restartWith(h, page, pageS) {
  const before = await demoState(page);
  await page.evaluate(() => { window.heraldDemo.state.badges = []; });
  const t = Date.now();
  await h.stop();
  say(`c: herald stopped (SIGTERM) after ${Date.now() - t} ms`);
  await waitBadge(page, "reconnecting", 10_000);
  await waitBadge(pageS, "reconnecting", 10_000);
  await sleep(800); // down for a moment: reconnect attempts fail meanwhile
  await h.start();
  await waitBadge(page, "live", 20_000);
  await waitCounts(page, 4, 15_000, counts(before));
  const st = await demoState(page);
  const badges = st.badges.map((b) => b.badge);
  assert(badges.includes("reconnecting"), `badge never showed reconnecting: ${badges}`);
  assert(badges[badges.length - 1] === "live", `badge ends ${badges[badges.length - 1]}`);
  const a = audit(st);
  assert(a.problems.length === 0, a.problems.join("; "));
  const newGaps = st.gapEvents.slice(before.gapEvents.length);
  const closes = st.closes.slice(before.closes.length).map((c) => c.code ?? c.reason);
  // HTTP publish on one node: positions are node-local, a restart starts new epochs.
  assert(a.epochChanges === 0 || newGaps.length > 0, "epochs changed but no gap event");
  assert(st.gaps > 0 && (await text(page, "#gaps")) === String(st.gaps), `gap counter ${await text(page, "#gaps")} after a restart with new epochs`);
  return `ws page: badges ${badges.join("→")}; closes ${JSON.stringify(closes)}; ${newGaps.length} gap events (${[...new Set(newGaps.map((g) => g.reason))].join(",")}), ${a.epochChanges} channel epoch changes, every missed position reported`;
}

async function caseD() {
  const h = await new HeraldProc("D", await freePort(), tempDir("d"), ["--demo-interval-ms", "0"]).start();
  ctx.D = h;
  let key = h.demoKey;
  if (!key) key = (await h.api("POST", "/admin/v1/tenants/demo/publish-key")).publish_key;
  assert(key, "no demo publish key");
  const page = await openPage(pageUrl(h));
  try {
    await page.waitForFunction(() => window.heraldDemo.client.state === "open", null, { timeout: 10_000 });
    const pub = h.publisher("demo", key, { everyMs: 250 });
    await waitCounts(page, 4, 10_000);
    await waitBadge(page, "live", 5000);
    await pub.stop();
    assert(pub.errors.length === 0, pub.errors.join("; "));
    const stoppedAt = Date.now();
    await waitBadge(page, "stalled", 8000);
    const stalledAfter = Date.now() - stoppedAt;
    assert(stalledAfter <= 6000, `stalled only after ${stalledAfter} ms`);
    const mid = await demoState(page);
    const st1 = mid.statusEvents[mid.statusEvents.length - 1];
    assert(st1 && st1.state === "stalled", `last status event ${JSON.stringify(st1)}`);
    const pub2 = h.publisher("demo", key, { everyMs: 250 });
    const t = Date.now();
    await waitBadge(page, "live", 5000);
    const liveAfter = Date.now() - t;
    await waitCounts(page, 2, 5000, counts(mid));
    await pub2.stop();
    const st = await demoState(page);
    const a = audit(st);
    assert(a.problems.length === 0, a.problems.join("; "));
    assert(st.gaps === 0, `gaps ${st.gaps}`);
    return `stalled ${stalledAfter} ms after the last publish (source ${st1.source}), live ${liveAfter} ms after publishing again`;
  } finally {
    await page.close();
    await h.stop();
  }
}

function findExamplePlugin() {
  const rel = "plugins/target/wasm32-wasip2/release";
  for (const name of ["herald_example.wasm", "herald_example_rust.wasm"]) {
    const p = join(REPO, rel, name);
    if (existsSync(p)) return p;
  }
  const p = join(REPO, "plugins/target/example/rust.wasm");
  return existsSync(p) ? p : null;
}

async function plugInTenant(h, id, config) {
  const wasm = findExamplePlugin();
  if (!wasm) throw new Skip("the example plugin is not built (plugins/example/build.sh or plugins/build.sh)");
  const t = await h.api("POST", "/admin/v1/tenants", { id, access: "plugin", config });
  const r = await h.api("POST", `/admin/v1/tenants/${id}/plugins`, new Uint8Array(readFileSync(wasm)), { raw: true, type: "application/wasm" });
  let up = await r.json();
  if (r.status === 202) {
    up = await waitFor("the plugin upload to compile", async () => {
      const s = await h.api("GET", up.status_url);
      if (s.status === "failed") throw new Error(`upload failed: ${JSON.stringify(s.error)}`);
      return s.status === "stored" ? s : null;
    }, 60_000, 250);
  } else if (r.status !== 201) {
    throw new Error(`plugin upload: ${r.status} ${JSON.stringify(up)}`);
  }
  await h.api("POST", `/admin/v1/tenants/${id}/plugins/${up.version}/activate`);
  return { key: t.publish_key, version: up.version, wasm };
}

async function deniedPage(url, code) {
  const page = await openPage(url);
  try {
    await page.waitForFunction(() => document.getElementById("error").classList.contains("shown"), null, { timeout: 15_000 });
    const err = await text(page, "#error");
    assert(err.includes(code), `#error shows ${JSON.stringify(err)}, expected ${code}`);
    await sleep(500);
    const st = await demoState(page);
    assert(st.messages === 0, `a refused page received ${st.messages} messages`);
    assert(st.clientState === "closed", `client state ${st.clientState} after a refusal (it should stop)`);
    const e = st.errors.find((x) => x.fatal);
    return { err, e, badge: await text(page, "#status") };
  } finally {
    await page.close();
  }
}

async function caseE() {
  const h = ctx.A;
  const { key, version } = await plugInTenant(h, "acme", { tokens: { "tok-alice": { subject: "alice", audience: "pro" }, "tok-bob": { subject: "bob" } } });
  const results = [];
  for (const [via, transport] of [["protocol", "auto"], ["query", "sse"]]) {
    const d = await deniedPage(pageUrl(h, { tenant: "acme", token: "tok-mallory", tokenVia: via, transport }), "invalid_token");
    assert(d.e && d.e.status === 403, `error event ${JSON.stringify(d.e)}`);
    results.push(`bad token via ${via}/${transport}: ${d.e.code} (HTTP ${d.e.status})`);
  }
  {
    // No credentials: answered as an unknown tenant would be (probing.rs).
    const d = await deniedPage(pageUrl(h, { tenant: "acme" }), "unauthorized");
    results.push(`no token: ${d.e.code}`);
  }
  const pub = h.publisher("acme", key, { everyMs: 250, pxAsString: true });
  try {
    for (const [token, via, transport] of [["tok-alice", "protocol", "ws"], ["tok-bob", "query", "sse"], ["tok-alice", "cookie", "auto"]]) {
      const page = await openPage(pageUrl(h, { tenant: "acme", token, tokenVia: via, transport }));
      try {
        await waitCounts(page, 3, 10_000);
        const st = await demoState(page);
        assert(st.errors.length === 0, `errors ${JSON.stringify(st.errors)}`);
        assert(!(await page.evaluate(() => document.getElementById("error").classList.contains("shown"))), "error box shown");
        results.push(`${token} via ${via}/${st.transport}: values`);
      } finally {
        await page.close();
        await context.clearCookies();
      }
    }
  } finally {
    await pub.stop();
  }
  assert(pub.errors.length === 0, pub.errors.join("; "));
  return `plugin v${version} active; ${results.join("; ")}`;
}

async function caseF() {
  const h = ctx.A;
  const origin = staticUrl;
  const ok = await h.api("POST", "/admin/v1/tenants", { id: "xok", access: "public", allowed_origins: [origin] });
  await h.api("POST", "/admin/v1/tenants", { id: "xno", access: "public", allowed_origins: ["http://127.0.0.1:1"] });
  const url = (tenant, extra = {}) => {
    const q = new URLSearchParams({ server: h.url, tenant, ...extra });
    if (useLocalAssets) q.set("client", `${staticUrl}/herald.js`);
    return `${staticUrl}/?${q}`;
  };
  const results = [];
  const pub = h.publisher("xok", ok.publish_key, { everyMs: 250 });
  try {
    for (const transport of ["ws", "sse"]) {
      const page = await openPage(url("xok", { transport }));
      try {
        await waitCounts(page, 3, 10_000);
        let st = await demoState(page);
        assert(st.errors.length === 0, `errors ${JSON.stringify(st.errors)}`);
        assert(st.transport === transport, `transport ${st.transport}`);
        // Resume across origins (SSE: Last-Event-ID needs the CORS preflight).
        const sessions = await sessionsOf(h, "xok");
        let resumed = "";
        if (sessions) {
          const before = st;
          await h.api("POST", "/admin/v1/tenants/xok/disconnect", { session: sessions.find((s) => s.transport === transport).session });
          await page.waitForFunction((n) => window.heraldDemo.state.opens > n, before.opens, { timeout: 10_000 });
          await waitCounts(page, 3, 10_000, counts(before));
          st = await demoState(page);
          const a = audit(st);
          assert(a.problems.length === 0 && st.gaps === 0, `after resume: gaps ${st.gaps}; ${a.problems.join("; ")}`);
          resumed = ", resumed without loss";
        }
        results.push(`allowed origin over ${transport}: values${resumed}`);
      } finally {
        await page.close();
      }
    }
  } finally {
    await pub.stop();
  }
  for (const transport of ["auto", "sse"]) {
    const d = await deniedPage(url("xno", { transport }), "origin_not_allowed");
    results.push(`other origin over ${transport}: ${d.e.code}${d.e.inferred ? " (inferred: the refusal is not readable cross-origin)" : ""}`);
  }
  return results.join("; ");
}

async function caseG() {
  const h = ctx.A;
  proxyTarget = h.url;
  const q = new URLSearchParams({ server: staticUrl, tenant: "demo", client: `${staticUrl}/herald.js` });
  const page = await openPage(`${staticUrl}/?${q}`);
  try {
    await waitCounts(page, 3, 10_000);
    let st = await demoState(page);
    assert(st.transport === "sse", `transport ${st.transport}, expected the SSE fallback`);
    assert(st.errors.length === 0 && st.gaps === 0, `errors ${JSON.stringify(st.errors)}, gaps ${st.gaps}`);
    const fallback = await page.evaluate(() => document.getElementById("log").textContent.includes("SSE fallback"));
    assert(fallback, "the page did not report the fallback");
    // Twice more through a disconnect: resumes over SSE each time.
    for (let i = 0; i < 2; i++) {
      const before = st;
      const sessions = await sessionsOf(h, "demo");
      if (!sessions) break;
      const mine = sessions.filter((s) => s.transport === "sse" && s.remote_addr && s.channels.includes("ticks.NVDA"));
      for (const s of mine) await h.api("POST", "/admin/v1/tenants/demo/disconnect", { session: s.session });
      await page.waitForFunction((n) => window.heraldDemo.state.opens > n, before.opens, { timeout: 10_000 });
      await waitCounts(page, 2, 10_000, counts(before));
      st = await demoState(page);
    }
    const a = audit(st);
    assert(a.problems.length === 0 && st.gaps === 0, `gaps ${st.gaps}; ${a.problems.join("; ")}`);
    assert(st.transport === "sse", `transport ${st.transport}`);
    return `WebSocket refused by the proxy (502), SSE adopted from the probe; ${st.opens} opens, ${st.messages} messages, contiguous`;
  } finally {
    proxyTarget = null;
    await page.close();
  }
}

// ------------------------------------------------------------------ main

async function cleanup() {
  try { if (context) await Promise.race([context.close(), sleep(5000)]); } catch (_) { /* gone */ }
  for (const h of started) {
    try { await h.stop(); } catch (_) { /* gone */ }
  }
  try { if (staticServer) { staticServer.closeAllConnections?.(); staticServer.close(); } } catch (_) { /* closed */ }
  if (process.env.HERALD_TEST_KEEP !== "1") for (const d of tempDirs) { try { rmSync(d, { recursive: true, force: true }); } catch (_) { /* busy */ } }
  else say(`kept ${tempDirs.join(" ")}`);
}

async function main() {
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: apt-get install -y chromium (this script never downloads a browser)`);
  let chromium;
  try {
    ({ chromium } = await import("playwright-core"));
  } catch (e) {
    throw new Error(`playwright-core is not installed: PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix ${HERE} (${e.message})`);
  }
  await waitFor(`${HERALD_BIN} (set HERALD_BIN)`, () => existsSync(HERALD_BIN), 30_000, 500);
  staticServer = await staticAssets();
  staticUrl = `http://127.0.0.1:${staticServer.address().port}`;
  const profile = tempDir("profile");
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: process.env.HERALD_TEST_HEADFUL !== "1",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"].filter((a) => a !== "--headless" || process.env.HERALD_TEST_HEADFUL !== "1"),
    viewport: { width: 900, height: 540 },
    timeout: 30_000,
  });
  ctx.A = await new HeraldProc("A", await freePort(), tempDir("a")).start();
  const cases = [
    ["u", "client logic (unit tests, fake WebSocket and fetch)", caseU],
    ["a", "page from Herald at / updates live", caseA],
    ["b", "operator disconnect resumes without loss", caseB],
    ["c", "server restart: reconnecting, live again, no silent loss", caseC],
    ["d", "silent publisher: stalled, then live", caseD],
    ["e", "plugin tenant: bad token refused with the server's code, good token gets values", caseE],
    ["f", "cross-origin page: allowed origin served, other origin refused", caseF],
    ["g", "WebSocket blocked on the way: SSE fallback, resumes", caseG],
  ];
  let failed = 0;
  for (const [id, title, fn] of cases) {
    if (ONLY.length && !ONLY.includes(id)) continue;
    const t = Date.now();
    try {
      const r = await fn();
      say(`PASS ${id}. ${title} — ${r} (${Date.now() - t} ms)`);
    } catch (e) {
      if (e instanceof Skip) {
        say(`SKIP ${id}. ${title} — ${e.message}`);
        continue;
      }
      failed++;
      say(`FAIL ${id}. ${title} — ${e.message}`);
      if (ctx.pageA && id <= "c") {
        try { say(`  page state: ${JSON.stringify(await demoState(ctx.pageA)).slice(0, 1500)}`); } catch (_) { /* no page */ }
        say(`  console: ${ctx.pageA.consoleLines.slice(-15).join(" | ")}`);
      }
    }
  }
  return failed;
}

let failures = 1;
const guard = setTimeout(async () => {
  say(`FAIL: the run exceeded ${OVERALL_MS / 1000} s`);
  await cleanup();
  process.exit(1);
}, OVERALL_MS);
try {
  failures = await main();
} catch (e) {
  say(`FAIL setup: ${e.message}`);
  failures = 1;
} finally {
  await cleanup();
  clearTimeout(guard);
}
say(failures ? `${failures} case(s) failed` : "all cases passed");
process.exit(failures ? 1 : 0);
