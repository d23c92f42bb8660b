/*
 * handle_type.c -- hostless._core.Handle, the C base of Fence, Timeline,
 * Buffer and Queue: one held reference, the hot operations (signal, wait,
 * release) through METH_FASTCALL, the buffer protocol over a window of the
 * domain's mmap, and the Core methods that make Handle instances.
 */
#include "binding.h"

#include <structmember.h>

static PyObject *StatusCls, *StatusMap;

/* the members for the words 0..7 (ACTIVE, SUCCESS, ERROR, CANCEL, OWNER_DIED), looked up once */
#define SMALL_STATUS 8
static PyObject *small_status[SMALL_STATUS];

int hlpy_set_status(PyObject *cls, PyObject *map) {
    Py_XSETREF(StatusCls, Py_NewRef(cls));
    Py_XSETREF(StatusMap, Py_NewRef(map));
    for (int i = 0; i < SMALL_STATUS; i++) {
        PyObject *k = PyLong_FromLong(i);
        if (!k) return -1;
        PyObject *m = PyDict_GetItemWithError(map, k);
        Py_DECREF(k);
        if (!m && PyErr_Occurred()) return -1;
        Py_XSETREF(small_status[i], Py_XNewRef(m));
    }
    return 0;
}



/* What a wait for point `value` of timeline h returns, given the word w it
 * read: SUCCESS, also for a point reached before a failure (hle_point_status),
 * or the failure; CorruptDomain for a word no participant writes. */
PyObject *hlpy_timeline_status(hle_ctx *c, uint64_t h, uint64_t value, uint64_t w) {
    if ((w & HL_TIMELINE_FAILED) ? (w & ~HL_TIMELINE_FAILED) > 0xffffffffull || (w & 0xffffffffull) == HL_STATUS_SUCCESS ||
                                       !hl_status_valid(w & 0xffffffffull)
                                 : w > HL_TIMELINE_MAX) {
        hle_fail(HL_E_CORRUPT,
                 "timeline 0x%llx holds an invalid word 0x%llx (written by a buggy or hostile participant)",
                 (unsigned long long)h, (unsigned long long)w);
        return hlpy_raise(HL_E_CORRUPT);
    }
    uint32_t s = HL_STATUS_SUCCESS;
    if (w & HL_TIMELINE_FAILED) {
        int r = hle_point_status(c, h, value, w, &s);
        if (r) return hlpy_raise(r);
    }
    return hlpy_status_obj(s);
}

PyObject *hlpy_status_obj(uint64_t s) {
    if (!hl_status_valid(s)) {
        /* a completion word no conforming participant writes (a timeline's
         * word >= 2^62 without a valid status, a fence word of 1, 5, ...) */
        hle_fail(HL_E_CORRUPT,
               "the object completed with an invalid status word 0x%llx (written by a buggy or hostile "
               "participant)",
               (unsigned long long)s);
        return hlpy_raise(HL_E_CORRUPT);
    }
    if (s < SMALL_STATUS && small_status[s]) return Py_NewRef(small_status[s]);
    PyObject *k = PyLong_FromUnsignedLongLong(s);
    if (!k) return NULL;
    PyObject *m = StatusMap ? PyDict_GetItemWithError(StatusMap, k) : NULL;
    if (m) {
        Py_DECREF(k);
        return Py_NewRef(m);
    }
    if (PyErr_Occurred() || !StatusCls) {
        Py_DECREF(k);
        return NULL;
    }
    PyObject *r = PyObject_CallOneArg(StatusCls, k);
    Py_DECREF(k);
    return r;
}

static int handle_live(Handle *o) {
    if (!o->held) {
        hle_fail(HL_E_HANDLE, "object 0x%llx was released", (unsigned long long)o->handle);
        hlpy_raise(HL_E_HANDLE);
        return 0;
    }
    if (!o->core || !o->core->ctx.base || o->core->ctx.me < 0) {
        PyErr_SetString(hlpy_exc(HL_E_CLOSED), "the object's domain is closed");
        return 0;
    }
    return 1;
}

Handle *hlpy_handle_make(PyTypeObject *cls, Core *c, PyObject *dom, uint64_t h) {
    if (!PyType_IsSubtype(cls, HandleType)) {
        PyErr_SetString(PyExc_TypeError, "class must derive from hostless._core.Handle");
        return NULL;
    }
    Handle *o = (Handle *)hlpy_alloc(cls, 0);
    if (!o) return NULL;
    o->core = (Core *)Py_NewRef((PyObject *)c);
    o->dom = Py_NewRef(dom);
    o->handle = h;
    o->held = 1;
    return o;
}

/* Drop the reference (the __exit__ of a `with` block and the start of release()). */
static PyObject *Handle_release(Handle *o, PyObject *noargs) {
    if (!o->held) {
        hle_fail(HL_E_HANDLE, "object 0x%llx was already released", (unsigned long long)o->handle);
        return hlpy_raise(HL_E_HANDLE);
    }
    o->held = 0;
    Py_CLEAR(o->bb_map);
    o->bb_len = 0;
    if (o->core && o->core->ctx.base && o->core->ctx.me >= 0) {
        int r = hle_release(&o->core->ctx, o->handle);
        if (r) return hlpy_raise(r);
    }
    Py_RETURN_NONE;
}

/* release(): drop the reference, then release the inner nodes of a merged
 * tree (Domain.merge of more than 32 fences keeps them in _inner). */
static PyObject *Handle_release_all(Handle *o, PyObject *noargs) {
    PyObject *inner = o->held ? o->inner : NULL;
    Py_XINCREF(inner);
    PyObject *r = Handle_release(o, NULL);
    if (!r || !inner) {
        Py_XDECREF(inner);
        return r;
    }
    int t = PyObject_IsTrue(inner);
    if (t <= 0) {
        Py_DECREF(inner);
        if (t < 0) Py_CLEAR(r);
        return r;
    }
    Py_CLEAR(o->inner);
    PyObject *it = PyObject_GetIter(inner);
    Py_DECREF(inner);
    if (!it) {
        Py_DECREF(r);
        return NULL;
    }
    PyObject *node;
    while ((node = PyIter_Next(it))) {
        PyObject *x = PyObject_CallMethod(node, "release", NULL);
        Py_DECREF(node);
        if (!x) break;
        Py_DECREF(x);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) Py_CLEAR(r);
    return r;
}

static int parse_timeout(PyObject *t, long long *ns) {
    if (!t || t == Py_None) {
        *ns = -1;
        return 0;
    }
    double d = PyFloat_AsDouble(t);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    if (d < 0 || d != d) {
        PyErr_SetString(PyExc_ValueError, "timeout must be >= 0 or None");
        return -1;
    }
    *ns = d > 9e9 ? (long long)9e18 : (long long)(d * 1e9);
    return 0;
}

/* parse (pos..., *, spin=None) where pos names are given; returns 0 */
static int parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names, int npos,
                      PyObject **out, int nout) {
    for (int i = 0; i < nout; i++) out[i] = NULL;
    if (nargs > npos) {
        PyErr_Format(PyExc_TypeError, "takes at most %d positional arguments", npos);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) out[i] = args[i];
    if (kwnames) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            const char *kn = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k)); /* cached in the str object */
            if (!kn) return -1;
            int found = 0;
            for (int i = 0; i < nout; i++) {
                if (kn[0] == names[i][0] && strcmp(kn, names[i]) == 0) {
                    if (out[i]) {
                        PyErr_Format(PyExc_TypeError, "got multiple values for argument '%s'", kn);
                        return -1;
                    }
                    out[i] = args[nargs + k];
                    found = 1;
                }
            }
            if (!found) {
                PyErr_Format(PyExc_TypeError, "unexpected keyword argument '%s'", kn);
                return -1;
            }
        }
    }
    return 0;
}

static int parse_spin(Core *c, PyObject *sp, long long *ns) {
    if (!sp || sp == Py_None) {
        *ns = c->ctx.spin_ns;
        return 0;
    }
    double d = PyFloat_AsDouble(sp);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    if (!(d >= 0 && d <= 3600)) { /* nan and inf too: hostless.shm.check_spin's rule */
        PyErr_Format(PyExc_ValueError, "spin must be seconds in 0..3600, got %R", sp);
        return -1;
    }
    *ns = (long long)(d * 1e9);
    return 0;
}

/* Fence.signal(status=SUCCESS) */
static PyObject *Handle_fence_signal(Handle *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"status"};
    PyObject *a[1];
    if (parse_args(args, nargs, kwnames, names, 1, a, 1) < 0) return NULL;
    unsigned long long s = HL_STATUS_SUCCESS;
    if (a[0]) {
        s = PyLong_AsUnsignedLongLong(a[0]);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "a status is an int: SUCCESS, ERROR, CANCEL, OWNER_DIED or 64..2^32-1");
            return NULL;
        }
    }
    if (!handle_live(o)) return NULL;
    int r = hle_signal(&o->core->ctx, o->handle, s);
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

/* Fence.wait(timeout=None, *, spin=None) -> Status */
static PyObject *Handle_fence_wait(Handle *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"timeout", "spin"};
    PyObject *a[2];
    long long tmo, spin;
    uint64_t w;
    if (parse_args(args, nargs, kwnames, names, 1, a, 2) < 0) return NULL;
    if (!handle_live(o) || parse_timeout(a[0], &tmo) < 0 || parse_spin(o->core, a[1], &spin) < 0) return NULL;
    int r = hle_wait(&o->core->ctx, o->handle, 1, tmo, spin, &w);
    if (r == HL_E_TIMEOUT) {
        hle_fail(HL_E_TIMEOUT, "fence 0x%llx not signaled within the timeout", (unsigned long long)o->handle);
        return hlpy_raise(HL_E_TIMEOUT);
    }
    if (r) return hlpy_raise(r);
    return hlpy_status_obj(w);
}

/* Timeline.signal(value) */
static PyObject *Handle_timeline_signal(Handle *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"value"};
    PyObject *a[1];
    if (parse_args(args, nargs, kwnames, names, 1, a, 1) < 0) return NULL;
    if (!a[0]) {
        PyErr_SetString(PyExc_TypeError, "signal() needs a value");
        return NULL;
    }
    if (!PyLong_Check(a[0]) || PyBool_Check(a[0])) {
        PyErr_SetString(PyExc_TypeError, "timeline values are ints");
        return NULL;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(a[0]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "timeline values are integers in 0..2^62-1");
        return NULL;
    }
    if (!handle_live(o)) return NULL;
    int r = hle_timeline_signal(&o->core->ctx, o->handle, v);
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

/* Timeline.wait(value, timeout=None, *, spin=None) -> Status (SUCCESS or the failure) */
static PyObject *Handle_timeline_wait(Handle *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"value", "timeout", "spin"};
    PyObject *a[3];
    long long tmo, spin;
    uint64_t w;
    if (parse_args(args, nargs, kwnames, names, 2, a, 3) < 0) return NULL;
    if (!a[0]) {
        PyErr_SetString(PyExc_TypeError, "wait() needs a value");
        return NULL;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(a[0]);
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > HL_TIMELINE_MAX) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "timeline values are integers in 0..2^62-1");
        return NULL;
    }
    if (!handle_live(o) || parse_timeout(a[1], &tmo) < 0 || parse_spin(o->core, a[2], &spin) < 0) return NULL;
    int r = hle_wait(&o->core->ctx, o->handle, v, tmo, spin, &w);
    if (r == HL_E_TIMEOUT) {
        hle_fail(HL_E_TIMEOUT, "timeline 0x%llx did not reach %llu within the timeout", (unsigned long long)o->handle,
                 v);
        return hlpy_raise(HL_E_TIMEOUT);
    }
    if (r) return hlpy_raise(r);
    return hlpy_timeline_status(&o->core->ctx, o->handle, v, w);
}

static int Handle_traverse(Handle *b, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)b)); /* a heap type's instances hold a reference to it */
    Py_VISIT(b->inner);
    Py_VISIT(b->bb_map);
    Py_VISIT(b->dom);
    Py_VISIT((PyObject *)b->core);
    return 0;
}

static int Handle_clear(Handle *b) {
    Py_CLEAR(b->inner);
    Py_CLEAR(b->bb_map);
    Py_CLEAR(b->dom);
    Py_CLEAR(b->core);
    return 0;
}

/* Dropping the last Python reference drops the domain reference too (as
 * release() would), unless the domain is closed. */
static void Handle_finalize(Handle *o) {
    if (o->held && o->core && o->core->ctx.base && o->core->ctx.me >= 0) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        o->held = 0;
        hle_release(&o->core->ctx, o->handle);
        PyErr_Restore(et, ev, tb);
    }
}

/* The finalizer runs first (a Python subclass's subtype_dealloc or the collector may
 * have run it already: it is then a no-op, the reference being dropped); it makes no
 * new reference to o, so o cannot come back to life. */
static void Handle_dealloc(Handle *o) {
    PyObject_GC_UnTrack(o);
    Handle_finalize(o);
    if (o->weakreflist) PyObject_ClearWeakRefs((PyObject *)o);
    Handle_clear(o);
    hlpy_free((PyObject *)o);
}

static PyObject *Handle_get_held(Handle *o, void *closure) { return PyBool_FromLong(o->held); }
static PyObject *Handle_get_handle(Handle *o, void *closure) { return PyLong_FromUnsignedLongLong(o->handle); }
static PyObject *Handle_get_dom(Handle *o, void *closure) { return Py_NewRef(o->dom ? o->dom : Py_None); }
static PyObject *Handle_get_core(Handle *o, void *closure) {
    return Py_NewRef(o->core ? (PyObject *)o->core : Py_None);
}
static PyObject *Handle_get_nbytes(Handle *o, void *closure) { return PyLong_FromSsize_t(o->bb_len); }
static PyObject *Handle_get_offset(Handle *o, void *closure) { return PyLong_FromSsize_t(o->bb_off); }
static PyObject *Handle_get_device(Handle *o, void *closure) { return PyLong_FromLong(o->bb_device); }
/* _device = device heap index + 1 marks a device buffer (its host views refuse); 0: host */
static int Handle_set_device(Handle *o, PyObject *v, void *closure) {
    long d = v ? PyLong_AsLong(v) : -1;
    if (d == -1 && PyErr_Occurred()) return -1;
    if (d < 0 || d > (long)HL_MAX_DEVICE_HEAPS) {
        PyErr_SetString(PyExc_ValueError, "_device is a device heap index + 1, or 0");
        return -1;
    }
    o->bb_device = (int)d;
    return 0;
}

static PyGetSetDef Handle_getset[] = {
    {"handle", (getter)Handle_get_handle, NULL, "global 64-bit handle, valid in every participant", NULL},
    {"_held", (getter)Handle_get_held, NULL, NULL, NULL},
    {"_dom", (getter)Handle_get_dom, NULL, NULL, NULL},
    {"_core", (getter)Handle_get_core, NULL, NULL, NULL},
    {"_window_len", (getter)Handle_get_nbytes, NULL, NULL, NULL},
    {"_window_off", (getter)Handle_get_offset, NULL, NULL, NULL},
    {"_device", (getter)Handle_get_device, (setter)Handle_set_device, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *Handle_enter(Handle *o, PyObject *noargs) { return Py_NewRef((PyObject *)o); }

/* __exit__: release the reference if it is still held (a `with` block owns it) */
static PyObject *Handle_exit(Handle *o, PyObject *args) {
    if (o->held) return Handle_release(o, NULL);
    Py_RETURN_NONE;
}

/* The methods Fence and Timeline expose as signal() / wait(): named and documented
 * as such (hostless._core.handle_method(i) makes the descriptor of entry i). */
static PyMethodDef named_methods[] = {
    {"signal", (PyCFunction)(void (*)(void))Handle_fence_signal, METH_FASTCALL | METH_KEYWORDS,
     "signal($self, /, status=2)\n--\n\n"
     "Complete the fence with ``status``: SUCCESS (2, the default), ERROR, CANCEL,\n"
     "OWNER_DIED or a custom code 64..2**32-1.  One atomic step: the first signal\n"
     "stands and wakes every waiter in every process; merged fences that contain\n"
     "this one are told.  Raises AlreadySignaled when it was signaled before,\n"
     "InvalidOperation for a merged fence (it completes from its children),\n"
     "ValueError for another status, InvalidHandle after release(), DomainClosed."},
    {"wait", (PyCFunction)(void (*)(void))Handle_fence_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait($self, /, timeout=None, *, spin=None)\n--\n\n"
     "Block until the fence is signaled; returns its final Status (SUCCESS or the\n"
     "failure: ERROR, CANCEL, OWNER_DIED when its owner died, a custom code).\n"
     "Spins for ``spin`` seconds (default: the domain's ``spin``), then sleeps on a\n"
     "futex with the GIL released; a status stored by a device without a wake-up\n"
     "is seen within the domain's poll interval.  ``timeout`` in seconds (None:\n"
     "forever); TimeoutError when it passes.  Ctrl-C (any signal handler that\n"
     "raises) ends the wait within a few ms, in the main thread.  InvalidHandle\n"
     "after release(), DomainClosed when the domain is closed meanwhile."},
    {"signal", (PyCFunction)(void (*)(void))Handle_timeline_signal, METH_FASTCALL | METH_KEYWORDS,
     "signal($self, value, /)\n--\n\n"
     "Advance the timeline to ``value`` (greater than the current value, at most\n"
     "2**62-1); wakes every waiter whose point is reached, in every process.\n"
     "Raises ValueError for a value that does not advance it, AlreadySignaled\n"
     "after a failure (failures are sticky), InvalidHandle after release()."},
    {"wait", (PyCFunction)(void (*)(void))Handle_timeline_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait($self, value, /, timeout=None, *, spin=None)\n--\n\n"
     "Block until the timeline's value is >= ``value``; returns SUCCESS, or the\n"
     "failure Status when the timeline has failed (every waiter wakes then, also\n"
     "those of points never reached: OWNER_DIED when its owner died).  Spins for\n"
     "``spin`` seconds, then sleeps on the timeline's wake sequence with the GIL\n"
     "released.  ``timeout`` in seconds (None: forever); TimeoutError when it\n"
     "passes.  Ctrl-C ends the wait within a few ms, in the main thread."},
    {"point", (PyCFunction)(void (*)(void))hlpy_timeline_point, METH_FASTCALL | METH_KEYWORDS,
     "point($self, /, value)\n--\n\n"
     "The point ``value`` of this timeline (a :class:`hostless.Point`): a waitable\n"
     "that completes when the value reaches ``value`` (SUCCESS) or the timeline\n"
     "fails (its failure status).  Accepted wherever a fence is: ``Domain.merge``,\n"
     "``hostless.wait_any`` / ``wait_all``, ``await``, a packet's wait list\n"
     "(``hostless.packet_waits``), ``Domain.publish``.  It holds no reference of\n"
     "its own: the timeline object must stay held while it is used.  TypeError\n"
     "for a value that is not an int, ValueError outside 0..2**62-1."},
};

PyObject *hlpy_handle_method(PyObject *m, PyObject *arg) {
    long i = PyLong_AsLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= (long)(sizeof named_methods / sizeof named_methods[0]))
        return PyErr_Format(PyExc_IndexError, "no handle method %ld", i);
    return PyDescr_NewMethod(HandleType, &named_methods[i]);
}

static PyMethodDef Handle_methods[] = {
    {"release", (PyCFunction)Handle_release_all, METH_NOARGS,
     "Drop this reference.  Raises InvalidHandle when released twice.\n\nWhen it was the last reference in "
     "the domain and a fence is still ACTIVE, the fence is signaled CANCEL."},
    {"__enter__", (PyCFunction)Handle_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Handle_exit, METH_VARARGS, "Release the reference if still held."},
    {"_set_window", (PyCFunction)hlpy_handle_set_window, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Handle_members[] = {
    {"_inner", T_OBJECT, offsetof(Handle, inner), 0, NULL}, /* None when unset: no AttributeError to catch */
    {"__weaklistoffset__", T_PYSSIZET, offsetof(Handle, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Handle_slots[] = {
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_dealloc, (void *)Handle_dealloc},
    {Py_tp_finalize, (void *)Handle_finalize},
    {Py_tp_traverse, (void *)Handle_traverse},
    {Py_tp_clear, (void *)Handle_clear},
    {Py_bf_getbuffer, (void *)hlpy_handle_getbuffer},
    {Py_bf_releasebuffer, (void *)hlpy_handle_releasebuffer},
    {Py_tp_methods, Handle_methods},
    {Py_tp_getset, Handle_getset},
    {Py_tp_members, Handle_members},
    {0, NULL},
};

PyType_Spec hlpy_handle_spec = {
    "hostless._core.Handle", sizeof(Handle), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE, Handle_slots};

/* Core.new(cls, dom, kind, owner) -> instance holding a new fence or timeline */
PyObject *Core_new_obj(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 4 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "new(cls, dom, kind, owner)");
        return NULL;
    }
    /* as PyArg_ParseTuple's "I": masked to 32 bits */
    unsigned int kind = (unsigned int)PyLong_AsUnsignedLongMask(args[2]);
    if (PyErr_Occurred()) return NULL;
    unsigned int owner = (unsigned int)PyLong_AsUnsignedLongMask(args[3]);
    if (PyErr_Occurred()) return NULL;
    uint64_t h;
    int r = hle_create(&c->ctx, kind, owner, &h);
    if (r) return hlpy_raise(r);
    Handle *o = hlpy_handle_make((PyTypeObject *)args[0], c, args[1], h);
    if (!o) hle_release(&c->ctx, h);
    return (PyObject *)o;
}

/* Core.adopt(cls, dom, handle, want_kind) -> instance after taking a reference */
PyObject *Core_adopt(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 4 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "adopt(cls, dom, handle, want_kind)");
        return NULL;
    }
    uint64_t h;
    if (hlpy_handle_arg(args[2], &h) < 0) return NULL;
    unsigned long want = PyLong_AsUnsignedLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    int r = hle_import(&c->ctx, h, (uint32_t)want);
    if (r) return hlpy_raise(r);
    Handle *o = hlpy_handle_make((PyTypeObject *)args[0], c, args[1], h);
    if (!o) hle_release(&c->ctx, h);
    return (PyObject *)o;
}

/* Core.new_buffer(cls, dom, nbytes, meta, mmap) -> instance with its window set */
PyObject *Core_new_buffer(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if ((nargs != 5 && nargs != 8 && nargs != 9) || !PyType_Check(args[0]) || !PyBytes_Check(args[3]) ||
        PyBytes_GET_SIZE(args[3]) != HL_BUFFER_META_SIZE) {
        PyErr_SetString(PyExc_TypeError,
                        "new_buffer(cls, dom, nbytes, meta: 128 bytes, mmap[, fmt, itemsize, shape[, device]])");
        return NULL;
    }
    unsigned long long nbytes = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    long dev = nargs == 9 ? PyLong_AsLong(args[8]) : -1;
    if (dev == -1 && PyErr_Occurred()) return NULL;
    uint64_t h, off;
    int r = dev < 0 ? hle_block_new(&c->ctx, HL_KIND_BUFFER, nbytes, PyBytes_AS_STRING(args[3]), 0, &h, &off)
                    : hle_device_buffer_new(&c->ctx, dev > 1000 ? 1000 : (int)dev, nbytes, PyBytes_AS_STRING(args[3]),
                                            &h, &off);
    if (r) return hlpy_raise(r);
    Handle *o = hlpy_handle_make((PyTypeObject *)args[0], c, args[1], h);
    if (!o) {
        hle_release(&c->ctx, h);
        return NULL;
    }
    if (dev < 0) o->bb_map = Py_NewRef(args[4]); /* a device buffer has no host window: bb_off is its device offset */
    o->bb_off = (Py_ssize_t)off;
    o->bb_len = (Py_ssize_t)nbytes;
    o->bb_readonly = 0;
    o->bb_device = dev < 0 ? 0 : (int)dev + 1;
    if (nargs >= 8) {
        const char *fmt = PyUnicode_AsUTF8(args[5]);
        Py_ssize_t itemsize = PyLong_AsSsize_t(args[6]);
        if (!fmt || PyErr_Occurred() || hlpy_set_layout(o, fmt, itemsize, args[7], (Py_ssize_t)nbytes) < 0) {
            Py_DECREF(o); /* the finalizer drops the reference */
            return NULL;
        }
    }
    return (PyObject *)o;
}

/* Core.wrap(cls, dom, handle) -> instance for a handle we already hold one count of */
PyObject *Core_wrap(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 3 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "wrap(cls, dom, handle)");
        return NULL;
    }
    uint64_t h;
    if (hlpy_handle_arg(args[2], &h) < 0) return NULL;
    return (PyObject *)hlpy_handle_make((PyTypeObject *)args[0], c, args[1], h);
}
/* A handle argument: a non-negative 64-bit integer (InvalidHandle otherwise). */
int hlpy_handle_arg(PyObject *o, uint64_t *h) {
    *h = PyLong_AsUnsignedLongLong(o);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(hlpy_exc(HL_E_HANDLE), "a handle is a non-negative 64-bit integer");
        return -1;
    }
    return 0;
}
