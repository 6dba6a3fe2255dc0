/* The recorder's candidates JSON in C (optional; collectors/router/_recorder.py falls back to
 * its Python formatter when this does not compile or declines a call).
 *
 * candidates_json(rows, chosen_index, decided_ns) -> str | None formats the stored candidate
 * tuples exactly as the Python fast path does (_row_encoder in _recorder.py): keys in spec
 * order, unknown (None) values omitted, the telemetry age after the telemetry timestamp,
 * "chosen" last. It returns None, leaving the call to Python, as soon as a value is not of
 * exactly its field's type (str, bool, int, int or float), an int is outside int64 or a float
 * is not finite: Python then coerces or drops it value by value and counts the error.
 * Why: 8 candidates cost ~30 us in Python on the project machine, most of a decision's own
 * work; here 4.4 us, about 7x less (docs/performance.md, "Decision-record overhead").
 *
 * configure(spec, ts_index, age_key, chosen_key, escape) sets the layout once, from Python:
 * spec is a tuple of (json_key, kind) with kinds 0 bool, 1 str, 2 int, 3 float.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { K_BOOL = 0, K_STR = 1, K_INT = 2, K_FLOAT = 3 };
#define MAX_FIELDS 32

static int n_fields = 0;
static int kinds[MAX_FIELDS];
static char *keys[MAX_FIELDS]; /* '"key":' */
static Py_ssize_t key_lens[MAX_FIELDS];
static int ts_index = -1;
static char *age_key = NULL, *chosen_key = NULL;
static Py_ssize_t age_len = 0, chosen_len = 0;
static PyObject *escape = NULL; /* json.encoder.encode_basestring_ascii */

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} buf_t;

static int buf_put(buf_t *b, const char *s, Py_ssize_t n) {
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n) cap *= 2;
        char *p = PyMem_Realloc(b->p, (size_t)cap);
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

/* Decimal digits of x into o (snprintf's "%lld" costs more than the rest of a row). */
static int fmt_ll(char *o, long long x) {
    char tmp[24];
    int n = 0, len = 0;
    unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (x < 0) o[len++] = '-';
    while (n) o[len++] = tmp[--n];
    return len;
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
                                1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17};

/* Length of repr(v) written to out, for the common case of a value with few decimals, without the general shortest-digits
 * search (dtoa costs ~0.5 us a value here): the smallest k for which some integer n gives
 * n / 10**k == v is the shortest round-tripping decimal, which is what repr prints, in fixed
 * notation for 1e-4 <= |v| < 1e16. Declines (0) when that is ambiguous (n +- 1 would also
 * round-trip: repr picks the nearer, which a rounded product cannot tell) or out of range. */
static int short_repr(double v, char *out) {
    double a = fabs(v);
    if (!(a >= 1e-4 && a < 1e15)) return 0;
    for (int k = 0; k < (int)(sizeof POW10 / sizeof POW10[0]); k++) {
        double p = POW10[k], y = a * p;
        if (y >= 9007199254740992.0) return 0; /* 2**53: n no longer exact */
        long long n = llround(y);
        if ((double)n / p != a) continue;
        if ((double)(n + 1) / p == a || (double)(n - 1) / p == a) return 0;
        long long scale = 1;
        for (int i = 0; i < k; i++) scale *= 10;
        int len = 0;
        if (v < 0) out[len++] = '-';
        len += fmt_ll(out + len, n / scale);
        out[len++] = '.';
        if (k == 0) {
            out[len++] = '0';
        } else {
            long long frac = n % scale;
            for (int i = k - 1; i >= 0; i--, frac /= 10) out[len + i] = (char)('0' + frac % 10);
            len += k;
        }
        return len;
    }
    return 0;
}

static int put_double(buf_t *b, double v) {
    char fast[64];
    int n = short_repr(v, fast);
    if (n) return buf_put(b, fast, n);
    char *s = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!s) return -1;
    int rc = buf_put(b, s, (Py_ssize_t)strlen(s));
    PyMem_Free(s);
    return rc;
}

/* 1 written, 0 declined (no error set), -1 error. */
static int put_str(buf_t *b, PyObject *s) {
    if (PyUnicode_IS_ASCII(s)) {
        const char *c = (const char *)PyUnicode_DATA(s);
        Py_ssize_t n = PyUnicode_GET_LENGTH(s), i;
        for (i = 0; i < n; i++) {
            char ch = c[i];
            if (ch < 0x20 || ch > 0x7e || ch == '"' || ch == '\\') break;
        }
        if (i == n) {
            if (buf_put(b, "\"", 1) < 0 || buf_put(b, c, n) < 0) return -1;
            return buf_put(b, "\"", 1) < 0 ? -1 : 1;
        }
    }
    PyObject *e = PyObject_CallOneArg(escape, s); /* the same escaping as Python's path */
    if (!e) return -1;
    if (!PyUnicode_Check(e) || !PyUnicode_IS_ASCII(e)) {
        Py_DECREF(e);
        return 0;
    }
    int rc = buf_put(b, (const char *)PyUnicode_DATA(e), PyUnicode_GET_LENGTH(e));
    Py_DECREF(e);
    return rc < 0 ? -1 : 1;
}

static int put_row(buf_t *b, PyObject *row, long long decided, int chosen) {
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != n_fields) return 0;
    char tmp[32];
    int first = 1;
    if (buf_put(b, "{", 1) < 0) return -1;
    for (int i = 0; i < n_fields; i++) {
        PyObject *v = PyTuple_GET_ITEM(row, i);
        if (v == Py_None) continue;
        int k = kinds[i];
        if (!first && buf_put(b, ",", 1) < 0) return -1;
        first = 0;
        if (buf_put(b, keys[i], key_lens[i]) < 0) return -1;
        if (k == K_STR) {
            if (!PyUnicode_CheckExact(v)) return 0;
            int rc = put_str(b, v);
            if (rc <= 0) return rc;
        } else if (k == K_BOOL) {
            if (!PyBool_Check(v)) return 0;
            if (v == Py_True ? buf_put(b, "true", 4) : buf_put(b, "false", 5)) return -1;
        } else if (PyLong_CheckExact(v)) { /* int, or int where a float goes */
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow) return 0;
            if (x == -1 && PyErr_Occurred()) return -1;
            if (buf_put(b, tmp, fmt_ll(tmp, x)) < 0) return -1;
            if (i == ts_index) {
                __int128 age = (__int128)decided - (__int128)x;
                if (buf_put(b, ",", 1) < 0 || buf_put(b, age_key, age_len) < 0) return -1;
                if (put_double(b, (double)age / 1e6) < 0) return -1;
            }
        } else if (k == K_FLOAT && PyFloat_CheckExact(v)) {
            double x = PyFloat_AS_DOUBLE(v);
            if (!isfinite(x)) return 0;
            if (put_double(b, x) < 0) return -1;
        } else {
            return 0;
        }
    }
    if (!first && buf_put(b, ",", 1) < 0) return -1;
    if (buf_put(b, chosen_key, chosen_len) < 0) return -1;
    if (chosen ? buf_put(b, "true}", 5) : buf_put(b, "false}", 6)) return -1;
    return 1;
}

static PyObject *candidates_json(PyObject *self, PyObject *args) {
    PyObject *rows, *decided_obj;
    Py_ssize_t chosen_index;
    if (!PyArg_ParseTuple(args, "O!nO!", &PyList_Type, &rows, &chosen_index, &PyLong_Type,
                          &decided_obj))
        return NULL;
    if (!n_fields || !escape) Py_RETURN_NONE;
    int overflow = 0;
    long long decided = PyLong_AsLongLongAndOverflow(decided_obj, &overflow);
    if (overflow) Py_RETURN_NONE;
    if (decided == -1 && PyErr_Occurred()) return NULL;
    buf_t b = {NULL, 0, 0};
    int rc = buf_put(&b, "[", 1) < 0 ? -1 : 1;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    for (Py_ssize_t i = 0; rc >= 0 && i < n; i++) {
        if (i && buf_put(&b, ",", 1) < 0) {
            rc = -1;
            break;
        }
        rc = put_row(&b, PyList_GET_ITEM(rows, i), decided, i == chosen_index);
        if (rc == 0) break;
    }
    PyObject *out = NULL;
    if (rc > 0 && buf_put(&b, "]", 1) == 0)
        out = PyUnicode_DecodeASCII(b.p, b.len, NULL);
    else if (rc == 0 && !PyErr_Occurred())
        out = Py_NewRef(Py_None);
    PyMem_Free(b.p);
    return out;
}

static char *copy_ascii(PyObject *s, Py_ssize_t *len) {
    if (!PyUnicode_Check(s) || !PyUnicode_IS_ASCII(s)) {
        PyErr_SetString(PyExc_TypeError, "keys must be ASCII str");
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    char *p = PyMem_Malloc((size_t)n + 1);
    if (!p) return (char *)PyErr_NoMemory();
    memcpy(p, PyUnicode_DATA(s), (size_t)n + 1);
    *len = n;
    return p;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *spec, *age, *chosen, *esc;
    int ts;
    if (!PyArg_ParseTuple(args, "O!iUUO", &PyTuple_Type, &spec, &ts, &age, &chosen, &esc))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(spec);
    if (n > MAX_FIELDS || ts >= n || !PyCallable_Check(esc)) {
        PyErr_SetString(PyExc_ValueError, "bad candidates layout");
        return NULL;
    }
    n_fields = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(spec, i);
        PyObject *key;
        int kind;
        if (!PyArg_ParseTuple(item, "Ui", &key, &kind)) return NULL;
        PyMem_Free(keys[i]);
        keys[i] = NULL;
        if (!(keys[i] = copy_ascii(key, &key_lens[i]))) return NULL;
        kinds[i] = kind;
    }
    PyMem_Free(age_key);
    PyMem_Free(chosen_key);
    age_key = chosen_key = NULL;
    if (!(age_key = copy_ascii(age, &age_len)) || !(chosen_key = copy_ascii(chosen, &chosen_len)))
        return NULL;
    ts_index = ts;
    Py_XSETREF(escape, Py_NewRef(esc));
    n_fields = (int)n;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"candidates_json", candidates_json, METH_VARARGS,
     "candidates_json(rows, chosen_index, decided_ns) -> str | None"},
    {"configure", configure, METH_VARARGS,
     "configure(spec, ts_index, age_key, chosen_key, escape)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native",
                                    "The recorder's candidates JSON in C.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
