/*
 * frame.c (binding) -- hostless._core.FrameProgram: a frame program
 * (core/frame.c) built and validated once from a Python description, run
 * per frame with one call (the GIL released for the whole program, taken
 * back only for the interrupt hook).
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
 * The host's whole frame in the one call (CompiledGraph.run's fast path):
 *
 *   bind_io(inputs, outputs, idents, ndarray)   once, at compile
 *     inputs:  (name, format, itemsize, shape, dst_buffers) per graph input:
 *              the input is copied into every dst buffer (held, of
 *              itemsize * prod(shape) bytes) before the program runs
 *     outputs: (name, ndarray view) per graph output, copied out after it
 *     idents:  (ctl_offset, ctl_mask, ctl_want, consumer_offset,
 *              consumer_want) per agent: words of the mapping that must
 *              hold their compile-time values (u64 & mask, u32) before and
 *              after the frame
 *     ndarray: the type an input must be exactly (numpy.ndarray)
 *   frame(inputs, frame, timeout) -> one of
 *     None   nothing was done: the caller takes its general path (an agent's
 *            words changed, an input is not an exact C-contiguous ndarray of
 *            the input's format and shape, a name is missing or unknown, an
 *            unusual timeout, a destination no longer held, ...)
 *     dict   the frame ran and the agents' words held: {name: copy of output}
 *     False  the frame ran, an agent's words changed meanwhile: the caller
 *            checks the agents (and reads the outputs itself)
 *     tuple  the frame ran and stopped: as run()
 *   and raises what run() raises.  inputs: a dict (None when bind_io had
 *   no inputs); timeout: None (forever) or seconds >= 0.  No Python object
 *   is made per frame but the outputs' copies and their dict.
 */
#include "binding.h"

#define FIO_MAX_NDIM 32

struct fio_in {
    PyObject *name;   /* interned str */
    char format[32];  /* the buffer protocol's format of the input's dtype */
    Py_ssize_t itemsize, nbytes;
    int ndim;
    Py_ssize_t shape[FIO_MAX_NDIM];
    uint32_t ndst;
    uint64_t *dst;     /* buffer handles */
    uint64_t *dst_off; /* their data's offset in the mapping */
};

struct fio_out {
    PyObject *name;
    PyObject *view;
};

struct fio_ident {
    uint64_t ctl_off, ctl_mask, ctl_want, cons_off;
    uint32_t cons_want;
};

typedef struct {
    PyObject_HEAD
    Core *core;
    struct hle_frame f;
    uint64_t *watch;
    /* bind_io */
    int io;
    Py_ssize_t nin, nout, nid;
    struct fio_in *ins;
    struct fio_out *outs;
    struct fio_ident *ids;
    PyObject *ndarray;
} FrameProgram;

static PyObject *stop_result(int r, const struct hle_frame_stop *s);
static PyObject *str_copy; /* "copy", interned at the first bind_io */

static void fio_clear(FrameProgram *p) {
    for (Py_ssize_t i = 0; p->ins && i < p->nin; i++) {
        Py_XDECREF(p->ins[i].name);
        PyMem_Free(p->ins[i].dst);
        PyMem_Free(p->ins[i].dst_off);
    }
    for (Py_ssize_t i = 0; p->outs && i < p->nout; i++) {
        Py_XDECREF(p->outs[i].name);
        Py_XDECREF(p->outs[i].view);
    }
    PyMem_Free(p->ins);
    PyMem_Free(p->outs);
    PyMem_Free(p->ids);
    Py_CLEAR(p->ndarray);
    p->ins = NULL;
    p->outs = NULL;
    p->ids = NULL;
    p->nin = p->nout = p->nid = 0;
    p->io = 0;
}

static void FP_dealloc(FrameProgram *p) {
    fio_clear(p);
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
    return stop_result(r, &stop);
}

/* ---- the whole frame in one call: bind_io and frame (see the top of the file) ---- */

static int fio_u64(PyObject *o, uint64_t *out, const char *what) {
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "bind_io: %s is not an int", what);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(o);
    return PyErr_Occurred() ? -1 : 0;
}

static int fio_parse_in(FrameProgram *p, PyObject *t, struct fio_in *in) {
    hle_ctx *c = &p->core->ctx;
    PyObject *name, *shape, *dsts;
    const char *fmt;
    Py_ssize_t itemsize;
    if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "UsnO!O", &name, &fmt, &itemsize, &PyTuple_Type, &shape, &dsts)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "bind_io: an input is (name, format, itemsize, shape, dsts)");
        return -1;
    }
    if (strlen(fmt) >= sizeof in->format || itemsize <= 0 || PyTuple_GET_SIZE(shape) > FIO_MAX_NDIM) {
        PyErr_SetString(PyExc_ValueError, "bind_io: an input's format, itemsize or shape is out of range");
        return -1;
    }
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name);
    in->name = name;
    strcpy(in->format, fmt);
    in->itemsize = itemsize;
    in->ndim = (int)PyTuple_GET_SIZE(shape);
    Py_ssize_t n = itemsize;
    for (int d = 0; d < in->ndim; d++) {
        Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (x < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bind_io: a negative dimension");
            return -1;
        }
        in->shape[d] = x;
        n *= x;
    }
    in->nbytes = n;
    PyObject *dl = PySequence_Fast(dsts, "bind_io: an input's dsts must be a sequence");
    if (!dl) return -1;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(dl);
    in->dst = PyMem_Calloc(nd ? (size_t)nd : 1, sizeof *in->dst);
    in->dst_off = PyMem_Calloc(nd ? (size_t)nd : 1, sizeof *in->dst_off);
    in->ndst = (uint32_t)nd;
    if (!in->dst || !in->dst_off) {
        Py_DECREF(dl);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < nd; j++) {
        uint64_t h, nb = 0;
        if (hlpy_handle_arg(PySequence_Fast_GET_ITEM(dl, j), &h) < 0) goto fail;
        int64_t idx = hle_check_handle(c, h, HL_KIND_BUFFER, 1);
        if (idx < 0) {
            hlpy_raise((int)idx);
            goto fail;
        }
        char *d = hl_buffer_data(&c->dv, h, &nb);
        if (!d || d < c->base || (uint64_t)(d - c->base) > c->size || nb > c->size - (uint64_t)(d - c->base) ||
            nb != (uint64_t)n) {
            PyErr_Format(PyExc_ValueError, "bind_io: buffer 0x%llx is not a host buffer of %zd bytes in the heap",
                         (unsigned long long)h, n);
            goto fail;
        }
        in->dst[j] = h;
        in->dst_off[j] = (uint64_t)(d - c->base);
    }
    Py_DECREF(dl);
    return 0;
fail:
    Py_DECREF(dl);
    return -1;
}

/* bind_io(inputs, outputs, idents, ndarray): see the top of the file */
static PyObject *FP_bind_io(FrameProgram *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "bind_io(inputs, outputs, idents, ndarray)");
        return NULL;
    }
    NEED_ATTACHED(p->core);
    hle_ctx *c = &p->core->ctx;
    if (!str_copy && !(str_copy = PyUnicode_InternFromString("copy"))) return NULL;
    fio_clear(p);
    PyObject *il = PySequence_Fast(args[0], "bind_io: inputs must be a sequence");
    PyObject *ol = il ? PySequence_Fast(args[1], "bind_io: outputs must be a sequence") : NULL;
    PyObject *dl = ol ? PySequence_Fast(args[2], "bind_io: idents must be a sequence") : NULL;
    if (!dl) goto fail;
    Py_ssize_t ni = PySequence_Fast_GET_SIZE(il), no = PySequence_Fast_GET_SIZE(ol), nd = PySequence_Fast_GET_SIZE(dl);
    p->ins = PyMem_Calloc(ni ? (size_t)ni : 1, sizeof *p->ins);
    p->outs = PyMem_Calloc(no ? (size_t)no : 1, sizeof *p->outs);
    p->ids = PyMem_Calloc(nd ? (size_t)nd : 1, sizeof *p->ids);
    if (!p->ins || !p->outs || !p->ids) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < ni; i++) {
        p->nin = i + 1; /* what fio_clear frees */
        if (fio_parse_in(p, PySequence_Fast_GET_ITEM(il, i), &p->ins[i]) < 0) goto fail;
    }
    for (Py_ssize_t i = 0; i < no; i++) {
        PyObject *name, *view, *t = PySequence_Fast_GET_ITEM(ol, i);
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "UO", &name, &view)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "bind_io: an output is (name, view)");
            goto fail;
        }
        p->nout = i + 1;
        p->outs[i].name = Py_NewRef(name);
        p->outs[i].view = Py_NewRef(view);
    }
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(dl, i);
        struct fio_ident *d = &p->ids[i];
        uint64_t cw;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) {
            PyErr_SetString(PyExc_TypeError, "bind_io: an ident is (ctl_offset, ctl_mask, ctl_want, consumer_offset, consumer_want)");
            goto fail;
        }
        if (fio_u64(PyTuple_GET_ITEM(t, 0), &d->ctl_off, "ctl_offset") < 0 ||
            fio_u64(PyTuple_GET_ITEM(t, 1), &d->ctl_mask, "ctl_mask") < 0 ||
            fio_u64(PyTuple_GET_ITEM(t, 2), &d->ctl_want, "ctl_want") < 0 ||
            fio_u64(PyTuple_GET_ITEM(t, 3), &d->cons_off, "consumer_offset") < 0 ||
            fio_u64(PyTuple_GET_ITEM(t, 4), &cw, "consumer_want") < 0)
            goto fail;
        if (d->ctl_off % 8 || d->cons_off % 4 || c->size < 8 || d->ctl_off > c->size - 8 || d->cons_off > c->size - 4 ||
            cw > 0xffffffffull) {
            PyErr_SetString(PyExc_ValueError, "bind_io: an ident's word lies outside the mapping or is misaligned");
            goto fail;
        }
        d->cons_want = (uint32_t)cw;
        p->nid = i + 1;
    }
    p->ndarray = Py_NewRef(args[3]);
    p->io = 1;
    Py_DECREF(il);
    Py_DECREF(ol);
    Py_DECREF(dl);
    Py_RETURN_NONE;
fail:
    fio_clear(p);
    Py_XDECREF(il);
    Py_XDECREF(ol);
    Py_XDECREF(dl);
    return NULL;
}

/* every agent's words as compiled (two loads each) */
static int fio_idents_hold(const FrameProgram *p) {
    const char *base = p->core->ctx.base;
    for (Py_ssize_t i = 0; i < p->nid; i++) {
        const struct fio_ident *d = &p->ids[i];
        uint32_t cons = __atomic_load_n((const uint32_t *)(base + d->cons_off), __ATOMIC_ACQUIRE);
        uint64_t ctl = __atomic_load_n((const uint64_t *)(base + d->ctl_off), __ATOMIC_ACQUIRE);
        if (cons != d->cons_want || (ctl & d->ctl_mask) != d->ctl_want) return 0;
    }
    return 1;
}

/* Copy the frame's inputs into their buffers: 1 done, 0 not an input this path takes
 * (nothing is left half-done that the general path does not redo), -1 an error. */
static int fio_put_inputs(FrameProgram *p, PyObject *inputs) {
    hle_ctx *c = &p->core->ctx;
    if (!PyDict_CheckExact(inputs) || PyDict_GET_SIZE(inputs) != p->nin) return 0;
    for (Py_ssize_t i = 0; i < p->nin; i++) {
        const struct fio_in *in = &p->ins[i];
        PyObject *o = PyDict_GetItemWithError(inputs, in->name);
        if (!o) {
            if (PyErr_Occurred()) return -1;
            return 0;
        }
        if ((PyObject *)Py_TYPE(o) != p->ndarray) return 0;
        Py_buffer v;
        if (PyObject_GetBuffer(o, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            PyErr_Clear();
            return 0;
        }
        int ok = v.len == in->nbytes && v.itemsize == in->itemsize && v.ndim == in->ndim && v.format &&
                 strcmp(v.format, in->format) == 0;
        for (int d = 0; ok && d < in->ndim; d++) ok = v.shape[d] == in->shape[d];
        for (uint32_t j = 0; ok && j < in->ndst; j++)
            ok = hle_check_handle(c, in->dst[j], HL_KIND_BUFFER, 1) >= 0 && in->dst_off[j] <= c->size &&
                 (uint64_t)in->nbytes <= c->size - in->dst_off[j];
        for (uint32_t j = 0; ok && j < in->ndst; j++) memmove(c->base + in->dst_off[j], v.buf, (size_t)in->nbytes);
        PyBuffer_Release(&v);
        if (!ok) return 0;
    }
    return 1;
}

/* timeout: None -> -1; seconds >= 0 (int or float) -> ns; else 0 (the general path decides) */
static int fio_timeout(PyObject *t, int64_t *ns) {
    if (t == Py_None) {
        *ns = -1;
        return 1;
    }
    double s;
    if (PyFloat_CheckExact(t)) {
        s = PyFloat_AS_DOUBLE(t);
    } else if (PyLong_CheckExact(t)) {
        s = PyLong_AsDouble(t);
        if (s == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else {
        return 0;
    }
    if (!(s >= 0.0 && s < 1e9)) return 0;
    *ns = (int64_t)(s * 1e9);
    return 1;
}

/* frame(inputs, frame, timeout): see the top of the file */
static PyObject *FP_frame(FrameProgram *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "frame(inputs, frame, timeout)");
        return NULL;
    }
    Core *c = p->core;
    int64_t timeout;
    if (!p->io || !c->ctx.base || !fio_timeout(args[2], &timeout) || !fio_idents_hold(p)) Py_RETURN_NONE;
    unsigned long long frame = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (p->nin) {
        int r = fio_put_inputs(p, args[0]);
        if (r < 0) return NULL;
        if (r == 0) Py_RETURN_NONE;
    } else if (args[0] != Py_None) {
        Py_RETURN_NONE;
    }
    struct hle_frame_stop stop;
    int r = hle_frame_run(&c->ctx, &p->f, frame, timeout, c->ctx.spin_ns, &stop);
    if (r != HL_OK) return stop_result(r, &stop);
    if (!c->ctx.base || !fio_idents_hold(p)) Py_RETURN_FALSE;
    PyObject *out = PyDict_New();
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < p->nout; i++) {
        PyObject *v = PyObject_CallMethodNoArgs(p->outs[i].view, str_copy);
        if (!v || PyDict_SetItem(out, p->outs[i].name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(v);
    }
    return out;
}

static PyObject *stop_result(int r, const struct hle_frame_stop *s) {
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
    {"bind_io", (PyCFunction)(void (*)(void))FP_bind_io, METH_FASTCALL,
     "bind_io(inputs, outputs, idents, ndarray): what frame() copies in, copies out and checks"},
    {"frame", (PyCFunction)(void (*)(void))FP_frame, METH_FASTCALL,
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
