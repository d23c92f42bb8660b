/*
 * hostless_engine.h -- the public entry points of the hostless engine for C
 * programs (the "firmware" participant that links libhostless.a, and the
 * CPython binding).  Plain C11, no Python.
 *
 * A C program joins a domain that some participant created, creates, signals,
 * waits on and releases fences and timelines, and recovers dead participants:
 *
 *     hle_ctx *c = hle_ctx_new();
 *     int fd = open("/dev/shm/<name>", O_RDWR);
 *     if (hle_attach(c, fd, NULL, "fw", "c", 0) != HL_OK) puts(hle_errmsg());
 *     uint64_t h;
 *     hle_create(c, HL_KIND_FENCE, 0, &h);
 *     hle_signal(c, h, HL_STATUS_SUCCESS);
 *     hle_release(c, h);
 *     hle_leave(c);  hle_ctx_free(c);
 *
 * Error convention: every call returns HL_OK (0) or a negative code; the
 * HL_E_* codes of hostless.h (CORRUPT, HANDLE, ALREADY, VALUE, FAILED, FULL)
 * and the engine codes below.  A failing call leaves a human-readable message
 * for the calling thread in hle_errmsg() (valid until the thread's next
 * failing call).  A context is used by one thread at a time for its attach /
 * leave, and by any number of threads for the object calls.
 */
#ifndef HOSTLESS_ENGINE_H
#define HOSTLESS_ENGINE_H

#include <stdint.h>

#include "hostless.h"

#ifdef __cplusplus
extern "C" {
#endif

/* engine-only error codes (hostless.h owns -1..-31) */
#define HL_E_CLOSED -32      /* the context is not attached, or leave() is in progress */
#define HL_E_OOM -33         /* the shared heap cannot satisfy the allocation (or there is no heap) */
#define HL_E_TIMEOUT -34     /* a wait reached its timeout: not a failure of the object */
#define HL_E_INTR -35        /* the interrupt hook stopped a blocking wait (Python: a signal handler raised) */
#define HL_E_QUEUE_FULL -36  /* a queue stayed full for the whole timeout */
#define HL_E_INVALID -37     /* the operation does not apply (merged fence signaled, queue not bound, ...) */
#define HL_E_TABLE_FULL -38  /* the fence or participant table has no free slot */
#define HL_E_LOCKED -39      /* the shared heap lock is kept by a live participant for too long */
#define HL_E_OS -40          /* a system call failed: hle_errno() has its errno */
#define HL_E_NOMEM -41       /* local (process) memory is exhausted */
#define HL_E_RANGE -42       /* an index argument is out of range */
#define HL_E_EXISTS -43      /* a name is published already (for another object) */
#define HL_E_NOT_FOUND -44   /* no live object has that name */

typedef struct hle_ctx hle_ctx;

/* The message of the calling thread's last failing call ("" if none). */
const char *hle_errmsg(void);
/* errno of the last HL_E_OS of the calling thread. */
int hle_errno(void);

/* Allocate / free a detached context (NULL when out of memory).  Free only a
 * context that is detached (after hle_leave or a failed hle_attach). */
hle_ctx *hle_ctx_new(void);
void hle_ctx_free(hle_ctx *c);

/* Parameters of a domain to initialise (hle_attach with init != NULL). */
struct hle_init {
    uint64_t fences, participants, queues_size, trace_size, heap_size, tag, poll_ns;
};

/* Map the domain file `fd` (initialising it first when init != NULL: the file
 * must be fresh and zero, of the size hle_layout computes), validate it once
 * (the private view is never re-read), and join: take a free participant
 * slot with its liveness lock (when the table is full, dead participants are
 * recovered first).  label / kind are recorded in the participant slot.  When
 * watchdog_ns != 0 a thread reaps dead participants, sweeps merges and
 * retries deferred frees every watchdog_ns.  On success the context owns fd
 * (hle_leave closes it).
 * Returns HL_OK; HL_E_OS (fstat / mmap failed); HL_E_CORRUPT (size does not
 * match the layout, or not a valid domain of this ABI); HL_E_NOMEM;
 * HL_E_TABLE_FULL (no free participant slot); HL_E_INVALID (already attached). */
int hle_attach(hle_ctx *c, int fd, const struct hle_init *init, const char *label, const char *kind,
               uint64_t watchdog_ns);

/* Leave: wait for this process's threads to leave their GIL-free loops, stop
 * the watchdog, recover ourselves (every reference dropped, owned ACTIVE
 * fences become OWNER_DIED), free our slot, unlock, unmap, close the fd.
 * Always HL_OK (a detached context is left as it is). */
int hle_leave(hle_ctx *c);

/* Create a fence (HL_KIND_FENCE) or timeline (HL_KIND_TIMELINE) with one
 * reference held by us.  owner 0: we own it; else an owner code
 * (HL_OWNER(inc, index)) of a live participant, whose death fails it.
 * Returns HL_OK with *handle; HL_E_CLOSED; HL_E_VALUE (kind, dead or unknown
 * owner); HL_E_TABLE_FULL. */
int hle_create(hle_ctx *c, uint32_t kind, uint32_t owner, uint64_t *handle);

/* Take one more reference on an object created elsewhere (want_kind 0: any
 * kind; HL_KIND_FENCE accepts merged fences).  Waits (bounded, 2 s) while
 * its last holder is releasing it.  Returns HL_OK; HL_E_CLOSED; HL_E_HANDLE
 * (foreign, stale, forged, wrong kind). */
int hle_import(hle_ctx *c, uint64_t handle, uint32_t want_kind);

/* Drop one of our references; the last holder's drop frees the object (a
 * fence still ACTIVE is completed with CANCEL first).  Returns HL_OK;
 * HL_E_CLOSED; HL_E_HANDLE (not held by us). */
int hle_release(hle_ctx *c, uint64_t handle);

/* Complete a fence we hold with `status` (HL_STATUS_SUCCESS, ERROR, CANCEL,
 * OWNER_DIED or 64..2^32-1): one CAS of the word from 0, then the futex
 * wake, then the merged parents are told.  Returns HL_OK; HL_E_CLOSED;
 * HL_E_HANDLE; HL_E_INVALID (a merged fence); HL_E_VALUE (bad status);
 * HL_E_ALREADY (completed before); HL_E_CORRUPT (the word holds garbage). */
int hle_signal(hle_ctx *c, uint64_t handle, uint64_t status);

/* Advance a timeline we hold to `value` (it only grows).  Returns HL_OK;
 * HL_E_CLOSED; HL_E_HANDLE; HL_E_VALUE (value > 2^62-1 or not greater than
 * the current one); HL_E_ALREADY (the timeline has failed). */
int hle_timeline_signal(hle_ctx *c, uint64_t handle, uint64_t value);

/* Wait until the object's completion word >= threshold (fence: 1; timeline:
 * a value; a failed timeline wakes every waiter).  Spins for spin_ns, then
 * sleeps on the futex in bounded slices.  timeout_ns < 0: forever.
 * Returns HL_OK with *word; HL_E_TIMEOUT (with *word = the last value read);
 * HL_E_CLOSED (the domain was closed during the wait); HL_E_CORRUPT (the file
 * was truncated); HL_E_HANDLE; HL_E_INTR (the interrupt hook said stop). */
int hle_wait(hle_ctx *c, uint64_t handle, uint64_t threshold, int64_t timeout_ns, int64_t spin_ns, uint64_t *word);

/* Check every other participant; recover the dead ones (their fences and
 * timelines fail with OWNER_DIED, their references are dropped, their queue
 * cells are skipped), then sweep merged fences.  Works attached, or merely
 * mapped.  Writes recovered ids ((incarnation << 8) | index) into out (up to
 * outcap) and returns how many (>= 0), or HL_E_CLOSED. */
int hle_reap(hle_ctx *c, uint64_t *out, int outcap);

/* ---- the name table (names.c; layout in hostless_layout.h) ----
 * Publish `handle` (a live fence, timeline, buffer or queue) under `name`
 * (n bytes, 1..HL_NAME_MAX-1, no NUL).  The entry holds no reference and
 * dies with the object.  Publishing the same object again is a no-op;
 * `replace` rebinds a name held by another object.  Returns HL_OK;
 * HL_E_CLOSED; HL_E_VALUE (name); HL_E_HANDLE (not a live object);
 * HL_E_EXISTS (another live object has the name; *existing gets its handle);
 * HL_E_TABLE_FULL; HL_E_LOCKED (a live writer kept the table lock > 1 s). */
int hle_name_publish(hle_ctx *c, const char *name, size_t n, uint64_t handle, int replace, uint64_t *existing);
/* Remove the entries named `name` (only the one of `handle` when it is not 0).
 * HL_OK; HL_E_CLOSED; HL_E_VALUE; HL_E_NOT_FOUND; HL_E_LOCKED. */
int hle_name_remove(hle_ctx *c, const char *name, size_t n, uint64_t handle);
/* The handle of the live object named `name` (no lock: a seqlock read).
 * HL_OK with *handle; HL_E_CLOSED; HL_E_VALUE; HL_E_NOT_FOUND.  The object
 * may die right after: import the handle to hold it (that checks again). */
int hle_name_lookup(hle_ctx *c, const char *name, size_t n, uint64_t *handle);
/* Call visit(ctx, name, handle) for each live entry; a nonzero return stops
 * (a negative one is returned).  Returns the count seen, or HL_E_CLOSED. */
int hle_name_list(hle_ctx *c, int (*visit)(void *ctx, const char *name, uint64_t handle), void *ctx);
/* The table's change counter (bumped after every publish and remove; a
 * futex word: hl_names.seq). */
uint32_t hle_name_seq(hle_ctx *c);


/* ---- the native agent loop (agent.c, kernels.c) ----
 * hle_agent_run serves one queue as its consumer, in C, until a STOP packet,
 * cfg->should_stop() returning nonzero (asked while idle, every 64 packets
 * and between the slices of an input wait), or the domain closing.  It follows the rule of
 * hostless.agents.loop (a bad packet fails alone with ERROR; a failed input
 * passes its status on without running the work; the follow-ups of a failed
 * packet fail too, at most HLE_AGENT_FAIL_DEPTH deep and HLE_AGENT_FAIL_BUDGET
 * signals; input waits bounded by wait_timeout_ns; follow-up pushes share a
 * deadline of follow_timeout_ns, a push into the own queue never waits and a
 * chain through it is cut after HLE_AGENT_HOP_LIMIT hops).  Every count of an
 * argument block is checked against the block's size by subtraction; every
 * handle is imported with its kind and generation checked; a buffer's
 * metadata must agree with its size.  KERNEL packets whose kernel id is in the
 * C table (hle_agent_kernel) run with no callback; any other KERNEL and every
 * ERT packet goes to cfg->python_kernel (NULL: they fail with ERROR).
 * cfg->record (may be NULL) is told why a packet failed in C.
 * The calling thread must be the only user of the context's blocking calls
 * while it runs (its GIL hooks must be unset: the loop never relocks).
 * Returns HL_OK (STOP or should_stop); HL_E_CLOSED / HL_E_CORRUPT (the domain
 * closed or was truncated); HL_E_HANDLE / HL_E_INVALID (the queue cannot be
 * held or bound). */
#define HLE_AGENT_HOP_LIMIT 64
#define HLE_AGENT_FAIL_DEPTH 16
#define HLE_AGENT_FAIL_BUDGET 256
struct hl_packet;
struct hle_agent_cfg {
    int64_t spin_ns;           /* doorbell spin before parking on the futex */
    int64_t wait_timeout_ns;   /* bound on a packet's input waits (< 0: none) */
    int64_t follow_timeout_ns; /* shared deadline of one packet's follow-up pushes */
    void *ud;                  /* passed to the callbacks */
    int (*should_stop)(void *ud);
    /* Run packet idx (a KERNEL not in the C table, or an ERT packet); returns
     * an HL_STATUS_* (SUCCESS or the failure status). */
    uint64_t (*python_kernel)(void *ud, uint64_t idx, const struct hl_packet *p);
    void (*record)(void *ud, uint64_t signal, const char *why);
    uint32_t c_kernels;         /* bit i: C kernel i may run (0: none; a user kernel of that id wins) */
    uint64_t packets, failures; /* out: packets run, packets failed and follow-ups dropped */
};
int hle_agent_run(hle_ctx *c, uint64_t queue, struct hle_agent_cfg *cfg);

/* The C kernel table: 1 when `kernel` is a built-in C kernel id. */
int hle_agent_has_kernel(uint32_t kernel);

/* ---- joining by path, queues, buffers, records (open.c, queue.c, records.c) ----
 * Open the domain file at `path` (no symbolic link followed; a regular file
 * of this user), wait up to ready_timeout_ns (< 0: forever) for its creator
 * to finish initialising it, then hle_attach it (label, kind, watchdog_ns as
 * there).  What Domain.open does from Python.  Returns HL_OK; HL_E_OS (cannot
 * open it: hle_errno() has the errno, ENOENT when there is no such domain);
 * HL_E_CORRUPT (not a regular file, not a hostless domain, never ready, or
 * what hle_attach finds); HL_E_INVALID (another user's file); the codes of
 * hle_attach.  On failure the file is closed and c stays detached. */
int hle_open(hle_ctx *c, const char *path, const char *label, const char *kind, uint64_t watchdog_ns,
             int64_t ready_timeout_ns);

/* Whether the context is still usable: HL_OK; HL_E_CLOSED (detached or
 * leaving); HL_E_CORRUPT (the file was truncated under the mapping: every
 * later call fails, leave it).  The message says which. */
int hle_usable(hle_ctx *c);

/* Become the consumer of queue h (which we hold): free, ours already, or its
 * consumer is dead.  HL_OK; HL_E_HANDLE (not a live queue we hold);
 * HL_E_CORRUPT (its header is garbage); HL_E_INVALID (a live consumer). */
int hle_queue_bind(hle_ctx *c, uint64_t h);

/* Allocate a buffer of nbytes from the shared heap, described for importers
 * by dtype (NumPy's dtype.str, e.g. "<f4", "|u1"), itemsize, ndim and shape
 * (whose product times itemsize must be nbytes).  We hold one reference
 * (hle_release frees it); *data points at its bytes (not zeroed).  HL_OK;
 * HL_E_CLOSED; HL_E_VALUE (description); HL_E_OOM; HL_E_TABLE_FULL; HL_E_LOCKED. */
int hle_buffer_new(hle_ctx *c, uint64_t nbytes, const char *dtype, uint32_t itemsize, uint32_t ndim,
                   const uint64_t *shape, uint64_t *handle, void **data);

/* Failure records (hostless.records' layout): the why of a failed fence or
 * timeline, as text in a "|u1" buffer published as "!error:<handle in hex>"
 * (replacing an older record of the same handle), read from Python with
 * hostless.records.read.  A writer keeps its last HLE_RECORD_KEEP records
 * alive (older ones are released and their names die with them); texts are
 * cut at HLE_RECORD_MAX bytes.  hle_record_write returns HL_OK, HL_E_VALUE
 * (handle 0), or the codes of hle_buffer_new / hle_name_publish (the failure
 * then keeps its status alone).  hle_records_close releases every record.
 * One struct hle_records per writer thread, zero-initialised. */
#define HLE_RECORD_KEEP 8
#define HLE_RECORD_MAX 4000
struct hle_records {
    uint64_t kept[HLE_RECORD_KEEP];
    uint32_t n, next;
};
int hle_record_write(hle_ctx *c, struct hle_records *rec, uint64_t handle, const char *text);
void hle_records_close(hle_ctx *c, struct hle_records *rec);

/* A named trace record (hostless.trace's convention: HL_EV_USER with
 * a = "HL" magic | type, b = key, c..e = the first 24 bytes of text, cut at a
 * character boundary).  type 1 (HLE_TRACE_JOIN, key = participant id, text =
 * "label (kind)") names this participant's track after it left.  Nothing
 * when the domain has no trace ring. */
#define HLE_TRACE_JOIN 1u
void hle_trace_user(hle_ctx *c, uint32_t type, uint64_t key, const char *text);

/* Our participant index (-1 when detached) and our owner code. */
int hle_me(const hle_ctx *c);
uint32_t hle_owner_code(const hle_ctx *c);

#ifdef __cplusplus
}
#endif
#endif /* HOSTLESS_ENGINE_H */
