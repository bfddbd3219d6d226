/* A prototype, not a broker: the accept path of `broker serve` for bench.noop in C,
 * to measure what native code would buy (issue 30, item 4). README.md beside it says
 * what it does and does not do compared with the broker.
 *
 *     accept OUTBOX RESULTS STATE_DIR
 *
 * Per wake-up, as broker/loop/pipeline.py's step: up to 64 request names; each checked
 * for a writer (read lease), claimed (renamed into STATE_DIR/claimed/default); one
 * transaction (BEGIN IMMEDIATE; the previous results' `synced` updates; the durable
 * audit head's drop; per request: read O_NOFOLLOW, strict JSON, the envelope's and
 * bench.noop's fields, SAVEPOINT, the id's lookup, the row, RELEASE; the audit events
 * queued; COMMIT with synchronous=FULL); then each result by temp file and rename; then
 * the queued events read back and appended to STATE_DIR/audit.jsonl, sha256-chained,
 * under its lock. The log is fsynced once a second or when idle, and the claimed files
 * are removed when idle, as the broker does. Prints "ready" once it serves; SIGTERM
 * stops it. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "json.h"
#include "schema.h"

#define MAX_BATCH 64 /* files per wake-up: broker/loop/fairness.py */
#define MAX_REQUEST_BYTES (1 << 20)
#define MAX_DEPTH 64
#define SANDBOX "default"
#define REASON "applied automatically (default): no rule matched; reversible effects apply at once"
#define VERDICT                                                                            \
    "{\"action\":\"auto\",\"rule\":\"default\",\"reason\":\"no rule matched; reversible " \
    "effects apply at once\",\"approvals\":1,\"timeout_s\":3600.0,\"on_timeout\":\"deny\"}"

/* the statements as the broker's trace shows them (bound, not interpolated) */
static const char *SQL[] = {
    "BEGIN IMMEDIATE",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT one",
    "RELEASE one",
    "SELECT * FROM requests WHERE sandbox = ? AND id = ?",
    INSERT_REQUEST,
    "INSERT INTO audit_queue (event) VALUES (?)",
    "UPDATE requests SET synced = 1 WHERE sandbox = ? AND id = ? AND state = ?",
    "SELECT seq, event FROM audit_queue WHERE seq > ? ORDER BY seq",
    "DELETE FROM audit_queue WHERE seq <= ?",
    "SELECT value FROM meta WHERE key = 'audit_head'",
    "INSERT OR REPLACE INTO meta (key, value) VALUES ('audit_head', ?)",
};
enum { S_BEGIN, S_COMMIT, S_ROLLBACK, S_SAVEPOINT, S_RELEASE, S_LOOKUP, S_INSERT, S_QUEUE,
       S_SYNCED, S_BACKLOG, S_DROP, S_HEAD, S_SET_HEAD, S_COUNT };

typedef struct {
    char name[160];    /* in the outbox */
    char stem[136];
    char claimed[200]; /* in the claim dir */
    char *raw;
    size_t raw_len;
    jval *doc;
    char id[72];
    char effect[136];
    long version;
    char sha[65];
    buf payload; /* canonical request */
    char received_at[40], decided_at[40], completed_at[40];
    int state; /* 0: applied, 1: invalid, 2: nothing to answer (same bytes again) */
    const char *code;
    char path[32];
    char message[256];
} request;

static struct {
    int outbox_fd, results_fd, claim_fd, inotify_fd;
    char audit_path[4096], lock_path[4096];
    sqlite3 *db;
    sqlite3_stmt *st[S_COUNT];
    long counter;
    /* the audit log */
    long long appended, synced, durable_seq;
    char head[65], durable_head[65];
    struct timespec synced_at;
    ino_t left_ino;
    off_t left_size;
    struct timespec left_mtime;
    int left_known;
    /* after each commit */
    char (*unsynced)[72]; /* ids whose results were written since the last commit */
    size_t n_unsynced, cap_unsynced;
    char (*consumed)[200];
    size_t n_consumed, cap_consumed, consumed_from;
    /* names seen and not yet taken (the broker's backlog) */
    char (*backlog)[160];
    size_t n_backlog, cap_backlog, backlog_from;
    arena arena;
    buf events, line, body, scratch;
} g;

static volatile sig_atomic_t stopping;

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "accept: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void *grow(void *p, size_t *cap, size_t need, size_t item) {
    if (need <= *cap) return p;
    size_t n = *cap ? *cap * 2 : 256;
    while (n < need) n *= 2;
    p = realloc(p, n * item);
    if (!p) die("out of memory");
    *cap = n;
    return p;
}

static void now_iso(char out[40]) {
    struct timespec ts;
    struct tm tm;
    char text[96];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(ts.tv_nsec / 1000000) % 1000);
    snprintf(out, 40, "%.39s", text);
}

static double monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sha256_hex(const void *data, size_t n, char out[65]) {
    unsigned char md[32];
    unsigned int len = 0;
    static const char hex[] = "0123456789abcdef";
    if (!EVP_Digest(data, n, md, &len, EVP_sha256(), NULL)) die("sha256 failed");
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[64] = 0;
}

/* -- SQLite ----------------------------------------------------------------------- */

static void check(int rc, const char *what) {
    if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW)
        die("%s: %s", what, sqlite3_errmsg(g.db));
}

static void run(int which) {
    sqlite3_stmt *s = g.st[which];
    check(sqlite3_step(s), SQL[which]);
    sqlite3_reset(s);
}

static void bind_text(sqlite3_stmt *s, int i, const char *text, int n) {
    check(n < 0 && !text ? sqlite3_bind_null(s, i) : sqlite3_bind_text(s, i, text, n, SQLITE_STATIC),
          "bind");
}

static void open_ledger(const char *state) {
    char path[4096];
    snprintf(path, sizeof path, "%s/ledger.sqlite3", state);
    if (sqlite3_open(path, &g.db) != SQLITE_OK) die("%s: cannot open the ledger", path);
    sqlite3_busy_timeout(g.db, 30000);
    check(sqlite3_exec(g.db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL), "journal_mode");
    check(sqlite3_exec(g.db, "PRAGMA synchronous=FULL", NULL, NULL, NULL), "synchronous");
    check(sqlite3_exec(g.db, "PRAGMA foreign_keys=ON", NULL, NULL, NULL), "foreign_keys");
    check(sqlite3_exec(g.db, SCHEMA, NULL, NULL, NULL), "schema");
    for (int i = 0; i < S_COUNT; i++)
        check(sqlite3_prepare_v3(g.db, SQL[i], -1, SQLITE_PREPARE_PERSISTENT, &g.st[i], NULL), SQL[i]);
}

/* -- names and files -------------------------------------------------------------- */

static int id_char(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* broker/names.py: a request is <name>.json, name [A-Za-z0-9][A-Za-z0-9_-]{0,127} */
static int request_name(const char *name, char stem[136]) {
    size_t n = strlen(name);
    if (name[0] == '.' || n < 6 || strcmp(name + n - 5, ".json") != 0) return 0;
    n -= 5;
    if (n > 128 || name[0] == '_' || name[0] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!id_char((unsigned char)name[i])) return 0;
    memcpy(stem, name, n);
    stem[n] = 0;
    return 1;
}

/* broker/intake/claims.py being_written: a read lease cannot be had on a file open for
 * writing */
static int being_written(const char *name) {
    struct stat st;
    if (fstatat(g.outbox_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode)) return 0;
    int fd = openat(g.outbox_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return 0;
    int busy = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        if (fcntl(fd, F_SETLEASE, F_RDLCK) < 0) busy = errno == EAGAIN;
        else fcntl(fd, F_SETLEASE, F_UNLCK);
    }
    close(fd);
    return busy;
}

static int claim(request *r) {
    if (being_written(r->name)) return 0;
    size_t n = strlen(r->name); /* name~pid-counter, the broker's claimed name */
    memcpy(r->claimed, r->name, n);
    snprintf(r->claimed + n, sizeof r->claimed - n, "~%d-%ld", (int)getpid(), ++g.counter);
    return renameat(g.outbox_fd, r->name, g.claim_fd, r->claimed) == 0;
}

static void refuse(request *r, const char *code, const char *path, const char *message) {
    r->state = 1;
    r->code = code;
    snprintf(r->path, sizeof r->path, "%s", path);
    snprintf(r->message, sizeof r->message, "%s", message);
}

static int regular_single(const struct stat *st, request *r) {
    if (S_ISLNK(st->st_mode)) {
        refuse(r, "not_regular_file", "", "the request is a symbolic link; write a regular file");
        return 0;
    }
    if (!S_ISREG(st->st_mode)) {
        refuse(r, "not_regular_file", "", "the request is not a regular file; write a regular file");
        return 0;
    }
    if (st->st_nlink != 1) {
        refuse(r, "hard_link", "", "the request file has several hard links; write a new file");
        return 0;
    }
    return 1;
}

/* read_file: at most the limit, never through a link, never blocking */
static int read_claimed(request *r) {
    struct stat st;
    if (fstatat(g.claim_fd, r->claimed, &st, AT_SYMLINK_NOFOLLOW) < 0) return -1;
    if (!regular_single(&st, r)) return 0;
    int fd = openat(g.claim_fd, r->claimed, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        if (errno == ELOOP || errno == EMLINK) refuse(r, "not_regular_file", "", "the request is a symbolic link");
        return errno == ENOENT ? -1 : 0;
    }
    if (fstat(fd, &st) < 0 || !regular_single(&st, r)) { close(fd); return 0; }
    if (st.st_size > MAX_REQUEST_BYTES) {
        close(fd);
        refuse(r, "too_large", "", "the file is larger than the 1048576-byte limit");
        return 0;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *data = arena_alloc(&g.arena, MAX_REQUEST_BYTES + 1 < cap + 4096 ? MAX_REQUEST_BYTES + 2 : cap + 4096);
    size_t room = MAX_REQUEST_BYTES + 1 < cap + 4096 ? MAX_REQUEST_BYTES + 1 : cap + 4095;
    for (;;) {
        ssize_t got = read(fd, data + n, room - n);
        if (got <= 0) break;
        n += (size_t)got;
        if (n == room) break;
    }
    close(fd);
    if (n > MAX_REQUEST_BYTES) {
        refuse(r, "too_large", "", "the file is larger than the 1048576-byte limit");
        return 0;
    }
    r->raw = data;
    r->raw_len = n;
    return 1;
}

/* -- the envelope (schemas/envelope.json) and bench.noop's params ------------------ */

static int effect_name(const jval *v) {
    /* ^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*){1,2}$, at most 128 */
    if (v->len > 128 || !v->len) return 0;
    int parts = 0, at_start = 1;
    for (size_t i = 0; i < v->len; i++) {
        unsigned char c = (unsigned char)v->s[i];
        if (at_start) {
            if (c < 'a' || c > 'z') return 0;
            at_start = 0;
        } else if (c == '.') {
            parts++;
            at_start = 1;
        } else if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
            return 0;
        }
    }
    return !at_start && parts >= 1 && parts <= 2;
}

static int envelope(request *r) {
    static const char *allowed[] = {"attachments", "effect", "id", "idempotency_key",
                                    "params", "reason", "version"};
    const jval *d = r->doc;
    if (d->type != J_OBJ) { refuse(r, "type", "", "the request is not a JSON object"); return 0; }
    for (size_t i = 0; i < d->len; i++) {
        int known = 0;
        for (size_t k = 0; k < sizeof allowed / sizeof *allowed; k++)
            known |= d->keys[i]->len == strlen(allowed[k]) && !memcmp(d->keys[i]->s, allowed[k], d->keys[i]->len);
        if (!known) { refuse(r, "additionalProperties", "", "an unknown top-level key"); return 0; }
    }
    const jval *version = json_get(d, "version"), *effect = json_get(d, "effect"),
               *params = json_get(d, "params"), *id = json_get(d, "id");
    if (!version || !effect || !params) { refuse(r, "required", "", "version, effect and params are required"); return 0; }
    if (!((version->type == J_INT && version->len == 1 && (version->s[0] == '1' || version->s[0] == '2')) ||
          (version->type == J_FLOAT && (version->num == 1.0 || version->num == 2.0)))) {
        refuse(r, "enum", "/version", "version must be 1 or 2");
        return 0;
    }
    r->version = version->type == J_INT ? version->s[0] - '0' : (long)version->num;
    if (effect->type != J_STR || !effect_name(effect)) { refuse(r, "pattern", "/effect", "not an effect name"); return 0; }
    if (params->type != J_OBJ) { refuse(r, "type", "/params", "params must be an object"); return 0; }
    if (id) {
        if (id->type != J_STR || id->len < 1 || id->len > 64) { refuse(r, "pattern", "/id", "not an id"); return 0; }
        for (size_t i = 0; i < id->len; i++)
            if (!id_char((unsigned char)id->s[i])) { refuse(r, "pattern", "/id", "not an id"); return 0; }
        memcpy(r->id, id->s, id->len);
        r->id[id->len] = 0;
    } else {
        snprintf(r->id, sizeof r->id, "%.64s", r->stem);
    }
    const jval *reason = json_get(d, "reason"), *idem = json_get(d, "idempotency_key");
    if (reason && (reason->type != J_STR || utf8_chars(reason->s, reason->len) > 2000)) {
        refuse(r, "maxLength", "/reason", "reason must be a string of at most 2000 characters");
        return 0;
    }
    if (idem && (idem->type != J_STR || !idem->len || utf8_chars(idem->s, idem->len) > 200)) {
        refuse(r, "maxLength", "/idempotency_key", "idempotency_key must be 1 to 200 characters");
        return 0;
    }
    if (json_get(d, "attachments")) { refuse(r, "unsupported", "/attachments", "the prototype takes no attachments"); return 0; }
    memcpy(r->effect, effect->s, effect->len);
    r->effect[effect->len] = 0;
    if (strcmp(r->effect, "bench.noop") != 0) { refuse(r, "unknown_effect", "/effect", "the prototype knows bench.noop only"); return 0; }
    /* bench.noop: {"value": string | integer}, nothing else */
    for (size_t i = 0; i < params->len; i++) {
        const jval *k = params->keys[i], *v = params->items[i];
        if (k->len != 5 || memcmp(k->s, "value", 5) != 0) { refuse(r, "additionalProperties", "/params", "unknown param"); return 0; }
        if (v->type != J_STR && v->type != J_INT) { refuse(r, "type", "/params/value", "value must be a string or an integer"); return 0; }
    }
    return 1;
}

static void accept_one(request *r) {
    r->payload.len = 0;
    r->state = 0;
    int got = read_claimed(r);
    now_iso(r->received_at);
    if (got < 0) { r->state = 2; return; }
    if (got == 0) { sha256_hex("", 0, r->sha); snprintf(r->id, sizeof r->id, "%.64s", r->stem); return; }
    char m[200];
    r->doc = json_parse(&g.arena, r->raw, r->raw_len, MAX_DEPTH, &r->code, m, sizeof m);
    if (!r->doc) {
        refuse(r, r->code, "", m);
        snprintf(r->id, sizeof r->id, "%.64s", r->stem);
        sha256_hex(r->raw, r->raw_len, r->sha);
        return;
    }
    if (!envelope(r)) {
        if (!r->id[0]) snprintf(r->id, sizeof r->id, "%.64s", r->stem);
        sha256_hex(r->raw, r->raw_len, r->sha);
        return;
    }
    /* Request.envelope's canonical form: the id (the file's stem when absent), the
     * version as an integer, the optional keys only when given; keys in sorted order */
    buf *b = &r->payload;
    const jval *reason = json_get(r->doc, "reason"), *idem = json_get(r->doc, "idempotency_key");
    buf_puts(b, "{\"effect\":");
    buf_str(b, r->effect, strlen(r->effect));
    buf_puts(b, ",\"id\":");
    buf_str(b, r->id, strlen(r->id));
    if (idem) {
        buf_puts(b, ",\"idempotency_key\":");
        buf_str(b, idem->s, idem->len);
    }
    buf_puts(b, ",\"params\":");
    if (json_canonical(b, json_get(r->doc, "params")) < 0) die("no canonical form");
    if (reason) {
        buf_puts(b, ",\"reason\":");
        buf_str(b, reason->s, reason->len);
    }
    buf_puts(b, r->version == 1 ? ",\"version\":1}" : ",\"version\":2}");
    sha256_hex(b->data, b->len, r->sha);
}

/* -- the audit events queued with the row (broker/audit/log.py event) --------------- */

static void event_head(buf *b, const char *at, const char *kind, const request *r) {
    b->len = 0;
    buf_puts(b, "{\"at\":\"");
    buf_puts(b, at);
    buf_puts(b, "\",\"event\":\"");
    buf_puts(b, kind);
    buf_puts(b, "\",\"sandbox\":\"" SANDBOX "\",\"id\":");
    buf_str(b, r->id, strlen(r->id));
    buf_puts(b, ",\"effect\":");
    if (r->effect[0]) buf_str(b, r->effect, strlen(r->effect));
    else buf_puts(b, "null");
    buf_puts(b, ",\"sha256\":\"");
    buf_puts(b, r->sha);
    buf_puts(b, "\"");
}

/* BENCH_NATIVE_LEAN=1: fewer statements than the broker's (no savepoint, no lookup
 * before the insert: the UNIQUE constraint finds a duplicate; a request's audit events
 * in one multi-row INSERT), to measure what statements cost; not the broker's path */
static int lean;
static buf lean_events;
static size_t lean_ends[8], lean_n;
static sqlite3_stmt *lean_insert[8];

static void queue_event(buf *b) {
    buf_puts(b, "}");
    if (lean && lean_n < 8) {
        buf_put(&lean_events, b->data, b->len);
        lean_ends[lean_n++] = lean_events.len;
        return;
    }
    bind_text(g.st[S_QUEUE], 1, b->data, (int)b->len);
    run(S_QUEUE);
}

static void flush_lean_events(void) {
    if (!lean_n) return;
    sqlite3_stmt *s = lean_insert[lean_n - 1];
    if (!s) {
        buf sql = {0};
        buf_puts(&sql, "INSERT INTO audit_queue (event) VALUES (?)");
        for (size_t i = 1; i < lean_n; i++) buf_puts(&sql, ", (?)");
        check(sqlite3_prepare_v3(g.db, sql.data, (int)sql.len, SQLITE_PREPARE_PERSISTENT, &s, NULL), "lean");
        free(sql.data);
        lean_insert[lean_n - 1] = s;
    }
    for (size_t i = 0, from = 0; i < lean_n; from = lean_ends[i++])
        bind_text(s, (int)i + 1, lean_events.data + from, (int)(lean_ends[i] - from));
    check(sqlite3_step(s), "lean events");
    sqlite3_reset(s);
    lean_n = 0;
    lean_events.len = 0;
}

/* an id recorded already: 1 when handled (nothing to answer, or a duplicate's refusal) */
static int recorded_before(request *r) {
    sqlite3_stmt *s = g.st[S_LOOKUP];
    bind_text(s, 1, SANDBOX, -1);
    bind_text(s, 2, r->id, -1);
    int found = sqlite3_step(s);
    check(found, "lookup");
    if (found != SQLITE_ROW) {
        sqlite3_reset(s);
        return 0;
    }
    const char *sha = (const char *)sqlite3_column_text(s, 6);
    int same = sha && strcmp(sha, r->sha) == 0;
    sqlite3_reset(s);
    if (!lean) run(S_RELEASE);
    if (same) { r->state = 2; return 1; } /* the same bytes again: nothing to answer */
    refuse(r, "duplicate_id", "/id", "the id is already used by another request in this sandbox");
    event_head(&g.scratch, r->received_at, "duplicate_id", r);
    queue_event(&g.scratch);
    flush_lean_events();
    return 1; /* a result file only: the row is the other request's */
}

static void record(request *r) {
    buf *b = &g.scratch;
    if (r->state == 2) return;
    if (!lean) {
        run(S_SAVEPOINT);
        if (recorded_before(r)) return;
    }
    sqlite3_stmt *s;
    now_iso(r->decided_at);
    now_iso(r->completed_at);
    s = g.st[S_INSERT];
    int applied = r->state == 0;
    char errors[512] = "";
    if (!applied) {
        buf e = {0};
        buf_puts(&e, "[{\"path\":");
        buf_str(&e, r->path, strlen(r->path));
        buf_puts(&e, ",\"code\":");
        buf_str(&e, r->code, strlen(r->code));
        buf_puts(&e, ",\"message\":");
        buf_str(&e, r->message, strlen(r->message));
        buf_puts(&e, "}]");
        snprintf(errors, sizeof errors, "%.*s", (int)e.len, e.data);
        free(e.data);
    }
    char reason[300];
    snprintf(reason, sizeof reason, "invalid: %s", r->message);
    bind_text(s, 1, SANDBOX, -1);
    bind_text(s, 2, r->id, -1);
    bind_text(s, 3, r->stem, -1);
    bind_text(s, 4, applied ? "applied" : "invalid", -1);
    bind_text(s, 5, r->received_at, -1);
    bind_text(s, 6, r->effect[0] ? r->effect : NULL, -1);
    bind_text(s, 7, applied ? r->payload.data : NULL, applied ? (int)r->payload.len : -1);
    bind_text(s, 8, r->sha, -1);
    bind_text(s, 9, NULL, -1);
    bind_text(s, 10, applied ? REASON : reason, -1);
    bind_text(s, 11, applied ? NULL : errors, -1);
    bind_text(s, 12, applied ? "{}" : NULL, -1);
    bind_text(s, 13, applied ? VERDICT : NULL, -1);
    bind_text(s, 14, NULL, -1);
    check(applied ? sqlite3_bind_int(s, 15, 1) : sqlite3_bind_null(s, 15), "bind");
    bind_text(s, 16, applied ? "policy" : NULL, -1);
    bind_text(s, 17, NULL, -1);
    bind_text(s, 18, applied ? r->decided_at : NULL, -1);
    bind_text(s, 19, r->completed_at, -1);
    bind_text(s, 20, NULL, -1);
    bind_text(s, 21, NULL, -1);
    bind_text(s, 22, NULL, -1);
    bind_text(s, 23, applied ? "{\"protected\":[]}" : NULL, -1);
    if (lean) {
        int rc = sqlite3_step(s);
        sqlite3_reset(s);
        if (rc == SQLITE_CONSTRAINT && recorded_before(r)) return;
        check(rc, "insert");
    } else {
        run(S_INSERT);
        run(S_RELEASE);
    }
    /* queued at commit in one executemany, as SQLiteStore._write_audit */
    event_head(b, r->received_at, "received", r);
    buf_puts(b, ",\"name\":");
    buf_str(b, r->stem, strlen(r->stem));
    queue_event(b);
    if (!applied) {
        event_head(b, r->completed_at, "invalid", r);
        buf_puts(b, ",\"reason\":");
        buf_str(b, reason, strlen(reason));
        queue_event(b);
        flush_lean_events();
        return;
    }
    event_head(b, r->decided_at, "decided", r);
    buf_puts(b, ",\"action\":\"auto\",\"rule\":\"default\",\"by\":\"policy\"");
    queue_event(b);
    event_head(b, r->decided_at, "applying", r);
    queue_event(b);
    event_head(b, r->completed_at, "applied", r);
    buf_puts(b, ",\"reason\":\"" REASON "\"");
    queue_event(b);
    flush_lean_events();
}

/* -- after the commit: the result, then the audit lines ----------------------------- */

static void write_result(request *r) {
    buf *b = &g.body;
    char v[8];
    snprintf(v, sizeof v, "%ld", r->version ? r->version : 1);
    b->len = 0;
    buf_puts(b, "{\"version\":");
    buf_puts(b, v);
    buf_puts(b, ",\"id\":");
    buf_str(b, r->id, strlen(r->id));
    buf_puts(b, ",\"effect\":");
    if (r->effect[0]) buf_str(b, r->effect, strlen(r->effect));
    else buf_puts(b, "null");
    if (r->state == 0) {
        buf_puts(b, ",\"status\":\"applied\",\"reason\":\"" REASON "\",\"output\":{},\"errors\":[]");
    } else {
        buf_puts(b, ",\"status\":\"invalid\",\"reason\":");
        char reason[300];
        snprintf(reason, sizeof reason, "invalid: %s", r->message);
        buf_str(b, reason, strlen(reason));
        buf_puts(b, ",\"output\":null,\"errors\":[{\"path\":");
        buf_str(b, r->path, strlen(r->path));
        buf_puts(b, ",\"code\":");
        buf_str(b, r->code, strlen(r->code));
        buf_puts(b, ",\"message\":");
        buf_str(b, r->message, strlen(r->message));
        buf_puts(b, "}]");
    }
    buf_puts(b, ",\"request_sha256\":\"");
    buf_puts(b, r->sha);
    buf_puts(b, r->state == 0 ? "\",\"decided_by\":\"policy\",\"received_at\":\"" : "\",\"decided_by\":null,\"received_at\":\"");
    buf_puts(b, r->received_at);
    buf_puts(b, r->state == 0 ? "\",\"decided_at\":\"" : "\",\"decided_at\":null,\"completed_at\":\"");
    if (r->state == 0) {
        buf_puts(b, r->decided_at);
        buf_puts(b, "\",\"completed_at\":\"");
    }
    buf_puts(b, r->completed_at[0] ? r->completed_at : r->received_at);
    buf_puts(b, "\"}");
    char tmp[200];
    snprintf(tmp, sizeof tmp, ".%s.json.tmp", r->stem);
    char final[160];
    snprintf(final, sizeof final, "%s.json", r->stem);
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_TRUNC | O_NOFOLLOW | O_CLOEXEC;
    int fd = openat(g.results_fd, tmp, flags, 0644);
    if (fd < 0 && errno == EEXIST) {
        unlinkat(g.results_fd, tmp, 0);
        fd = openat(g.results_fd, tmp, flags, 0644);
    }
    if (fd < 0) die("%s: cannot create: %s", tmp, strerror(errno));
    fchmod(fd, 0644);
    if (write(fd, b->data, b->len) != (ssize_t)b->len) die("%s: short write", tmp);
    close(fd);
    if (renameat(g.results_fd, tmp, g.results_fd, final) < 0) die("%s: rename: %s", final, strerror(errno));
}

/* the last line's seq and hash (AuditLog._recover_tail, without the torn-line repair) */
static void audit_tail(void) {
    g.appended = 0;
    memset(g.head, '0', 64);
    g.head[64] = 0;
    int fd = open(g.audit_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    fstat(fd, &st);
    off_t from = st.st_size > 8192 ? st.st_size - 8192 : 0;
    char tail[8193];
    ssize_t n = pread(fd, tail, 8192, from);
    close(fd);
    if (n <= 1) return;
    tail[n] = 0;
    ssize_t end = n - 1, start = end;
    while (start > 0 && tail[start - 1] != '\n') start--;
    const char *code;
    char m[100];
    jval *last = json_parse(&g.arena, tail + start, (size_t)(end - start), MAX_DEPTH, &code, m, sizeof m);
    const jval *seq = json_get(last, "seq"), *hash = json_get(last, "hash");
    if (!seq || !hash || hash->len != 64) die("%s: the last line is not an audit event", g.audit_path);
    g.appended = atoll(seq->s);
    memcpy(g.head, hash->s, 64);
}

/* canonical_json of an event with `seq`, `prev` and maybe `hash` put in their sorted places */
static void audit_line(buf *b, const jval *event, long long seq, const char *prev, const char *hash) {
    char seq_text[24];
    snprintf(seq_text, sizeof seq_text, "%lld", seq);
    const char *extra_keys[] = {"hash", "prev", "seq"};
    const char *extra_vals[] = {hash, prev, seq_text};
    size_t e = hash ? 0 : 1, i = 0;
    int first = 1;
    buf_put(b, "{", 1);
    while (i < event->len || e < 3) {
        int take_extra;
        if (e >= 3) take_extra = 0;
        else if (i >= event->len) take_extra = 1;
        else {
            const jval *k = event->keys[i];
            size_t n = strlen(extra_keys[e]), m = k->len < n ? k->len : n;
            int c = memcmp(k->s, extra_keys[e], m);
            take_extra = c > 0 || (c == 0 && k->len > n);
        }
        if (!first) buf_put(b, ",", 1);
        first = 0;
        if (take_extra) {
            buf_str(b, extra_keys[e], strlen(extra_keys[e]));
            buf_put(b, ":", 1);
            if (e == 2) buf_puts(b, extra_vals[e]);
            else buf_str(b, extra_vals[e], 64);
            e++;
        } else {
            buf_str(b, event->keys[i]->s, event->keys[i]->len);
            buf_put(b, ":", 1);
            json_canonical(b, event->items[i]);
            i++;
        }
    }
    buf_put(b, "}", 1);
}

static void audit_sync(void) {
    if (g.appended > g.synced) {
        int fd = open(g.audit_path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            if (fsync(fd) < 0) die("%s: cannot sync", g.audit_path);
            close(fd);
        }
        g.synced = g.appended;
        g.durable_seq = g.appended;
        memcpy(g.durable_head, g.head, 65);
    }
    clock_gettime(CLOCK_MONOTONIC, &g.synced_at);
}

static void audit_flush(void) {
    sqlite3_stmt *s = g.st[S_BACKLOG];
    sqlite3_bind_int64(s, 1, g.appended);
    buf *out = &g.events;
    out->len = 0;
    long long last = g.appended;
    char head[65];
    int lock = -1;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (lock < 0) { /* AuditLog.append: under its lock, the head read again if changed */
            lock = open(g.lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
            if (lock < 0 || flock(lock, LOCK_EX) < 0) die("%s: cannot lock", g.lock_path);
            struct stat st;
            int same = g.left_known && stat(g.audit_path, &st) == 0 && st.st_ino == g.left_ino &&
                       st.st_size == g.left_size && st.st_mtim.tv_sec == g.left_mtime.tv_sec &&
                       st.st_mtim.tv_nsec == g.left_mtime.tv_nsec;
            if (!same) audit_tail();
            memcpy(head, g.head, 65);
            last = g.appended;
        }
        long long seq = sqlite3_column_int64(s, 0);
        const char *text = (const char *)sqlite3_column_text(s, 1);
        int n = sqlite3_column_bytes(s, 1);
        if (seq <= last) continue;
        const char *code;
        char m[100];
        jval *event = json_parse(&g.arena, text, (size_t)n, MAX_DEPTH, &code, m, sizeof m);
        if (!event) die("a queued audit event does not parse: %s", m);
        char prev[65];
        memcpy(prev, head, 65);
        g.line.len = 0; /* line_hash: the entry without its hash, then the line with it */
        audit_line(&g.line, event, seq, prev, NULL);
        sha256_hex(g.line.data, g.line.len, head);
        audit_line(out, event, seq, prev, head);
        buf_put(out, "\n", 1);
        last = seq;
    }
    check(rc, "backlog");
    sqlite3_reset(s);
    if (lock < 0) return;
    if (out->len) {
        int fd = open(g.audit_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) die("%s: cannot append", g.audit_path);
        size_t done = 0;
        while (done < out->len) {
            ssize_t w = write(fd, out->data + done, out->len - done);
            if (w <= 0) die("%s: cannot append", g.audit_path);
            done += (size_t)w;
        }
        struct stat st;
        fstat(fd, &st);
        g.left_ino = st.st_ino;
        g.left_size = st.st_size;
        g.left_mtime = st.st_mtim;
        g.left_known = 1;
        close(fd);
        g.appended = last;
        memcpy(g.head, head, 65);
    }
    close(lock);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((double)(now.tv_sec - g.synced_at.tv_sec) + (double)(now.tv_nsec - g.synced_at.tv_nsec) / 1e9 >= 1.0)
        audit_sync();
}

/* -- one wake-up ------------------------------------------------------------------- */

static request batch[MAX_BATCH];

/* where a request's wall time goes, summed over the run and printed at exit (stderr):
 * a split within one process and one moment, which load moves less than the total */
enum { T_CLAIM, T_READ, T_SQL, T_COMMIT, T_RESULT, T_AUDIT, T_COUNT };
static const char *STAGE[] = {"claim", "read_parse_check", "statements", "commit",
                              "result", "audit"};
static double spent[T_COUNT], mark;
static long long accepted;

static void lap(int stage) {
    double now = monotonic();
    spent[stage] += now - mark;
    mark = now;
}

static void print_stages(void) {
    fprintf(stderr, "stages {\"requests\": %lld", accepted);
    for (int i = 0; i < T_COUNT; i++)
        fprintf(stderr, ", \"%s_us\": %.2f", STAGE[i], accepted ? spent[i] / (double)accepted * 1e6 : 0.0);
    fprintf(stderr, "}\n");
}

static void step(size_t taken) {
    size_t n = 0;
    arena_reset(&g.arena);
    mark = monotonic();
    for (size_t i = 0; i < taken; i++) {
        request *r = &batch[n];
        snprintf(r->name, sizeof r->name, "%s", g.backlog[g.backlog_from + i]);
        if (!request_name(r->name, r->stem)) continue;
        r->id[0] = r->effect[0] = r->completed_at[0] = r->decided_at[0] = 0;
        r->version = 0;
        r->doc = NULL;
        if (claim(r)) n++;
    }
    g.backlog_from += taken;
    if (!n && !g.n_unsynced && !g.durable_seq) return;
    lap(T_CLAIM);
    run(S_BEGIN);
    for (size_t i = 0; i < g.n_unsynced; i++) {
        sqlite3_stmt *s = g.st[S_SYNCED];
        bind_text(s, 1, SANDBOX, -1);
        bind_text(s, 2, g.unsynced[i], -1);
        bind_text(s, 3, "applied", -1);
        run(S_SYNCED);
    }
    g.n_unsynced = 0;
    if (g.durable_seq) { /* AuditWriter.durable → Store.drop_audit */
        sqlite3_bind_int64(g.st[S_DROP], 1, g.durable_seq);
        run(S_DROP);
        sqlite3_stmt *s = g.st[S_HEAD];
        check(sqlite3_step(s), "audit head");
        sqlite3_reset(s);
        char value[100];
        snprintf(value, sizeof value, "[%lld,\"%s\"]", g.durable_seq, g.durable_head);
        bind_text(g.st[S_SET_HEAD], 1, value, -1);
        run(S_SET_HEAD);
        g.durable_seq = 0;
    }
    for (size_t i = 0; i < n; i++) {
        lap(T_SQL);
        accept_one(&batch[i]);
        lap(T_READ);
        record(&batch[i]);
    }
    lap(T_SQL);
    run(S_COMMIT);
    lap(T_COMMIT);
    accepted += (long long)n;
    for (size_t i = 0; i < n; i++) {
        request *r = &batch[i];
        if (r->state != 2) write_result(r);
        if (r->state == 0) {
            g.unsynced = grow(g.unsynced, &g.cap_unsynced, g.n_unsynced + 1, sizeof *g.unsynced);
            snprintf(g.unsynced[g.n_unsynced++], 72, "%s", r->id);
        }
        g.consumed = grow(g.consumed, &g.cap_consumed, g.n_consumed + 1, sizeof *g.consumed);
        snprintf(g.consumed[g.n_consumed++], 200, "%s", r->claimed);
    }
    lap(T_RESULT);
    audit_flush();
    lap(T_AUDIT);
}

/* claimed files whose request is recorded, removed when idle within a budget */
static void purge(double budget) {
    double end = monotonic() + budget;
    while (g.consumed_from < g.n_consumed && monotonic() < end) {
        struct stat st;
        const char *name = g.consumed[g.consumed_from++];
        if (fstatat(g.claim_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) unlinkat(g.claim_fd, name, 0);
    }
    if (g.consumed_from == g.n_consumed) g.consumed_from = g.n_consumed = 0;
}

static void see(const char *name) {
    g.backlog = grow(g.backlog, &g.cap_backlog, g.n_backlog + 1, sizeof *g.backlog);
    snprintf(g.backlog[g.n_backlog++], 160, "%s", name);
}

static void on_term(int sig) {
    (void)sig;
    stopping = 1;
}

static int open_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) die("%s: %s", path, strerror(errno));
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 4) die("usage: accept OUTBOX RESULTS STATE_DIR");
    const char *state = argv[3];
    char path[4096];
    g.outbox_fd = open_dir(argv[1]);
    g.results_fd = open_dir(argv[2]);
    snprintf(path, sizeof path, "%s/claimed", state);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/claimed/" SANDBOX, state);
    mkdir(path, 0700);
    g.claim_fd = open_dir(path);
    snprintf(g.audit_path, sizeof g.audit_path, "%s/audit.jsonl", state);
    snprintf(g.lock_path, sizeof g.lock_path, "%s/audit.jsonl.lock", state);
    lean = getenv("BENCH_NATIVE_LEAN") && strcmp(getenv("BENCH_NATIVE_LEAN"), "1") == 0;
    open_ledger(state);
    audit_tail();
    g.synced = g.appended;
    clock_gettime(CLOCK_MONOTONIC, &g.synced_at);

    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    g.inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    /* the broker's mask (broker/intake/inotify.py FILE_EVENTS): it wakes for the temp
     * file's create and close too */
    uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK;
    if (g.inotify_fd < 0 || inotify_add_watch(g.inotify_fd, argv[1], mask) < 0) die("inotify: %s", strerror(errno));
    DIR *dir = fdopendir(dup(g.outbox_fd)); /* what was there before the watch */
    for (struct dirent *e; dir && (e = readdir(dir));) see(e->d_name);
    if (dir) closedir(dir);
    printf("ready\n");
    fflush(stdout);

    char events[1 << 16] __attribute__((aligned(__alignof__(struct inotify_event))));
    while (!stopping) {
        if (g.backlog_from >= g.n_backlog) {
            g.backlog_from = g.n_backlog = 0;
            struct pollfd p = {g.inotify_fd, POLLIN, 0};
            int ready = poll(&p, 1, g.n_consumed ? 50 : 500);
            if (ready <= 0) { /* idle: the log made durable, consumed files removed */
                audit_sync();
                purge(0.01);
                if (g.n_unsynced || g.durable_seq) step(0);
                continue;
            }
            ssize_t len = read(g.inotify_fd, events, sizeof events);
            for (ssize_t off = 0; off < len;) {
                const struct inotify_event *ev = (const struct inotify_event *)(events + off);
                off += (ssize_t)(sizeof *ev + ev->len);
                if (ev->len && !(ev->mask & IN_ISDIR)) {
                    char stem[136];
                    if (request_name(ev->name, stem)) see(ev->name);
                }
            }
        }
        size_t left = g.n_backlog - g.backlog_from;
        step(left < MAX_BATCH ? left : MAX_BATCH);
    }
    audit_sync();
    purge(1e9);
    step(0);
    print_stages();
    for (int i = 0; i < S_COUNT; i++) sqlite3_finalize(g.st[i]);
    sqlite3_close(g.db);
    return 0;
}
