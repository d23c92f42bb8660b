/*
 * hostless_errors.h -- every return code of hostless, in one place: those of
 * the header-only operations (hostless_ops.h, hostless_queue.h: -1..-31) and
 * those of the engine library (hostless_engine.h: -32 and below).  Every call
 * returns HL_OK (0) or one of these negative codes; the Python binding maps
 * each to an exception (binding/errors.c).  Valid C11, C++11 and CUDA.
 */
#ifndef HOSTLESS_ERRORS_H
#define HOSTLESS_ERRORS_H

#define HL_OK 0

/* ---- the ABI's codes (header-only operations; -1..-31) ----
 * HL_E_KIND is reserved: no operation returns it.  A handle of the wrong kind
 * (a timeline handle given to hl_fence_signal, say) is HL_E_HANDLE, like any
 * handle that names no live object of the expected kind in this domain: the
 * kind is part of the handle, so a wrong-kind handle is one that names no
 * such object.  The value -4 stays reserved so that no later code reuses it. */
#define HL_E_CORRUPT -1 /* header, table or queue does not match this ABI */
#define HL_E_HANDLE -2  /* stale, forged, foreign or wrong-kind handle */
#define HL_E_ALREADY -3 /* fence already signaled */
#define HL_E_KIND -4    /* reserved: never returned (see above) */
#define HL_E_VALUE -5   /* bad status or timeline value */
#define HL_E_FAILED -6  /* timeline already failed */
#define HL_E_FULL -7    /* the queue has no free cell (nothing is overwritten; hl_queue_try_push) */

/* ---- the engine's codes (libhostless / the extension; -32 and below) ---- */
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
#define HL_E_DEVICE_FULL -45 /* a device heap cannot satisfy the allocation */
#define HL_E_VERSION -46     /* the domain was made by a hostless of another HL_ABI_VERSION (older or newer) */

#endif /* HOSTLESS_ERRORS_H */
