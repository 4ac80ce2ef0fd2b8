// ticker-conflate in JavaScript: the same contract as plugins/ticker-conflate.
const dec = new TextDecoder();
const enc = new TextEncoder();
const NO_KEY = 0xffffffffffffffffn;

function symbolOk(s) {
  return typeof s === "string" && s.length > 0 && s.length <= 32 && /^[A-Za-z0-9.-]+$/.test(s);
}

export const guest = {
  describe() {
    return {
      name: "ticker-conflate-js",
      version: "0.1.0",
      hooks: { authorizeConnect: false, authorizeSubscribe: false, transform: false, transformFlat: true, merge: false },
    };
  },
  authorizeConnect(_req) {
    return { subject: "anonymous", audience: undefined, attributes: [] };
  },
  authorizeSubscribe(_session, _channel) {},
  // herald:plugin@0.2.0: this plugin declares the flat transform (one
  // buffer each way, the cheapest in JS too); the typed one is never called.
  transform(_records) {
    throw new Error("ticker-conflate-js declares transform-flat");
  },
  transformFlat(batch) {
    const data = batch.data;
    const meta = batch.meta;
    const outMeta = [];
    const parts = [];
    let off = 0;
    const n = meta.length / 6;
    for (let i = 0; i < n; i++) {
      const keyLen = meta[i * 6 + 2];
      const valueLen = Number(meta[i * 6 + 3]);
      const chanLen = Number(meta[i * 6 + 4]);
      const hdrLen = Number(meta[i * 6 + 5]);
      const klen = keyLen === NO_KEY ? 0 : Number(keyLen);
      off += klen;
      const value = data.subarray(off, off + valueLen);
      off += valueLen;
      const chan = chanLen > 0 ? data.subarray(off, off + chanLen) : null;
      off += chanLen + hdrLen;
      let tick;
      try {
        tick = JSON.parse(dec.decode(value));
      } catch (_) {
        continue;
      }
      if (!tick || !symbolOk(tick.sym)) continue;
      const ch = chan ? chan : enc.encode("ticks." + tick.sym);
      const key = enc.encode(tick.sym);
      parts.push(ch, value, key);
      outMeta.push(ch.length, value.length, key.length, 0xffffffff, i);
    }
    let total = 0;
    for (const p of parts) total += p.length;
    const out = new Uint8Array(total);
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return { data: out, meta: new Uint32Array(outMeta) };
  },
  merge(_key, _older, newer) {
    return newer;
  },
};
