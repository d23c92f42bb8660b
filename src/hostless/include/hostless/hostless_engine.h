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

/* the error codes (HL_E_CLOSED, HL_E_OOM, ... and the ABI's) are in hostless_errors.h */

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
    /* device heaps (ABI 4): ndev <= HL_MAX_DEVICE_HEAPS, each of dev_size bytes
     * (rounded up to HL_DEVICE_ALIGN) on CUDA device dev_ordinal */
    uint32_t ndev;
    uint32_t dev_ordinal[HL_MAX_DEVICE_HEAPS];
    uint64_t dev_size[HL_MAX_DEVICE_HEAPS];
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
 * fences become OWNER_LEFT and owned timelines fail with OWNER_LEFT: leaving
 * is not dying, ABI 6), free our slot, unlock, unmap, close the fd.
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

/* The status a wait for point `value` of a timeline we hold ends with, given
 * the word it returned (hl_point_status): SUCCESS when the value was reached,
 * also before a failure (a point reached stays reached, ABI 6), else the
 * failure's status.  Returns HL_OK with *status; HL_E_CLOSED; HL_E_HANDLE. */
int hle_point_status(hle_ctx *c, uint64_t handle, uint64_t value, uint64_t word, uint32_t *status);

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
 * and between the slices of an input wait), or the domain closing.  It is
 * the command processor of every cpu and npu agent (hostless.agents.native,
 * hostless-agent); the cuda agent's loop in Python (hostless.agents.loop)
 * follows the same rule.
 *
 * THE RULE ON BAD PACKETS (every agent's contract; stated here only):
 * - A bad packet fails alone: it never stops the agent and never wedges it.
 *   Bad is: an unknown type; a signal handle that is not a fence or timeline
 *   the agent can import (wrong kind, merged, stale, forged) or a timeline
 *   signal value above HL_TIMELINE_MAX (2**62 - 1); a wait handle that is not
 *   a fence, merged fence or timeline the agent can import, or a timeline
 *   wait value above HL_TIMELINE_MAX; an input that completes with a word that is not a final
 *   status (ACTIVE, 5, ...); a missing, malformed or wrong-kind argument block
 *   or buffer handle (every count and offset is checked against the block by
 *   subtraction before it is read; a buffer's metadata must agree with its
 *   size); an unknown kernel id or CU; a malformed ERT command buffer (header
 *   count past the buffer, a cu_mask naming no CU or several, argument counts
 *   past the payload, a chained command that is itself a CMD_CHAIN, an
 *   unsupported opcode); a kernel that fails (a C kernel's error, a Python
 *   kernel that raises); a LOAD_KERNEL packet (code is loaded only through
 *   the spawner's private channel, hostless.agents.control: the Python
 *   callback refuses it with a record, and nothing is imported).  Nothing of
 *   a bad packet runs (a wait that fails does not run the work), and it is
 *   finished with ERROR (a failed input passes its own failure status on
 *   instead).  cfg->record is told why (hostless.records keeps it for the
 *   packet's signal).
 * - Finishing with a failure: a fence signal gets the status; a timeline
 *   signal is *failed* with it (sticky: every waiter of every later point
 *   wakes with the failure), because its point will never be reached.  A
 *   signal handle that cannot be signaled (wrong kind, stale) is left alone.
 *   A timeline that is already at or past signal_value when a successful
 *   packet finishes is left as it is (several producers may race on one
 *   timeline).  The signals of the follow-up packets that will now never run
 *   are failed with the same status (recursively, at most
 *   HLE_AGENT_FAIL_DEPTH levels and HLE_AGENT_FAIL_BUDGET signals per
 *   packet), so nobody waits for them forever.
 * - A respawned agent (one that binds the queue of a dead consumer,
 *   hle_queue_bind) does not run what was queued for the dead one: every
 *   packet below the write index its bind found (hle_queue_stale_below) fails
 *   unrun, a STOP included, its signal and its follow-ups' with OWNER_DIED; a
 *   packet pushed after the takeover runs.
 * - Input waits are bounded: a packet whose inputs have not completed within
 *   wait_timeout_ns (< 0: none; spawn's wait_timeout, default 60 s) fails with
 *   ERROR and a record saying so.  Waits are taken in slices of 50 ms,
 *   between which should_stop is asked (SIGTERM, the spawner's death).
 * - Follow-up pushes are bounded: the follow-ups of one packet share a
 *   deadline of follow_timeout_ns for queues of other consumers; a push into
 *   the agent's own queue never waits (only this agent frees its cells).  A
 *   chain of follow-ups through the agent's own queue is cut after
 *   HLE_AGENT_HOP_LIMIT hops (a packet that re-enqueues itself runs at most
 *   1 + HLE_AGENT_HOP_LIMIT times).  A follow-up that cannot be pushed (full
 *   until the deadline, its queue handle of the wrong kind, stale, its
 *   consumer dead, or past the hop limit) is dropped and its own signal (and
 *   those of the follow-ups nested in it) fails with ERROR; the packet that
 *   carried it has already finished with its own status (its work did
 *   complete).  A cycle through several agents' queues is not cut (a packet
 *   carries no hop count).
 * - Trace: START when a packet is taken, END (with its status) when it is
 *   finished, when the domain has a trace ring.
 * The pure parts of these checks (the kinds a packet may signal or wait on,
 * timeline points, the status an input's final word passes on) are
 * hostless_ops.h's hl_signal_kind_ok, hl_wait_kind_ok, hl_point_ok and
 * hl_input_status, which the GPU command processor (gpucp.cu) applies too.
 * The cuda agent makes the same checks before it enqueues any stream wait;
 * its waits and follow-up pushes then run on the GPU (a stream wait is not
 * bounded by wait_timeout; a device push into a queue that stays full gives
 * up after a bounded spin without failing the follow-up's signal).
 *
 * Kernels: ids (KERNEL packets) and CU indices (ERT commands) below
 * HLE_AGENT_MAX_CUS share one table, as the Python agents' do (an npu agent's
 * KERNEL packet names a CU index): kernel_map[i] is the built-in C kernel
 * (HL_K_*) of id / CU i, 0 for none; `present` bit i says id / CU i exists
 * at all (a C or a Python kernel).  A table left all zero is filled from
 * `kind`: HLE_AGENT_CPU maps id i to HL_K_i for each bit i of c_kernels;
 * HLE_AGENT_NPU loads the emulated NPU's xclbin (hle_agent_npu_cus).
 * KERNEL packets whose id maps to a C kernel run with no callback; any other
 * KERNEL goes to cfg->python_kernel (NULL: it fails with ERROR).  ERT packets
 * are decoded and run in C (START_CU, START_NPU, CMD_CHAIN; states written
 * back into the command's header word); a CU without a C kernel, or whose C
 * kernel does not take those dtypes, runs through cfg->python_cu (NULL: the
 * command fails with ERROR).  A malformed command (header count past its
 * buffer, a cu_mask naming no CU or several, a CU not in the table, argument
 * words that do not match their counts, a chained command out of its payload
 * or itself a CMD_CHAIN, an unsupported opcode) fails its packet with ERROR,
 * its state ERROR.
 * GEMM (HL_K_GEMM, f32) runs through a CBLAS sgemm dlopen'ed at agent start
 * from cfg->blas_path (OpenBLAS: `scipy_cblas_sgemm` of the scipy-openblas32
 * wheel, or a plain `cblas_sgemm`); without it GEMM is not a C kernel and
 * goes to the Python callback (cfg->blas_loaded says which, cfg->blas_why why).
 * Doorbell: spin at most spin_ns before parking on the futex, scaled by the
 * recent wait for a packet (a running average): 4x that wait, at least
 * 20 us, at most spin_ns, while the average is below max(spin_ns, 1 ms)
 * (a parked pop's wait includes its wake-up); park at once when packets
 * come rarer than that, and after every idle slice; cfg->fixed_spin = 1
 * always spins spin_ns.  An agent idle for HLE_AGENT_IDLE_AFTER_NS sleeps up
 * to cfg->idle_nap_ns at a time (when longer than the domain's poll_ns)
 * instead of poll_ns: a host push wakes it at once as ever, a doorbell rung
 * by a plain store (a device) is seen within idle_nap_ns; 0 keeps poll_ns.
 * Once a device (HL_PRODUCER_IS_DEVICE) has pushed into the queue the agent
 * keeps the domain's poll_ns for good.
 * Kept imports (cfg->keep_ns > 0): the objects a packet named (its signal,
 * waits, argument block, buffers, follow-up queues; at most
 * HLE_AGENT_MAX_KEPT) stay imported after it, so that the next packets
 * naming them import them from the local count alone: no write to their
 * shared slots, whose lines the host and the other agents read (an import
 * and a release are two atomic writes to a slot's line each).  A kept object
 * that no other participant holds any more is released within
 * HLE_AGENT_KEEP_SLICE_NS, busy or idle (a look after a packet at most that
 * often, and between the slices of idle polling); all are released
 * once no packet came for keep_ns, and when the loop ends.  So an object
 * released by its last other holder while the agent is busy is freed at
 * most that much later (as an object a running packet names is freed after
 * the packet); recovery drops a dead agent's kept references as any other.
 * cfg->record (may be NULL) is told why a packet failed in C.
 * The calling thread must be the only user of the context's blocking calls
 * while it runs (its GIL hooks must be unset: the loop never relocks).
 * Returns HL_OK (STOP or should_stop); HL_E_CLOSED / HL_E_CORRUPT (the domain
 * closed or was truncated); HL_E_HANDLE / HL_E_INVALID (the queue cannot be
 * held or bound).
 * The struct grows at its end only: zero-initialize it ({0} or memset) and
 * set the fields you use; new fields keep the old behaviour at zero. */
#define HLE_AGENT_HOP_LIMIT 64
#define HLE_AGENT_FAIL_DEPTH 16
#define HLE_AGENT_FAIL_BUDGET 256
#define HLE_AGENT_MAX_CUS 32
#define HLE_AGENT_IDLE_AFTER_NS 100000000ll /* 100 ms without a packet: idle (idle_nap_ns) */
#define HLE_AGENT_BUSY_NS 1000000ll      /* packets that come within 1 ms of each other on average come often */
#define HLE_AGENT_KEEP_NS 200000ll        /* hostless's agents: kept imports live 200 us past the last packet */
#define HLE_AGENT_KEEP_SLICE_NS 50000ll   /* while keeping: a pop slice, then the kept objects are swept */
#define HLE_AGENT_MAX_KEPT 32
#define HLE_AGENT_CPU 0u
#define HLE_AGENT_NPU 1u
/* the built-in C kernels' ids (HL_K_*) and the NPU's CU table are in hostless_kernels.h */
struct hl_packet;
struct hle_agent_cfg {
    int64_t spin_ns;           /* doorbell spin before parking on the futex (the adaptive bound) */
    int64_t wait_timeout_ns;   /* bound on a packet's input waits (< 0: none) */
    int64_t follow_timeout_ns; /* shared deadline of one packet's follow-up pushes */
    void *ud;                  /* passed to the callbacks */
    int (*should_stop)(void *ud);
    /* Run packet idx (a KERNEL not in the C table); returns an HL_STATUS_*
     * (SUCCESS or the failure status). */
    uint64_t (*python_kernel)(void *ud, uint64_t idx, const struct hl_packet *p);
    void (*record)(void *ud, uint64_t signal, const char *why);
    uint32_t c_kernels;         /* cpu kind, empty table: bit i: C kernel i may run as id i */
    uint64_t packets, failures; /* out: packets run, packets failed and follow-ups dropped */
    /* ---- since the native NPU (issue 11) ---- */
    uint32_t kind;              /* HLE_AGENT_CPU / HLE_AGENT_NPU: the default kernel table */
    uint32_t present;           /* bit i: id / CU i exists (0 with an empty table: derived from it) */
    uint8_t kernel_map[HLE_AGENT_MAX_CUS]; /* id / CU i -> HL_K_*, 0: none in C */
    /* Run CU `cu` of an ERT command on buffers bufs[nbuf] and scalars[ns]
     * (the CUs the C table does not run); the packet's signal is given for
     * the failure record.  Returns HL_STATUS_SUCCESS or a failure status. */
    uint64_t (*python_cu)(void *ud, uint32_t cu, const uint64_t *bufs, uint32_t nbuf, const uint64_t *scalars,
                          uint32_t ns, uint64_t signal);
    const char *blas_path;      /* CBLAS library to dlopen (NULL / "": none) */
    int32_t blas_threads;       /* > 0: set the BLAS's thread count (1 suits an agent on one core) */
    int32_t fixed_spin;         /* 1: always spin spin_ns (0, the default: the adaptive spin) */
    int32_t blas_loaded;        /* out: 1 when GEMM runs through the BLAS */
    char blas_why[200];         /* out: the library loaded, or why none was (the cause only: what runs GEMM
                                   instead is the caller's to say) */
    uint64_t parks, spins;      /* out: pops that parked at once / that spun first (statistics) */
    int64_t idle_nap_ns;        /* longest doorbell sleep once idle (0: the domain's poll_ns) */
    /* ---- since per-hop work (issue 22) ---- */
    int64_t keep_ns;            /* keep recent packets' objects imported this long once no packet
                                   comes (0: none, each released after its packet; HLE_AGENT_KEEP_NS
                                   is what hostless's agents use).  See hle_agent_run. */
};
int hle_agent_run(hle_ctx *c, uint64_t queue, struct hle_agent_cfg *cfg);

/* The C kernel table: 1 when `kernel` is a built-in C kernel (HL_K_*). */
int hle_agent_has_kernel(uint32_t kernel);
/* The emulated NPU's xclbin (hostless.kernels.NPU_CUS): sets present and
 * kernel_map of cfg (CU 0 int8_gemm, 1 gemm, 2 relu, 3 softmax, 4 conv2d, 5 copy). */
void hle_agent_npu_cus(struct hle_agent_cfg *cfg);
/* The table hle_agent_run uses when cfg's is empty (kind, c_kernels, and
 * whether cfg has Python callbacks): *present and map[HLE_AGENT_MAX_CUS]. */
void hle_agent_default_table(const struct hle_agent_cfg *cfg, uint32_t *present, uint8_t *map);

/* ---- frame programs (frame.c) ----
 * What a host does per frame of a prepared pipeline (hostless.graph), as a
 * list of ops run in order in one call, with one unlock of the caller's lock:
 *   STORE  handle = a buffer, arg = a byte offset in it (8-aligned): the u64
 *          there becomes the frame number, a release store (a follow-up
 *          packet's value inside an argument block; the word an armed GPU
 *          segment waits on, after the inputs the frame wrote);
 *   PUSH   handle = a queue, packet = a prepared packet whose u64 words
 *          selected by mask (only signal_value, wait_value[0], wait_value[1])
 *          become the frame number; pushed as hle_queue_push (timeout_ns);
 *   COPY   handle = the destination buffer, arg = the source buffer (the
 *          same size): one memcpy between their extents;
 *   WAIT   handle = a timeline: wait until it reaches the frame number (or
 *          fails), in sleeps of slice_ns; after each slice that ends without
 *          it, the `count` timelines of watch[arg ...] are checked for a
 *          failure; past timeout_ns (whole slices: as hostless.graph always
 *          did) the wait times out.
 * hle_frame_check validates a program once: every handle held by us and of
 * its op's kind, every store inside its buffer, every copy between extents
 * of one size, every watch range inside watch[], the masks; it resolves the
 * offsets in the mapping (dst_off, src_off, nbytes).  HL_OK; HL_E_CLOSED;
 * HL_E_HANDLE (a handle not held or of the wrong kind), HL_E_RANGE (a store
 * outside its buffer or the mapping, a watch range outside watch[]),
 * HL_E_VALUE (an unknown op, a mask naming another word, copy sizes that
 * differ, too many ops); the message names the op.
 * hle_frame_run runs a checked program for frame number `frame` (1..2^62-1):
 * every op checks its handles again (a released buffer fails; its offset is
 * checked against the mapping by subtraction).  It keeps the binding's lock
 * (the GIL) until an op must block: a push into a full queue, a WAIT whose
 * timeline is not there after a spin of at most 2 us (none where spin_ns is
 * 0), a COPY over 64 KiB; a frame done within that spin is never unlocked.
 * Returns HL_OK; HLE_FRAME_FAILED (> 0: the WAIT op stop->op found its timeline failed,
 * stop->word the word); HLE_FRAME_WATCH (> 0: a watched timeline,
 * watch[stop->watch], failed during WAIT op stop->op; stop->word its word);
 * HL_E_TIMEOUT (WAIT op stop->op timed out); or the code of the failing op
 * (stop->op): hle_queue_push's, HL_E_HANDLE, HL_E_CLOSED / HL_E_CORRUPT,
 * HL_E_INTR (the interrupt hook).
 * hle_frame_run_hooked is hle_frame_run that calls before_wait(arg) once,
 * with the binding's lock held, at the first WAIT op whose timeline has not
 * reached the frame yet (the pushes before it made, the agents at work):
 * what the caller needs once the frame is done (its outputs' arrays) is made
 * while the frame runs instead of after it; never when every WAIT finds its
 * timeline there already.  Its value is ignored: the frame is in flight,
 * and the hook keeps its own failure.  What it runs may close the domain:
 * the run then ends with HL_E_CLOSED. */
#define HLE_FOP_STORE 1u
#define HLE_FOP_PUSH 2u
#define HLE_FOP_COPY 3u
#define HLE_FOP_WAIT 4u
#define HLE_FRAME_FAILED 1
#define HLE_FRAME_WATCH 2
#define HLE_FRAME_MAX_OPS 65536u
struct hle_frame_op {
    uint32_t type;    /* HLE_FOP_* */
    uint32_t mask;    /* PUSH: bit i set: u64 word i of the packet gets the frame number */
    uint64_t handle;  /* STORE, COPY: (destination) buffer; PUSH: queue; WAIT: timeline */
    uint64_t arg;     /* STORE: byte offset in the buffer; COPY: source buffer; WAIT: first watch index */
    uint64_t count;   /* WAIT: how many watch entries */
    uint64_t dst_off, src_off, nbytes; /* filled by hle_frame_check (offsets in the mapping) */
    struct hl_packet packet;           /* PUSH: the prepared packet */
};
struct hle_frame {
    struct hle_frame_op *ops;
    uint32_t nops, nwatch;
    const uint64_t *watch; /* timelines watched by WAIT ops */
    int64_t slice_ns;      /* WAIT: sleep slice (<= 0: one sleep of the whole timeout) */
};
struct hle_frame_stop {
    uint32_t op;    /* index of the op that stopped the run */
    uint32_t watch; /* HLE_FRAME_WATCH: index into watch[] */
    uint64_t word;  /* the timeline word that stopped it */
};
int hle_frame_check(hle_ctx *c, struct hle_frame *f);
int hle_frame_run(hle_ctx *c, const struct hle_frame *f, uint64_t frame, int64_t timeout_ns, int64_t spin_ns,
                  struct hle_frame_stop *stop);
int hle_frame_run_hooked(hle_ctx *c, const struct hle_frame *f, uint64_t frame, int64_t timeout_ns, int64_t spin_ns,
                         int (*before_wait)(void *), void *arg, struct hle_frame_stop *stop);

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
 * HL_E_CORRUPT (its header is garbage); HL_E_INVALID (a live consumer).
 * Taking over a queue that had a consumer before (dead now, or unbound by its
 * recovery) records, privately, the queue's write index read after the
 * takeover: hle_queue_stale_below returns it. */
int hle_queue_bind(hle_ctx *c, uint64_t h);

/* The index below which queue h's packets were queued for the consumer we
 * replaced (0: we were its first consumer, or we never bound it here; the
 * last HLE_BOUND_MAX takeovers are remembered).  A consumer must not run
 * those packets: its predecessor died with them, and their producers may
 * have reused what they name (a graph re-patches its argument blocks).  It
 * fails them instead: each signal, and those of its follow-ups, with
 * OWNER_DIED (hle_agent_run does).  A packet reserved after the takeover gets
 * an index at or above it and runs; one reserved before and published after
 * fails: a concurrent producer never loses a packet silently. */
uint64_t hle_queue_stale_below(hle_ctx *c, uint64_t h);

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

/* A named trace record (the one writer of hostless.trace's records: HL_EV_USER
 * with a = HLE_TRACE_USER_MAGIC | type, b = key, c..e = the first
 * HLE_TRACE_TEXT_BYTES bytes of text, cut at a character boundary).  Types:
 * HLE_TRACE_JOIN (key = participant id, text = "label (kind)": names this
 * participant's track after it left), HLE_TRACE_NAME_KERNEL (key = kernel
 * id), HLE_TRACE_NAME_HANDLE (key = a fence, timeline or queue),
 * HLE_TRACE_SPAN_BEGIN / _END (key = span id), HLE_TRACE_INSTANT.  Nothing
 * when the domain has no trace ring. */
#define HLE_TRACE_USER_MAGIC 0x484C000000000000ull /* "HL" in the high bytes of a */
#define HLE_TRACE_TEXT_BYTES 24u
#define HLE_TRACE_JOIN 1u
#define HLE_TRACE_NAME_KERNEL 2u
#define HLE_TRACE_NAME_HANDLE 3u
#define HLE_TRACE_SPAN_BEGIN 4u
#define HLE_TRACE_SPAN_END 5u
#define HLE_TRACE_INSTANT 6u
void hle_trace_user(hle_ctx *c, uint32_t type, uint64_t key, const char *text);

/* Our participant index (-1 when detached) and our owner code. */
int hle_me(const hle_ctx *c);
uint32_t hle_owner_code(const hle_ctx *c);

#ifdef __cplusplus
}
#endif
#endif /* HOSTLESS_ENGINE_H */
