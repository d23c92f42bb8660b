/*
 * binding.h -- the CPython binding of the hostless engine: argument parsing,
 * GIL release (through the engine's hooks), and one table that maps engine
 * codes to exception classes.  No protocol logic lives here.
 */
#ifndef HOSTLESS_BINDING_H
#define HOSTLESS_BINDING_H

/* Internal to the extension (compiled with HOSTLESS_INTERNAL); not installed for C users. */
#ifndef HOSTLESS_INTERNAL
#error "binding/binding.h is internal to the hostless extension"
#endif

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "limited.h"

#include "../core/engine.h"

/* hostless._core.Core: the engine context of one domain. */
typedef struct {
    PyObject_HEAD
    hle_ctx ctx;
    struct hle_records records; /* the failure records this context wrote (codecs.c) */
} Core;

/* hostless._core.Handle: the C base of Fence, Timeline, Buffer and Queue.  It
 * holds one local reference (a count in the context's lrefs) and gives the
 * hot operations (signal, wait, release) without a Python frame.  For
 * buffers it also exports the buffer protocol over a window of a Python mmap
 * object; each export pins the mmap, so the mapping cannot be closed under a
 * live view. */
typedef struct {
    PyObject_HEAD
    Core *core;
    PyObject *dom;
    uint64_t handle;
    int held;
    PyObject *bb_map;
    Py_ssize_t bb_off;
    Py_ssize_t bb_len;
    int bb_readonly;
    int bb_device; /* a device buffer: device heap index + 1 (no host memory), 0: host */
    int bb_ndim; /* 0: plain bytes */
    Py_ssize_t bb_itemsize;
    Py_ssize_t bb_shape[HL_BUFFER_MAX_DIMS];
    char bb_fmt[16]; /* PEP 3118 format of one item */
    PyObject *weakreflist;
    PyObject *inner; /* _inner: the tree nodes a merged root keeps (released with it), or NULL */
} Handle;

/* The types, heap types made at import (module.c) from the specs of their files. */
extern PyTypeObject *CoreType;
extern PyTypeObject *HandleType;
extern PyTypeObject *FrameProgramType; /* frame.c: hostless._core.FrameProgram */
extern PyType_Spec hlpy_core_spec, hlpy_handle_spec, hlpy_frame_program_spec, hlpy_wait_set_spec;
/* module.c: a view of obj, writable, C-contiguous, 8-byte aligned and of `need` bytes or more,
 * for memory the engine or a device writes words of (push records, the gpucp outbox, a heap
 * word); 0, or -1 with BufferError / ValueError ("<what> must be ...") set.  The caller
 * releases the view. */
int hlpy_words_view(PyObject *obj, Py_buffer *view, Py_ssize_t need, const char *what);
/* cpfwd.c: the GPU command processor's host forwarder */
PyObject *hlpy_cpfwd_start(PyObject *m, PyObject *args);
PyObject *hlpy_cpfwd_stop(PyObject *m, PyObject *cap);

/* errors.c: raise the exception for engine code `code` (< 0) with the
 * thread's detail message; returns NULL.  HL_E_INTR: the exception the
 * interrupt hook left pending. */
PyObject *hlpy_raise(int code);
/* the same, returning -1 (for int-returning helpers) */
int hlpy_raise_int(int code);
/* Look the exception classes up by name in hostless.errors (at import). */
int hlpy_errors_init(void);
/* Install the GIL hooks in a context. */
void hlpy_set_hooks(hle_ctx *c);
/* The class of an engine code (borrowed). */
PyObject *hlpy_exc(int code);

/* handle_type.c */
PyObject *hlpy_status_obj(uint64_t s);
/* The status a wait on timeline `h` returns for its word `w`: SUCCESS, or its
 * failure; a word no conforming participant writes is CorruptDomain. */
PyObject *hlpy_timeline_status(hle_ctx *c, uint64_t h, uint64_t value, uint64_t w);
int hlpy_set_status(PyObject *cls, PyObject *map);
Handle *hlpy_handle_make(PyTypeObject *cls, Core *c, PyObject *dom, uint64_t h);
int hlpy_set_layout(Handle *b, const char *fmt, Py_ssize_t itemsize, PyObject *shape, Py_ssize_t len);
int hlpy_handle_arg(PyObject *o, uint64_t *h);
PyObject *Core_new_obj(Core *c, PyObject *const *args, Py_ssize_t nargs);
PyObject *Core_adopt(Core *c, PyObject *const *args, Py_ssize_t nargs);
PyObject *Core_wrap(Core *c, PyObject *const *args, Py_ssize_t nargs);
PyObject *Core_new_buffer(Core *c, PyObject *const *args, Py_ssize_t nargs);

/* buffer_export.c: Handle's buffer protocol and _set_window */
int hlpy_handle_getbuffer(PyObject *o, Py_buffer *view, int flags);
void hlpy_handle_releasebuffer(PyObject *o, Py_buffer *view);
PyObject *hlpy_handle_set_window(Handle *b, PyObject *args);

/* module.c: parse [(ordinal, bytes), ...] into in->ndev / dev_*; -1 with an exception */
int hlpy_parse_devheaps(PyObject *devs, struct hle_init *in);
/* errors.c: DeviceBufferError (borrowed) */
PyObject *hlpy_device_buffer_error(void);

/* abi_table.c: add the ABI constants to module m; -1 on error. */
int hlpy_add_abi_constants(PyObject *m);
/* handle_type.c: handle_method(i) -> Fence.signal, Fence.wait, Timeline.signal, Timeline.wait, Timeline.point
 * (i = 0..4) */
PyObject *hlpy_handle_method(PyObject *m, PyObject *arg);
/* dlpack.c: a DLPack capsule over an address (kDLCUDA, kDLCUDAHost exports) */
PyObject *hlpy_dlpack_capsule(PyObject *m, PyObject *args);
/* names.c: Core's name-table methods */
PyObject *Core_name_publish(Core *c, PyObject *const *args, Py_ssize_t nargs);
PyObject *Core_name_remove(Core *c, PyObject *const *args, Py_ssize_t nargs);
PyObject *Core_name_lookup(Core *c, PyObject *name);
PyObject *Core_name_list(Core *c, PyObject *noargs);
PyObject *Core_name_seq(Core *c, PyObject *noargs);

/* core_queue.c: Core's queue and trace methods */
PyObject *Core_queue_new(Core *c, PyObject *arg);
PyObject *Core_queue_bind(Core *c, PyObject *arg);
PyObject *Core_queue_push(Core *c, PyObject *const *args, Py_ssize_t nargs);
PyObject *Core_queue_pop(Core *c, PyObject *const *args, Py_ssize_t nargs);
PyObject *Core_queue_info(Core *c, PyObject *arg);
PyObject *Core_queue_view(Core *c, PyObject *arg);
PyObject *Core_queue_doorbell_addr(Core *c, PyObject *arg);
PyObject *Core_queue_completed(Core *c, PyObject *arg);
PyObject *Core_trace(Core *c, PyObject *const *args, Py_ssize_t nargs);
PyObject *Core_trace_enabled(Core *c, PyObject *noargs);

/* agent.c: Core.agent_run (the native agent loop) */
PyObject *Core_agent_run(Core *c, PyObject *args);
PyObject *hlpy_blas_probe(PyObject *self, PyObject *args);
PyObject *hlpy_agent_table(PyObject *self, PyObject *args);

/* waits.c: Core.wait_many, and the module's wait_any / wait_all / set_completed (hl.wait_any and
 * hl.wait_all: one call for a list or tuple of objects of one domain) */
PyObject *Core_wait_many(Core *c, PyObject *const *args, Py_ssize_t nargs);
extern PyMethodDef hlpy_wait_methods[];
/* One (handle, value) from a held Fence / merged fence (value 0) or a Point of
 * core *c (NULL: set from the object): 1; 0 when it is none of those.  Runs
 * no Python code. */
int hlpy_object_pair(Core **c, PyObject *o, uint64_t *h, uint64_t *v);
/* A wait's timeout argument in ns: None -> -1 (forever); ValueError / TypeError. */
int hlpy_timeout_ns(PyObject *t, int64_t *out);
/* The final Status of object (h, v) that read word w at or past its threshold. */
PyObject *hlpy_pair_status(Core *c, uint64_t h, uint64_t v, uint64_t w);
/* wait_all's loop: every pair in turn within tmo ns in all (< 0: no limit); HL_OK, or the
 * engine's code with *at the index it stopped at. */
int hlpy_wait_all_pairs(Core *c, const uint64_t *hs, const uint64_t *vs, Py_ssize_t n, int64_t tmo,
                        Py_ssize_t *at);
/* NULL with wait_all's error for code r at index at (TimeoutError: how many completed, within t s). */
PyObject *hlpy_wait_all_error(Core *c, const uint64_t *hs, const uint64_t *vs, Py_ssize_t n, int r,
                              Py_ssize_t at, PyObject *t);
/* waitset.c: hostless._core.WaitSet (a prepared wait_any / wait_all) */
extern PyTypeObject *WaitSetType;
/* point.c: hostless._core.Point, the C base of hostless.Point: a timeline (a
 * Timeline, checked at construction) and its value, read-only; v is the value
 * as a number (0..HL_TIMELINE_MAX) for the waits */
typedef struct {
    PyObject_HEAD
    PyObject *timeline;
    PyObject *value;
    uint64_t v;
} HlPoint;
extern PyTypeObject *PointType;
extern PyType_Spec hlpy_point_spec;
extern PyMethodDef hlpy_point_methods[];
/* Timeline.point(value) (handle_method(4)) */
PyObject *hlpy_timeline_point(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* channel.c: hostless._core.ChannelRing and ChannelFrame, the C bases of a channel's
 * _Ring (publisher and subscribers) and of hostless.Frame: the fast loan / receive / exit */
extern PyTypeObject *ChannelRingType, *ChannelFrameType;
extern PyType_Spec hlpy_channel_ring_spec, hlpy_channel_frame_spec;
extern PyMethodDef hlpy_channel_methods[];
int hlpy_channel_init(void);

/* codecs.c: ERT decoding, failure and trace records (module functions) */
extern PyMethodDef hlpy_codec_methods[];
#ifdef HOSTLESS_TEST_HOOKS
/* module.c: the testing table (test hooks), a separate module object (test build only). */
PyObject *hlpy_testing_module(void);
#endif

#define NEED_ATTACHED(c)                                                                          \
    do {                                                                                          \
        int _r = hle_need_attached(&(c)->ctx);                                                    \
        if (_r) return hlpy_raise(_r);                                                            \
    } while (0)

#endif
