/*
 * waits.c -- waits over several objects of one domain, in one engine call
 * (hle_wait_many): Core.wait_many over (handle, value) pairs, and
 * hostless._core.wait_any, the whole of hl.wait_any when every object is a
 * held Fence or Point of one domain.  One parser reads the items of both.
 */
#include "binding.h"

#include <math.h>

static PyObject *g_s_timeline, *g_s_value, *g_completed;

/* One (handle, value) from a held Fence / merged fence (value 0) or a Point
 * (its timeline's handle, its value) of core *c (NULL: the first item's core,
 * stored there): 1; 0 when it is none of those (another domain, released, a
 * bare Timeline, another type); -1 with an exception. */
int hlpy_object_pair(Core **c, PyObject *o, uint64_t *h, uint64_t *v) {
    if (PyObject_TypeCheck(o, HandleType)) {
        Handle *x = (Handle *)o;
        uint32_t k = HL_HANDLE_KIND(x->handle);
        if ((*c && x->core != *c) || !x->held || (k != HL_KIND_FENCE && k != HL_KIND_MERGED)) return 0;
        *c = x->core;
        *h = x->handle;
        *v = 0;
        return 1;
    }
    if (!g_s_timeline && !(g_s_timeline = PyUnicode_InternFromString("timeline"))) return -1;
    if (!g_s_value && !(g_s_value = PyUnicode_InternFromString("value"))) return -1;
    PyObject *t = PyObject_GetAttr(o, g_s_timeline);
    if (!t) {
        PyErr_Clear();
        return 0;
    }
    Handle *x = (Handle *)t;
    int ok = PyObject_TypeCheck(t, HandleType) && (!*c || x->core == *c) && x->held &&
             HL_HANDLE_KIND(x->handle) == HL_KIND_TIMELINE;
    if (ok) {
        *c = x->core;
        *h = x->handle;
    }
    Py_DECREF(t);
    if (!ok) return 0;
    PyObject *val = PyObject_GetAttr(o, g_s_value);
    if (!val) {
        PyErr_Clear();
        return 0;
    }
    *v = PyLong_AsUnsignedLongLong(val);
    Py_DECREF(val);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* A (handle, value) tuple: 1, or -1 with TypeError / OverflowError. */
static int tuple_pair(PyObject *t, uint64_t *h, uint64_t *v) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
        PyErr_SetString(PyExc_TypeError, "wait_many expects (handle, value) pairs");
        return -1;
    }
    *h = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 0));
    if (*h == (uint64_t)-1 && PyErr_Occurred()) return -1;
    *v = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 1));
    if (*v == (uint64_t)-1 && PyErr_Occurred()) return -1;
    return 1;
}

/* The one parser of both entry points: the n items of list or tuple `seq`
 * into hs / vs, as pairs (objects = 0) or as Fences / Points of one core
 * (objects = 1; *c NULL: found from the first).  Returns n (1..
 * HLE_WAIT_MANY_MAX); 0 when the objects do not fit the one-call path; -1
 * with an exception (pairs: a bad pair, a bad count). */
static Py_ssize_t wait_items(Core **c, PyObject *seq, int objects, uint64_t *hs, uint64_t *vs) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > HLE_WAIT_MANY_MAX) {
        if (objects) return 0;
        PyErr_Format(PyExc_ValueError, "wait_many takes 1..%d objects, got %zd", HLE_WAIT_MANY_MAX, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        int r = objects ? hlpy_object_pair(c, it, &hs[i], &vs[i]) : tuple_pair(it, &hs[i], &vs[i]);
        if (r <= 0) return r;
    }
    return n;
}

/* hle_wait_many with the GIL hooks of the context; the engine code. */
static int wait_on(Core *c, const uint64_t *hs, const uint64_t *vs, Py_ssize_t n, int64_t timeout, int64_t spin,
                   int *idx, uint64_t *w) {
    if (spin < 0) spin = c->ctx.spin_ns;
    return hle_wait_many(&c->ctx, hs, vs, (int)n, timeout, spin, idx, w);
}

/* Core.wait_many([(handle, value), ...], timeout_ns, spin_ns) -> (index, word):
 * the first complete object in list order (a point carries its value, a fence
 * 0); timeout_ns < 0: forever; spin_ns < 0: the domain's spin.  TimeoutError,
 * KeyboardInterrupt, InvalidHandle as the single waits. */
PyObject *Core_wait_many(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "wait_many(pairs, timeout_ns, spin_ns)");
        return NULL;
    }
    long long timeout = PyLong_AsLongLong(args[1]);
    if (timeout == -1 && PyErr_Occurred()) return NULL;
    long long spin = PyLong_AsLongLong(args[2]);
    if (spin == -1 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[0], "wait_many expects a sequence of (handle, value)");
    if (!seq) return NULL;
    uint64_t hs[HLE_WAIT_MANY_MAX], vs[HLE_WAIT_MANY_MAX];
    Py_ssize_t n = wait_items(&c, seq, 0, hs, vs);
    Py_DECREF(seq);
    if (n < 0) return NULL;
    int idx = -1;
    uint64_t w = 0;
    int r = wait_on(c, hs, vs, n, timeout, spin, &idx, &w);
    if (r) return hlpy_raise(r);
    return Py_BuildValue("(iK)", idx, (unsigned long long)w);
}

/* set_completed(cls): the tuple subclass wait_any returns (hostless.Completed). */
static PyObject *py_set_completed(PyObject *m, PyObject *cls) {
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "set_completed takes a tuple subclass (hostless.Completed)");
        return NULL;
    }
    Py_XSETREF(g_completed, Py_NewRef(cls));
    Py_RETURN_NONE;
}

/* The timeout argument of hl.wait_any in ns: None -> -1 (forever); a
 * negative or NaN number is ValueError, another type TypeError. */
int hlpy_timeout_ns(PyObject *t, int64_t *out) {
    if (t == Py_None) {
        *out = -1;
        return 0;
    }
    double d = PyFloat_AsDouble(t);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    if (!(d >= 0)) {
        PyErr_SetString(PyExc_ValueError, "timeout must be >= 0 or None");
        return -1;
    }
    *out = d * 1e9 >= 9.2e18 ? INT64_MAX : (int64_t)(d * 1e9);
    return 0;
}

/* wait_any(objs, timeout) -> Completed | None: hl.wait_any in one call when
 * objs is a list of 1..HLE_WAIT_MANY_MAX held Fences and Points of one domain
 * (None otherwise, before anything is waited for: the caller's general path
 * takes it, or says what is wrong).  The first complete object in list
 * order, with its status; TimeoutError, KeyboardInterrupt, InvalidHandle,
 * ValueError / TypeError for a bad timeout. */
static PyObject *py_wait_any(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait_any(objs, timeout)");
        return NULL;
    }
    if (!PyList_Check(args[0]) || !g_completed) Py_RETURN_NONE;
    uint64_t hs[HLE_WAIT_MANY_MAX], vs[HLE_WAIT_MANY_MAX];
    Core *c = NULL;
    Py_ssize_t n = wait_items(&c, args[0], 1, hs, vs);
    if (n < 0) return NULL;
    if (n == 0) Py_RETURN_NONE;
    int64_t timeout;
    if (hlpy_timeout_ns(args[1], &timeout) < 0) return NULL;
    /* the list may change while the GIL is released: the objects waited for
     * are kept */
    PyObject *objs[HLE_WAIT_MANY_MAX];
    for (Py_ssize_t k = 0; k < n; k++) objs[k] = Py_NewRef(PyList_GET_ITEM(args[0], k));
    int idx = -1;
    uint64_t w = 0;
    int r = wait_on(c, hs, vs, n, timeout, -1, &idx, &w);
    PyObject *obj = r ? NULL : Py_NewRef(objs[idx]);
    for (Py_ssize_t k = 0; k < n; k++) Py_DECREF(objs[k]);
    if (r == HL_E_TIMEOUT) {
        PyErr_Format(PyExc_TimeoutError, "none of %zd objects completed within %R s", n, args[1]);
        return NULL;
    }
    if (r) return hlpy_raise(r);
    /* a fence's status; a timeline's failure or SUCCESS (as Timeline.wait) */
    PyObject *st = HL_HANDLE_KIND(hs[idx]) == HL_KIND_TIMELINE ? hlpy_timeline_status(&c->ctx, hs[idx], vs[idx], w)
                                                               : hlpy_status_obj(w);
    if (!st) {
        Py_DECREF(obj);
        return NULL;
    }
    PyObject *i = PyLong_FromLong(idx);
    PyTypeObject *ct = (PyTypeObject *)g_completed;
    PyObject *out = i ? hlpy_alloc(ct, 3) : NULL;
    if (!out) {
        Py_XDECREF(i);
        Py_DECREF(st);
        Py_DECREF(obj);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, i);
    PyTuple_SET_ITEM(out, 1, obj);
    PyTuple_SET_ITEM(out, 2, st);
    return out;
}

PyMethodDef hlpy_wait_methods[] = {
    {"wait_any", (PyCFunction)(void (*)(void))py_wait_any, METH_FASTCALL,
     "wait_any(objs, timeout) -> Completed | None: hl.wait_any's one-call path"},
    {"set_completed", py_set_completed, METH_O, "set_completed(cls): the type wait_any returns"},
    {NULL, NULL, 0, NULL},
};
