/* A small strict JSON reader for Herald plugins (RFC 8259).
 *
 * - Input must be valid UTF-8 (no BOM, no surrogate code points, no
 *   overlong forms); only space, \t, \n and \r count as whitespace.
 * - Strings are decoded: \" \\ \/ \b \f \n \r \t and \uXXXX (surrogate pairs
 *   become one 4-byte UTF-8 sequence; an unpaired surrogate is an error, as
 *   in serde_json). Raw control characters (< 0x20) inside strings are errors.
 * - Numbers follow the JSON grammar exactly; the text is kept as written
 *   (hp_json_number converts it with strtod).
 * - Nesting deeper than HP_JSON_MAX_DEPTH (127 levels: serde_json refuses
 *   128) is an error.
 * - An object may repeat a key; hp_json_get returns the last one (as Python,
 *   JavaScript and serde_json's Value do).
 *
 * Every value is malloc'd; hp_json_free releases a whole tree. Allocation
 * failure aborts (see hp_xmalloc), which the host reports as `memory` when
 * the tenant's memory cap was the cause.
 */
#include "herald_plugin.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
    int depth;
} hp_parser;

static void skip_ws(hp_parser *ps) {
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

/* Length of the valid UTF-8 sequence at p (1-4), or 0 if invalid. */
static size_t utf8_seq(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if ((size_t)(end - p) < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return n;
}

bool hp_utf8_valid(const void *data, size_t len) {
    const uint8_t *p = data, *end = p + len;
    while (p < end) {
        size_t n = utf8_seq(p, end);
        if (n == 0) return false;
        p += n;
    }
    return true;
}

static size_t put_utf8(char *out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hex4(hp_parser *ps, uint32_t *out) {
    if (ps->end - ps->p < 4) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = ps->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return 0;
    }
    ps->p += 4;
    *out = v;
    return 1;
}

/* Parses a string starting at the opening quote. On success *out is a
 * malloc'd, NUL-terminated buffer of *out_len decoded bytes. */
static int parse_string(hp_parser *ps, char **out, size_t *out_len) {
    ps->p++; /* opening quote */
    /* The decoded form is never longer than the escaped one. */
    const uint8_t *scan = ps->p;
    while (scan < ps->end && *scan != '"') {
        scan += (*scan == '\\' && scan + 1 < ps->end) ? 2 : 1;
    }
    if (scan >= ps->end) return 0;
    char *buf = hp_xmalloc((size_t)(scan - ps->p) + 1);
    size_t n = 0;
    for (;;) {
        if (ps->p >= ps->end) goto fail;
        uint8_t c = *ps->p;
        if (c == '"') { ps->p++; break; }
        if (c < 0x20) goto fail;
        if (c != '\\') {
            size_t k = utf8_seq(ps->p, ps->end);
            if (k == 0) goto fail;
            memcpy(buf + n, ps->p, k);
            n += k;
            ps->p += k;
            continue;
        }
        ps->p++;
        if (ps->p >= ps->end) goto fail;
        c = *ps->p++;
        switch (c) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (!hex4(ps, &cp)) goto fail;
            if (cp >= 0xDC00 && cp <= 0xDFFF) goto fail; /* lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') goto fail;
                ps->p += 2;
                if (!hex4(ps, &lo) || lo < 0xDC00 || lo > 0xDFFF) goto fail;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            /* "\uXXXX" is 6 bytes, its UTF-8 at most 3; a pair is 12 for 4. */
            n += put_utf8(buf + n, cp);
            break;
        }
        default: goto fail;
        }
    }
    buf[n] = '\0';
    *out = buf;
    *out_len = n;
    return 1;
fail:
    free(buf);
    return 0;
}

static int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

static int parse_number(hp_parser *ps, hp_json *v) {
    const uint8_t *start = ps->p;
    if (ps->p < ps->end && *ps->p == '-') ps->p++;
    if (ps->p >= ps->end) return 0;
    if (*ps->p == '0') {
        ps->p++;
    } else if (*ps->p >= '1' && *ps->p <= '9') {
        while (ps->p < ps->end && is_digit(*ps->p)) ps->p++;
    } else {
        return 0;
    }
    if (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        if (ps->p >= ps->end || !is_digit(*ps->p)) return 0;
        while (ps->p < ps->end && is_digit(*ps->p)) ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (ps->p >= ps->end || !is_digit(*ps->p)) return 0;
        while (ps->p < ps->end && is_digit(*ps->p)) ps->p++;
    }
    size_t len = (size_t)(ps->p - start);
    char *text = hp_xmalloc(len + 1);
    memcpy(text, start, len);
    text[len] = '\0';
    v->kind = HP_JSON_NUMBER;
    v->str = text;
    v->len = len;
    return 1;
}

static int literal(hp_parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return 0;
    ps->p += n;
    return 1;
}

static void free_value(hp_json *v);

static int parse_value(hp_parser *ps, hp_json *v) {
    memset(v, 0, sizeof *v);
    skip_ws(ps);
    if (ps->p >= ps->end) return 0;
    switch (*ps->p) {
    case 'n': v->kind = HP_JSON_NULL; return literal(ps, "null");
    case 't': v->kind = HP_JSON_TRUE; return literal(ps, "true");
    case 'f': v->kind = HP_JSON_FALSE; return literal(ps, "false");
    case '"': {
        char *s;
        size_t n;
        if (!parse_string(ps, &s, &n)) return 0;
        v->kind = HP_JSON_STRING;
        v->str = s;
        v->len = n;
        return 1;
    }
    case '[':
    case '{': {
        int is_obj = *ps->p == '{';
        uint8_t close = is_obj ? '}' : ']';
        if (++ps->depth > HP_JSON_MAX_DEPTH) return 0;
        ps->p++;
        v->kind = is_obj ? HP_JSON_OBJECT : HP_JSON_ARRAY;
        size_t cap = 0;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            ps->depth--;
            return 1;
        }
        for (;;) {
            if (v->count == cap) {
                cap = cap ? cap * 2 : 4;
                if (is_obj) v->members = hp_xrealloc(v->members, cap * sizeof *v->members);
                else v->items = hp_xrealloc(v->items, cap * sizeof *v->items);
            }
            hp_json *slot;
            if (is_obj) {
                hp_json_member *m = &v->members[v->count];
                m->key = NULL;
                memset(&m->value, 0, sizeof m->value);
                skip_ws(ps);
                if (ps->p >= ps->end || *ps->p != '"') return 0;
                if (!parse_string(ps, &m->key, &m->key_len)) return 0;
                v->count++; /* counted now so that a failure frees the key */
                skip_ws(ps);
                if (ps->p >= ps->end || *ps->p != ':') return 0;
                ps->p++;
                slot = &m->value;
            } else {
                slot = &v->items[v->count];
                memset(slot, 0, sizeof *slot);
                v->count++;
            }
            if (!parse_value(ps, slot)) return 0;
            skip_ws(ps);
            if (ps->p >= ps->end) return 0;
            if (*ps->p == ',') { ps->p++; continue; }
            if (*ps->p == close) { ps->p++; break; }
            return 0;
        }
        ps->depth--;
        return 1;
    }
    default:
        if (*ps->p == '-' || is_digit(*ps->p)) return parse_number(ps, v);
        return 0;
    }
}

static void free_value(hp_json *v) {
    if (v->kind == HP_JSON_OBJECT) {
        for (size_t i = 0; i < v->count; i++) {
            free(v->members[i].key);
            free_value(&v->members[i].value);
        }
        free(v->members);
    } else if (v->kind == HP_JSON_ARRAY) {
        for (size_t i = 0; i < v->count; i++) free_value(&v->items[i]);
        free(v->items);
    } else if (v->kind == HP_JSON_STRING || v->kind == HP_JSON_NUMBER) {
        free(v->str);
    }
    memset(v, 0, sizeof *v);
}

hp_json *hp_json_parse(const void *data, size_t len) {
    hp_parser ps = {(const uint8_t *)data, (const uint8_t *)data + len, 0};
    hp_json *root = hp_xmalloc(sizeof *root);
    if (!parse_value(&ps, root)) goto fail;
    skip_ws(&ps);
    if (ps.p != ps.end) goto fail;
    return root;
fail:
    free_value(root);
    free(root);
    return NULL;
}

void hp_json_free(hp_json *v) {
    if (!v) return;
    free_value(v);
    free(v);
}

const hp_json *hp_json_get(const hp_json *obj, const char *key) {
    return hp_json_get_n(obj, key, strlen(key));
}

const hp_json *hp_json_get_n(const hp_json *obj, const char *key, size_t key_len) {
    if (!obj || obj->kind != HP_JSON_OBJECT) return NULL;
    for (size_t i = obj->count; i-- > 0;) {
        const hp_json_member *m = &obj->members[i];
        if (m->key_len == key_len && memcmp(m->key, key, key_len) == 0) return &m->value;
    }
    return NULL;
}

const char *hp_json_string(const hp_json *v, size_t *len) {
    if (!v || v->kind != HP_JSON_STRING) return NULL;
    if (len) *len = v->len;
    return v->str;
}

bool hp_json_is_null(const hp_json *v) { return v && v->kind == HP_JSON_NULL; }

bool hp_json_is_true(const hp_json *v) { return v && v->kind == HP_JSON_TRUE; }

bool hp_json_bool(const hp_json *v, bool dflt) {
    if (v && v->kind == HP_JSON_TRUE) return true;
    if (v && v->kind == HP_JSON_FALSE) return false;
    return dflt;
}

double hp_json_number(const hp_json *v, double dflt) {
    if (!v || v->kind != HP_JSON_NUMBER) return dflt;
    return strtod(v->str, NULL);
}
