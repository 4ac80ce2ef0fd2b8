// Unit tests of herald.js without a browser or a server: the SSE parser,
// the id and token encodings, and the client's protocol logic against a fake
// WebSocket and a fake fetch.   node --test clients/js/test/unit.mjs

import { test } from "node:test";
import assert from "node:assert/strict";
import { Herald, SseParser, parseEventId, base64url, CloseCodes } from "../herald.js";

const tick = () => new Promise((r) => setTimeout(r, 0));
const until = async (cond, ms = 2000) => {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 5));
  }
};

test("SSE parser: fields, multi-line data, comments, CRLF split across chunks", () => {
  const events = [];
  let comments = 0;
  const p = new SseParser((e) => events.push(e), () => comments++);
  p.feed("retry: 2000\n\nevent: msg\r");
  p.feed("\ndata: {\"a\":\ndata: 1}\nid: 7:42,9:1\r\n\r\n:\n\n");
  p.feed("event: status\ndata: {}\n");
  assert.equal(events.length, 1);
  p.feed("\n");
  assert.equal(p.retry, 2000);
  assert.deepEqual(events[0], { type: "msg", data: "{\"a\":\n1}", id: "7:42,9:1" });
  assert.deepEqual(events[1], { type: "status", data: "{}", id: "7:42,9:1" }, "the id persists");
  assert.equal(comments, 1);
  p.feed("event: x\n\n");
  assert.equal(events.length, 2, "an event without data is not dispatched");
  p.feed("data:no-space\rdata: two\r\r");
  assert.equal(events[2].data, "no-space\ntwo");
  assert.equal(events[2].type, "message");
});

test("event ids and token encoding", () => {
  assert.deepEqual(parseEventId("7:42,9:0"), [[7, 42], [9, 0]]);
  assert.equal(parseEventId("x:1"), null);
  assert.equal(parseEventId(""), null);
  for (const t of ["tok-alice", "é ü/+?=", "a".repeat(100), "\u{1F600}"]) {
    assert.equal(base64url(t), Buffer.from(t, "utf8").toString("base64url"));
  }
});

class FakeWS {
  static all = [];
  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.readyState = 0;
    this.sent = [];
    FakeWS.all.push(this);
  }
  send(s) { this.sent.push(JSON.parse(s)); }
  close() { this.readyState = 3; }
  open() { this.readyState = 1; this.onopen && this.onopen({}); }
  frame(obj) { this.onmessage && this.onmessage({ data: JSON.stringify(obj) }); }
  serverClose(code, reason = "") { this.readyState = 3; this.onclose && this.onclose({ code, reason }); }
  subs() { return this.sent.filter((f) => f.op === "sub"); }
}

function setup(opts = {}) {
  FakeWS.all = [];
  globalThis.WebSocket = FakeWS;
  const c = new Herald({ url: "http://h.test", tenant: "t1", backoff: { baseMs: 10, maxMs: 20 }, ...opts });
  const seen = { msgs: [], gaps: [], errors: [], closes: [], states: [] };
  c.on("message", (m) => seen.msgs.push(m));
  c.on("gap", (g) => seen.gaps.push(g));
  c.on("error", (e) => seen.errors.push(e));
  c.on("close", (e) => seen.closes.push(e));
  c.on("state", (s) => seen.states.push(s.state));
  return { c, seen };
}

const ack = (ws, sub, epoch, seq) => ws.frame({ op: "ack", id: sub.id, ch: sub.ch, epoch, seq });
const msg = (ws, ch, seq, prev, data = {}) => ws.frame({ op: "msg", ch, seq, prev, data });

test("WebSocket: subscribe, prev gaps, duplicates, resume with since/epoch", async () => {
  const { c, seen } = setup({ token: "tok é", tokenVia: "protocol" });
  const got = [];
  c.subscribe("a", (d, m) => got.push(m.seq));
  await tick();
  const ws = FakeWS.all[0];
  assert.equal(ws.url, "ws://h.test/v1/t/t1/ws");
  assert.deepEqual(ws.protocols, ["herald.v1", "herald.token." + Buffer.from("tok é").toString("base64url")]);
  ws.open();
  const [s1] = ws.subs();
  assert.deepEqual({ ...s1, id: 0 }, { op: "sub", ch: "a", id: 0 });
  ack(ws, s1, 77, 10);
  msg(ws, "a", 11, 10);
  msg(ws, "a", 11, 10); // duplicate
  msg(ws, "a", 14, 13); // 12..13 missing
  assert.deepEqual(got, [11, 14]);
  assert.equal(c.stats.duplicates, 1);
  assert.deepEqual(seen.gaps.map((g) => [g.from, g.to, g.reason]), [[12, 13, "prev"]]);
  // The operator disconnects: reconnect and resume from 14 in epoch 77.
  ws.serverClose(CloseCodes.DISCONNECTED, "disconnected by the operator");
  assert.equal(c.state, "reconnecting");
  await until(() => FakeWS.all.length === 2);
  const ws2 = FakeWS.all[1];
  ws2.open();
  const [s2] = ws2.subs();
  assert.equal(s2.since, 14);
  assert.equal(s2.epoch, 77);
  ack(ws2, s2, 77, 20);
  ws2.frame({ op: "gap", ch: "a", from: 15, to: 16 });
  msg(ws2, "a", 17, 16); // replay after the reported gap: no second gap
  msg(ws2, "a", 18, 17);
  assert.deepEqual(got, [11, 14, 17, 18]);
  assert.deepEqual(seen.gaps.map((g) => [g.from, g.to, g.reason]), [[12, 13, "prev"], [15, 16, "server"]]);
  assert.deepEqual(c.position("a"), { epoch: 77, seq: 18 });
  c.close();
});

test("WebSocket: a new epoch after a restart is a gap of unknown size; history replays", async () => {
  const { c, seen } = setup();
  const got = [];
  c.subscribe("a", (d, m) => got.push([m.epoch, m.seq]));
  await tick();
  const ws = FakeWS.all[0];
  ws.open();
  ack(ws, ws.subs()[0], 5, 3);
  msg(ws, "a", 4, 3);
  ws.serverClose(CloseCodes.GOING_AWAY, "server shutting down");
  await until(() => FakeWS.all.length === 2);
  const ws2 = FakeWS.all[1];
  ws2.open();
  const s = ws2.subs()[0];
  assert.equal(s.since, 4);
  ack(ws2, s, 9, 2);
  msg(ws2, "a", 1, 0);
  msg(ws2, "a", 2, 1);
  assert.deepEqual(got, [[5, 4], [9, 1], [9, 2]]);
  assert.deepEqual(seen.gaps.map((g) => [g.from, g.to, g.reason, g.epoch, g.newEpoch]), [[5, null, "epoch", 5, 9]]);
  c.close();
});

test("close codes: 4000 and 1008 stop, 1012 and 4001-4004 reconnect", async () => {
  for (const [code, reconnects] of [[4000, false], [1008, false], [4999, false], [1012, true], [4001, true], [4002, true], [4004, true], [1006, true]]) {
    const { c, seen } = setup();
    c.subscribe("a");
    await tick();
    FakeWS.all[0].open();
    FakeWS.all[0].serverClose(code, "r");
    if (reconnects) {
      await until(() => FakeWS.all.length === 2);
      assert.equal(seen.errors.length, 0, `code ${code}`);
    } else {
      await new Promise((r) => setTimeout(r, 60));
      assert.equal(FakeWS.all.length, 1, `code ${code} must not reconnect`);
      assert.equal(c.state, "closed");
      assert.equal(seen.errors.at(-1).fatal, true);
      assert.equal(seen.errors.at(-1).closeCode, code);
    }
    c.close();
  }
});

test("a refused handshake is explained by probing the SSE endpoint", async () => {
  const { c, seen } = setup({ token: "bad", tokenVia: "query" });
  const asked = [];
  globalThis.fetch = async (url, init) => {
    asked.push({ url, init });
    return new Response(JSON.stringify({ error: { code: "invalid_token", message: "unknown token" } }), { status: 403, headers: { "content-type": "application/json" } });
  };
  c.subscribe("a");
  c.subscribe("b");
  await tick();
  assert.equal(FakeWS.all.length, 1, "one connection for both subscriptions");
  assert.match(FakeWS.all[0].url, /\?token=bad$/);
  FakeWS.all[0].serverClose(1006);
  await until(() => c.state === "closed");
  assert.equal(asked.length, 1);
  assert.equal(asked[0].url, "http://h.test/v1/t/t1/sse?ch=a&ch=b&token=bad");
  const e = seen.errors.at(-1);
  assert.deepEqual([e.code, e.message, e.status, e.fatal], ["invalid_token", "unknown token", 403, true]);
  await new Promise((r) => setTimeout(r, 60));
  assert.equal(FakeWS.all.length, 1, "no reconnect after a denial");
  delete globalThis.fetch;
});

test("503 with Retry-After is honoured", async () => {
  const { c, seen } = setup();
  globalThis.fetch = async () => new Response(JSON.stringify({ error: { code: "shutting_down", message: "retry later" } }), { status: 503, headers: { "retry-after": "1" } });
  c.subscribe("a");
  await tick();
  const t = Date.now();
  FakeWS.all[0].serverClose(1006);
  await until(() => FakeWS.all.length === 2, 3000);
  assert.ok(Date.now() - t >= 950, `reconnected after ${Date.now() - t} ms`);
  assert.equal(seen.errors[0].code, "shutting_down");
  assert.equal(seen.errors[0].fatal, false);
  c.close();
  delete globalThis.fetch;
});

test("SSE: Last-Event-ID carries every channel's position; epochs come from ids", async () => {
  const bodies = [];
  const requests = [];
  globalThis.fetch = async (url, init) => {
    requests.push({ url, headers: init.headers });
    let ctl;
    const body = new ReadableStream({ start(c) { ctl = c; } });
    bodies.push({ push: (s) => ctl.enqueue(new TextEncoder().encode(s)), end: () => ctl.close() });
    init.signal.addEventListener("abort", () => { try { ctl.error(new Error("aborted")); } catch (_) { /* closed */ } });
    return new Response(body, { status: 200, headers: { "content-type": "text/event-stream" } });
  };
  const { c, seen } = setup({ transport: "sse", token: "tk", tokenVia: "protocol" });
  const got = [];
  c.subscribe("a", (d, m) => got.push([m.ch, m.epoch, m.seq]));
  c.subscribe("b", (d, m) => got.push([m.ch, m.epoch, m.seq]));
  await until(() => bodies.length === 1);
  assert.equal(requests[0].url, "http://h.test/v1/t/t1/sse?ch=a&ch=b");
  assert.equal(requests[0].headers.Authorization, "Bearer tk");
  assert.equal(requests[0].headers["Last-Event-ID"], undefined);
  bodies[0].push("retry: 2000\n\nevent: msg\ndata: {\"op\":\"msg\",\"ch\":\"a\",\"seq\":5,\"prev\":4,\"data\":1}\nid: 3:5,8:2\n\n");
  bodies[0].push("event: status\ndata: {\"op\":\"status\",\"source\":\"http\",\"state\":\"stalled\",\"since_ms\":1}\n\n");
  bodies[0].push("event: close\ndata: {\"op\":\"close\",\"code\":4003,\"reason\":\"disconnected by the operator\"}\n\n");
  await until(() => bodies.length === 2);
  assert.equal(requests[1].headers["Last-Event-ID"], "3:5,8:2");
  assert.deepEqual(seen.closes[0].code, 4003);
  bodies[1].push("event: msg\ndata: {\"op\":\"msg\",\"ch\":\"b\",\"seq\":4,\"prev\":2,\"data\":1}\nid: 3:5,8:4\n\n");
  await until(() => got.length === 2);
  assert.deepEqual(got, [["a", 3, 5], ["b", 8, 4]]);
  assert.deepEqual(seen.gaps, [], "b resumed from the position its stream started at");
  c.close();
  delete globalThis.fetch;
});
