/* The example plugin in C: plugins/example/SPEC.md, byte for byte.
 * Built by build.sh beside this file into plugins/target/example/c.wasm. */
#define _GNU_SOURCE /* getentropy */
#include "herald_plugin.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define THROWN "herald-example: thrown on request"

/* ---- small checks ------------------------------------------------------ */

static bool is_alnum(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* -?[0-9]{1,12}(\.[0-9]{1,8})? */
static bool px_ok(const char *s, size_t n) {
    size_t i = 0, d = 0;
    if (i < n && s[i] == '-') i++;
    while (i < n && is_digit(s[i])) { i++; d++; }
    if (d < 1 || d > 12) return false;
    if (i == n) return true;
    if (s[i] != '.') return false;
    i++;
    d = 0;
    while (i < n && is_digit(s[i])) { i++; d++; }
    return d >= 1 && d <= 8 && i == n;
}

/* 1-64 characters of [a-z0-9] */
static bool aud_ok(const char *s, size_t n) {
    if (n < 1 || n > 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || is_digit(s[i]))) return false;
    return true;
}

static bool eq(const char *s, size_t n, const char *lit) {
    return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

/* ---- hostile behaviours -------------------------------------------------- */

static _Noreturn void throw_on_request(void) {
    fflush(stdout);
    fputs(THROWN "\n", stderr);
    fflush(stderr);
    abort(); /* a wasm trap: `unreachable` */
}

static _Noreturn void loop_forever(void) {
    volatile uint64_t spins = 0;
    for (;;) spins++;
}

static void *volatile bomb_head; /* keeps every block reachable */

static _Noreturn void bomb(void) {
    for (;;) {
        void **block = malloc(1 << 20);
        /* Nothing is printed: writing to stderr may itself need memory
         * (the WASI adapter allocates its state on first use). */
        if (!block) abort();
        *block = bomb_head;
        bomb_head = block;
    }
}

static bool hostile_on(const hp_json *cfg) { return hp_json_is_true(hp_json_get(cfg, "hostile")); }

/* ---- describe ------------------------------------------------------------ */

void exports_herald_plugin_guest_describe(exports_herald_plugin_guest_info_t *ret) {
    hp_describe(ret, "herald-example-c", "1.0.0",
                HP_HOOK_AUTHORIZE_CONNECT | HP_HOOK_AUTHORIZE_SUBSCRIBE | HP_HOOK_TRANSFORM);
}

/* ---- authorize-connect ----------------------------------------------------- */

static bool connect(const hp_json *cfg, const hp_connect_request *req, hp_session *ret, hp_denial *err) {
    const hp_string *cred = req->credentials.is_some ? &req->credentials.val : NULL;
    if (cred && hostile_on(cfg)) {
        if (hp_str_eq(cred, "hostile-throw")) throw_on_request();
        if (hp_str_eq(cred, "hostile-loop")) loop_forever();
        if (hp_str_eq(cred, "hostile-print")) {
            fputs("herald-example: connect printed\n", stdout);
            fflush(stdout);
        }
    }
    if (!cred) return hp_deny(err, "missing_token", "a token is required");
    const hp_json *tokens = hp_json_get(cfg, "tokens");
    const hp_json *entry = hp_json_get_n(tokens, (const char *)cred->ptr, cred->len);
    if (!entry) return hp_deny(err, "invalid_token", "unknown token");
    /* SPEC.md leaves an entry without a string subject (or with a
     * non-string audience) open; it is treated as an unknown token. */
    size_t subject_len, aud_len = 0;
    const char *subject = hp_json_string(hp_json_get(entry, "subject"), &subject_len);
    const hp_json *aud_v = hp_json_get(entry, "audience");
    const char *aud = NULL;
    if (aud_v && !hp_json_is_null(aud_v)) {
        aud = hp_json_string(aud_v, &aud_len);
        if (!aud) subject = NULL;
    }
    if (!subject) return hp_deny(err, "invalid_token", "unknown token");
    hp_session_init(ret, subject, subject_len);
    if (aud) hp_session_set_audience(ret, aud, aud_len);
    hp_session_add_attribute(ret, "transport", req->transport.ptr, req->transport.len);
    return true;
}

bool exports_herald_plugin_guest_authorize_connect(exports_herald_plugin_guest_connect_request_t *req,
                                                   exports_herald_plugin_guest_session_t *ret,
                                                   exports_herald_plugin_guest_denial_t *err) {
    hp_json *cfg = hp_config();
    bool ok = connect(cfg, req, ret, err);
    hp_json_free(cfg);
    hp_free_connect_request(req);
    return ok;
}

/* ---- authorize-subscribe ----------------------------------------------------- */

static bool subscribe(const hp_session *session, const hp_string *channel, hp_denial *err) {
    if (hp_str_starts_with(channel, "public.") || hp_str_starts_with(channel, "ticks.")) return true;
    const size_t user = 5; /* "user." */
    const hp_string *sub = &session->subject;
    if (hp_str_starts_with(channel, "user.")) {
        if (channel->len >= user + sub->len && memcmp(channel->ptr + user, sub->ptr, sub->len) == 0 &&
            (channel->len == user + sub->len || channel->ptr[user + sub->len] == '.'))
            return true;
        return hp_deny(err, "forbidden", "not your channel");
    }
    return hp_deny(err, "unknown_channel", "no such channel");
}

bool exports_herald_plugin_guest_authorize_subscribe(exports_herald_plugin_guest_session_t *session,
                                                     plugin_string_t *channel,
                                                     exports_herald_plugin_guest_denial_t *err) {
    bool ok = subscribe(session, channel, err);
    hp_free_session(session);
    hp_free_string(channel);
    return ok;
}

/* ---- transform ------------------------------------------------------------- */

static void transform_one(bool hostile, uint32_t i, const hp_source_record *rec, hp_outgoing_builder *out) {
    hp_json *v = hp_json_parse(rec->value.ptr, rec->value.len);
    if (!v || v->kind != HP_JSON_OBJECT) goto done;

    size_t sym_len;
    const char *sym = hp_json_string(hp_json_get(v, "sym"), &sym_len);
    if (!sym || sym_len < 1 || sym_len > 12) goto done;
    for (size_t k = 0; k < sym_len; k++)
        if (!is_alnum(sym[k])) goto done;

    char px_buf[32];
    const char *px = NULL;
    size_t px_len = 0;
    if (hostile) {
        if (eq(sym, sym_len, "LOOP")) loop_forever();
        if (eq(sym, sym_len, "BOMB")) bomb();
        if (eq(sym, sym_len, "THROW")) throw_on_request();
        if (eq(sym, sym_len, "BADKEY")) {
            char key[200];
            memset(key, 'k', sizeof key);
            hp_outgoing *m = hp_outgoing_push(out, i, "ticks.BADKEY", 12, "{}", 2);
            hp_outgoing_set_key(m, key, sizeof key);
            goto done;
        }
        if (eq(sym, sym_len, "BADCHAN")) {
            hp_outgoing_push(out, i, "bad channel!", 12, "{}", 2);
            goto done;
        }
        if (eq(sym, sym_len, "PRINT")) {
            printf("herald-example: transform printed %" PRIu32 "\n", i);
            fflush(stdout);
        }
        if (eq(sym, sym_len, "TIME")) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
            px_len = (size_t)snprintf(px_buf, sizeof px_buf, "%" PRIu64, ms);
            px = px_buf;
        }
        if (eq(sym, sym_len, "RAND")) {
            unsigned char r[8];
            if (getentropy(r, sizeof r) != 0) abort();
            for (int k = 0; k < 8; k++) snprintf(px_buf + 2 * k, 3, "%02x", r[k]);
            px_len = 16;
            px = px_buf;
        }
    }
    /* TIME's and RAND's px replace the record's and are not held to the
     * px pattern (RAND's 16 hex digits never match it). */
    if (!px) {
        px = hp_json_string(hp_json_get(v, "px"), &px_len);
        if (!px || !px_ok(px, px_len)) goto done;
    }

    const hp_json *aud_v = hp_json_get(v, "aud");
    const char *aud = NULL;
    size_t aud_len = 0;
    if (aud_v && !hp_json_is_null(aud_v)) {
        aud = hp_json_string(aud_v, &aud_len);
        if (!aud || !aud_ok(aud, aud_len)) goto done;
    }

    char up[12];
    for (size_t k = 0; k < sym_len; k++) up[k] = (sym[k] >= 'a' && sym[k] <= 'z') ? (char)(sym[k] - 32) : sym[k];

    /* {"sym":"SYM","px":"PX"}: SYM is alphanumeric and PX digits, '-', '.'
     * or hex, so nothing needs escaping. */
    char payload[64];
    int plen = snprintf(payload, sizeof payload, "{\"sym\":\"%.*s\",\"px\":\"%.*s\"}", (int)sym_len, up,
                        (int)px_len, px);

    char chan_buf[6 + 12];
    const void *chan;
    size_t chan_len;
    /* An empty channel counts as none, as in the flat encoding. */
    if (rec->channel.is_some && rec->channel.val.len > 0) {
        chan = rec->channel.val.ptr;
        chan_len = rec->channel.val.len;
    } else {
        memcpy(chan_buf, "ticks.", 6);
        memcpy(chan_buf + 6, up, sym_len);
        chan = chan_buf;
        chan_len = 6 + sym_len;
    }

    hp_outgoing *m = hp_outgoing_push(out, i, chan, chan_len, payload, (size_t)plen);
    hp_outgoing_set_key(m, up, sym_len);
    if (aud) hp_outgoing_set_audience(m, aud, aud_len);
done:
    hp_json_free(v);
}

void exports_herald_plugin_guest_transform(exports_herald_plugin_guest_list_source_record_t *records,
                                           exports_herald_plugin_guest_list_outgoing_t *ret) {
    hp_json *cfg = hp_config();
    bool hostile = hostile_on(cfg);
    hp_json_free(cfg);
    hp_outgoing_builder out = {0};
    for (size_t i = 0; i < records->len; i++) transform_one(hostile, (uint32_t)i, &records->ptr[i], &out);
    hp_outgoing_finish(&out, ret);
    hp_free_records(records);
}
