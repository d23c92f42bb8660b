/*
 * ctx.c -- the engine context: errors (the per-thread detail buffer), the
 * layout of a new domain, attach (map, initialise, validate once, join),
 * leave (recover ourselves), and the small accessors.
 */
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static __thread char tls_msg[1024];
static __thread int tls_errno;

int hle_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_msg, sizeof tls_msg, fmt, ap);
    va_end(ap);
    return code;
}

int hle_version_fail(const char *path, unsigned found) {
    const int older = found < HL_ABI_VERSION;
    return hle_fail(HL_E_VERSION,
                    "%s is a hostless domain of ABI version %u, %s than this hostless (ABI version %u): "
                    "it cannot be joined.  Open it with a hostless release of ABI version %u (CHANGELOG.md "
                    "lists each release's ABI version), or, once the processes using it have stopped, remove "
                    "its file (Domain.unlink(name), or rm; hostless gc leaves other versions alone) and "
                    "create it again with this one",
                    path, found, older ? "older" : "newer", HL_ABI_VERSION, found);
}

int hle_fail_errno(int err) {
    tls_errno = err;
    snprintf(tls_msg, sizeof tls_msg, "%s", strerror(err));
    return HL_E_OS;
}

const char *hle_errmsg(void) { return tls_msg; }
int hle_errno(void) { return tls_errno; }

int hle_closed_error(hle_ctx *c, const char *msg) {
    if (TRUNCATED(c)) return hle_fail(HL_E_CORRUPT, TRUNCATED_MSG);
    return hle_fail(HL_E_CLOSED, "%s", msg);
}

int hle_need_attached(hle_ctx *c) {
    if (!c->base || c->me < 0) return hle_fail(HL_E_CLOSED, "domain is closed");
    if (TRUNCATED(c)) return hle_fail(HL_E_CORRUPT, TRUNCATED_MSG);
    return HL_OK;
}

void hle_ctx_init(hle_ctx *c) {
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->me = -1;
    c->rec_busy = -1;
    pthread_mutex_init(&c->wd_mu, NULL);
    pthread_mutex_init(&c->reap_mu, NULL);
    pthread_mutex_init(&c->defer_mu, NULL);
    pthread_cond_init(&c->wd_cv, NULL);
}

void hle_ctx_destroy(hle_ctx *c) {
    hle_unmap(c);
    pthread_mutex_destroy(&c->wd_mu);
    pthread_mutex_destroy(&c->reap_mu);
    pthread_mutex_destroy(&c->defer_mu);
    pthread_cond_destroy(&c->wd_cv);
}

hle_ctx *hle_ctx_new(void) {
    hle_ctx *c = malloc(sizeof *c);
    if (c) hle_ctx_init(c);
    return c;
}

void hle_ctx_free(hle_ctx *c) {
    if (!c) return;
    hle_ctx_destroy(c);
    free(c);
}

int hle_me(const hle_ctx *c) { return c->me; }
uint32_t hle_owner_code(const hle_ctx *c) { return HL_OWNER(c->inc, c->me); }

void hle_unmap(hle_ctx *c) {
    hle_stop_watchdog(c);
    if (c->base) hle_guard_remove(c);
    if (c->base) munmap(c->base, c->size);
    c->base = NULL;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->lrefs);
    free(c->lgen);
    c->lrefs = c->lgen = NULL;
    c->me = -1;
}

int hle_layout(uint64_t fences, uint64_t parts, uint64_t qsize, uint64_t tsize, uint64_t hsize,
                          struct hl_header *h) {
    memset(h, 0, sizeof *h);
    h->magic = HL_MAGIC;
    h->abi_version = HL_ABI_VERSION;
    h->header_size = HL_HEADER_SIZE;
    h->participant_size = HL_PARTICIPANT_SIZE;
    h->participant_capacity = (uint32_t)parts;
    h->fence_size = HL_FENCE_SIZE;
    h->fence_capacity = (uint32_t)fences;
    uint64_t off = HL_HEADER_SIZE;
    h->participants_offset = off;
    off = ALIGN_UP(off + parts * HL_PARTICIPANT_SIZE, HL_PAGE);
    h->fences_offset = off;
    off = ALIGN_UP(off + fences * HL_FENCE_SIZE, HL_PAGE);
    h->queues_offset = off;
    h->queues_size = ALIGN_UP(qsize, HL_PAGE);
    off += h->queues_size;
    h->trace_offset = off;
    h->trace_size = ALIGN_UP(tsize, HL_PAGE);
    off += h->trace_size;
    h->heap_offset = off;
    if (hsize) {
        uint64_t bo, g, dof, region;
        hle_heap_layout(hsize, &bo, &g, &dof, &region);
        h->heap_size = region;
    } else {
        h->heap_size = 0;
    }
    off += h->heap_size;
    h->devheap_offset = off;
    h->total_size = off;
    return 0;
}

int hle_layout_init(const struct hle_init *in, struct hl_header *h, uint64_t *dev_bitmap) {
    uint32_t n = in->ndev < HL_MAX_DEVICE_HEAPS ? in->ndev : HL_MAX_DEVICE_HEAPS;
    int meta = n && !in->heap_size; /* the device buffers' metadata needs a heap */
    hle_layout(in->fences, in->participants, in->queues_size, in->trace_size, meta ? HL_DEVICE_META_HEAP : in->heap_size, h);
    if (!n) return 0;
    if (meta) h->flags |= HL_FLAG_META_HEAP;
    uint64_t r = (uint64_t)n * HL_DEVHEAP_SIZE;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t g = ALIGN_UP(in->dev_size[i], HL_DEVICE_ALIGN) / HL_DEVICE_GRANULE;
        if (dev_bitmap) dev_bitmap[i] = r;
        r += (g + 63) / 64 * 8;
    }
    h->devheap_count = n;
    h->devheap_size = ALIGN_UP(r, HL_PAGE);
    h->total_size = h->devheap_offset + h->devheap_size;
    return 0;
}

uint64_t hle_proc_start_time(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    /* field 3 starts at p+2; start_time is field 22 */
    int field = 2;
    for (; *p && field < 22; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

/* Contract in hostless_engine.h. */
int hle_attach(hle_ctx *c, int fd, const struct hle_init *init, const char *label, const char *kind,
               uint64_t wd_ns) {
    if (c->base) return hle_fail(HL_E_INVALID, "core already attached");
    struct stat sb;
    if (fstat(fd, &sb) != 0) return hle_fail_errno(errno);
    size_t size = (size_t)sb.st_size;
    if (init) {
        struct hl_header hh;
        uint64_t dev_bm[HL_MAX_DEVICE_HEAPS];
        hle_layout_init(init, &hh, dev_bm);
        uint64_t hs = (hh.flags & HL_FLAG_META_HEAP) ? HL_DEVICE_META_HEAP : init->heap_size;
        if (hh.total_size != size)
            return hle_fail(HL_E_CORRUPT, "file size %zu does not match layout size %llu", size,
                            (unsigned long long)hh.total_size);
        void *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (b == MAP_FAILED) return hle_fail_errno(errno);
        hh.tag = (uint32_t)init->tag;
        hh.poll_ns = init->poll_ns;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        hh.created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        hh.ready = 0;
        memcpy(b, &hh, sizeof hh); /* tables are zero (fresh file): FREE everywhere */
        if (hh.trace_size >= 128) {
            struct hl_trace *tr = (struct hl_trace *)((char *)b + hh.trace_offset);
            tr->capacity = (hh.trace_size - 64) / 64;
            tr->magic = HL_TRACE_MAGIC;
        }
        if (hs) {
            struct hl_heap *hp = (struct hl_heap *)((char *)b + hh.heap_offset);
            uint64_t region;
            hle_heap_layout(hs, &hp->bitmap_offset, &hp->granules, &hp->data_offset, &region);
            hp->data_size = hp->granules * HL_GRANULE;
            hp->magic = HL_HEAP_MAGIC;
        }
        for (uint32_t i = 0; i < hh.devheap_count; i++) {
            struct hl_devheap *dh = (struct hl_devheap *)((char *)b + hh.devheap_offset + (uint64_t)i * HL_DEVHEAP_SIZE);
            dh->device_kind = HL_DEVICE_CUDA;
            dh->device_ordinal = init->dev_ordinal[i];
            dh->granule = HL_DEVICE_GRANULE;
            dh->granules = ALIGN_UP(init->dev_size[i], HL_DEVICE_ALIGN) / HL_DEVICE_GRANULE;
            dh->size = dh->granules * HL_DEVICE_GRANULE;
            dh->bitmap_offset = dev_bm[i];
            dh->magic = HL_DEVHEAP_MAGIC;
        }
        __atomic_store_n(&((struct hl_header *)b)->ready, 1, __ATOMIC_SEQ_CST);
        c->base = (char *)b;
    } else {
        if (size < HL_HEADER_SIZE)
            return hle_fail(HL_E_CORRUPT, "domain file is %zu bytes, smaller than a header", size);
        void *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (b == MAP_FAILED) return hle_fail_errno(errno);
        c->base = (char *)b;
    }
    c->size = size;
    c->fd = fd;
    c->truncated = 0;
    if (hle_guard_add(c) != HL_OK) { /* from the first read of the mapping on; never unguarded */
        munmap(c->base, size);
        c->base = NULL;
        c->fd = -1;
        return HL_E_NOMEM; /* hle_guard_add said why */
    }
    c->h = (struct hl_header *)c->base;
    /* validate once; from here on only the private view c->dv is used */
    if (__atomic_load_n(&c->h->ready, __ATOMIC_ACQUIRE) != 1 || hl_attach(&c->dv, c->base, size) != HL_OK) {
        const struct hl_header *h = c->h;
        char why[160];
        unsigned found = h->abi_version;
        if (h->magic == HL_MAGIC && found != HL_ABI_VERSION) { /* magic and abi_version never move */
            hle_guard_remove(c);
            munmap(c->base, size);
            c->base = NULL;
            c->fd = -1;
            return hle_version_fail("the domain", found);
        }
        if (h->magic != HL_MAGIC)
            snprintf(why, sizeof why, "bad magic 0x%llx", (unsigned long long)h->magic);
        else if (h->ready != 1)
            snprintf(why, sizeof why, "creator has not finished initialising it");
        else if (hl_domain_validate(c->base, size) == HL_OK)
            snprintf(why, sizeof why, "the heap header or a device-heap descriptor is inconsistent");
        else
            snprintf(why, sizeof why, "header sizes or offsets do not match a %zu-byte domain", size);
        hle_guard_remove(c);
        munmap(c->base, size);
        c->base = NULL;
        c->fd = -1;
        return hle_fail(HL_E_CORRUPT, "not a valid hostless domain: %s", why);
    }
    c->parts = c->dv.parts;
    c->fences = c->dv.fences;
    c->cap = c->dv.fence_capacity;
    c->pcap = c->dv.participant_capacity;
    c->tag = c->dv.tag;
    c->poll_ns = c->dv.poll_ns; /* within [HL_POLL_MIN_NS, HL_POLL_MAX_NS] */
    c->trace = c->dv.trace;
    c->meta_heap = (__atomic_load_n(&c->h->flags, __ATOMIC_RELAXED) & HL_FLAG_META_HEAP) != 0; /* read once */
    c->trace_cap = c->dv.trace_capacity;
    c->lrefs = calloc(c->cap, sizeof(uint32_t));
    c->lgen = calloc(c->cap, sizeof(uint32_t));
    if (!c->lrefs || !c->lgen) {
        hle_unmap(c);
        return hle_fail(HL_E_NOMEM, "out of memory");
    }
    /* join: lock byte i first, then claim slot i; the lock is our liveness.
     * Pass 0 takes only slots whose lock it gets; pass 1 (no such slot) also
     * slots whose byte a reader's read lock keeps us off: we join without the
     * lock, flagged HL_PART_FLAG_PIDLIVE, and are judged by our pid
     * (liveness.c); a later reap takes the lock when the reader is gone. */
    pid_t pid = getpid();
    for (int round = 0; round < 2 && c->me < 0; round++) {
        for (int pass = 0; pass < 2 && c->me < 0; pass++) {
            for (uint32_t i = 0; i < c->pcap; i++) {
                uint64_t pc = ld(&c->parts[i].ctl);
                if (HL_PCTL_STATE(pc) != HL_PART_FREE) continue;
                int locked = hle_take_lock(fd, (int)i) == 0;
                if (!locked && (pass == 0 || hle_lock_state(fd, (int)i) != F_RDLCK)) continue;
                uint32_t inc = HL_PCTL_INC(pc) + 1;
                if (!cas(&c->parts[i].ctl, &pc, HL_PCTL(inc, 0, HL_PART_ALIVE))) {
                    if (locked) hle_drop_lock(fd, (int)i);
                    continue;
                }
                struct hl_participant *p = &c->parts[i];
                /* pid last: 0 (cleared when the slot was freed) reads as "joining" */
                __atomic_store_n(&p->start_time, hle_proc_start_time(pid), __ATOMIC_SEQ_CST);
                __atomic_store_n(&p->flags, locked ? 0u : HL_PART_FLAG_PIDLIVE, __ATOMIC_SEQ_CST);
                __atomic_store_n(&p->pid, (uint32_t)pid, __ATOMIC_SEQ_CST);
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                p->joined_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
                memset(p->label, 0, sizeof p->label);
                strncpy(p->label, label, sizeof p->label - 1);
                memset(p->kind, 0, sizeof p->kind);
                strncpy(p->kind, kind, sizeof p->kind - 1);
                c->me = (int)i;
                c->mybit = 1ull << i;
                c->inc = inc;
                break;
            }
        }
        if (c->me < 0 && round == 0) {
            /* full: maybe some participants are dead */
            uint64_t ids[HL_MAX_PARTICIPANTS];
            void *tok = hle_unlock(c);
            hle_reap_all(c, ids, HL_MAX_PARTICIPANTS);
            hle_relock(c, tok);
        }
    }
    if (c->me < 0) {
        hle_guard_remove(c);
        munmap(c->base, c->size);
        c->base = NULL;
        c->fd = -1;
        free(c->lrefs);
        free(c->lgen);
        c->lrefs = c->lgen = NULL;
        return hle_fail(HL_E_TABLE_FULL, "domain has no free participant slot (capacity %u)", c->pcap);
    }
    if (wd_ns) hle_start_watchdog(c, wd_ns);
    return HL_OK;
}

/* Contract in hostless_engine.h. */
int hle_leave(hle_ctx *c) {
    if (!c->base) return HL_OK;
    __atomic_store_n(&c->closing, 1, __ATOMIC_SEQ_CST);
    void *tok = hle_unlock(c);
    /* threads of this process inside GIL-free loops notice `closing` within
     * one bounded sleep; the mapping must outlive them */
    int mine = hle_tls_hook_ctx == c ? hle_tls_hook_depth : 0; /* called from a signal handler inside our wait */
    while (__atomic_load_n(&c->busy, __ATOMIC_SEQ_CST) > mine) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    hle_relock(c, tok);
    hle_stop_watchdog(c);
    if (c->me >= 0 && !__atomic_load_n(&c->truncated, __ATOMIC_SEQ_CST)) {
        int me = c->me;
        uint64_t pc = ld(&c->parts[me].ctl);
        uint64_t claimed = HL_PCTL(HL_PCTL_INC(pc), (uint32_t)me, HL_PART_RECOVERING);
        if (cas(&c->parts[me].ctl, &pc, claimed)) {
            tok = hle_unlock(c);
            hle_recover_participant(c, me, claimed, HL_STATUS_OWNER_LEFT); /* leaving is not dying */
            hle_relock(c, tok);
        }
        hle_drop_lock(c->fd, me);
    }
    hle_unmap(c);
    return HL_OK;
}

void hle_abandon(hle_ctx *c) {
    c->wd_running = 0; /* the thread does not exist in a forked child */
    if (c->base) hle_guard_remove(c);
    if (c->base) munmap(c->base, c->size);
    c->base = NULL;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->me = -1;
}
