/*
 * point.c -- hostless._core.Point, the C base of hostless.Point (a value
 * object: a timeline and a value, read-only), and Timeline.point(value).
 *
 * A point per frame in a wait loop (hl.wait_any([*fences, tl.point(i)])) is on
 * the hot path: a Python-level object costs several C calls to build and its
 * fields a getattr each to read; here it is one allocation, and the waits
 * (waits.c, waitset.c) read its timeline and value from the struct.  The
 * checks are those of the Python class before it (same errors, same words).
 */
#include "binding.h"

#include <structmember.h>

/* set_point_types(point_cls, timeline_cls): the class Timeline.point makes
 * (hostless.Point) and the class a point's timeline must be (hostless.Timeline) */
static PyTypeObject *g_point_cls, *g_timeline_cls;

static PyObject *set_point_types(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], PointType) ||
        !PyType_Check(args[1]) || !PyType_IsSubtype((PyTypeObject *)args[1], HandleType)) {
        PyErr_SetString(PyExc_TypeError, "set_point_types(point_cls, timeline_cls): a Point and a Handle subclass");
        return NULL;
    }
    Py_XSETREF(g_point_cls, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(g_timeline_cls, (PyTypeObject *)Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* A new point of type cls, its fields set (the checks done by the caller). */
static PyObject *point_make(PyTypeObject *cls, PyObject *timeline, PyObject *value, uint64_t v) {
    HlPoint *p = (HlPoint *)hlpy_alloc(cls, 0);
    if (!p) return NULL;
    p->timeline = Py_NewRef(timeline);
    p->value = Py_NewRef(value);
    p->v = v;
    return (PyObject *)p;
}

/* NULL with TypeError fmt (one %U: the name of o's type) */
static PyObject *type_error(const char *fmt, PyObject *o) {
    PyObject *tn = hlpy_type_name(o);
    if (tn) PyErr_Format(PyExc_TypeError, fmt, tn);
    Py_XDECREF(tn);
    return NULL;
}

/* Point(timeline, value): TypeError for what is not a Timeline or an int (a
 * bool is not), ValueError for a value outside 0..2**62-1. */
static PyObject *Point_new(PyTypeObject *cls, PyObject *args, PyObject *kw) {
    static char *names[] = {"timeline", "value", NULL};
    PyObject *timeline, *value;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:Point", names, &timeline, &value)) return NULL;
    int is_tl = g_timeline_cls ? PyObject_IsInstance(timeline, (PyObject *)g_timeline_cls) : 0;
    if (is_tl < 0) return NULL;
    if (!is_tl) return type_error("a point is on a Timeline, got %U", timeline);
    if (PyBool_Check(value) || !PyLong_Check(value)) return type_error("a point's value is an int, got %U", value);
    int over = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &over);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (over || v < 0 || (uint64_t)v > HL_TIMELINE_MAX)
        return PyErr_Format(PyExc_ValueError, "timeline values are in 0..2**62-1, got %S", value);
    return point_make(cls, timeline, value, (uint64_t)v);
}

/* Timeline.point(value): a plain int in range on a Timeline is made here at
 * once; anything else goes through Point(self, value) and its errors. */
PyObject *hlpy_timeline_point(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw != 1 ||
        (nkw && (!PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)) ||
                 PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "value") != 0))) {
        PyErr_SetString(PyExc_TypeError, "point() takes one argument, value");
        return NULL;
    }
    if (!g_point_cls) {
        PyErr_SetString(PyExc_RuntimeError, "hostless.Point is not registered (import hostless)");
        return NULL;
    }
    PyObject *value = args[0];
    if (Py_IS_TYPE(self, g_timeline_cls) && PyLong_CheckExact(value)) {
        int over = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &over);
        if (!over && v >= 0 && (uint64_t)v <= HL_TIMELINE_MAX) return point_make(g_point_cls, self, value, (uint64_t)v);
        if (v == -1 && PyErr_Occurred()) return NULL;
    }
    return PyObject_CallFunctionObjArgs((PyObject *)g_point_cls, self, value, NULL);
}

static int Point_traverse(HlPoint *p, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)p)); /* a heap type's instances hold a reference to it */
    Py_VISIT(p->timeline);
    Py_VISIT(p->value);
    return 0;
}

static int Point_clear(HlPoint *p) {
    Py_CLEAR(p->timeline);
    Py_CLEAR(p->value);
    return 0;
}

/* hlpy_free drops the instance's reference to its heap type (a Python
 * subclass's subtype_dealloc leaves that to its heap base, this one). */
static void Point_dealloc(HlPoint *p) {
    PyObject_GC_UnTrack(p);
    Point_clear(p);
    hlpy_free((PyObject *)p);
}

static PyMemberDef Point_members[] = {
    {"timeline", T_OBJECT, offsetof(HlPoint, timeline), READONLY, "the point's Timeline"},
    {"value", T_OBJECT, offsetof(HlPoint, value), READONLY, "the point's value (0..2**62-1)"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Point_slots[] = {
    {Py_tp_doc, (void *)"The C base of hostless.Point (a timeline and a value, read-only)."},
    {Py_tp_new, (void *)Point_new},
    {Py_tp_dealloc, (void *)Point_dealloc},
    {Py_tp_traverse, (void *)Point_traverse},
    {Py_tp_clear, (void *)Point_clear},
    {Py_tp_members, Point_members},
    {0, NULL},
};

/* A heap type (module.c's add_type makes PointType from it), subclassed by hostless.Point. */
PyType_Spec hlpy_point_spec = {
    "hostless._core.Point", sizeof(HlPoint), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE, Point_slots};

PyMethodDef hlpy_point_methods[] = {
    {"set_point_types", (PyCFunction)(void (*)(void))set_point_types, METH_FASTCALL,
     "set_point_types(point_cls, timeline_cls): the class Timeline.point makes, the class of a point's timeline"},
    {NULL, NULL, 0, NULL},
};
