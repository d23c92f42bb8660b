/*
 * waitset.c -- hostless._core.WaitSet, the C base of hostless.WaitSet: a wait
 * over a fixed list of fences and timeline points of one domain, prepared
 * once.  The objects are read (and their handles kept) at construction; each
 * wait_any is then one engine call (hle_wait_many) over the stored (handle,
 * value) pairs that returns the index of the first complete object: no
 * object is read, no list or result object is built per call.  A point's
 * value can be moved (set_value) without building a Point.  The handles are
 * checked by the engine at every wait (kind and generation), and each
 * object's Handle is checked to be still held, so a released object is
 * InvalidHandle, never a wait on a reused slot.
 */
#include "binding.h"

typedef struct {
    PyObject_HEAD
    Core *core;         /* the domain's context (a strong reference), NULL before __init__ */
    PyObject *holders;  /* tuple: each object's Handle (the fence, or the point's timeline) */
    Py_ssize_t n;
    uint64_t hs[HLE_WAIT_MANY_MAX];
    uint64_t vs[HLE_WAIT_MANY_MAX]; /* a point's value; 0 for a fence */
} WaitSet;

static void ws_clear(WaitSet *s) {
    Py_CLEAR(s->holders);
    Py_CLEAR(s->core);
    s->n = 0;
}

static void WS_dealloc(WaitSet *s) {
    ws_clear(s);
    hlpy_free((PyObject *)s);
}

/* WaitSet(objs): 1..HLE_WAIT_MANY_MAX held Fences and Points of one domain
 * (hostless.WaitSet checks them first and says what is wrong). */
static int WS_init(WaitSet *s, PyObject *args, PyObject *kw) {
    PyObject *objs;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "WaitSet(objs) takes no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O:WaitSet", &objs)) return -1;
    PyObject *seq = PySequence_Fast(objs, "WaitSet takes a sequence of Fences and Points");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > HLE_WAIT_MANY_MAX) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "a WaitSet holds 1..%d objects, got %zd", HLE_WAIT_MANY_MAX, n);
        return -1;
    }
    PyObject *holders = PyTuple_New(n);
    if (!holders) {
        Py_DECREF(seq);
        return -1;
    }
    Core *c = NULL;
    uint64_t hs[HLE_WAIT_MANY_MAX], vs[HLE_WAIT_MANY_MAX];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        int r = hlpy_object_pair(&c, it, &hs[i], &vs[i]);
        PyObject *holder = NULL;
        if (r == 1) {
            holder = Py_NewRef(PyObject_TypeCheck(it, PointType) ? ((HlPoint *)it)->timeline : it);
        } else if (r == 0) {
            PyErr_Format(PyExc_ValueError,
                         "WaitSet: item %zd is not a held Fence or timeline Point of the first item's domain", i);
        }
        if (!holder) {
            Py_DECREF(holders);
            Py_DECREF(seq);
            return -1;
        }
        PyTuple_SET_ITEM(holders, i, holder);
    }
    Py_DECREF(seq);
    ws_clear(s);
    s->core = (Core *)Py_NewRef((PyObject *)c);
    s->holders = holders;
    s->n = n;
    memcpy(s->hs, hs, (size_t)n * sizeof hs[0]);
    memcpy(s->vs, vs, (size_t)n * sizeof vs[0]);
    return 0;
}

/* 0 when the set is built, its domain attached and every object still held;
 * -1 with DomainClosed / InvalidHandle / TypeError otherwise. */
static int ws_live(WaitSet *s) {
    if (!s->core) {
        PyErr_SetString(PyExc_TypeError, "the WaitSet was not initialised (WaitSet(objs))");
        return -1;
    }
    int r = hle_need_attached(&s->core->ctx);
    if (r) return hlpy_raise_int(r);
    for (Py_ssize_t i = 0; i < s->n; i++) {
        Handle *x = (Handle *)PyTuple_GET_ITEM(s->holders, i);
        if (!x->held) {
            hle_fail(HL_E_HANDLE, "object %zd of the WaitSet (handle 0x%llx) was released", i,
                     (unsigned long long)x->handle);
            return hlpy_raise_int(HL_E_HANDLE);
        }
    }
    return 0;
}

/* The one optional argument `timeout` (positional or keyword) of wait_any / wait_all. */
static int timeout_arg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **t) {
    *t = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 1) {
        PyErr_SetString(PyExc_TypeError, "takes one argument, timeout");
        return -1;
    }
    if (nkw && !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0))) return -1;
    if (nkw && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "timeout") != 0) {
        PyErr_Format(PyExc_TypeError, "unexpected keyword argument %R", PyTuple_GET_ITEM(kwnames, 0));
        return -1;
    }
    if (nargs + nkw == 1) *t = args[0];
    return 0;
}

/* What one wait of the set waits on: the pairs and the objects as they are at
 * its start, whatever another thread does to the set (set_value, __init__)
 * while the GIL is released. */
struct ws_snap {
    Core *c;
    PyObject *holders, *t;
    Py_ssize_t n;
    int64_t tmo;
    uint64_t hs[HLE_WAIT_MANY_MAX], vs[HLE_WAIT_MANY_MAX];
};

/* The argument `timeout` of wait_any / wait_all read, the set checked live, the
 * snapshot taken (ws_end releases it): 0, or -1 with an exception. */
static int ws_begin(WaitSet *s, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, struct ws_snap *sn) {
    if (timeout_arg(args, nargs, kwnames, &sn->t) < 0 || hlpy_timeout_ns(sn->t, &sn->tmo) < 0 || ws_live(s) < 0)
        return -1;
    sn->n = s->n;
    memcpy(sn->hs, s->hs, (size_t)s->n * sizeof s->hs[0]);
    memcpy(sn->vs, s->vs, (size_t)s->n * sizeof s->vs[0]);
    sn->c = (Core *)Py_NewRef((PyObject *)s->core);
    sn->holders = Py_NewRef(s->holders);
    return 0;
}

static void ws_end(struct ws_snap *sn) {
    Py_DECREF(sn->holders);
    Py_DECREF((PyObject *)sn->c);
}

/* wait_any(timeout=None) -> int */
static PyObject *WS_wait_any(WaitSet *s, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    struct ws_snap sn;
    if (ws_begin(s, args, nargs, kwnames, &sn) < 0) return NULL;
    int idx = -1;
    uint64_t w = 0;
    int r = hle_wait_many(&sn.c->ctx, sn.hs, sn.vs, (int)sn.n, sn.tmo, sn.c->ctx.spin_ns, &idx, &w);
    ws_end(&sn);
    if (r == HL_E_TIMEOUT) return PyErr_Format(PyExc_TimeoutError, "none of %zd objects completed within %S s", sn.n, sn.t);
    if (r) return hlpy_raise(r);
    return PyLong_FromLong(idx);
}

/* wait_all(timeout=None) -> None (the loop and its error are hl.wait_all's, waits.c) */
static PyObject *WS_wait_all(WaitSet *s, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    struct ws_snap sn;
    if (ws_begin(s, args, nargs, kwnames, &sn) < 0) return NULL;
    Py_ssize_t at = 0;
    int r = hlpy_wait_all_pairs(sn.c, sn.hs, sn.vs, sn.n, sn.tmo, &at);
    PyObject *out = r ? hlpy_wait_all_error(sn.c, sn.hs, sn.vs, sn.n, r, at, sn.t) : Py_NewRef(Py_None);
    ws_end(&sn);
    return out;
}

/* The index argument of _status / value / set_value: 0..n-1 (a negative one counts from the end). */
static int index_arg(WaitSet *s, PyObject *o, Py_ssize_t *i) {
    Py_ssize_t k = PyNumber_AsSsize_t(o, PyExc_IndexError);
    if (k == -1 && PyErr_Occurred()) return -1;
    if (k < 0) k += s->n;
    if (k < 0 || k >= s->n) {
        PyErr_Format(PyExc_IndexError, "WaitSet index %R out of range (%zd objects)", o, s->n);
        return -1;
    }
    *i = k;
    return 0;
}

/* _status(i) -> Status | None: None while object i is not complete, then its final status
 * (hostless.WaitSet.status says ACTIVE for None) */
static PyObject *WS_status(WaitSet *s, PyObject *arg) {
    Py_ssize_t i;
    if (ws_live(s) < 0 || index_arg(s, arg, &i) < 0) return NULL;
    uint64_t w = 0, h = s->hs[i];
    int tl = HL_HANDLE_KIND(h) == HL_KIND_TIMELINE;
    int r = hle_word(&s->core->ctx, h, &w);
    if (r) return hlpy_raise(r);
    if (w < (tl ? s->vs[i] : 1)) Py_RETURN_NONE;
    return hlpy_pair_status(s->core, h, s->vs[i], w);
}

/* value(i) -> int: point i's value (0 for a fence) */
static PyObject *WS_value(WaitSet *s, PyObject *arg) {
    Py_ssize_t i;
    if (index_arg(s, arg, &i) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(s->vs[i]);
}

/* set_value(i, value): point i of the set becomes its timeline's point `value` */
static PyObject *WS_set_value(WaitSet *s, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t i;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_value(index, value)");
        return NULL;
    }
    if (index_arg(s, args[0], &i) < 0) return NULL;
    if (HL_HANDLE_KIND(s->hs[i]) != HL_KIND_TIMELINE) {
        PyErr_Format(PyExc_ValueError, "object %zd of the WaitSet is a fence, not a timeline point: it has no value", i);
        return NULL;
    }
    if (PyBool_Check(args[1]) || !PyLong_Check(args[1])) {
        PyObject *tn = hlpy_type_name(args[1]);
        if (tn) PyErr_Format(PyExc_TypeError, "a point's value is an int, got %U", tn);
        Py_XDECREF(tn);
        return NULL;
    }
    int over = 0;
    long long v = PyLong_AsLongLongAndOverflow(args[1], &over);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (over || v < 0 || (uint64_t)v > HL_TIMELINE_MAX) {
        PyErr_Format(PyExc_ValueError, "timeline values are in 0..2**62-1, got %R", args[1]);
        return NULL;
    }
    s->vs[i] = (uint64_t)v;
    Py_RETURN_NONE;
}

static PyObject *WS_holders(WaitSet *s, void *closure) {
    if (!s->holders) return PyTuple_New(0);
    return Py_NewRef(s->holders);
}

static PyObject *WS_len(WaitSet *s, void *closure) { return PyLong_FromSsize_t(s->n); }

#define KW(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS
static PyMethodDef WS_methods[] = {
    {"wait_any", KW(WS_wait_any),
     "wait_any(timeout=None) -> int: block until one object of the set has completed; the index of\n"
     "the first complete one in the set's order.  A failure completes an object too (status(i)\n"
     "says which).  TimeoutError after timeout seconds (None: no limit), KeyboardInterrupt on\n"
     "Ctrl-C (within a few ms), InvalidHandle when an object was released, DomainClosed."},
    {"wait_all", KW(WS_wait_all),
     "wait_all(timeout=None) -> None: block until every object of the set has completed (a failure\n"
     "completes an object too: check status(i)).  TimeoutError saying how many completed,\n"
     "KeyboardInterrupt, InvalidHandle, DomainClosed as wait_any."},
    {"_status", (PyCFunction)WS_status, METH_O,
     "_status(i) -> Status | None: None while object i has not completed, then SUCCESS or its\n"
     "failure (a fence's status, a timeline's failure; a point reached before a failure is SUCCESS)."},
    {"value", (PyCFunction)WS_value, METH_O, "value(i) -> int: the value of point i (0 for a fence)."},
    {"set_value", (PyCFunction)(void (*)(void))WS_set_value, METH_FASTCALL,
     "set_value(i, value): object i, a timeline point, becomes the point `value` of its timeline\n"
     "(ValueError for a fence or a value outside 0..2**62-1).  Takes effect at the next wait."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef WS_getset[] = {
    {"_holders", (getter)WS_holders, NULL, "each object's Handle: the fence, or the point's timeline", NULL},
    {"_n", (getter)WS_len, NULL, "the number of objects", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot WS_slots[] = {
    {Py_tp_doc, (void *)"The C base of hostless.WaitSet (a prepared wait over fences and timeline points)."},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)WS_init},
    {Py_tp_dealloc, (void *)WS_dealloc},
    {Py_tp_methods, WS_methods},
    {Py_tp_getset, WS_getset},
    {0, NULL},
};

PyType_Spec hlpy_wait_set_spec = {"hostless._core.WaitSet", sizeof(WaitSet), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_IMMUTABLETYPE, WS_slots};
