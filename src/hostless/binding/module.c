/*
 * module.c -- the hostless._core module: the types, the module functions,
 * the ABI constants, and hostless._core.testing, a separate table of test
 * hooks compiled only into the test build (HOSTLESS_TEST_HOOKS).
 */
#include "binding.h"

/* Parse a device-heap list [(ordinal, bytes), ...] (None or empty: none) into in. */
int hlpy_parse_devheaps(PyObject *devs, struct hle_init *in) {
    in->ndev = 0;
    if (!devs || devs == Py_None) return 0;
    PyObject *seq = PySequence_Fast(devs, "device heaps: a sequence of (ordinal, bytes)");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > HL_MAX_DEVICE_HEAPS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "at most %u device heaps", HL_MAX_DEVICE_HEAPS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned int ord;
        unsigned long long size;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "IK", &ord, &size)) {
            Py_DECREF(seq);
            return -1;
        }
        if (ord > 255 || size == 0 || size > HL_DEVICE_MAX_SIZE) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "device heap %u of %llu bytes: ordinals are 0..255, sizes 1..%llu bytes",
                         ord, size, (unsigned long long)HL_DEVICE_MAX_SIZE);
            return -1;
        }
        in->dev_ordinal[i] = ord;
        in->dev_size[i] = size;
    }
    in->ndev = (uint32_t)n;
    Py_DECREF(seq);
    return 0;
}

/* layout(fences, participants, queues_size, trace_size, heap_size[, device_heaps]) -> dict of offsets */
static PyObject *py_layout(PyObject *m, PyObject *args) {
    unsigned long long f, p, q, t, hs;
    PyObject *devs = NULL;
    if (!PyArg_ParseTuple(args, "KKKKK|O", &f, &p, &q, &t, &hs, &devs)) return NULL;
    struct hle_init in = {f, p, q, t, hs, 0, 0};
    if (hlpy_parse_devheaps(devs, &in) < 0) return NULL;
    struct hl_header h;
    hle_layout_init(&in, &h, NULL);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "total_size", (unsigned long long)h.total_size,
                         "participants_offset", (unsigned long long)h.participants_offset, "fences_offset",
                         (unsigned long long)h.fences_offset, "queues_offset", (unsigned long long)h.queues_offset,
                         "queues_size", (unsigned long long)h.queues_size, "trace_offset",
                         (unsigned long long)h.trace_offset, "trace_size", (unsigned long long)h.trace_size,
                         "heap_offset", (unsigned long long)h.heap_offset, "heap_size",
                         (unsigned long long)h.heap_size, "devheap_offset", (unsigned long long)h.devheap_offset,
                         "devheap_size", (unsigned long long)h.devheap_size);
}

static PyObject *py_host_wake_fn(PyObject *m, PyObject *noargs) {
    return PyLong_FromVoidPtr((void *)(uintptr_t)&hle_host_wake);
}

static PyObject *py_host_push_fn(PyObject *m, PyObject *noargs) {
    return PyLong_FromVoidPtr((void *)(uintptr_t)&hle_host_push);
}

/* Contract in binding.h. */
int hlpy_words_view(PyObject *obj, Py_buffer *view, Py_ssize_t need, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len < need || ((uintptr_t)view->buf & 7)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be a writable, 8-byte aligned buffer of %zd bytes or more", what,
                     need);
        return -1;
    }
    return 0;
}

/* host_push_fill(rec, q, cells, packets, capacity, packet, doorbell, producer, timeout_ns) -> gate offset:
 * writes struct hle_push_rec into the buffer rec (pinned memory the stream's copy of the gate
 * reaches); the caller copies the gate (an int32) to the returned offset before the function runs. */
static PyObject *py_host_push_fill(PyObject *m, PyObject *args) {
    PyObject *obj;
    unsigned long long q, cells, packets, cap, packet, doorbell, timeout_ns;
    unsigned int producer;
    Py_buffer v;
    if (!PyArg_ParseTuple(args, "OKKKKKKIK", &obj, &q, &cells, &packets, &cap, &packet, &doorbell, &producer,
                          &timeout_ns))
        return NULL;
    if (hlpy_words_view(obj, &v, (Py_ssize_t)sizeof(struct hle_push_rec), "a push record") < 0) return NULL;
    struct hle_push_rec *r = (struct hle_push_rec *)v.buf;
    memset(r, 0, sizeof *r);
    r->q = q;
    r->cells = cells;
    r->packets = packets;
    r->capacity = cap;
    r->packet = packet;
    r->doorbell = doorbell;
    r->producer = producer;
    r->timeout_ns = timeout_ns;
    PyBuffer_Release(&v);
    return PyLong_FromSize_t(offsetof(struct hle_push_rec, gate));
}

/* host_push_state(rec) -> (done, result) */
static PyObject *py_host_push_state(PyObject *m, PyObject *obj) {
    Py_buffer v;
    if (hlpy_words_view(obj, &v, (Py_ssize_t)sizeof(struct hle_push_rec), "a push record") < 0) return NULL;
    struct hle_push_rec *r = (struct hle_push_rec *)v.buf;
    int done = __atomic_load_n(&r->done, __ATOMIC_ACQUIRE);
    int result = r->result;
    PyBuffer_Release(&v);
    return Py_BuildValue("(ii)", done, result);
}

/* word_op(buf, op, a, b) -> old: an atomic step on the first 8 bytes of a writable buffer
 * (a heap word the GPU also reads): op 0 exchanges it for a, op 1 compares it with a and,
 * if equal, stores b.  Host atomics: the GPU's on host memory are not atomic against them. */
static PyObject *py_word_op(PyObject *m, PyObject *args) {
    PyObject *obj;
    int op;
    unsigned long long a, b;
    Py_buffer v;
    if (!PyArg_ParseTuple(args, "OiKK", &obj, &op, &a, &b)) return NULL;
    if (op != 0 && op != 1) return PyErr_Format(PyExc_ValueError, "word_op: op must be 0 or 1, not %d", op);
    if (hlpy_words_view(obj, &v, 8, "the word") < 0) return NULL;
    uint64_t *w = (uint64_t *)v.buf, old;
    if (op == 0) {
        old = __atomic_exchange_n(w, (uint64_t)a, __ATOMIC_SEQ_CST);
    } else {
        old = (uint64_t)a;
        __atomic_compare_exchange_n(w, &old, (uint64_t)b, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(old);
}

/* status_valid(s) -> bool: hl_status_valid, for the Python checker */
static PyObject *py_status_valid(PyObject *m, PyObject *arg) {
    unsigned long long s = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    return PyBool_FromLong(hl_status_valid(s));
}

static PyObject *py_set_status(PyObject *m, PyObject *args) {
    PyObject *cls, *map;
    if (!PyArg_ParseTuple(args, "OO!", &cls, &PyDict_Type, &map)) return NULL;
    if (hlpy_set_status(cls, map) < 0) return NULL;
    Py_RETURN_NONE;
}

/* view_guard(buffer) -> capsule: put a mapping of a domain that no context owns (a
 * read-only view, hostless.view) under the SIGBUS guard (hle_guard_add_flag): a page
 * truncated under it reads zeros instead of killing the process.
 * view_guard_hit(capsule) -> bool: a truncation was seen through it.
 * view_guard_remove(capsule): out of the guard (call before unmapping; the capsule's
 * destructor does it too). */
#define VIEW_GUARD "hostless.view_guard"
static void view_guard_free(PyObject *cap) {
    int *flag = (int *)PyCapsule_GetPointer(cap, VIEW_GUARD);
    if (!flag) return;
    hle_guard_remove_flag(flag);
    free(flag);
}

static PyObject *py_view_guard(PyObject *m, PyObject *obj) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) < 0) return NULL;
    uintptr_t lo = (uintptr_t)v.buf, hi = (uintptr_t)v.buf + (uintptr_t)v.len;
    PyBuffer_Release(&v);
    int *flag = (int *)calloc(1, sizeof *flag);
    if (!flag) return PyErr_NoMemory();
    PyObject *cap = PyCapsule_New(flag, VIEW_GUARD, view_guard_free);
    if (!cap) {
        free(flag);
        return NULL;
    }
    if (hle_guard_add_flag(lo, hi, flag) != HL_OK) {
        Py_DECREF(cap);
        return PyErr_NoMemory();
    }
    return cap;
}

static PyObject *py_view_guard_hit(PyObject *m, PyObject *cap) {
    int *flag = (int *)PyCapsule_GetPointer(cap, VIEW_GUARD);
    if (!flag) return NULL;
    return PyBool_FromLong(__atomic_load_n(flag, __ATOMIC_SEQ_CST) != 0);
}

static PyObject *py_view_guard_remove(PyObject *m, PyObject *cap) {
    int *flag = (int *)PyCapsule_GetPointer(cap, VIEW_GUARD);
    if (!flag) return NULL;
    hle_guard_remove_flag(flag);
    Py_RETURN_NONE;
}

/* guard_front(): the SIGBUS guard's handler back in front of one a library installed since. */
static PyObject *py_guard_front(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    hle_guard_front();
    Py_RETURN_NONE;
}

/* version_error(path, found) -> str: the message of a domain of ABI version `found` (hle_version_fail). */
static PyObject *py_version_error(PyObject *self, PyObject *args) {
    const char *path;
    unsigned int found;
    if (!PyArg_ParseTuple(args, "sI", &path, &found)) return NULL;
    hle_version_fail(path, found);
    return PyUnicode_FromString(hle_errmsg());
}

static PyMethodDef module_methods[] = {
    {"view_guard", py_view_guard, METH_O, "view_guard(buffer) -> guard: a read-only view's mapping under the SIGBUS guard"},
    {"view_guard_hit", py_view_guard_hit, METH_O, "view_guard_hit(guard) -> whether a truncation was seen"},
    {"view_guard_remove", py_view_guard_remove, METH_O, "view_guard_remove(guard): before unmapping"},
    {"guard_front", py_guard_front, METH_NOARGS, "guard_front(): the SIGBUS guard in front of a handler a library installed since"},
    {"version_error", py_version_error, METH_VARARGS, "version_error(path, found) -> message for a domain of another ABI version"},
    {"host_wake_fn", py_host_wake_fn, METH_NOARGS, "address of void hl_host_wake(void *futex_word)"},
    {"host_push_fn", py_host_push_fn, METH_NOARGS, "address of void hle_host_push(void *rec)"},
    {"host_push_fill", py_host_push_fill, METH_VARARGS,
     "host_push_fill(rec, q, cells, packets, capacity, packet, doorbell, producer, timeout_ns) -> gate offset"},
    {"host_push_state", py_host_push_state, METH_O, "host_push_state(rec) -> (done, result)"},
    {"cpfwd_start", hlpy_cpfwd_start, METH_VARARGS, "cpfwd_start(core, outbox, own_queue) -> forwarder"},
    {"cpfwd_stop", hlpy_cpfwd_stop, METH_O, "cpfwd_stop(forwarder) -> (pushed, failed)"},
    {"word_op", py_word_op, METH_VARARGS, "word_op(buf, op, a, b) -> old: atomic exchange (0) or CAS (1)"},
    {"set_status", py_set_status, METH_VARARGS, NULL},
    {"status_valid", py_status_valid, METH_O, "hl_status_valid(s): a status a fence can complete with"},
    {"layout", py_layout, METH_VARARGS, "layout(fences, participants, queues, trace, heap) -> offsets"},
    {"agent_table", hlpy_agent_table, METH_VARARGS, "agent_table(kind, c_kernels=0) -> (present, map): an empty table's default"},
    {"blas_probe", hlpy_blas_probe, METH_VARARGS, "blas_probe(path, threads=0) -> (loaded, why): the BLAS an agent would use"},
    {"handle_method", hlpy_handle_method, METH_O, "handle_method(i): Fence.signal/wait, Timeline.signal/wait/point (0..4)"},
    {"dlpack_capsule", hlpy_dlpack_capsule, METH_VARARGS,
     "dlpack_capsule(owner, data, shape, code, bits, device_type, device_id, versioned, readonly) -> capsule"},
    {NULL, NULL, 0, NULL},
};

/* ---- hostless._core.testing: hooks that make a test's failure happen ----
 * Compiled only with HOSTLESS_TEST_HOOKS (setup.py: the environment variable of the same name,
 * which `make venv` / `make test` set); the production extension has no `testing`. */
#ifdef HOSTLESS_TEST_HOOKS

static Core *core_arg(PyObject *o) {
    if (!PyObject_TypeCheck(o, CoreType)) {
        PyErr_SetString(PyExc_TypeError, "the first argument is a hostless._core.Core (dom._core)");
        return NULL;
    }
    return (Core *)o;
}

/* device_store(core, handle, word): store a word like a device would (one
 * plain 64-bit store, no wake, no propagation). */
static PyObject *t_device_store(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "device_store(core, handle, word)");
        return NULL;
    }
    Core *c = core_arg(args[0]);
    if (!c) return NULL;
    NEED_ATTACHED(c);
    uint64_t h = PyLong_AsUnsignedLongLong(args[1]);
    uint64_t v = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    int r = hle_device_store(&c->ctx, h, v);
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

/* queue_reserve_stuck(core, queue, signal) -> index: reserve a cell, write
 * only its signal handle, and stop (as a producer killed while filling). */
static PyObject *t_queue_reserve_stuck(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "queue_reserve_stuck(core, queue, signal)");
        return NULL;
    }
    Core *c = core_arg(args[0]);
    if (!c) return NULL;
    NEED_ATTACHED(c);
    uint64_t h, sig, w;
    if (hlpy_handle_arg(args[1], &h) < 0 || hlpy_handle_arg(args[2], &sig) < 0) return NULL;
    int r = hle_queue_reserve_stuck(&c->ctx, h, sig, &w);
    if (r) return hlpy_raise(r);
    return PyLong_FromUnsignedLongLong(w);
}

/* heap_lock_forever(core[, device]): take the heap lock (device >= 0: that
 * device heap's) and never give it back (as a holder killed inside the
 * critical section would). */
static PyObject *t_heap_lock_forever(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "heap_lock_forever(core[, device])");
        return NULL;
    }
    Core *c = core_arg(args[0]);
    if (!c) return NULL;
    NEED_ATTACHED(c);
    long dev = nargs == 2 ? PyLong_AsLong(args[1]) : -1;
    if (PyErr_Occurred()) return NULL;
    int r = hle_pool_lock_forever(&c->ctx, dev < 0 ? 0 : (int)(dev + 1 > HLE_POOLS ? HLE_POOLS : dev + 1));
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

/* device_buffer_stuck(core, device, nbytes, stage): start a device allocation
 * and stop after stage 1 (metadata block) or 2 (device extent), the slot left
 * ALLOC, as a participant killed there would. */
static PyObject *t_device_buffer_stuck(PyObject *m, PyObject *args) {
    PyObject *co;
    int dev, stage;
    unsigned long long nbytes;
    if (!PyArg_ParseTuple(args, "OiKi", &co, &dev, &nbytes, &stage)) return NULL;
    Core *c = core_arg(co);
    if (!c) return NULL;
    NEED_ATTACHED(c);
    int r = hle_device_buffer_stuck(&c->ctx, dev, nbytes, stage == 1 ? 1 : 2);
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

static PyMethodDef testing_methods[] = {
    {"device_buffer_stuck", t_device_buffer_stuck, METH_VARARGS, NULL},
    {"device_store", (PyCFunction)(void (*)(void))t_device_store, METH_FASTCALL, NULL},
    {"queue_reserve_stuck", (PyCFunction)(void (*)(void))t_queue_reserve_stuck, METH_FASTCALL, NULL},
    {"heap_lock_forever", (PyCFunction)(void (*)(void))t_heap_lock_forever, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef testingmodule = {PyModuleDef_HEAD_INIT, "hostless._core.testing",
                                           "test hooks of the C core (not for production code)", -1,
                                           testing_methods};

PyObject *hlpy_testing_module(void) { return PyModule_Create(&testingmodule); }
#endif /* HOSTLESS_TEST_HOOKS */

static struct PyModuleDef coremodule = {PyModuleDef_HEAD_INIT, "hostless._core", "hostless C core", -1,
                                        module_methods};

PyTypeObject *CoreType, *HandleType, *FrameProgramType, *WaitSetType, *PointType;

/* The types, made once (the module is single-phase: one per process); each global keeps
 * a reference for the process's life, the module another. */
static int add_type(PyObject *m, const char *name, PyType_Spec *spec, PyTypeObject **out) {
    if (!*out) {
        *out = (PyTypeObject *)PyType_FromSpec(spec);
        if (!*out) return -1;
    }
    Py_INCREF((PyObject *)*out);
    if (PyModule_AddObject(m, name, (PyObject *)*out) < 0) {
        Py_DECREF(*out);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__core(void) {
    PyObject *m = PyModule_Create(&coremodule);
    if (!m) return NULL;
    if (add_type(m, "Core", &hlpy_core_spec, &CoreType) < 0 ||
        add_type(m, "Handle", &hlpy_handle_spec, &HandleType) < 0 ||
        add_type(m, "FrameProgram", &hlpy_frame_program_spec, &FrameProgramType) < 0 ||
        add_type(m, "WaitSet", &hlpy_wait_set_spec, &WaitSetType) < 0 ||
        add_type(m, "Point", &hlpy_point_spec, &PointType) < 0 ||
        add_type(m, "ChannelRing", &hlpy_channel_ring_spec, &ChannelRingType) < 0 ||
        add_type(m, "ChannelFrame", &hlpy_channel_frame_spec, &ChannelFrameType) < 0 || hlpy_channel_init() < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "FOP_STORE", HLE_FOP_STORE);
    PyModule_AddIntConstant(m, "FOP_PUSH", HLE_FOP_PUSH);
    PyModule_AddIntConstant(m, "FOP_COPY", HLE_FOP_COPY);
    PyModule_AddIntConstant(m, "FOP_WAIT", HLE_FOP_WAIT);
#ifdef HOSTLESS_TEST_HOOKS
    PyObject *testing = hlpy_testing_module();
    if (!testing || PyModule_AddObject(m, "testing", testing) < 0) {
        Py_XDECREF(testing);
        Py_DECREF(m);
        return NULL;
    }
#endif
    if (hlpy_add_abi_constants(m) < 0 || PyModule_AddFunctions(m, hlpy_codec_methods) < 0 ||
        PyModule_AddFunctions(m, hlpy_wait_methods) < 0 || PyModule_AddFunctions(m, hlpy_point_methods) < 0 ||
        PyModule_AddFunctions(m, hlpy_channel_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    /* the exception classes, by name (retried at the first error if hostless.errors cannot be imported now) */
    if (hlpy_errors_init() < 0) PyErr_Clear();
    return m;
}
