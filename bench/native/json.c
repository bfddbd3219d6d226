/* Strict JSON and its canonical form: see json.h. */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INT_DIGITS 4300 /* CPython's int() limit: longer is "bad_number" */

/* blocks chained, never moved: values point into them until the arena is reset */
typedef struct block {
    struct block *next;
    size_t size, used;
    char data[];
} block;

void arena_reset(arena *a) {
    block *b = a->head;
    if (!b) return;
    for (block *old = b->next; old;) { /* keep the newest (largest) block only */
        block *next = old->next;
        free(old);
        old = next;
    }
    b->next = NULL;
    b->used = 0;
}

void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    block *b = a->head;
    if (!b || b->used + n > b->size) {
        size_t size = b ? b->size * 2 : 1 << 16;
        while (size < n) size *= 2;
        block *fresh = malloc(sizeof *fresh + size);
        if (!fresh) return NULL;
        fresh->size = size;
        fresh->used = 0;
        fresh->next = b;
        a->head = b = fresh;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

typedef struct {
    arena *a;
    const unsigned char *p, *end;
    int max_depth;
    const char *code;
    char *message;
    size_t message_len;
} parser;

static jval *fail(parser *ps, const char *code, const char *message) {
    if (!ps->code) {
        ps->code = code;
        snprintf(ps->message, ps->message_len, "%s", message);
    }
    return NULL;
}

static int utf8_valid(const unsigned char *s, size_t n, size_t *bad) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        unsigned cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { k = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; cp = c & 0x07; }
        else { *bad = i; return 0; }
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80) { *bad = i; return 0; }
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF)) { *bad = i; return 0; }
        i += k + 1;
    }
    return 1;
}

size_t utf8_chars(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static jval *new_val(parser *ps, enum jtype t) {
    jval *v = arena_alloc(ps->a, sizeof *v);
    if (!v) return fail(ps, "too_large", "out of memory");
    memset(v, 0, sizeof *v);
    v->type = t;
    return v;
}

static int hex4(const unsigned char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = p[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        v = v * 16 + d;
    }
    *out = v;
    return 1;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static jval *parse_string(parser *ps) {
    const unsigned char *start = ++ps->p; /* after the quote */
    const unsigned char *q = start;
    int plain = 1;
    while (q < ps->end && *q != '"') {
        if (*q < 0x20) return fail(ps, "bad_json", "not valid JSON: invalid control character");
        if (*q == '\\') { plain = 0; q++; }
        q++;
    }
    if (q >= ps->end) return fail(ps, "bad_json", "not valid JSON: unterminated string");
    jval *v = new_val(ps, J_STR);
    if (!v) return NULL;
    if (plain) { /* no escapes: the bytes as they are (already valid UTF-8) */
        v->s = (const char *)start;
        v->len = (size_t)(q - start);
        ps->p = q + 1;
        return v;
    }
    char *out = arena_alloc(ps->a, (size_t)(q - start) + 1);
    if (!out) return fail(ps, "too_large", "out of memory");
    size_t n = 0;
    const unsigned char *p = start;
    while (p < q) {
        if (*p != '\\') { out[n++] = (char)*p++; continue; }
        p++;
        switch (*p) {
        case '"': out[n++] = '"'; p++; break;
        case '\\': out[n++] = '\\'; p++; break;
        case '/': out[n++] = '/'; p++; break;
        case 'b': out[n++] = '\b'; p++; break;
        case 'f': out[n++] = '\f'; p++; break;
        case 'n': out[n++] = '\n'; p++; break;
        case 'r': out[n++] = '\r'; p++; break;
        case 't': out[n++] = '\t'; p++; break;
        case 'u': {
            unsigned cp, lo;
            if (q - p < 5 || !hex4(p + 1, &cp))
                return fail(ps, "bad_json", "not valid JSON: invalid \\uXXXX escape");
            p += 5;
            if (cp >= 0xD800 && cp <= 0xDBFF && q - p >= 6 && p[0] == '\\' && p[1] == 'u' &&
                hex4(p + 2, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                return fail(ps, "bad_unicode", "a string holds a lone surrogate escape");
            }
            n += put_utf8(out + n, cp);
            break;
        }
        default: return fail(ps, "bad_json", "not valid JSON: invalid escape");
        }
    }
    v->s = out;
    v->len = n;
    ps->p = q + 1;
    return v;
}

static jval *parse_number(parser *ps) {
    const unsigned char *s = ps->p, *p = s;
    int is_float = 0;
    if (p < ps->end && *p == '-') p++;
    if (p < ps->end && *p == '0') p++;
    else if (p < ps->end && *p >= '1' && *p <= '9') while (p < ps->end && *p >= '0' && *p <= '9') p++;
    else return fail(ps, "bad_json", "not valid JSON: expecting value");
    if (p < ps->end && *p == '.' && p + 1 < ps->end && p[1] >= '0' && p[1] <= '9') {
        is_float = 1;
        p++;
        while (p < ps->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        const unsigned char *e = p + 1;
        if (e < ps->end && (*e == '+' || *e == '-')) e++;
        if (e < ps->end && *e >= '0' && *e <= '9') {
            is_float = 1;
            p = e;
            while (p < ps->end && *p >= '0' && *p <= '9') p++;
        }
    }
    ps->p = p;
    size_t n = (size_t)(p - s);
    if (!is_float) {
        jval *v = new_val(ps, J_INT);
        if (!v) return NULL;
        if (n - (*s == '-') > MAX_INT_DIGITS) return fail(ps, "bad_number", "a number is too large");
        v->s = (const char *)s;
        v->len = n;
        if (n == 2 && s[0] == '-' && s[1] == '0') { v->s = "0"; v->len = 1; }
        return v;
    }
    char tmp[512];
    char *text = n < sizeof tmp ? tmp : arena_alloc(ps->a, n + 1);
    if (!text) return fail(ps, "too_large", "out of memory");
    memcpy(text, s, n);
    text[n] = 0;
    jval *v = new_val(ps, J_FLOAT);
    if (!v) return NULL;
    v->num = strtod(text, NULL);
    if (!isfinite(v->num)) return fail(ps, "non_finite_number", "a number is too large to be finite");
    return v;
}

static int key_cmp(const void *a, const void *b) {
    const jval *x = **(jval *const *const *)a, *y = **(jval *const *const *)b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static jval *parse_value(parser *ps, int depth);

/* items grow in a scratch list on the C stack of each level, then move to the arena */
#define CHUNK 32

static jval *parse_container(parser *ps, int depth, int is_obj) {
    if (depth > ps->max_depth) return fail(ps, "too_deep", "nesting too deep");
    ps->p++;
    size_t cap = CHUNK, n = 0;
    jval *local_k[CHUNK], *local_v[CHUNK];
    jval **ks = local_k, **vs = local_v;
    jval *v = new_val(ps, is_obj ? J_OBJ : J_ARR);
    if (!v) return NULL;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == (is_obj ? '}' : ']')) { ps->p++; return v; }
    for (;;) {
        jval *key = NULL;
        skip_ws(ps);
        if (is_obj) {
            if (ps->p >= ps->end || *ps->p != '"')
                return fail(ps, "bad_json", "not valid JSON: expecting property name");
            if (!(key = parse_string(ps))) return NULL;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':')
                return fail(ps, "bad_json", "not valid JSON: expecting ':' delimiter");
            ps->p++;
        }
        jval *item = parse_value(ps, depth + 1);
        if (!item) return NULL;
        if (n == cap) {
            size_t grown = cap * 4;
            jval **nk = arena_alloc(ps->a, grown * sizeof *nk), **nv = arena_alloc(ps->a, grown * sizeof *nv);
            if (!nk || !nv) return fail(ps, "too_large", "out of memory");
            memcpy(nk, ks, n * sizeof *nk);
            memcpy(nv, vs, n * sizeof *nv);
            ks = nk; vs = nv; cap = grown;
        }
        ks[n] = key;
        vs[n++] = item;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == (is_obj ? '}' : ']')) { ps->p++; break; }
        return fail(ps, "bad_json", "not valid JSON: expecting ',' delimiter");
    }
    v->len = n;
    v->items = arena_alloc(ps->a, n * sizeof *v->items);
    if (!v->items) return fail(ps, "too_large", "out of memory");
    if (!is_obj) {
        memcpy(v->items, vs, n * sizeof *vs);
        return v;
    }
    /* sorted once, by key bytes (= code points): the canonical order, and duplicates
     * side by side */
    jval ***order = arena_alloc(ps->a, n * sizeof *order);
    v->keys = arena_alloc(ps->a, n * sizeof *v->keys);
    if (!order || !v->keys) return fail(ps, "too_large", "out of memory");
    for (size_t i = 0; i < n; i++) order[i] = &ks[i];
    qsort(order, n, sizeof *order, key_cmp);
    for (size_t i = 0; i < n; i++) {
        size_t at = (size_t)(order[i] - ks);
        v->keys[i] = ks[at];
        v->items[i] = vs[at];
        if (i && key_cmp(&order[i - 1], &order[i]) == 0) {
            char m[160];
            snprintf(m, sizeof m, "the key '%.*s' appears twice in one object",
                     (int)(v->keys[i]->len > 100 ? 100 : v->keys[i]->len), v->keys[i]->s);
            return fail(ps, "duplicate_key", m);
        }
    }
    return v;
}

static int word(parser *ps, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, w, n) == 0) { ps->p += n; return 1; }
    return 0;
}

static jval *parse_value(parser *ps, int depth) {
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "bad_json", "not valid JSON: expecting value");
    switch (*ps->p) {
    case '{': return parse_container(ps, depth, 1);
    case '[': return parse_container(ps, depth, 0);
    case '"': return parse_string(ps);
    case 't': if (word(ps, "true")) return new_val(ps, J_TRUE); break;
    case 'f': if (word(ps, "false")) return new_val(ps, J_FALSE); break;
    case 'n': if (word(ps, "null")) return new_val(ps, J_NULL); break;
    case 'N': if (word(ps, "NaN")) return fail(ps, "non_finite_number", "NaN is not a JSON number"); break;
    case 'I': if (word(ps, "Infinity")) return fail(ps, "non_finite_number", "Infinity is not a JSON number"); break;
    case '-': if (word(ps, "-Infinity")) return fail(ps, "non_finite_number", "-Infinity is not a JSON number");
              return parse_number(ps);
    default:
        if (*ps->p >= '0' && *ps->p <= '9') return parse_number(ps);
    }
    return fail(ps, "bad_json", "not valid JSON: expecting value");
}

jval *json_parse(arena *a, const char *text, size_t len, int max_depth, const char **code,
                 char *message, size_t message_len) {
    parser ps = {a, (const unsigned char *)text, (const unsigned char *)text + len, max_depth,
                 NULL, message, message_len};
    size_t bad;
    *code = NULL;
    if (!utf8_valid(ps.p, len, &bad)) {
        char m[80];
        snprintf(m, sizeof m, "the file is not UTF-8 (byte %zu)", bad);
        fail(&ps, "bad_utf8", m);
        *code = ps.code;
        return NULL;
    }
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        fail(&ps, "bad_json", "the file starts with a byte order mark");
        *code = ps.code;
        return NULL;
    }
    jval *v = parse_value(&ps, 1);
    if (v) {
        skip_ws(&ps);
        if (ps.p != ps.end) v = fail(&ps, "bad_json", "not valid JSON: extra data");
    }
    *code = ps.code;
    return v;
}

jval *json_get(const jval *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    size_t n = strlen(key), lo = 0, hi = obj->len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const jval *k = obj->keys[mid];
        size_t m = k->len < n ? k->len : n;
        int c = memcmp(k->s, key, m);
        if (!c) c = (k->len > n) - (k->len < n);
        if (!c) return obj->items[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

void buf_put(buf *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n) cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) abort();
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
}

void buf_puts(buf *b, const char *s) { buf_put(b, s, strlen(s)); }

void buf_str(buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    buf_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        buf_put(b, s + run, i - run);
        run = i + 1;
        switch (c) {
        case '"': buf_put(b, "\\\"", 2); break;
        case '\\': buf_put(b, "\\\\", 2); break;
        case '\n': buf_put(b, "\\n", 2); break;
        case '\r': buf_put(b, "\\r", 2); break;
        case '\t': buf_put(b, "\\t", 2); break;
        case '\b': buf_put(b, "\\b", 2); break;
        case '\f': buf_put(b, "\\f", 2); break;
        default: {
            char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            buf_put(b, u, 6);
        }
        }
    }
    buf_put(b, s + run, n - run);
    buf_put(b, "\"", 1);
}

/* Python's repr(float): the shortest digits that read back the same, fixed notation
 * for decimal exponents -4 ≤ e < 16, else d.ddde±XX */
static void put_float(buf *b, double x) {
    char digits[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(digits, sizeof digits, "%.*e", p - 1, x);
        if (strtod(digits, NULL) == x) break;
    }
    const char *s = digits;
    char sign = 0;
    if (*s == '-') { sign = '-'; s++; }
    char mant[24];
    size_t m = 0;
    for (; *s && *s != 'e'; s++) if (*s != '.') mant[m++] = *s;
    while (m > 1 && mant[m - 1] == '0') m--;
    int e = atoi(s + 1);
    char out[64];
    size_t o = 0;
    if (sign) out[o++] = '-';
    if (e >= -4 && e < 16) {
        if (e < 0) {
            out[o++] = '0'; out[o++] = '.';
            for (int i = -1; i > e; i--) out[o++] = '0';
            memcpy(out + o, mant, m); o += m;
        } else {
            for (int i = 0; i <= e; i++) out[o++] = (size_t)i < m ? mant[i] : '0';
            out[o++] = '.';
            if ((size_t)e + 1 < m) { memcpy(out + o, mant + e + 1, m - (size_t)e - 1); o += m - (size_t)e - 1; }
            else out[o++] = '0';
        }
    } else {
        out[o++] = mant[0];
        if (m > 1) { out[o++] = '.'; memcpy(out + o, mant + 1, m - 1); o += m - 1; }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    buf_put(b, out, o);
}

int json_canonical(buf *b, const jval *v) {
    switch (v->type) {
    case J_NULL: buf_put(b, "null", 4); return 0;
    case J_TRUE: buf_put(b, "true", 4); return 0;
    case J_FALSE: buf_put(b, "false", 5); return 0;
    case J_INT: buf_put(b, v->s, v->len); return 0;
    case J_FLOAT:
        if (!isfinite(v->num)) return -1;
        put_float(b, v->num);
        return 0;
    case J_STR: buf_str(b, v->s, v->len); return 0;
    case J_ARR:
        buf_put(b, "[", 1);
        for (size_t i = 0; i < v->len; i++) {
            if (i) buf_put(b, ",", 1);
            if (json_canonical(b, v->items[i])) return -1;
        }
        buf_put(b, "]", 1);
        return 0;
    case J_OBJ:
        buf_put(b, "{", 1);
        for (size_t i = 0; i < v->len; i++) {
            if (i) buf_put(b, ",", 1);
            buf_str(b, v->keys[i]->s, v->keys[i]->len);
            buf_put(b, ":", 1);
            if (json_canonical(b, v->items[i])) return -1;
        }
        buf_put(b, "}", 1);
        return 0;
    }
    return -1;
}
