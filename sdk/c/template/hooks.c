/* A Herald plugin in C. Build: bash build.sh -> target/plugin.wasm
 *
 * Tenant config (admin API, "config"):
 *     {"tokens": {"secret-1": "alice", "secret-2": "bob"}}
 *
 * - authorize-connect: the client's token must be a key of "tokens"; the
 *   session's subject is its value.
 * - transform: every record is published as it is, to its own channel (or
 *   "events" if it names none), conflated by the record's key when the key
 *   is 1-128 bytes of UTF-8.
 * authorize-subscribe is not declared: every channel may be subscribed to.
 * See docs/plugins/c.md for the conventions of the generated bindings. */
#include "herald_plugin.h"

void exports_herald_plugin_guest_describe(exports_herald_plugin_guest_info_t *ret) {
    hp_describe(ret, "my-plugin", "0.1.0", HP_HOOK_AUTHORIZE_CONNECT | HP_HOOK_TRANSFORM);
}

bool exports_herald_plugin_guest_authorize_connect(exports_herald_plugin_guest_connect_request_t *req,
                                                   exports_herald_plugin_guest_session_t *ret,
                                                   exports_herald_plugin_guest_denial_t *err) {
    bool ok;
    hp_json *cfg = hp_config(); /* NULL if the config is not JSON */
    if (!req->credentials.is_some) {
        ok = hp_deny(err, "missing_token", "a token is required");
    } else {
        const hp_string *token = &req->credentials.val;
        size_t len;
        const char *subject = hp_json_string(
            hp_json_get_n(hp_json_get(cfg, "tokens"), (const char *)token->ptr, token->len), &len);
        if (!subject || len == 0) {
            ok = hp_deny(err, "invalid_token", "unknown token");
        } else {
            /* The host's log, under the tenant's name (`herald plugin test` shows it). */
            hp_log(HERALD_PLUGIN_TYPES_LEVEL_INFO, "connect: %.*s", (int)len, subject);
            hp_session_init(ret, subject, len);
            hp_session_add_attribute(ret, "transport", req->transport.ptr, req->transport.len);
            ok = true;
        }
    }
    hp_json_free(cfg);
    hp_free_connect_request(req); /* arguments are ours to free */
    return ok;
}

void exports_herald_plugin_guest_transform(exports_herald_plugin_guest_list_source_record_t *records,
                                           exports_herald_plugin_guest_list_outgoing_t *ret) {
    hp_outgoing_builder out = {0};
    for (size_t i = 0; i < records->len; i++) {
        const hp_source_record *r = &records->ptr[i];
        const char *channel = "events";
        size_t channel_len = 6;
        if (r->channel.is_some && r->channel.val.len > 0) {
            channel = (const char *)r->channel.val.ptr;
            channel_len = r->channel.val.len;
        }
        hp_outgoing *m = hp_outgoing_push(&out, (uint32_t)i, channel, channel_len, r->value.ptr, r->value.len);
        if (r->key.is_some && r->key.val.len >= 1 && r->key.val.len <= 128 &&
            hp_utf8_valid(r->key.val.ptr, r->key.val.len))
            hp_outgoing_set_key(m, r->key.val.ptr, r->key.val.len);
    }
    hp_outgoing_finish(&out, ret); /* the host frees it after copying */
    hp_free_records(records);
}
