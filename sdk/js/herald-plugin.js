// herald-plugin.js: the JavaScript SDK for Herald plugins (herald:plugin@0.2.0,
// world `plugin`, sdk/wit/herald.wit). One ES module with no dependencies;
// a plugin imports it and is built into a component with componentize-js:
//
//   import { definePlugin, Deny, config } from "./herald-plugin.js";
//   export const guest = definePlugin({
//     name: "my-plugin", version: "1.0.0",
//     authorizeConnect(req) { ...; return { subject: "alice" }; },   // or throw new Deny(code, message)
//     authorizeSubscribe(session, channel) { ... },                  // return = allow, throw Deny = refuse
//     transform(records) { return [{ channel, payload, conflationKey, audience, sourceIndex }]; },
//   });
//
// `definePlugin` builds the `guest` object componentize-js binds to the
// exports: `describe` declares exactly the hooks given (a hook written is
// declared, one not written is not), and every hook not given is a stub
// that throws (the host never calls it). The module must export that object
// as `guest`.
//
// Bindings conventions (componentize-js 0.23): WIT names are camelCase
// (`remote-addr` -> `remoteAddr`), records are plain objects, `option<T>` is
// `undefined` when none (null is accepted on output), `list<u8>` is a
// Uint8Array, `u64` a BigInt, `tuple<a, b>` a two-element array, an error of
// `result` is a thrown value (this SDK turns a thrown `Deny` into it and
// lets anything else trap), `flags` an object of booleans, `enum` a string.
//
// Do not call `config`, `log` or `nowMs` at the module's top level: the top
// level runs once at build time (a Wizer snapshot), where the host does not
// exist. Call them inside the hooks.

import * as host from "herald:plugin/host@0.2.0";

/** Thrown from `authorizeConnect` or `authorizeSubscribe` to refuse: the
 * client sees `code` (`[A-Za-z0-9_]`, at most 48; the host strips the rest)
 * and `message` (at most 256 bytes). */
export class Deny extends Error {
  constructor(code, message) {
    super(message === undefined ? String(code) : String(message));
    this.name = "Deny";
    this.code = String(code);
    // componentize-js reads a thrown value's own `payload` as the error of
    // a `result`; this SDK also converts it explicitly (see `definePlugin`).
    this.payload = { code: this.code, message: this.message };
  }
}

const HOOKS = ["authorizeConnect", "authorizeSubscribe", "transform", "merge"];
const ENCODER = new TextEncoder();

function utf8Length(s) {
  return ENCODER.encode(s).length;
}

function notDeclared(hook) {
  return () => {
    throw new Error(`herald-plugin: ${hook} is not implemented (describe does not declare it)`);
  };
}

const isThenable = (v) => v !== null && (typeof v === "object" || typeof v === "function") && typeof v.then === "function";

// A thrown Deny becomes `err`; any other thrown value traps the call (the
// host then fails closed) with that error's message and stack in the output.
//
// componentize-js 0.23 catches everything a result-returning export throws
// and, as its `instanceof Error` check does not see this module's Error,
// takes the error itself for the denial: the call then traps on encoding
// it, with "expected a string, received [undefined]" instead of the
// error's message. So the error is rethrown from the denial's getters,
// where the bindings read it, outside their catch.
function failure(e) {
  if (e instanceof Deny) return { tag: "err", val: { code: e.code, message: e.message } };
  const err = e instanceof Error ? e : new Error(`herald-plugin: a hook threw a non-Error value: ${String(e)}`);
  const rethrow = () => {
    throw err;
  };
  return { tag: "err", val: { get code() { return rethrow(); }, get message() { return rethrow(); } } };
}

// Runs a result-returning hook; `ok` shapes its value. A hook may be async
// (return a promise): the bindings await it.
function asResult(f, ok) {
  const done = (v) => {
    try {
      return { tag: "ok", val: ok(v) };
    } catch (e) {
      return failure(e);
    }
  };
  try {
    const v = f();
    return isThenable(v) ? Promise.resolve(v).then(done, failure) : done(v);
  } catch (e) {
    return failure(e);
  }
}

// Runs a plain hook (transform, merge), async or not, and shapes its value.
function andThen(v, f) {
  return isThenable(v) ? Promise.resolve(v).then(f) : f(v);
}

function toOutgoingList(out) {
  if (!Array.isArray(out)) throw new TypeError("herald-plugin: transform must return an array of messages");
  return out.map(toOutgoing);
}

function toSession(s) {
  if (s === null || typeof s !== "object" || typeof s.subject !== "string") {
    throw new TypeError("herald-plugin: authorizeConnect must return { subject: string, audience?, attributes? } or throw Deny");
  }
  let attributes = s.attributes ?? [];
  if (!Array.isArray(attributes)) attributes = Object.entries(attributes);
  return {
    subject: s.subject,
    audience: s.audience ?? undefined,
    attributes: attributes.map(([k, v]) => [String(k), String(v)]),
  };
}

/** Bytes from a string (UTF-8), a Uint8Array, any other typed array or
 * ArrayBuffer, or an array of byte values. */
export function bytes(v) {
  if (typeof v === "string") return ENCODER.encode(v);
  if (v instanceof Uint8Array) return v;
  if (ArrayBuffer.isView(v)) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  if (Array.isArray(v)) return Uint8Array.from(v);
  throw new TypeError(`herald-plugin: cannot make bytes of ${v === null ? "null" : typeof v}`);
}

function toOutgoing(m, n) {
  if (m === null || typeof m !== "object" || typeof m.channel !== "string") {
    throw new TypeError(`herald-plugin: transform's message ${n} needs a string channel`);
  }
  const i = m.sourceIndex;
  if (!Number.isInteger(i) || i < 0 || i > 0xffffffff) {
    throw new TypeError(`herald-plugin: transform's message ${n} needs sourceIndex, the index of its record`);
  }
  return {
    channel: m.channel,
    payload: bytes(m.payload ?? ""),
    conflationKey: m.conflationKey ?? undefined,
    audience: m.audience ?? undefined,
    sourceIndex: i,
  };
}

/**
 * Builds the `guest` export from the hooks given. `name` (1-64 bytes) and
 * `version` are what `describe` answers.
 */
export function definePlugin(def) {
  if (def === null || typeof def !== "object") throw new TypeError("herald-plugin: definePlugin({ name, version, ...hooks })");
  const { name, version = "0.0.0" } = def;
  if (typeof name !== "string" || utf8Length(name) < 1 || utf8Length(name) > 64) {
    throw new TypeError("herald-plugin: name must be a string of 1-64 bytes");
  }
  if (typeof version !== "string") throw new TypeError("herald-plugin: version must be a string");
  for (const k of Object.keys(def)) {
    if (k !== "name" && k !== "version" && !HOOKS.includes(k)) {
      throw new TypeError(`herald-plugin: unknown hook ${JSON.stringify(k)} (hooks: ${HOOKS.join(", ")})`);
    }
  }
  for (const h of HOOKS) {
    if (def[h] !== undefined && typeof def[h] !== "function") throw new TypeError(`herald-plugin: ${h} must be a function`);
  }
  const has = (h) => typeof def[h] === "function";
  const hooks = {
    authorizeConnect: has("authorizeConnect"),
    authorizeSubscribe: has("authorizeSubscribe"),
    transform: has("transform"),
    transformFlat: false,
    merge: has("merge"),
  };
  return {
    describe: () => ({ name, version, hooks: { ...hooks } }),
    authorizeConnect: hooks.authorizeConnect
      ? (req) => asResult(() => def.authorizeConnect(req), toSession)
      : () => asResult(notDeclared("authorizeConnect")),
    authorizeSubscribe: hooks.authorizeSubscribe
      ? (session, channel) => asResult(() => def.authorizeSubscribe(session, channel), () => undefined)
      : () => asResult(notDeclared("authorizeSubscribe")),
    transform: hooks.transform ? (records) => andThen(def.transform(records), toOutgoingList) : notDeclared("transform"),
    transformFlat: notDeclared("transformFlat"),
    merge: hooks.merge ? (key, older, newer) => andThen(def.merge(key, older, newer), bytes) : notDeclared("merge"),
  };
}

// ---- config ------------------------------------------------------------

let configCache;

/** The tenant's config (host `config()`), parsed; `null` when it is not
 * valid JSON. Read once per instance: the host reloads the plugin when the
 * config changes. */
export function config() {
  if (configCache === undefined) {
    configCache = { text: host.config() };
    try {
      configCache.value = JSON.parse(configCache.text);
    } catch {
      configCache.value = null;
    }
  }
  return configCache.value;
}

/** The tenant's config as the host gave it (JSON text). */
export function configText() {
  config();
  return configCache.text;
}

// ---- host --------------------------------------------------------------

/** Wall-clock milliseconds since the Unix epoch, as a Number: the one real
 * clock (WASI's clocks, so `Date.now()`, are frozen at 0). For token expiry
 * in the authorize hooks; a transform or merge must not depend on it. */
export function nowMs() {
  return Number(host.nowMs());
}

function logAt(level) {
  return (...parts) => host.log(level, parts.map((p) => (typeof p === "string" ? p : String(p))).join(" "));
}

/** To the host's log under the tenant's name (16 lines a call, 1 KiB each):
 * `log.info("x", 1)`, or `log("warn", "x")`. console.log writes to stdout
 * instead, which the host keeps only for a failed call's error. */
export const log = Object.assign((level, ...parts) => logAt(level)(...parts), {
  trace: logAt("trace"),
  debug: logAt("debug"),
  info: logAt("info"),
  warn: logAt("warn"),
  error: logAt("error"),
});

// ---- helpers -----------------------------------------------------------

/** The UTF-8 text of bytes, or `undefined` when they are not valid UTF-8
 * (a leading byte-order mark is kept, not skipped). */
export function text(b) {
  if (b === undefined || b === null) return undefined;
  try {
    return new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(b);
  } catch {
    return undefined;
  }
}

/** The JSON value of bytes (UTF-8), or `undefined` when they are not valid
 * UTF-8 JSON. */
export function parseJson(b) {
  const s = text(b);
  if (s === undefined) return undefined;
  try {
    return JSON.parse(s);
  } catch {
    return undefined;
  }
}

function lookup(pairs, name) {
  for (const [k, v] of pairs) if (k === name) return v;
  return undefined;
}

/** The first value of a request header (names are lower case), or undefined. */
export function header(req, name) {
  return lookup(req.headers, name.toLowerCase());
}

/** The first value of a query parameter, or undefined. */
export function query(req, name) {
  return lookup(req.query, name);
}

/** The value of a session attribute, or undefined. */
export function attribute(session, name) {
  return lookup(session.attributes, name);
}

/** The value of a record header as bytes, or undefined. */
export function recordHeader(record, name) {
  return lookup(record.headers, name);
}
