/*
 * core_queue.c -- hostless._core.Core's queue and trace-ring methods (the
 * rest of the Core type is core_type.c): each parses its arguments, calls the
 * engine's queue / trace API and maps a failing code to its exception.
 */
#include "binding.h"

/* ---- queues ---- */

/* queue_new(capacity) -> handle */
PyObject *Core_queue_new(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    long cap = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return NULL;
    uint64_t h;
    int r = hle_queue_new(&c->ctx, cap < 0 ? 0 : (uint64_t)cap, &h);
    if (r) return hlpy_raise(r);
    return PyLong_FromUnsignedLongLong(h);
}

/* queue_bind(handle) -> stale_below: become the queue's consumer (free, or its consumer
 * is dead); packets below the index returned were queued for the dead one */
PyObject *Core_queue_bind(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    int r = hle_queue_bind(&c->ctx, h);
    if (r) return hlpy_raise(r);
    return PyLong_FromUnsignedLongLong(hle_queue_stale_below(&c->ctx, h));
}

static int parse_packet(PyObject *o, struct hl_packet *p) {
    Py_buffer b;
    if (PyObject_GetBuffer(o, &b, PyBUF_SIMPLE) < 0) return -1;
    if (b.len != HL_PACKET_SIZE) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "a packet is 64 bytes");
        return -1;
    }
    memcpy(p, b.buf, HL_PACKET_SIZE);
    PyBuffer_Release(&b);
    return 0;
}

/* queue_push(handle, packet: 64 bytes, timeout_ns) -> write index.  Blocks
 * while the queue is full (QueueFull after timeout_ns; <0 = forever, 0 = try). */
PyObject *Core_queue_push(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "queue_push(handle, packet, timeout_ns)");
        return NULL;
    }
    uint64_t h, idx = 0;
    struct hl_packet p;
    if (hlpy_handle_arg(args[0], &h) < 0 || parse_packet(args[1], &p) < 0) return NULL;
    long long timeout = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    int r = hle_queue_push(&c->ctx, h, &p, timeout, &idx);
    if (r) return hlpy_raise(r);
    return PyLong_FromUnsignedLongLong(idx);
}

/* queue_pop(handle, timeout_ns, spin_ns) -> (index, packet bytes) or None on
 * timeout.  Consumer only.  Skips cells abandoned by dead producers. */
PyObject *Core_queue_pop(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "queue_pop(handle, timeout_ns, spin_ns)");
        return NULL;
    }
    uint64_t h, idx = 0;
    if (hlpy_handle_arg(args[0], &h) < 0) return NULL;
    long long timeout = PyLong_AsLongLong(args[1]);
    long long spin = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    struct hl_packet out;
    int r = hle_queue_pop(&c->ctx, h, timeout, spin, &idx, &out);
    if (r == HL_E_TIMEOUT) Py_RETURN_NONE;
    if (r) return hlpy_raise(r);
    return Py_BuildValue("(Ky#)", (unsigned long long)idx, (const char *)&out, (Py_ssize_t)sizeof out);
}

/* queue_info(handle) -> dict */
PyObject *Core_queue_info(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h;
    struct hl_qview v;
    if (hlpy_handle_arg(arg, &h) < 0) return NULL;
    int r = hle_queue_view(&c->ctx, h, &v);
    if (r) return hlpy_raise(r);
    struct hl_queue *q = v.q;
    return Py_BuildValue("{s:K,s:K,s:K,s:I,s:K,s:K}", "capacity", (unsigned long long)v.capacity, "write_index",
                         (unsigned long long)ld(&q->write_index), "read_index", (unsigned long long)ld(&q->read_index),
                         "consumer", __atomic_load_n(&q->consumer, __ATOMIC_SEQ_CST), "completed",
                         (unsigned long long)ld(&q->completed), "doorbell", (unsigned long long)ld(&q->doorbell));
}

/* queue_view(handle) -> (queue, cells, packets) host addresses and capacity,
 * validated once (struct hl_qview): what a device producer is handed */
PyObject *Core_queue_view(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h;
    struct hl_qview v;
    if (hlpy_handle_arg(arg, &h) < 0) return NULL;
    int r = hle_queue_view(&c->ctx, h, &v);
    if (r) return hlpy_raise(r);
    return Py_BuildValue("(KKKK)", (unsigned long long)(uintptr_t)v.q, (unsigned long long)(uintptr_t)v.cells,
                         (unsigned long long)(uintptr_t)v.packets, (unsigned long long)v.capacity);
}

/* queue_doorbell_addr(handle) -> host address of the queue's doorbell word */
PyObject *Core_queue_doorbell_addr(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h;
    struct hl_qview v;
    if (hlpy_handle_arg(arg, &h) < 0) return NULL;
    int r = hle_queue_view(&c->ctx, h, &v);
    if (r) return hlpy_raise(r);
    return PyLong_FromVoidPtr((void *)&v.q->doorbell);
}

PyObject *Core_queue_completed(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h;
    struct hl_qview v;
    if (hlpy_handle_arg(arg, &h) < 0) return NULL;
    int r = hle_queue_view(&c->ctx, h, &v);
    if (r) return hlpy_raise(r);
    __atomic_add_fetch(&v.q->completed, 1, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

/* trace(type, a, b, c, d, e) -- append an event to the domain's trace ring */
PyObject *Core_trace(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "trace(type, a, b, c, d, e)");
        return NULL;
    }
    if (!c->ctx.trace) Py_RETURN_NONE;
    unsigned long long v[6];
    for (int i = 0; i < 6; i++) {
        v[i] = PyLong_AsUnsignedLongLongMask(args[i]);
        if (PyErr_Occurred()) return NULL;
    }
    hle_trace_emit(&c->ctx, (uint32_t)v[0], v[1], v[2], v[3], v[4], v[5]);
    Py_RETURN_NONE;
}

PyObject *Core_trace_enabled(Core *c, PyObject *noargs) {
    return PyBool_FromLong(c->ctx.base && c->ctx.trace);
}
