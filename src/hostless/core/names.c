/*
 * names.c -- the name table: independent processes find each other's fences,
 * timelines, buffers and queues by name (struct hl_names in the header page,
 * hostless_layout.h).
 *
 * Publishing and removing are rare (set-up time), so they are serialised by
 * one lock word that names its holder (HL_OWNER).  A holder that died is
 * replaced by the next participant that needs the lock, and the cells it was
 * writing (state WRITING) are freed: nothing is left half-written for
 * readers, who see a cell only while it is LIVE and its ctl did not change
 * around their reads (a seqlock).  A lookup trusts an entry only while its
 * object is LIVE with the published generation, so an entry dies with its
 * object: lookups stop returning it at once, and the next publish frees the
 * cell.  Entries hold no reference: publishing does not keep an object alive.
 *
 * Everything read from the table is hostile: unknown states are garbage
 * (freed by the next publish), names are bounded by their cell, handles are
 * validated against the private view.
 */
#include "engine.h"

#include <string.h>

#define NAMES_LOCK_WAIT_NS 1000000000ull /* a live writer holds the lock for microseconds */

static struct hl_names *table(hle_ctx *c) { return &((struct hl_header *)c->dv.base)->names; }

static int name_ok(const char *name, size_t n) { return n >= 1 && n < HL_NAME_MAX && !memchr(name, 0, n); }

/* 1 when h names a live fence, timeline, buffer or queue of this domain. */
static int object_live(hle_ctx *c, uint64_t h) {
    struct hl_fence *f = hl_fence_slot(&c->dv, h, 0);
    return f && HL_HANDLE_KIND(h) != HL_KIND_MERGED && hl_fence_matches(f, h);
}

/* A cell's name, bounded by the cell and NUL-terminated. */
static void read_name(const struct hl_name *e, char out[HL_NAME_MAX]) {
    size_t i;
    for (i = 0; i < HL_NAME_MAX - 1; i++) {
        out[i] = __atomic_load_n(&e->name[i], __ATOMIC_RELAXED);
        if (!out[i]) break;
    }
    out[i] = 0;
}

/* A consistent copy of a LIVE cell: 1 with *h and name, 0 when not LIVE. */
static int snapshot(const struct hl_name *e, uint64_t *h, char name[HL_NAME_MAX]) {
    for (int tries = 0; tries < 64; tries++) {
        uint64_t c1 = ld(&e->ctl);
        if (HL_NAME_STATE(c1) != HL_NAME_LIVE) return 0;
        *h = ld(&e->handle);
        read_name(e, name);
        if (ld(&e->ctl) == c1) return 1;
    }
    return 0; /* rewritten all along: treat it as absent */
}

static int same_name(const char *cell, const char *name, size_t n) { return strlen(cell) == n && !memcmp(cell, name, n); }

static void set_state(struct hl_name *e, uint32_t state) {
    st(&e->ctl, HL_NAME_CTL(HL_NAME_SEQ(ld(&e->ctl)) + 1, state));
}

static int lock_names(hle_ctx *c, uint32_t me) {
    struct hl_names *t = table(c);
    uint64_t t0 = now_ns();
    for (;;) {
        uint32_t v = __atomic_load_n(&t->lock, __ATOMIC_SEQ_CST);
        if (v == 0 || (v != me && !hle_owner_alive(c, v))) { /* free, or its holder died: take it */
            if (__atomic_compare_exchange_n(&t->lock, &v, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return HL_OK;
            continue;
        }
        if (v == me) return hle_fail(HL_E_INVALID, "the name table lock is already ours (a nested call?)");
        if (now_ns() - t0 > NAMES_LOCK_WAIT_NS)
            return hle_fail(HL_E_LOCKED, "the name table is locked by participant %d for more than 1 s",
                            HL_OWNER_INDEX(v));
        sched_yield();
    }
}

static void unlock_names(hle_ctx *c, uint32_t me) {
    uint32_t v = me;
    (void)__atomic_compare_exchange_n(&table(c)->lock, &v, 0u, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

static void changed(hle_ctx *c) {
    struct hl_names *t = table(c);
    __atomic_add_fetch(&t->seq, 1u, __ATOMIC_SEQ_CST);
#if defined(HL_HAVE_FUTEX)
    hl_futex_wake_all(&t->seq);
#endif
}

/* Under the lock: free every cell that is not a LIVE entry of a live object. */
static void sweep(hle_ctx *c) {
    struct hl_names *t = table(c);
    for (uint32_t i = 0; i < HL_MAX_NAMES; i++) {
        struct hl_name *e = &t->entry[i];
        uint64_t ctl = ld(&e->ctl);
        if (HL_NAME_STATE(ctl) == HL_NAME_FREE) continue;
        if (HL_NAME_STATE(ctl) == HL_NAME_LIVE && object_live(c, ld(&e->handle))) continue;
        set_state(e, HL_NAME_FREE); /* a dead writer's cell, a dead object's entry, or garbage */
    }
}

/* Failure records ("!error:<handle>", records.c and hostless.records) share
 * the table with the user's names but may hold at most HLE_RECORD_NAMES of
 * its cells: a record past that share takes the cell of another record (the
 * newest failure's text is the useful one; the evicted record's buffer stays
 * with its writer, who releases it), never one a user's name could use. */
#define HLE_RECORD_NAMES 12u
static int is_record(const char *name, size_t n) { return n >= 7 && !memcmp(name, "!error:", 7); }

int hle_name_publish(hle_ctx *c, const char *name, size_t n, uint64_t handle, int replace, uint64_t *existing) {
    struct hl_names *t;
    struct hl_name *cell = NULL;
    char cur[HL_NAME_MAX];
    uint32_t me;
    int r;
    if ((r = hle_need_attached(c)) != HL_OK) return r;
    if (!name_ok(name, n))
        return hle_fail(HL_E_VALUE, "a name is 1..%u bytes of UTF-8 without NUL", HL_NAME_MAX - 1);
    if (!object_live(c, handle)) return hle_fail(HL_E_HANDLE, "handle %#llx is not a live object", (unsigned long long)handle);
    me = hle_owner_code(c);
    if ((r = lock_names(c, me)) != HL_OK) return r;
    t = table(c);
    sweep(c);
    int record = is_record(name, n);
    uint32_t records = 0;
    struct hl_name *victim = NULL, *same = NULL;
    for (uint32_t i = 0; i < HL_MAX_NAMES; i++) {
        struct hl_name *e = &t->entry[i];
        if (HL_NAME_STATE(ld(&e->ctl)) != HL_NAME_LIVE) {
            if (!cell) cell = e;
            continue;
        }
        read_name(e, cur);
        if (record && is_record(cur, strlen(cur))) {
            records++;
            if (!victim) victim = e;
            if (same_name(cur, name, n)) same = e;
        }
        if (!same_name(cur, name, n)) continue;
        if (!replace && ld(&e->handle) != handle) {
            if (existing) *existing = ld(&e->handle);
            unlock_names(c, me);
            return hle_fail(HL_E_EXISTS, "the name '%.*s' is published already (handle %#llx)", (int)n, name,
                            (unsigned long long)ld(&e->handle));
        }
        cell = e; /* rewrite it in place */
        break;
    }
    if (record && !same && records >= HLE_RECORD_NAMES && victim) cell = victim; /* the records' share is used up */
    if (!cell) {
        unlock_names(c, me);
        return hle_fail(HL_E_TABLE_FULL, "the name table is full (%u live names)", HL_MAX_NAMES);
    }
    set_state(cell, HL_NAME_WRITING);
    st(&cell->handle, handle);
    for (size_t i = 0; i < HL_NAME_MAX; i++) __atomic_store_n(&cell->name[i], i < n ? name[i] : 0, __ATOMIC_RELAXED);
    set_state(cell, HL_NAME_LIVE); /* seq_cst: the fields are visible before LIVE is */
    changed(c);
    unlock_names(c, me);
    return HL_OK;
}

int hle_name_remove(hle_ctx *c, const char *name, size_t n, uint64_t handle) {
    struct hl_names *t;
    char cur[HL_NAME_MAX];
    uint32_t me;
    int r, found = 0;
    if ((r = hle_need_attached(c)) != HL_OK) return r;
    if (!name_ok(name, n))
        return hle_fail(HL_E_VALUE, "a name is 1..%u bytes of UTF-8 without NUL", HL_NAME_MAX - 1);
    me = hle_owner_code(c);
    if ((r = lock_names(c, me)) != HL_OK) return r;
    t = table(c);
    for (uint32_t i = 0; i < HL_MAX_NAMES; i++) {
        struct hl_name *e = &t->entry[i];
        if (HL_NAME_STATE(ld(&e->ctl)) != HL_NAME_LIVE) continue;
        read_name(e, cur);
        if (!same_name(cur, name, n) || (handle && ld(&e->handle) != handle)) continue;
        set_state(e, HL_NAME_FREE);
        found = 1;
    }
    if (found) changed(c);
    unlock_names(c, me);
    return found ? HL_OK : hle_fail(HL_E_NOT_FOUND, "no entry named '%.*s'", (int)n, name);
}

int hle_name_lookup(hle_ctx *c, const char *name, size_t n, uint64_t *handle) {
    char cur[HL_NAME_MAX];
    uint64_t h;
    int r;
    if ((r = hle_need_attached(c)) != HL_OK) return r;
    if (!name_ok(name, n))
        return hle_fail(HL_E_VALUE, "a name is 1..%u bytes of UTF-8 without NUL", HL_NAME_MAX - 1);
    for (uint32_t i = 0; i < HL_MAX_NAMES; i++) {
        if (snapshot(&table(c)->entry[i], &h, cur) && same_name(cur, name, n) && object_live(c, h)) {
            *handle = h;
            return HL_OK;
        }
    }
    return hle_fail(HL_E_NOT_FOUND, "no live object named '%.*s'", (int)n, name);
}

int hle_name_list(hle_ctx *c, int (*visit)(void *ctx, const char *name, uint64_t handle), void *ctx) {
    char cur[HL_NAME_MAX];
    uint64_t h;
    int r, count = 0;
    if ((r = hle_need_attached(c)) != HL_OK) return r;
    for (uint32_t i = 0; i < HL_MAX_NAMES; i++) {
        if (!snapshot(&table(c)->entry[i], &h, cur) || !object_live(c, h)) continue;
        count++;
        if (visit && (r = visit(ctx, cur, h)) != 0) return r < 0 ? r : count;
    }
    return count;
}

uint32_t hle_name_seq(hle_ctx *c) { return c->dv.base ? __atomic_load_n(&table(c)->seq, __ATOMIC_SEQ_CST) : 0; }
