/*
 * hostless.h -- the hostless domain ABI (umbrella header).  Python (through
 * the _core extension), C programs and CUDA/NVRTC kernels include this file
 * and nothing else of hostless; it includes the four parts, which live in
 * the same directory (hl.abi_header_path() names this file; compile with
 * -I on its directory):
 *
 *   hostless_layout.h   the shared-memory layout: integer types, constants,
 *                       struct layouts, the completion word, the write rule,
 *                       the slot state machine (types and constants only):
 *                       HL_MAGIC, HL_ABI_VERSION, HL_STATUS_*, HL_CTL,
 *                       HL_HANDLE, struct hl_header / hl_participant /
 *                       hl_fence / hl_heap / hl_queue / hl_packet / hl_trace
 *                       (the regions after the fence table in its part
 *                       hostless_layout_regions.h, which it includes)
 *   hostless_atomic.h   atomics (host builtins / CUDA intrinsics), the
 *                       16-byte {word, ctl} CAS, futex wake-ups:
 *                       hl_load64, hl_store64, hl_cas64, hl_cas_word_ctl,
 *                       hl_wake_fence, hl_wake_timeline
 *   hostless_ops.h      return codes (HL_OK, HL_E_*); validation into the
 *                       private view: hl_domain_validate, hl_attach, struct
 *                       hl_dom; fences, timelines, buffers: hl_fence_signal,
 *                       hl_fence_poll, hl_timeline_signal, hl_timeline_fail,
 *                       hl_timeline_poll, hl_word, hl_buffer_data,
 *                       hl_buffer_device
 *   hostless_queue.h    command queues, producer side: hl_queue_open,
 *                       hl_queue_push, hl_queue_try_push (HL_E_FULL)
 *
 * Valid C11, C++11 and CUDA (nvcc and NVRTC).  A C program that includes only
 * this header can map a domain, validate it (hl_attach), signal fences,
 * advance timelines, poll them and push into queues ("firmware"
 * participants).  Creating objects, taking references and crash recovery
 * are done by the core library.  Every operation's contract (what it does,
 * its memory ordering, every return code) is written above it; docs/abi.md
 * explains the protocol.
 */
#ifndef HOSTLESS_H
#define HOSTLESS_H

#include "hostless_layout.h"
#include "hostless_atomic.h"
#include "hostless_ops.h"
#include "hostless_queue.h"
#include "hostless_ert.h"
#include "hostless_kernels.h"

#endif /* HOSTLESS_H */
