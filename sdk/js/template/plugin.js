// A Herald plugin in JavaScript. Build: `bash build.sh` (or `npm run build`)
// writes dist/plugin.wasm; upload it with the admin API (see README.md).
//
// The tenant's config (admin API `config`) this plugin reads: each token is
// a key of "tokens", its value the subject, or the subject and audience:
//   {"tokens": {"secret-1": "alice", "secret-2": {"subject": "bob", "audience": "pro"}}}
import { definePlugin, Deny, config, log, text } from "./herald-plugin.js";

// Who may connect: a token that is a key of the config's `tokens`.
function authorizeConnect(req) {
  const token = req.credentials;
  if (token === undefined) throw new Deny("missing_token", "a token is required");
  const tokens = config()?.tokens;
  let entry = tokens && typeof tokens === "object" && Object.hasOwn(tokens, token) ? tokens[token] : undefined;
  if (typeof entry === "string") entry = { subject: entry };
  if (!entry || typeof entry.subject !== "string") throw new Deny("invalid_token", "unknown token");
  // The host's log, under the tenant's name (`herald plugin test` shows it).
  log.info(`connect: ${entry.subject}`);
  return {
    subject: entry.subject,
    audience: typeof entry.audience === "string" ? entry.audience : undefined,
    attributes: { transport: req.transport },
  };
}

// Every record is published as it is: to the channel its publisher named (or
// "default"), conflated by its key when it has one.
function transform(records) {
  return records.map((r, i) => ({
    channel: r.channel || "default",
    payload: r.value,
    conflationKey: r.key && r.key.length >= 1 && r.key.length <= 128 ? text(r.key) : undefined,
    sourceIndex: i,
  }));
}

// Uncomment (and add it below) to decide who may subscribe to what; without
// it the hook is not declared and the host allows every subscription.
// function authorizeSubscribe(session, channel) {
//   if (channel.startsWith("user.") && channel !== `user.${session.subject}`) {
//     throw new Deny("forbidden", "not your channel");
//   }
// }

export const guest = definePlugin({
  name: "my-plugin",
  version: "0.1.0",
  authorizeConnect,
  transform,
});
