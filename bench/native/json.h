/* Strict JSON for the prototype: what broker/intake/strict_json.py accepts, nothing
 * more (UTF-8 only, no byte order mark, unique keys, finite numbers, no lone
 * surrogates, bounded depth), and the canonical byte form of broker.models
 * (sorted keys, no spaces, non-ASCII kept as UTF-8). Values live in one arena per
 * request; nothing is freed singly. */
#ifndef NATIVE_JSON_H
#define NATIVE_JSON_H

#include <stddef.h>
#include <stdint.h>

enum jtype { J_NULL, J_TRUE, J_FALSE, J_INT, J_FLOAT, J_STR, J_ARR, J_OBJ };

typedef struct jval jval;
struct jval {
    enum jtype type;
    const char *s; /* J_STR: decoded UTF-8; J_INT: its digits as written ("-0" → "0") */
    size_t len;    /* bytes of s; J_ARR/J_OBJ: number of items */
    double num;    /* J_FLOAT */
    jval **items;  /* J_ARR: values; J_OBJ: values, keys in keys[] */
    jval **keys;   /* J_OBJ: J_STR keys */
};

typedef struct {
    struct block *head;
} arena;

typedef struct {
    char *data;
    size_t len, cap;
} buf;

void arena_reset(arena *a);
void *arena_alloc(arena *a, size_t n);

/* NULL on refusal, with `code` (strict_json's codes: bad_utf8, bad_json, too_deep,
 * non_finite_number, bad_unicode, duplicate_key, bad_number) and a message. */
jval *json_parse(arena *a, const char *text, size_t len, int max_depth, const char **code,
                 char *message, size_t message_len);

jval *json_get(const jval *obj, const char *key);
size_t utf8_chars(const char *s, size_t len);

void buf_put(buf *b, const void *data, size_t n);
void buf_puts(buf *b, const char *s);
void buf_str(buf *b, const char *s, size_t n); /* a JSON string, json.dumps' escapes */
int json_canonical(buf *b, const jval *v);     /* -1: a float that has no JSON form */

#endif
