// The example plugin in JavaScript: plugins/example/SPEC.md, byte for byte.
// build.sh bundles this file with sdk/js/herald-plugin.js into one module and
// builds it with componentize-js into plugins/target/example/js.wasm.
import { definePlugin, Deny, config, parseJson } from "../../../sdk/js/herald-plugin.js";

const THROWN = "herald-example: thrown on request";
const SYM = /^[A-Za-z0-9]{1,12}$/;
const PX = /^-?[0-9]{1,12}(\.[0-9]{1,8})?$/;
const AUD = /^[a-z0-9]{1,64}$/;

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

// `tokens` when the config is valid JSON with a `tokens` object, else
// undefined (no token is valid).
function tokens() {
  const c = config();
  return isObject(c) && isObject(c.tokens) ? c.tokens : undefined;
}

function hostile() {
  const c = config();
  return isObject(c) && c.hostile === true;
}

function forever() {
  for (;;) {}
}

function bomb() {
  // Every allocation stays reachable until one fails.
  const kept = [];
  // Typed arrays: linear memory grows at once, not after a collector's
  // pause per chunk (a bomb that takes longer than the deadline is a loop).
  for (;;) {
    const block = new Uint8Array(1 << 20);
    block[0] = kept.length;
    kept.push(block);
  }
}

function authorizeConnect(req) {
  const cred = req.credentials;
  if (hostile()) {
    if (cred === "hostile-throw") throw new Error(THROWN);
    if (cred === "hostile-loop") forever();
    if (cred === "hostile-print") console.log("herald-example: connect printed");
  }
  if (cred === undefined) throw new Deny("missing_token", "a token is required");
  const t = tokens();
  // Own keys only: "constructor", "__proto__" and the like are not tokens.
  if (t === undefined || !Object.prototype.hasOwnProperty.call(t, cred)) {
    throw new Deny("invalid_token", "unknown token");
  }
  const entry = t[cred];
  // SPEC.md: an entry that is not an object, without a string subject, or
  // with an audience other than absent, null or a string is invalid.
  if (
    !isObject(entry) ||
    typeof entry.subject !== "string" ||
    !(entry.audience === undefined || entry.audience === null || typeof entry.audience === "string")
  ) {
    throw new Deny("invalid_token", "unknown token");
  }
  return {
    subject: entry.subject,
    audience: entry.audience ?? undefined,
    attributes: [["transport", req.transport]],
  };
}

function authorizeSubscribe(session, channel) {
  if (channel.startsWith("public.") || channel.startsWith("ticks.")) return;
  const own = "user." + session.subject;
  if (channel === own || channel.startsWith(own + ".")) return;
  if (channel.startsWith("user.")) throw new Deny("forbidden", "not your channel");
  throw new Deny("unknown_channel", "no such channel");
}

function hex(bytes) {
  let s = "";
  for (const b of bytes) s += b.toString(16).padStart(2, "0");
  return s;
}

function one(record, i, hot) {
  const v = parseJson(record.value);
  if (!isObject(v)) return [];
  const sym = v.sym;
  if (typeof sym !== "string" || !SYM.test(sym)) return [];
  let px = v.px;
  // TIME and RAND replace px and skip step 4's pattern: RAND's 16 hex digits
  // (and TIME's 13 digits on a real clock) never match it, yet the host's
  // suite compares RAND's px across instances. SPEC.md says "go on with
  // step 4"; this follows the table at its end (reported upstream).
  let computed = false;
  if (hot) {
    switch (sym) {
      case "LOOP":
        forever();
        break;
      case "BOMB":
        bomb();
        break;
      case "THROW":
        throw new Error(THROWN);
      case "BADKEY":
        return [{ channel: "ticks.BADKEY", payload: "{}", conflationKey: "k".repeat(200), sourceIndex: i }];
      case "BADCHAN":
        return [{ channel: "bad channel!", payload: "{}", sourceIndex: i }];
      case "PRINT":
        console.log(`herald-example: transform printed ${i}`);
        break;
      case "TIME":
        px = String(Date.now());
        computed = true;
        break;
      case "RAND":
        px = hex(crypto.getRandomValues(new Uint8Array(8)));
        computed = true;
        break;
    }
  }
  if (!computed && (typeof px !== "string" || !PX.test(px))) return [];
  const aud = v.aud ?? undefined;
  if (aud !== undefined && (typeof aud !== "string" || !AUD.test(aud))) return [];
  const SYMU = sym.toUpperCase();
  return [
    {
      // An empty channel counts as none, as in the flat encoding (length 0).
      channel: record.channel ? record.channel : "ticks." + SYMU,
      payload: `{"sym":"${SYMU}","px":"${px}"}`,
      conflationKey: SYMU,
      audience: aud,
      sourceIndex: i,
    },
  ];
}

function transform(records) {
  const hot = hostile();
  const out = [];
  records.forEach((r, i) => out.push(...one(r, i, hot)));
  return out;
}

export const guest = definePlugin({
  name: "herald-example-js",
  version: "1.0.0",
  authorizeConnect,
  authorizeSubscribe,
  transform,
});
