/*
 * frame_io.c (binding) -- FrameProgram.bind_io and FrameProgram.frame: the
 * host's whole frame in one call (the type itself: frame.c).
 *
 *   bind_io(inputs, outputs, idents, ndarray, empty_like)   once, at compile
 *     inputs:  (name, format, itemsize, shape, dst_buffers) per graph input:
 *              the input is copied into every dst buffer (held, of
 *              itemsize * prod(shape) bytes) before the program runs
 *     outputs: (name, ndarray view, buffer) per graph output: a C-contiguous
 *              view of all of a held host buffer, copied out after it
 *     idents:  (ctl_offset, ctl_mask, ctl_want, consumer_offset,
 *              consumer_want) per agent: words of the mapping that must
 *              hold their compile-time values (u64 & mask, u32) before and
 *              after the frame
 *     ndarray: the type an input must be exactly (numpy.ndarray)
 *     empty_like: numpy.empty_like, which makes the outputs' arrays
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
 *   is made per frame but the outputs' copies and their dict, and those are
 *   made while the agents work: the program calls back at its first wait
 *   that has to wait (hle_frame_run_hooked), and once the frame is done its
 *   outputs are one memcpy each into them; view.copy() after the frame
 *   where the frame was done at the first look (nothing to overlap) or that
 *   call back failed (a MemoryError is then raised there, as before).
 */
#include "binding.h"
#include "frame_program.h"

static PyObject *str_copy; /* "copy", interned at the first bind_io */

void hlpy_fio_clear(FrameProgram *p) {
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
    Py_CLEAR(p->empty_like);
    p->ins = NULL;
    p->outs = NULL;
    p->ids = NULL;
    p->nin = p->nout = p->nid = 0;
    p->io = 0;
}


static int fio_u64(PyObject *o, uint64_t *out, const char *what) {
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "bind_io: %s is not an int", what);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(o);
    return PyErr_Occurred() ? -1 : 0;
}

/* The offset in the mapping of held host buffer h's data, which must be n bytes. */
static int fio_extent(hle_ctx *c, uint64_t h, Py_ssize_t n, uint64_t *off) {
    uint64_t nb = 0;
    int64_t idx = hle_check_handle(c, h, HL_KIND_BUFFER, 1);
    if (idx < 0) {
        hlpy_raise((int)idx);
        return -1;
    }
    char *d = hl_buffer_data(&c->dv, h, &nb);
    if (!d || d < c->base || (uint64_t)(d - c->base) > c->size || nb > c->size - (uint64_t)(d - c->base) ||
        nb != (uint64_t)n) {
        char msg[160]; /* (PyErr_Format has no %llx before 3.12) */
        snprintf(msg, sizeof msg, "bind_io: buffer 0x%llx is not a host buffer of %zd bytes in the heap",
                 (unsigned long long)h, n);
        PyErr_SetString(PyExc_ValueError, msg);
        return -1;
    }
    *off = (uint64_t)(d - c->base);
    return 0;
}

/* An output: (name, view, buffer), the view C-contiguous and the buffer's size (the
 * caller's: a view of that buffer, which only the fallback copies). */
static int fio_parse_out(FrameProgram *p, PyObject *t, struct fio_out *o) {
    hle_ctx *c = &p->core->ctx;
    PyObject *name, *view, *bh;
    uint64_t h;
    if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "UOO", &name, &view, &bh)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "bind_io: an output is (name, view, buffer)");
        return -1;
    }
    o->name = Py_NewRef(name);
    o->view = Py_NewRef(view);
    if (hlpy_handle_arg(bh, &h) < 0) return -1;
    Py_buffer v; /* (a window of the domain's mmap object: another mapping than the engine's) */
    if (PyObject_GetBuffer(view, &v, PyBUF_C_CONTIGUOUS) < 0) return -1;
    Py_ssize_t n = v.len;
    PyBuffer_Release(&v);
    if (fio_extent(c, h, n, &o->off) < 0) return -1;
    o->buf = h;
    o->nbytes = n;
    return 0;
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
        uint64_t h;
        if (hlpy_handle_arg(PySequence_Fast_GET_ITEM(dl, j), &h) < 0 || fio_extent(c, h, n, &in->dst_off[j]) < 0)
            goto fail;
        in->dst[j] = h;
    }
    Py_DECREF(dl);
    return 0;
fail:
    Py_DECREF(dl);
    return -1;
}

/* bind_io(inputs, outputs, idents, ndarray, empty_like): see the top of the file */
PyObject *hlpy_fp_bind_io(FrameProgram *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyType_Check(args[3]) || !PyCallable_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "bind_io(inputs, outputs, idents, ndarray, empty_like)");
        return NULL;
    }
    NEED_ATTACHED(p->core);
    hle_ctx *c = &p->core->ctx;
    if (!str_copy && !(str_copy = PyUnicode_InternFromString("copy"))) return NULL;
    hlpy_fio_clear(p);
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
        p->nin = i + 1; /* what hlpy_fio_clear frees */
        if (fio_parse_in(p, PySequence_Fast_GET_ITEM(il, i), &p->ins[i]) < 0) goto fail;
    }
    for (Py_ssize_t i = 0; i < no; i++) {
        p->nout = i + 1; /* what hlpy_fio_clear frees */
        if (fio_parse_out(p, PySequence_Fast_GET_ITEM(ol, i), &p->outs[i]) < 0) goto fail;
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
    p->empty_like = Py_NewRef(args[4]);
    p->io = 1;
    Py_DECREF(il);
    Py_DECREF(ol);
    Py_DECREF(dl);
    Py_RETURN_NONE;
fail:
    hlpy_fio_clear(p);
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

/* The outputs' arrays, made while the agents work (fio_pre_make: the program's hook
 * at its first wait that has to wait). */
#define FIO_PRE_STACK 8
struct fio_pre {
    FrameProgram *p;
    PyObject *out;   /* {name: array}; NULL: not made (view.copy() after the frame) */
    Py_buffer *bufs; /* the arrays' data, one per output */
    Py_ssize_t held; /* bufs[0 .. held) are held */
    PyObject *et, *ev, *etb; /* a KeyboardInterrupt (or another non-Exception) raised meanwhile */
};

static void fio_pre_drop(struct fio_pre *x) {
    for (Py_ssize_t i = 0; i < x->held; i++) PyBuffer_Release(&x->bufs[i]);
    x->held = 0;
    Py_CLEAR(x->out);
}

/* One empty array per output (numpy.empty_like of its view), held for a memcpy.  A
 * failure leaves none and no error: the frame is in flight, and view.copy() after it
 * raises the error again if it still happens.  A KeyboardInterrupt (a signal handler that
 * ran meanwhile) or SystemExit is kept and raised once the frame is done. */
static int fio_pre_make(void *a) {
    struct fio_pre *x = a;
    FrameProgram *p = x->p;
    if (!(x->out = PyDict_New())) goto fail;
    for (Py_ssize_t i = 0; i < p->nout; i++) {
        PyObject *arr = PyObject_CallOneArg(p->empty_like, p->outs[i].view);
        if (!arr) goto fail;
        int r = PyDict_SetItem(x->out, p->outs[i].name, arr);
        Py_DECREF(arr); /* (the dict holds it) */
        if (r < 0 || PyObject_GetBuffer(arr, &x->bufs[i], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto fail;
        x->held = i + 1;
        if (x->bufs[i].len != p->outs[i].nbytes) goto fail;
    }
    return 0;
fail:
    if (PyErr_ExceptionMatches(PyExc_Exception) || x->et)
        PyErr_Clear();
    else
        PyErr_Fetch(&x->et, &x->ev, &x->etb);
    fio_pre_drop(x);
    return 0;
}

/* The frame's outputs: each output buffer's bytes into its array made ahead (the
 * buffer still held: one released meanwhile fails as a frame program's op does), or
 * view.copy() where none was made. */
static PyObject *fio_outputs(FrameProgram *p, struct fio_pre *x) {
    hle_ctx *c = &p->core->ctx;
    if (!x->out) {
        PyObject *out = PyDict_New();
        for (Py_ssize_t i = 0; out && i < p->nout; i++) {
            PyObject *v = PyObject_CallMethodNoArgs(p->outs[i].view, str_copy);
            if (!v || PyDict_SetItem(out, p->outs[i].name, v) < 0) Py_CLEAR(out);
            Py_XDECREF(v);
        }
        return out;
    }
    for (Py_ssize_t i = 0; i < p->nout; i++) {
        const struct fio_out *o = &p->outs[i];
        int64_t idx = hle_check_handle(c, o->buf, HL_KIND_BUFFER, 1);
        if (idx < 0 || o->off > c->size || (uint64_t)o->nbytes > c->size - o->off) {
            hlpy_raise(idx < 0 ? (int)idx : HL_E_CORRUPT);
            return NULL;
        }
        memcpy(x->bufs[i].buf, c->base + o->off, (size_t)o->nbytes);
    }
    PyObject *out = x->out;
    x->out = NULL; /* (given to the caller; its fio_pre_drop releases the buffers) */
    return out;
}

/* frame(inputs, frame, timeout): see the top of the file */
PyObject *hlpy_fp_frame(FrameProgram *p, PyObject *const *args, Py_ssize_t nargs) {
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
    Py_buffer stack[FIO_PRE_STACK];
    struct fio_pre pre = {p, NULL, stack, 0, NULL, NULL, NULL};
    if (p->nout > FIO_PRE_STACK && !(pre.bufs = PyMem_Malloc((size_t)p->nout * sizeof *pre.bufs)))
        pre.bufs = NULL; /* (no arrays made ahead: view.copy() after the frame) */
    struct hle_frame_stop stop;
    int (*make)(void *) = p->nout && pre.bufs ? fio_pre_make : NULL;
    int r = hle_frame_run_hooked(&c->ctx, &p->f, frame, timeout, c->ctx.spin_ns, make, &pre, &stop);
    PyObject *res;
    if (r != HL_OK)
        res = hlpy_frame_stop_result(r, &stop);
    else if (!c->ctx.base || !fio_idents_hold(p))
        res = Py_NewRef(Py_False);
    else
        res = fio_outputs(p, &pre);
    fio_pre_drop(&pre);
    if (pre.bufs != stack) PyMem_Free(pre.bufs);
    if (pre.et) { /* the frame ran (its outputs dropped): the interrupt now */
        Py_XDECREF(res);
        PyErr_Clear();
        PyErr_Restore(pre.et, pre.ev, pre.etb);
        return NULL;
    }
    return res;
}
