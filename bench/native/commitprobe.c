/* The largest part of what is left between the prototype and the durable floor, alone:
 * the ledger's commit for one request (the statements accept.c runs, synchronous=FULL,
 * WAL, the broker's schema) against the floor's one fdatasync'ed journal append, alternated in one process
 * so that both see the same moment of a shared machine.
 *
 *     commitprobe DIR [N] [bare]  → p50/p90 µs of each, and the median per-pair ratio
 *
 * `bare`: the commit of one row in a table with no index and nothing else (one WAL
 * frame), to tell the cost of syncing the frames a request's commit writes (the row in
 * the table and its five indexes, four audit rows, sqlite_sequence) from the cost of a
 * commit at all.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "schema.h"

static sqlite3 *db;

static void ok(int rc) {
    if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) {
        fprintf(stderr, "commitprobe: %s\n", sqlite3_errmsg(db));
        exit(1);
    }
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, int p) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[(n - 1) * p / 100];
}

static void exec(const char *sql) { ok(sqlite3_exec(db, sql, NULL, NULL, NULL)); }

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int n = argc > 2 ? atoi(argv[2]) : 300;
    int bare = argc > 3 && strcmp(argv[3], "bare") == 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/ledger.sqlite3", argv[1]);
    ok(sqlite3_open(path, &db));
    exec("PRAGMA journal_mode=WAL");
    exec("PRAGMA synchronous=FULL");
    exec(SCHEMA);
    exec("CREATE TABLE IF NOT EXISTS bare (id TEXT, body TEXT)");
    sqlite3_stmt *ins, *upd, *sel, *aud;
    ok(sqlite3_prepare_v2(db, INSERT_REQUEST, -1, &ins, NULL));
    ok(sqlite3_prepare_v2(db, "UPDATE requests SET synced = 1 WHERE sandbox = 'default' AND id = ?"
                              " AND state = 'applied'", -1, &upd, NULL));
    ok(sqlite3_prepare_v2(db, "SELECT * FROM requests WHERE sandbox = 'default' AND id = ?", -1, &sel, NULL));
    ok(sqlite3_prepare_v2(db, "INSERT INTO audit_queue (event) VALUES (?)", -1, &aud, NULL));
    sqlite3_stmt *lone;
    ok(sqlite3_prepare_v2(db, "INSERT INTO bare (id, body) VALUES (?, ?)", -1, &lone, NULL));
    snprintf(path, sizeof path, "%s/journal", argv[1]);
    int journal = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    double *commit = calloc((size_t)n, sizeof *commit), *append = calloc((size_t)n, sizeof *append),
           *ratio = calloc((size_t)n, sizeof *ratio);
    char event[300], line[100], id[32], prev[32] = "none";
    memset(event, 'e', sizeof event - 1);
    event[sizeof event - 1] = 0;
    memset(line, 'j', sizeof line - 1);
    line[sizeof line - 1] = '\n';
    for (int i = 0; i < n; i++) {
        snprintf(id, sizeof id, "p%d-%d", (int)getpid(), i);
        double t0 = now_us();
        if (bare) {
            exec("BEGIN IMMEDIATE");
            sqlite3_bind_text(lone, 1, id, -1, SQLITE_STATIC);
            sqlite3_bind_text(lone, 2, event, -1, SQLITE_STATIC);
            ok(sqlite3_step(lone));
            sqlite3_reset(lone);
            exec("COMMIT");
            goto timed;
        }
        exec("BEGIN IMMEDIATE");
        sqlite3_bind_text(upd, 1, prev, -1, SQLITE_STATIC);
        ok(sqlite3_step(upd));
        sqlite3_reset(upd);
        exec("SAVEPOINT one");
        sqlite3_bind_text(sel, 1, id, -1, SQLITE_STATIC);
        ok(sqlite3_step(sel));
        sqlite3_reset(sel);
        /* the columns a bench.noop row fills, with values of their sizes */
        static const int filled[][2] = {{1, 7}, {4, 7}, {5, 24}, {6, 10}, {7, 56}, {8, 64},
                                        {10, 84}, {12, 2}, {13, 132}, {16, 6}, {18, 24},
                                        {19, 24}, {23, 16}};
        sqlite3_bind_text(ins, 2, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(ins, 3, id, -1, SQLITE_STATIC);
        sqlite3_bind_int(ins, 15, 1);
        for (size_t k = 0; k < sizeof filled / sizeof *filled; k++)
            sqlite3_bind_text(ins, filled[k][0], event, filled[k][1], SQLITE_STATIC);
        ok(sqlite3_step(ins));
        sqlite3_reset(ins);
        exec("RELEASE one");
        for (int k = 0; k < 4; k++) {
            sqlite3_bind_text(aud, 1, event, -1, SQLITE_STATIC);
            ok(sqlite3_step(aud));
            sqlite3_reset(aud);
        }
        exec("COMMIT");
    timed:;
        double t1 = now_us();
        if (write(journal, line, sizeof line) != (ssize_t)sizeof line || fdatasync(journal) < 0) return 1;
        double t2 = now_us();
        commit[i] = t1 - t0;
        append[i] = t2 - t1;
        ratio[i] = commit[i] / append[i];
        snprintf(prev, sizeof prev, "%s", id);
    }
    printf("{\"mode\": \"%s\", \"n\": %d, \"commit_p50_us\": %.1f, \"commit_p90_us\": %.1f, \"append_p50_us\": %.1f,"
           " \"append_p90_us\": %.1f, \"ratio_p50\": %.2f}\n",
           bare ? "bare" : "request", n, pct(commit, n, 50), pct(commit, n, 90), pct(append, n, 50), pct(append, n, 90),
           pct(ratio, n, 50));
    sqlite3_close(db);
    return 0;
}
