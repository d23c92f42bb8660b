/*
 * frame.c (binding) -- hostless._core.FrameProgram: a frame program
 * (core/frame.c) built and validated once from a Python description, run
 * per frame with one call (the GIL kept until an op must block, then
 * released to the end, taken back only for the interrupt hook and, in
 * frame(), the hook that makes the outputs' arrays: core/frame.c).
 *
 *   FrameProgram(core, ops, watch, slice_ns)
 *     ops: a sequence of tuples, in order:
 *       (FOP_STORE, buffer, byte_offset)       the u64 there := frame
 *       (FOP_PUSH, queue, packet: 64 bytes, mask)
 *       (FOP_COPY, dst_buffer, src_buffer)
 *       (FOP_WAIT, timeline, first_watch, nwatch)
 *     watch: a sequence of timeline handles (WAIT ops name ranges of it)
 *   run(frame, timeout_ns) -> None when every op completed, else
 *     (op, "failed", word)   the WAIT op's timeline failed (its word)
 *     (op, "watch", word, j) watch[j] failed during the WAIT op
 *     (op, "timeout", word)  the WAIT op timed out
 *   and raises the engine's exception for any other failure (a push's
 *   QueueFull / InvalidOperation, InvalidHandle, DomainClosed, the
 *   KeyboardInterrupt of the interrupt hook).
 *
 * The host's whole frame in one call (bind_io, frame): frame_io.c.
 */
#include "binding.h"
#include "frame_program.h"

static void FP_dealloc(FrameProgram *p) {
    hlpy_fio_clear(p);
    PyMem_Free(p->f.ops);
    PyMem_Free(p->watch);
    Py_XDECREF((PyObject *)p->core);
    hlpy_free((PyObject *)p);
}

static int u64_item(PyObject *t, Py_ssize_t i, uint64_t *out) {
    PyObject *o = PyTuple_GET_ITEM(t, i);
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "frame program: item %zd of an op is not an int", i);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(o);
    return PyErr_Occurred() ? -1 : 0;
}

static int parse_op(PyObject *t, Py_ssize_t i, struct hle_frame_op *o) {
    uint64_t type, a = 0, b = 0, d = 0;
    Py_ssize_t n = PyTuple_Check(t) ? PyTuple_GET_SIZE(t) : 0;
    if (n < 3 || u64_item(t, 0, &type) < 0 || u64_item(t, 1, &a) < 0) goto bad;
    memset(o, 0, sizeof *o);
    o->type = (uint32_t)type;
    o->handle = a;
    if (type == HLE_FOP_PUSH) {
        Py_buffer v;
        if (n != 4 || u64_item(t, 3, &d) < 0 || d > 0xffffffffull) goto bad;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(t, 2), &v, PyBUF_SIMPLE) < 0) return -1;
        if (v.len != (Py_ssize_t)sizeof o->packet) {
            PyBuffer_Release(&v);
            PyErr_Format(PyExc_ValueError, "frame program op %zd (push): a packet is %zu bytes", i, sizeof o->packet);
            return -1;
        }
        memcpy(&o->packet, v.buf, sizeof o->packet);
        PyBuffer_Release(&v);
        o->mask = (uint32_t)d;
        return 0;
    }
    if (u64_item(t, 2, &b) < 0) goto bad;
    o->arg = b;
    if (type == HLE_FOP_WAIT) {
        if (n != 4 || u64_item(t, 3, &d) < 0) goto bad;
        o->count = d;
    } else if (n != 3) {
        goto bad;
    }
    return 0;
bad:
    if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError,
                     "frame program op %zd: expected (FOP_STORE, buffer, offset), (FOP_PUSH, queue, packet, mask), "
                     "(FOP_COPY, dst, src) or (FOP_WAIT, timeline, first_watch, nwatch) with ints in 0..2**64-1",
                     i);
    }
    return -1;
}

static PyObject *FP_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *core, *ops, *watch;
    long long slice;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "FrameProgram(core, ops, watch, slice_ns) takes no keywords");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!OOL", CoreType, &core, &ops, &watch, &slice)) return NULL;
    PyObject *opl = PySequence_Fast(ops, "frame program: ops must be a sequence");
    if (!opl) return NULL;
    PyObject *wl = PySequence_Fast(watch, "frame program: watch must be a sequence");
    if (!wl) {
        Py_DECREF(opl);
        return NULL;
    }
    Py_ssize_t nops = PySequence_Fast_GET_SIZE(opl), nw = PySequence_Fast_GET_SIZE(wl);
    FrameProgram *p = NULL;
    if (nops > (Py_ssize_t)HLE_FRAME_MAX_OPS || nw > (Py_ssize_t)0xffffffff) {
        PyErr_Format(PyExc_ValueError, "a frame program has at most %u ops", HLE_FRAME_MAX_OPS);
        goto fail;
    }
    p = (FrameProgram *)hlpy_alloc(type, 0);
    if (!p) goto fail;
    p->core = (Core *)Py_NewRef(core);
    p->f.ops = PyMem_Calloc(nops ? (size_t)nops : 1, sizeof *p->f.ops);
    p->watch = PyMem_Calloc(nw ? (size_t)nw : 1, sizeof *p->watch);
    if (!p->f.ops || !p->watch) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < nops; i++)
        if (parse_op(PySequence_Fast_GET_ITEM(opl, i), i, &p->f.ops[i]) < 0) goto fail;
    for (Py_ssize_t j = 0; j < nw; j++)
        if (hlpy_handle_arg(PySequence_Fast_GET_ITEM(wl, j), &p->watch[j]) < 0) goto fail;
    p->f.nops = (uint32_t)nops;
    p->f.nwatch = (uint32_t)nw;
    p->f.watch = p->watch;
    p->f.slice_ns = slice;
    int r = hle_frame_check(&p->core->ctx, &p->f);
    if (r) {
        hlpy_raise(r);
        goto fail;
    }
    Py_DECREF(opl);
    Py_DECREF(wl);
    return (PyObject *)p;
fail:
    Py_DECREF(opl);
    Py_DECREF(wl);
    Py_XDECREF((PyObject *)p);
    return NULL;
}

/* run(frame, timeout_ns): see the top of the file */
static PyObject *FP_run(FrameProgram *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "run(frame, timeout_ns)");
        return NULL;
    }
    unsigned long long frame = PyLong_AsUnsignedLongLong(args[0]);
    if (PyErr_Occurred()) return NULL;
    long long timeout = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    Core *c = p->core;
    NEED_ATTACHED(c);
    struct hle_frame_stop stop;
    int r = hle_frame_run(&c->ctx, &p->f, frame, timeout, c->ctx.spin_ns, &stop);
    return hlpy_frame_stop_result(r, &stop);
}

PyObject *hlpy_frame_stop_result(int r, const struct hle_frame_stop *s) {
    const struct hle_frame_stop stop = *s;
    switch (r) {
    case HL_OK: Py_RETURN_NONE;
    case HLE_FRAME_FAILED: return Py_BuildValue("(IsK)", stop.op, "failed", (unsigned long long)stop.word);
    case HLE_FRAME_WATCH:
        return Py_BuildValue("(IsKI)", stop.op, "watch", (unsigned long long)stop.word, stop.watch);
    case HL_E_TIMEOUT: return Py_BuildValue("(IsK)", stop.op, "timeout", (unsigned long long)stop.word);
    default: return hlpy_raise(r);
    }
}

static PyObject *FP_len(FrameProgram *p, void *closure) { return PyLong_FromUnsignedLong(p->f.nops); }

static PyMethodDef FP_methods[] = {
    {"run", (PyCFunction)(void (*)(void))FP_run, METH_FASTCALL,
     "run(frame, timeout_ns) -> None, or (op, 'failed'|'timeout', word) / (op, 'watch', word, j)"},
    {"bind_io", (PyCFunction)(void (*)(void))hlpy_fp_bind_io, METH_FASTCALL,
     "bind_io(inputs, outputs, idents, ndarray, empty_like): what frame() copies in, copies out and checks"},
    {"frame", (PyCFunction)(void (*)(void))hlpy_fp_frame, METH_FASTCALL,
     "frame(inputs, frame, timeout) -> None (not done), dict of outputs, False (agents changed) or a stop tuple"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef FP_getset[] = {
    {"nops", (getter)FP_len, NULL, "number of ops", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot FP_slots[] = {
    {Py_tp_dealloc, (void *)FP_dealloc},
    {Py_tp_doc, (void *)"A frame program (a prepared frame's stores, pushes, copies and waits), validated once."},
    {Py_tp_methods, FP_methods},
    {Py_tp_getset, FP_getset},
    {Py_tp_new, (void *)FP_new},
    {0, NULL},
};

PyType_Spec hlpy_frame_program_spec = {"hostless._core.FrameProgram", sizeof(FrameProgram), 0,
                                       Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, FP_slots};
