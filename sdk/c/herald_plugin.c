/* Herald C SDK: see herald_plugin.h. */
#include "herald_plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- memory ------------------------------------------------------------ */

static _Noreturn void oom(void) {
    static const char msg[] = "herald: out of memory\n";
    fwrite(msg, 1, sizeof msg - 1, stderr);
    fflush(stderr);
    abort();
}

void *hp_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) oom();
    return p;
}

void *hp_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) oom();
    return q;
}

_Noreturn void hp_panic(const char *fmt, ...) {
    va_list ap;
    fputs("herald: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stdout);
    fflush(stderr);
    abort();
}

/* ---- strings and bytes ------------------------------------------------- */

hp_string hp_str_n(const void *ptr, size_t len) {
    hp_string s = {NULL, len};
    if (len) {
        s.ptr = hp_xmalloc(len);
        memcpy(s.ptr, ptr, len);
    }
    return s;
}

hp_string hp_str(const char *cstr) { return hp_str_n(cstr, strlen(cstr)); }

hp_bytes hp_bytes_n(const void *ptr, size_t len) {
    hp_bytes b = {NULL, len};
    if (len) {
        b.ptr = hp_xmalloc(len);
        memcpy(b.ptr, ptr, len);
    }
    return b;
}

char *hp_cstr(const hp_string *s) {
    char *c = hp_xmalloc(s->len + 1);
    if (s->len) memcpy(c, s->ptr, s->len);
    c[s->len] = '\0';
    return c;
}

bool hp_str_eq_n(const hp_string *s, const void *ptr, size_t len) {
    return s->len == len && (len == 0 || memcmp(s->ptr, ptr, len) == 0);
}

bool hp_str_eq(const hp_string *s, const char *cstr) { return hp_str_eq_n(s, cstr, strlen(cstr)); }

bool hp_str_starts_with(const hp_string *s, const char *prefix) {
    size_t n = strlen(prefix);
    return s->len >= n && (n == 0 || memcmp(s->ptr, prefix, n) == 0);
}

const hp_string *hp_pairs_get(const plugin_list_tuple2_string_string_t *pairs, const char *name) {
    for (size_t i = 0; i < pairs->len; i++)
        if (hp_str_eq(&pairs->ptr[i].f0, name)) return &pairs->ptr[i].f1;
    return NULL;
}

/* ---- results ----------------------------------------------------------- */

void hp_describe(hp_info *info, const char *name, const char *version, hp_hooks hooks) {
    info->name = hp_str(name);
    info->version = hp_str(version);
    info->hooks = hooks;
}

bool hp_deny(hp_denial *err, const char *code, const char *message) {
    err->code = hp_str(code);
    err->message = hp_str(message);
    return false;
}

void hp_session_init(hp_session *s, const void *subject, size_t subject_len) {
    memset(s, 0, sizeof *s);
    s->subject = hp_str_n(subject, subject_len);
    s->audience.is_some = false;
}

void hp_session_set_audience(hp_session *s, const void *audience, size_t len) {
    if (s->audience.is_some) plugin_string_free(&s->audience.val);
    s->audience.is_some = true;
    s->audience.val = hp_str_n(audience, len);
}

void hp_session_add_attribute(hp_session *s, const char *name, const void *value, size_t value_len) {
    plugin_list_tuple2_string_string_t *a = &s->attributes;
    a->ptr = hp_xrealloc(a->ptr, (a->len + 1) * sizeof *a->ptr);
    a->ptr[a->len].f0 = hp_str(name);
    a->ptr[a->len].f1 = hp_str_n(value, value_len);
    a->len++;
}

hp_outgoing *hp_outgoing_push(hp_outgoing_builder *b, uint32_t source_index,
                              const void *channel, size_t channel_len,
                              const void *payload, size_t payload_len) {
    if (b->len == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 8;
        b->ptr = hp_xrealloc(b->ptr, b->cap * sizeof *b->ptr);
    }
    hp_outgoing *m = &b->ptr[b->len++];
    memset(m, 0, sizeof *m);
    m->channel = hp_str_n(channel, channel_len);
    m->payload = hp_bytes_n(payload, payload_len);
    m->source_index = source_index;
    return m;
}

void hp_outgoing_set_key(hp_outgoing *m, const void *key, size_t len) {
    if (m->conflation_key.is_some) plugin_string_free(&m->conflation_key.val);
    m->conflation_key.is_some = true;
    m->conflation_key.val = hp_str_n(key, len);
}

void hp_outgoing_set_audience(hp_outgoing *m, const void *audience, size_t len) {
    if (m->audience.is_some) plugin_string_free(&m->audience.val);
    m->audience.is_some = true;
    m->audience.val = hp_str_n(audience, len);
}

void hp_outgoing_finish(hp_outgoing_builder *b, hp_outgoings *ret) {
    ret->ptr = b->len ? b->ptr : NULL;
    ret->len = b->len;
    if (!b->len) free(b->ptr);
    b->ptr = NULL;
    b->len = b->cap = 0;
}

void hp_free_connect_request(hp_connect_request *req) { herald_plugin_types_connect_request_free(req); }
void hp_free_session(hp_session *s) { herald_plugin_types_session_free(s); }
void hp_free_string(hp_string *s) { plugin_string_free(s); }
void hp_free_records(hp_records *records) { exports_herald_plugin_guest_list_source_record_free(records); }

/* ---- host -------------------------------------------------------------- */

void hp_log(herald_plugin_types_level_t level, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
    hp_string msg = {(uint8_t *)buf, (size_t)n}; /* borrowed by the host */
    herald_plugin_host_log(level, &msg);
}

uint64_t hp_now_ms(void) { return herald_plugin_host_now_ms(); }

hp_json *hp_config(void) {
    hp_string cfg;
    herald_plugin_host_config(&cfg);
    hp_json *doc = hp_json_parse(cfg.ptr, cfg.len);
    plugin_string_free(&cfg);
    return doc;
}

/* ---- weak defaults for the hooks a plugin leaves out --------------------
 * The host calls only the hooks `describe` declares, so these run only if a
 * plugin declares a hook it does not define: the call fails with `trap`. */

__attribute__((weak)) bool exports_herald_plugin_guest_authorize_connect(
    exports_herald_plugin_guest_connect_request_t *req, exports_herald_plugin_guest_session_t *ret,
    exports_herald_plugin_guest_denial_t *err) {
    (void)req; (void)ret; (void)err;
    hp_panic("authorize-connect declared but not implemented");
}

__attribute__((weak)) bool exports_herald_plugin_guest_authorize_subscribe(
    exports_herald_plugin_guest_session_t *session, plugin_string_t *channel,
    exports_herald_plugin_guest_denial_t *err) {
    (void)session; (void)channel; (void)err;
    hp_panic("authorize-subscribe declared but not implemented");
}

__attribute__((weak)) void exports_herald_plugin_guest_transform(
    exports_herald_plugin_guest_list_source_record_t *records, exports_herald_plugin_guest_list_outgoing_t *ret) {
    (void)records; (void)ret;
    hp_panic("transform declared but not implemented");
}

__attribute__((weak)) void exports_herald_plugin_guest_transform_flat(
    exports_herald_plugin_guest_record_batch_t *batch, exports_herald_plugin_guest_outgoing_batch_t *ret) {
    (void)batch; (void)ret;
    hp_panic("transform-flat declared but not implemented");
}

__attribute__((weak)) void exports_herald_plugin_guest_merge(
    plugin_string_t *key, plugin_list_u8_t *older, plugin_list_u8_t *newer, plugin_list_u8_t *ret) {
    (void)key; (void)older; (void)newer; (void)ret;
    hp_panic("merge declared but not implemented");
}

/* plugin.c (generated with --no-object-file) still references the symbol
 * that plugin_component_type.o would define; the build embeds the component
 * type with `component embed` instead. Weak, so linking that object works
 * too. */
__attribute__((weak)) void __component_type_object_force_link_plugin(void) {}
