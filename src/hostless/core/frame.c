/*
 * frame.c -- frame programs: the host's per-frame path of a prepared
 * pipeline (stores of the frame number, pushes of prepared packets, copies
 * between buffers, waits for timeline points), validated once by
 * hle_frame_check and run by hle_frame_run in one GIL-free section.
 * Contracts in hostless_engine.h.
 */
#include "engine.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define WORD_OF(field) (offsetof(struct hl_packet, field) / 8)
/* the packet words a PUSH may set to the frame number: the values, never a handle */
#define VALUE_WORDS                                                                                      \
    ((1u << WORD_OF(signal_value)) | (1u << WORD_OF(wait_value)) | (1u << (WORD_OF(wait_value) + 1)))

_Static_assert(sizeof(struct hl_packet) == 64, "a packet is 8 words");
_Static_assert(offsetof(struct hl_packet, signal_value) % 8 == 0 && offsetof(struct hl_packet, wait_value) % 8 == 0,
               "packet values are aligned words");

static const char *op_name(uint32_t t) {
    switch (t) {
    case HLE_FOP_STORE: return "store";
    case HLE_FOP_PUSH: return "push";
    case HLE_FOP_COPY: return "copy";
    case HLE_FOP_WAIT: return "wait";
    default: return "?";
    }
}

static const char *kind_name(uint32_t k) {
    switch (k) {
    case HL_KIND_FENCE: return "a fence";
    case HL_KIND_TIMELINE: return "a timeline";
    case HL_KIND_MERGED: return "a merged fence";
    case HL_KIND_BUFFER: return "a buffer";
    case HL_KIND_QUEUE: return "a queue";
    default: return "no object kind";
    }
}

/* Where a check failed: "frame program op i (name)" or "... watch entry j". */
struct where {
    char s[64];
};
static struct where at_op(uint32_t i, uint32_t type) {
    struct where w;
    snprintf(w.s, sizeof w.s, "frame program op %u (%s)", i, op_name(type));
    return w;
}

/* Fail with "<where>: ..." and the code. */
__attribute__((format(printf, 3, 4))) static int fail_at(int code, const struct where *w, const char *fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return hle_fail(code, "%s: %s", w->s, msg);
}

/* A handle of kind `kind` that we hold; the engine's reason in the message otherwise. */
static int need_held(hle_ctx *c, const struct where *w, uint64_t h, uint32_t kind, const char *role) {
    if (HL_HANDLE_KIND(h) != kind)
        return fail_at(HL_E_HANDLE, w, "%s 0x%llx is %s, not %s", role, (unsigned long long)h,
                       kind_name(HL_HANDLE_KIND(h)), kind_name(kind));
    int64_t idx = hle_check_handle(c, h, kind, 1);
    if (idx < 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", hle_errmsg());
        return fail_at((int)idx, w, "%s 0x%llx: %s", role, (unsigned long long)h, why);
    }
    return HL_OK;
}

/* The offset in the mapping of a held buffer's data, and its size. */
static int extent(hle_ctx *c, const struct where *w, uint64_t h, const char *role, uint64_t *off, uint64_t *n) {
    int r = need_held(c, w, h, HL_KIND_BUFFER, role);
    if (r) return r;
    char *p = hl_buffer_data(&c->dv, h, n);
    if (!p || p < c->base || (uint64_t)(p - c->base) > c->size || *n > c->size - (uint64_t)(p - c->base))
        return fail_at(HL_E_CORRUPT, w, "%s 0x%llx has an extent outside the heap", role, (unsigned long long)h);
    *off = (uint64_t)(p - c->base);
    return HL_OK;
}

int hle_frame_check(hle_ctx *c, struct hle_frame *f) {
    int r = hle_need_attached(c);
    if (r) return r;
    if (f->nops > HLE_FRAME_MAX_OPS)
        return hle_fail(HL_E_VALUE, "a frame program has at most %u ops, got %u", HLE_FRAME_MAX_OPS, f->nops);
    for (uint32_t j = 0; j < f->nwatch; j++) {
        struct where w;
        snprintf(w.s, sizeof w.s, "frame program watch entry %u", j);
        if ((r = need_held(c, &w, f->watch[j], HL_KIND_TIMELINE, "timeline"))) return r;
    }
    for (uint32_t i = 0; i < f->nops; i++) {
        struct hle_frame_op *o = &f->ops[i];
        struct where w = at_op(i, o->type);
        uint64_t n, m;
        switch (o->type) {
        case HLE_FOP_STORE:
            if ((r = extent(c, &w, o->handle, "buffer", &o->dst_off, &n))) return r;
            if (o->arg % 8 || n < 8 || o->arg > n - 8)
                return fail_at(HL_E_RANGE, &w,
                               "a store at byte %llu of buffer 0x%llx (%llu bytes) lies outside the buffer "
                               "(stores are aligned u64 words inside it)",
                               (unsigned long long)o->arg, (unsigned long long)o->handle, (unsigned long long)n);
            o->dst_off += o->arg;
            if (o->dst_off > c->size - 8)
                return fail_at(HL_E_RANGE, &w, "a store at offset %llu lies outside the mapping (%llu bytes)",
                               (unsigned long long)o->dst_off, (unsigned long long)c->size);
            o->nbytes = 8;
            break;
        case HLE_FOP_COPY:
            if ((r = extent(c, &w, o->handle, "destination buffer", &o->dst_off, &n))) return r;
            if ((r = extent(c, &w, o->arg, "source buffer", &o->src_off, &m))) return r;
            if (n != m)
                return fail_at(HL_E_VALUE, &w, "size mismatch (%llu -> %llu bytes)", (unsigned long long)m,
                               (unsigned long long)n);
            o->nbytes = n;
            break;
        case HLE_FOP_PUSH: {
            if ((r = need_held(c, &w, o->handle, HL_KIND_QUEUE, "queue"))) return r;
            struct hl_qview v;
            if ((r = hle_queue_view(c, o->handle, &v))) {
                char why[256];
                snprintf(why, sizeof why, "%s", hle_errmsg());
                return fail_at(r, &w, "%s", why);
            }
            if (o->mask & ~VALUE_WORDS)
                return fail_at(HL_E_VALUE, &w, "mask 0x%x names packet words other than signal_value and wait_value",
                               o->mask);
            o->nbytes = 0;
            break;
        }
        case HLE_FOP_WAIT:
            if ((r = need_held(c, &w, o->handle, HL_KIND_TIMELINE, "timeline"))) return r;
            if (o->arg > f->nwatch || o->count > f->nwatch - o->arg)
                return fail_at(HL_E_RANGE, &w, "watch entries %llu..+%llu outside the %u of the program",
                               (unsigned long long)o->arg, (unsigned long long)o->count, f->nwatch);
            break;
        default:
            return fail_at(HL_E_VALUE, &w, "unknown op type %u", o->type);
        }
    }
    return HL_OK;
}

/* A buffer op's handles, checked again (still held: a released buffer's block
 * may be another buffer's now) and its extent against the mapping. */
static int recheck(hle_ctx *c, uint32_t i, const struct hle_frame_op *o) {
    struct where w;
    if (hle_check_handle(c, o->handle, HL_KIND_BUFFER, 1) < 0) {
        w = at_op(i, o->type);
        return fail_at(HL_E_HANDLE, &w, "buffer 0x%llx is no longer held (released?)", (unsigned long long)o->handle);
    }
    if (o->type == HLE_FOP_COPY && hle_check_handle(c, o->arg, HL_KIND_BUFFER, 1) < 0) {
        w = at_op(i, o->type);
        return fail_at(HL_E_HANDLE, &w, "buffer 0x%llx is no longer held (released?)", (unsigned long long)o->arg);
    }
    if (o->nbytes > c->size || o->dst_off > c->size - o->nbytes ||
        (o->type == HLE_FOP_COPY && o->src_off > c->size - o->nbytes)) {
        w = at_op(i, o->type);
        return fail_at(HL_E_RANGE, &w, "an extent outside the mapping (the program was not checked)");
    }
    return HL_OK;
}

/* A COPY larger than this runs unlocked (a memcpy of megabytes would hold the binding's other
 * threads off). */
#define LOCKED_COPY_MAX (64u << 10)

/* One run of a program.  It keeps the binding's lock (the GIL) until an op must block: a push
 * into a full queue, a WAIT whose timeline is not there after a locked spin of at most
 * HLE_LOCKED_SPIN_NS, a large COPY.  A frame the agents finish within that spin costs no unlock
 * and relock; the caller's hook runs at the first WAIT that finds its timeline not there yet. */
struct run {
    hle_ctx *c;
    const struct hle_frame *f;
    uint64_t frame;
    int64_t timeout, spin;
    int intr;
    int unlocked;
    void *tok;           /* hle_unlock's, once unlocked */
    int (*hook)(void *); /* the caller's (hle_frame_run_hooked), until it ran */
    void *arg;
    struct hle_frame_stop *stop;
};

static void unlock_run(struct run *x) {
    if (!x->unlocked) {
        x->tok = hle_unlock(x->c);
        x->unlocked = 1;
    }
}

/* The caller's hook, once, locked (relocked for it where the run is not). */
static void call_hook(struct run *x) {
    int (*fn)(void *) = x->hook;
    if (!fn) return;
    x->hook = NULL;
    if (x->unlocked) hle_relock(x->c, x->tok);
    hle_hook_call(x->c, fn, x->arg);
    if (x->unlocked) x->tok = hle_unlock(x->c);
}

static void call_hook_cb(void *a) { call_hook(a); }

/* A WAIT's first look, the hook, and a spin while locked: 1 when the timeline is there (or
 * failed: *w), 0 to wait unlocked (*t0: when the spin began), < 0 an error. */
static int locked_look(struct run *x, const struct hle_frame_op *o, uint64_t *w, uint64_t *t0) {
    hle_ctx *c = x->c;
    int64_t idx = hle_check_handle(c, o->handle, HL_KIND_TIMELINE, 1);
    if (idx < 0) return (int)idx;
    if ((*w = ld(&slot(c, (uint32_t)idx)->word)) >= x->frame) return 1;
    if (x->hook) {
        call_hook(x);
        if (CLOSING(c)) return hle_closed_error(c, "the domain was closed during a frame");
        /* what the hook ran may have released the timeline: look it up again */
        if ((idx = hle_check_handle(c, o->handle, HL_KIND_TIMELINE, 1)) < 0) return (int)idx;
    }
    *t0 = now_ns();
    return hle_spin_locked(&slot(c, (uint32_t)idx)->word, x->frame, x->spin, *t0, w);
}

/* One WAIT: the locked look, then slices, the watch check after each, the deadline. */
static int run_wait(struct run *x, uint32_t i) {
    hle_ctx *c = x->c;
    const struct hle_frame *f = x->f;
    const struct hle_frame_op *o = &f->ops[i];
    uint64_t w = 0, since = 0; /* (the locked spin counts toward the wait's spin and its yielding) */
    int r;
    if (!x->unlocked) {
        if ((r = locked_look(x, o, &w, &since)) < 0) return r;
        if (r > 0) {
            x->stop->word = w;
            return w > HL_TIMELINE_MAX ? HLE_FRAME_FAILED : HL_OK;
        }
        unlock_run(x);
    }
    uint64_t t0 = now_ns();
    for (;;) {
        int64_t slice = f->slice_ns > 0 ? f->slice_ns : x->timeout;
        /* (the hook, where the run was unlocked before this WAIT: after the wait's first look) */
        r = hle_wait_unlocked_hooked(c, o->handle, x->frame, slice, x->spin, &w, x->intr, &x->tok,
                                     x->hook ? call_hook_cb : NULL, x, since);
        since = 0;
        x->stop->word = w;
        if (r == HL_OK) return w > HL_TIMELINE_MAX ? HLE_FRAME_FAILED : HL_OK;
        if (r != HL_E_TIMEOUT) return r;
        for (uint64_t j = o->arg; j < o->arg + o->count; j++) {
            uint64_t ww;
            if ((r = hle_word(c, f->watch[j], &ww))) return r;
            if (ww > HL_TIMELINE_MAX) {
                x->stop->watch = (uint32_t)j;
                x->stop->word = ww;
                return HLE_FRAME_WATCH;
            }
        }
        if (x->timeout >= 0 && now_ns() - t0 > (uint64_t)x->timeout) return HL_E_TIMEOUT;
        if (f->slice_ns <= 0) return HL_E_TIMEOUT;
    }
}

/* One PUSH: a try while locked (it neither waits nor calls the interrupt hook); a full queue is
 * waited for unlocked. */
static int run_push(struct run *x, const struct hle_frame_op *o) {
    struct hl_packet p = o->packet;
    uint64_t words[8], idx;
    memcpy(words, &p, sizeof words);
    for (unsigned b = 0; b < 8; b++)
        if (o->mask & VALUE_WORDS & (1u << b)) words[b] = x->frame;
    memcpy(&p, words, sizeof p);
    if (!x->unlocked) {
        int r = hle_queue_push_unlocked(x->c, o->handle, &p, 0, &idx, 0, &x->tok);
        if (r != HL_E_QUEUE_FULL) return r;
        unlock_run(x);
    }
    return hle_queue_push_unlocked(x->c, o->handle, &p, x->timeout, &idx, x->intr, &x->tok);
}

static int run_ops(struct run *x) {
    hle_ctx *c = x->c;
    const struct hle_frame *f = x->f;
    int r;
    for (uint32_t i = 0; i < f->nops; i++) {
        const struct hle_frame_op *o = &f->ops[i];
        x->stop->op = i;
        if (CLOSING(c)) return hle_closed_error(c, "the domain was closed during a frame");
        switch (o->type) {
        case HLE_FOP_STORE:
            if ((r = recheck(c, i, o))) return r;
            /* release: a reader that sees the frame number sees what the frame wrote before
             * (the inputs: an armed GPU segment waits on such a word) */
            __atomic_store_n((uint64_t *)(c->base + o->dst_off), x->frame, __ATOMIC_RELEASE);
            break;
        case HLE_FOP_COPY:
            if ((r = recheck(c, i, o))) return r;
            if (o->nbytes > LOCKED_COPY_MAX) unlock_run(x);
            memmove(c->base + o->dst_off, c->base + o->src_off, o->nbytes);
            break;
        case HLE_FOP_PUSH:
            if ((r = run_push(x, o))) return r;
            break;
        case HLE_FOP_WAIT:
            if ((r = run_wait(x, i))) return r;
            break;
        default: {
            struct where w = at_op(i, o->type);
            return fail_at(HL_E_VALUE, &w, "unknown op type %u (the program was not checked)", o->type);
        }
        }
    }
    return HL_OK;
}

int hle_frame_run(hle_ctx *c, const struct hle_frame *f, uint64_t frame, int64_t timeout, int64_t spin,
                  struct hle_frame_stop *stop) {
    return hle_frame_run_hooked(c, f, frame, timeout, spin, NULL, NULL, stop);
}

int hle_frame_run_hooked(hle_ctx *c, const struct hle_frame *f, uint64_t frame, int64_t timeout, int64_t spin,
                         int (*before_wait)(void *), void *arg, struct hle_frame_stop *stop) {
    memset(stop, 0, sizeof *stop);
    int r = hle_need_attached(c);
    if (r) return r;
    if (frame == 0 || frame > HL_TIMELINE_MAX)
        return hle_fail(HL_E_VALUE, "a frame number is in 1..2^62-1, got %llu", (unsigned long long)frame);
    struct run x = {c, f, frame, timeout, spin, hle_interruptible(c), 0, NULL, before_wait, arg, stop};
    BUSY_ENTER(c);
    r = run_ops(&x);
    BUSY_LEAVE(c);
    if (x.unlocked) hle_relock(c, x.tok);
    return r;
}
