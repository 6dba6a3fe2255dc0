/* Native OTLP trace decoder: ExportTraceServiceRequest protobuf wire format -> raw store columns.
 *
 * Reads the bytes directly (no upb parse) and produces exactly what collectors/otlp/_decode.py's
 * decode() produces for the same request: Arrow-layout buffers for the fixed and typed columns,
 * JSON text identical to json.JSONEncoder(ensure_ascii=False, default=str), rejection records.
 * Anything rare or awkward (kvlist / bytes / nested values, duplicate keys in one attribute list,
 * repeated singular sub-messages, wrong wire types, malformed or truncated input, invalid UTF-8)
 * makes decode() return None: the caller then runs the Python decoder, which is the reference.
 * The rule: never accept what upb would reject, never produce anything Python would not.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_utf8.h"

enum { T_STR = 0, T_I64 = 1, T_F64 = 2, T_BOOL = 3, T_OBJ = 4,                   /* column kinds */
       T_LSTR = 5, T_LI64 = 6, T_LF64 = 7 };                 /* list<string|int64|double> */
enum { V_NONE = 0, V_STR, V_INT, V_DBL, V_BOOL, V_ARR };             /* attribute value kinds */
enum { CTX_SPAN = 0, CTX_RES = 1, CTX_EV = 2, CTX_LINK = 3 };
enum { M_KV, M_ANY, M_ARR, M_KVL, M_ENTREF, M_EVENT, M_LINK };        /* validator schemas */

/* ------------------------------------------------------------------------------------------- */
/* configuration (capsule)                                                                        */
/* ------------------------------------------------------------------------------------------- */
typedef struct {
    uint8_t *key;
    size_t klen;
    uint64_t h;
    int col[3];
    int prompt;
    int apart; /* a span attribute whose string value goes to its typed column only */
    int once;  /* a typed span attribute left out of the JSON when its column holds it exactly */
} KEnt;

typedef struct {
    KEnt *ents;
    size_t nents;
    int32_t *slots;
    size_t mask;
    int ncols[3];
    int *types[3];
    uint8_t **pfx;     /* prompt key patterns, lower case, without their trailing '*' */
    size_t *pfxlen;
    uint8_t *pfxexact; /* 1: the whole key (no trailing '*'); 0: a prefix */
    int npfx;
    size_t max_str, max_apart_str;
    size_t max_span_bytes;
    uint64_t min_ns, max_ns;
} Cfg;

static uint64_t fnv(const uint8_t *p, size_t n) { /* any good-enough 64-bit hash of the key */
    uint64_t h = 1469598103934665603ULL ^ (n * 0x9e3779b97f4a7c15ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 32;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

static void cfg_free(Cfg *c) {
    if (!c) return;
    for (size_t i = 0; i < c->nents; i++) free(c->ents[i].key);
    free(c->ents);
    free(c->slots);
    for (int i = 0; i < 3; i++) free(c->types[i]);
    for (int i = 0; i < c->npfx; i++) free(c->pfx[i]);
    free(c->pfx);
    free(c->pfxlen);
    free(c->pfxexact);
    free(c);
}

/* Whether the first n bytes of k equal `lower` (lower case) with ASCII letters folded. */
static int ascii_ieq(const uint8_t *k, const uint8_t *lower, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t c = k[i];
        if (c >= 'A' && c <= 'Z') c = (uint8_t)(c + 32);
        if (c != lower[i]) return 0;
    }
    return 1;
}

/* Whether the key matches a prompt pattern: the whole key, or a prefix for a pattern that ended
 * in '*', ASCII letters in any case (_decode.PROMPT_PATTERNS, _decode.is_prompt_key). */
static int matches_pattern(const Cfg *cfg, const uint8_t *k, size_t kl) {
    for (int i = 0; i < cfg->npfx; i++)
        if ((cfg->pfxexact[i] ? kl == cfg->pfxlen[i] : kl >= cfg->pfxlen[i])
            && ascii_ieq(k, cfg->pfx[i], cfg->pfxlen[i]))
            return 1;
    return 0;
}

static void cfg_capsule_free(PyObject *cap) {
    cfg_free((Cfg *)PyCapsule_GetPointer(cap, "routeaudit.native.cfg"));
}

static KEnt *cfg_lookup(const Cfg *c, uint64_t h, const uint8_t *k, size_t kl) {
    size_t i = (size_t)h & c->mask;
    for (;;) {
        int32_t s = c->slots[i];
        if (s < 0) return NULL;
        KEnt *e = &c->ents[s];
        if (e->h == h && e->klen == kl && memcmp(e->key, k, kl) == 0) return e;
        i = (i + 1) & c->mask;
    }
}

static KEnt *cfg_intern(Cfg *c, const uint8_t *k, size_t kl) {
    uint64_t h = fnv(k, kl);
    KEnt *e = cfg_lookup(c, h, k, kl);
    if (e) return e;
    e = &c->ents[c->nents];
    e->key = malloc(kl ? kl : 1);
    if (!e->key) return NULL;
    memcpy(e->key, k, kl);
    e->klen = kl;
    e->h = h;
    e->col[0] = e->col[1] = e->col[2] = -1;
    e->prompt = 0;
    size_t i = (size_t)h & c->mask;
    while (c->slots[i] >= 0) i = (i + 1) & c->mask;
    c->slots[i] = (int32_t)c->nents++;
    return e;
}

enum { MARK_PROMPT, MARK_APART, MARK_ONCE };

/* Interns every key of the list (str) and gives it the mark; 0: error set. */
static int cfg_mark(Cfg *c, PyObject *keys, int mark) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        Py_ssize_t kl;
        const char *k = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(keys, i), &kl);
        if (!k) return 0;
        KEnt *e = cfg_intern(c, (const uint8_t *)k, (size_t)kl);
        if (!e) {
            PyErr_NoMemory();
            return 0;
        }
        if (mark == MARK_APART) e->apart = 1;
        else if (mark == MARK_ONCE) e->once = 1;
        else e->prompt = 1;
    }
    return 1;
}

/* make_config(typed: tuple of 3 lists of (key: str, kind: int), prompt_keys: list[str],
 *             prompt_patterns: list[str] (lower case; ASCII letters match in any case; a
 *             trailing '*' matches any rest), apart_keys: list[str], once_keys: list[str], max_str,
 *             max_apart_str, max_span_bytes, min_ns, max_ns). apart_keys: typed span keys whose
 *             string values stay out of the attributes JSON (stored apart): truncated at
 *             max_apart_str code points instead of max_str, and not counted in max_span_bytes.
 *             once_keys: typed span keys left out of the attributes JSON when their column holds
 *             the value exactly (held_exactly); still counted in max_span_bytes. */
static PyObject *make_config(PyObject *self, PyObject *args) {
    PyObject *typed, *pkeys, *pfx, *apart, *once;
    Py_ssize_t max_str, max_apart, max_span;
    unsigned long long min_ns, max_ns;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!nnnKK", &PyTuple_Type, &typed, &PyList_Type, &pkeys, &PyList_Type,
                          &pfx, &PyList_Type, &apart, &PyList_Type, &once, &max_str, &max_apart, &max_span,
                          &min_ns, &max_ns))
        return NULL;
    if (PyTuple_GET_SIZE(typed) != 3) {
        PyErr_SetString(PyExc_ValueError, "typed must hold 3 lists");
        return NULL;
    }
    Cfg *c = calloc(1, sizeof(Cfg));
    if (!c) return PyErr_NoMemory();
    size_t total = (size_t)PyList_GET_SIZE(pkeys) + (size_t)PyList_GET_SIZE(apart)
                   + (size_t)PyList_GET_SIZE(once); /* entries at most */
    for (int t = 0; t < 3; t++) {
        PyObject *l = PyTuple_GET_ITEM(typed, t);
        if (!PyList_Check(l)) {
            PyErr_SetString(PyExc_TypeError, "typed lists expected");
            cfg_free(c);
            return NULL;
        }
        total += (size_t)PyList_GET_SIZE(l);
    }
    size_t cap = 16;
    while (cap < total * 4) cap <<= 1;
    c->ents = calloc(total + 1, sizeof(KEnt));
    c->slots = malloc(cap * sizeof(int32_t));
    if (!c->ents || !c->slots) {
        cfg_free(c);
        return PyErr_NoMemory();
    }
    memset(c->slots, 0xff, cap * sizeof(int32_t));
    c->mask = cap - 1;
    for (int t = 0; t < 3; t++) {
        PyObject *l = PyTuple_GET_ITEM(typed, t);
        Py_ssize_t n = PyList_GET_SIZE(l);
        c->ncols[t] = (int)n;
        c->types[t] = malloc((n ? n : 1) * sizeof(int));
        if (!c->types[t]) {
            cfg_free(c);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *it = PyList_GET_ITEM(l, i);
            const char *k;
            Py_ssize_t kl;
            int kind;
            if (!PyArg_ParseTuple(it, "s#i", &k, &kl, &kind)) {
                cfg_free(c);
                return NULL;
            }
            KEnt *e = cfg_intern(c, (const uint8_t *)k, (size_t)kl);
            if (!e) {
                cfg_free(c);
                return PyErr_NoMemory();
            }
            if (e->col[t] < 0) e->col[t] = (int)i; /* first wins; duplicates impossible in a dict */
            c->types[t][i] = kind;
        }
    }
    if (!cfg_mark(c, pkeys, MARK_PROMPT) || !cfg_mark(c, apart, MARK_APART) || !cfg_mark(c, once, MARK_ONCE)) {
        cfg_free(c);
        return NULL;
    }
    Py_ssize_t np = PyList_GET_SIZE(pfx);
    c->pfx = calloc(np ? np : 1, sizeof(uint8_t *));
    c->pfxlen = calloc(np ? np : 1, sizeof(size_t));
    c->pfxexact = calloc(np ? np : 1, 1);
    if (!c->pfx || !c->pfxlen || !c->pfxexact) {
        cfg_free(c);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < np; i++) {
        Py_ssize_t kl;
        const char *k = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(pfx, i), &kl);
        if (!k) {
            cfg_free(c);
            return NULL;
        }
        c->pfx[i] = malloc(kl ? kl : 1);
        if (!c->pfx[i]) {
            cfg_free(c);
            return PyErr_NoMemory();
        }
        memcpy(c->pfx[i], k, kl);
        c->pfxexact[i] = !(kl && k[kl - 1] == '*');
        c->pfxlen[i] = (size_t)kl - !c->pfxexact[i];
        c->npfx = (int)i + 1;
    }
    for (size_t i = 0; i < c->nents; i++) /* the configured keys' answers, computed once */
        c->ents[i].prompt = c->ents[i].prompt || matches_pattern(c, c->ents[i].key, c->ents[i].klen);
    c->max_str = (size_t)max_str;
    c->max_apart_str = (size_t)max_apart;
    c->max_span_bytes = (size_t)max_span;
    c->min_ns = min_ns;
    c->max_ns = max_ns;
    PyObject *cap_obj = PyCapsule_New(c, "routeaudit.native.cfg", cfg_capsule_free);
    if (!cap_obj) cfg_free(c);
    return cap_obj;
}

/* ------------------------------------------------------------------------------------------- */
/* decoder state                                                                                  */
/* ------------------------------------------------------------------------------------------- */
typedef struct {
    uint8_t *p;
    size_t len, cap;
} Buf;

typedef struct {
    int32_t row;
    uint8_t kind;
    int64_t i;
    double d;
    const uint8_t *p;
    size_t len;
} Cell;

typedef struct {
    Cell *v;
    size_t n, cap;
} CellVec;

typedef struct {
    int col;
    int ev;
    Cell c;
} Staged;

typedef struct {
    int kind;
    size_t n, nulls;
    Buf valid, data, offs;
} Col;

typedef struct {
    uint64_t h;
    const uint8_t *p;
    size_t len;
} KeyH;

typedef struct {
    const uint8_t *name;
    size_t namel;
    uint64_t time;
    size_t joff, jlen;
} EvStage;

enum { R_TRACE, R_SPAN, R_PARENT, R_RANGE, R_ORDER, R_SIZE };
typedef struct {
    int what;
    const uint8_t *sid, *name;
    size_t sidl, namel;
    uint64_t a, b;
} Rej;

enum { SC_TRACE, SC_SPAN, SC_PARENT, SC_TSTATE, SC_NAME, SC_KIND, SC_START, SC_END, SC_STATUS,
       SC_SMSG, SC_FLAGS, SC_SCOPE, SC_SCOPEV, SC_ATTRS, SC_LINKS, SC_EVCOUNT, SC_DROPPED,
       SC_RECV, SC_RESATTRS, NSC };
static const int SC_KINDS[NSC] = {T_STR, T_STR, T_STR, T_STR, T_STR, T_STR, T_I64, T_I64, T_STR,
                                  T_STR, T_I64, T_STR, T_STR, T_STR, T_STR, T_I64, T_I64, T_I64,
                                  T_STR};
enum { EC_TRACE, EC_SPAN, EC_IDX, EC_NAME, EC_TIME, EC_ATTRS, NEC };
static const int EC_KINDS[NEC] = {T_STR, T_STR, T_I64, T_STR, T_I64, T_STR};

typedef struct {
    jmp_buf jb;
    PyThreadState *released; /* non-NULL while the wire-format parse runs without the GIL */
    const Cfg *cfg;
    int keep;
    int64_t received_ns;
    int64_t truncated, prompts;
    Col sc[NSC], ec[NEC];
    CellVec *tc[3];
    Buf resjson, sjson, ejson, ljson, scratch;
    Buf tjson;      /* the span's typed attributes held exactly by their columns: counted, not stored */
    size_t ntyped;  /* entries in tjson */
    Staged *rst, *sst, *est;
    size_t nrst, caprst, nsst, capsst, nest, capest;
    EvStage *evs;
    size_t nev, capev;
    KeyH *keys;
    size_t nkeys, capkeys;
    Rej *rej;
    size_t nrej, caprej;
} D;

#define FAIL(d) longjmp((d)->jb, 1)

static void grow(D *d, void **p, size_t *cap, size_t need, size_t elsz) {
    if (need <= *cap) return;
    size_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * elsz);
    if (!np) FAIL(d);
    *p = np;
    *cap = nc;
}
#define VPUSH(d, arr, n, cap) (grow((d), (void **)&(arr), &(cap), (n) + 1, sizeof(*(arr))), &(arr)[(n)++])

static inline void reserve(D *d, Buf *b, size_t extra) {
    if (b->len + extra > b->cap) grow(d, (void **)&b->p, &b->cap, b->len + extra, 1);
}
static inline void put(D *d, Buf *b, const void *s, size_t n) {
    if (!n) return; /* an empty value may come with a NULL buffer: memcpy(NULL, 0) is undefined */
    reserve(d, b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
}
#define PUTS(d, b, lit) put((d), (b), (lit), sizeof(lit) - 1)
static inline void putc_(D *d, Buf *b, uint8_t c) {
    reserve(d, b, 1);
    b->p[b->len++] = c;
}

/* ------------------------------------------------------------------------------------------- */
/* columns                                                                                        */
/* ------------------------------------------------------------------------------------------- */
static void col_init(D *d, Col *c, int kind) {
    c->kind = kind;
    if (kind == T_STR) {
        int32_t z = 0;
        put(d, &c->offs, &z, 4);
    }
}
static inline void col_bit(D *d, Col *c, int valid) {
    if ((c->n & 7) == 0) putc_(d, &c->valid, 0);
    if (valid)
        c->valid.p[c->n >> 3] |= (uint8_t)(1u << (c->n & 7));
    else
        c->nulls++;
}
static inline void col_str_end(D *d, Col *c) {
    if (c->data.len > 0x7fffffffu) FAIL(d);
    int32_t o = (int32_t)c->data.len;
    put(d, &c->offs, &o, 4);
}
static void col_null(D *d, Col *c) {
    col_bit(d, c, 0);
    if (c->kind == T_STR)
        col_str_end(d, c);
    else if (c->kind == T_BOOL) {
        if ((c->n & 7) == 0) putc_(d, &c->data, 0);
    } else {
        reserve(d, &c->data, 8);
        memset(c->data.p + c->data.len, 0, 8);
        c->data.len += 8;
    }
    c->n++;
}
static void col_str(D *d, Col *c, const void *s, size_t n) {
    col_bit(d, c, 1);
    put(d, &c->data, s, n);
    col_str_end(d, c);
    c->n++;
}
static void col_hex(D *d, Col *c, const uint8_t *s, size_t n) {
    static const char hx[] = "0123456789abcdef";
    col_bit(d, c, 1);
    reserve(d, &c->data, 2 * n);
    uint8_t *o = c->data.p + c->data.len;
    for (size_t i = 0; i < n; i++) {
        o[2 * i] = (uint8_t)hx[s[i] >> 4];
        o[2 * i + 1] = (uint8_t)hx[s[i] & 15];
    }
    c->data.len += 2 * n;
    col_str_end(d, c);
    c->n++;
}
static void col_i64(D *d, Col *c, int64_t v) {
    col_bit(d, c, 1);
    put(d, &c->data, &v, 8);
    c->n++;
}
static void col_f64(D *d, Col *c, double v) {
    col_bit(d, c, 1);
    put(d, &c->data, &v, 8);
    c->n++;
}
static void col_bool(D *d, Col *c, int v) {
    col_bit(d, c, 1);
    if ((c->n & 7) == 0) putc_(d, &c->data, 0);
    if (v) c->data.p[c->n >> 3] |= (uint8_t)(1u << (c->n & 7));
    c->n++;
}
static void col_free(Col *c) {
    free(c->valid.p);
    free(c->data.p);
    free(c->offs.p);
}

/* ------------------------------------------------------------------------------------------- */
/* wire format                                                                                    */
/* ------------------------------------------------------------------------------------------- */
static inline uint64_t rd_varint(D *d, const uint8_t **pp, const uint8_t *end) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) FAIL(d);
        uint8_t b = *p++;
        if (i == 9 && b > 1) FAIL(d);
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *pp = p;
            return v;
        }
    }
    FAIL(d);
    return 0;
}
static inline void rd_tag(D *d, const uint8_t **pp, const uint8_t *end, uint32_t *fn, int *wt) {
    uint64_t k = rd_varint(d, pp, end);
    if (k >> 32) FAIL(d);
    *fn = (uint32_t)(k >> 3);
    *wt = (int)(k & 7);
    if (*fn == 0) FAIL(d);
}
static inline void rd_len(D *d, const uint8_t **pp, const uint8_t *end, const uint8_t **s, size_t *l) {
    uint64_t n = rd_varint(d, pp, end);
    if (n > (uint64_t)(end - *pp) || n > 0x7fffffffu) FAIL(d);
    *s = *pp;
    *l = (size_t)n;
    *pp += n;
}
static inline uint64_t rd_fixed64(D *d, const uint8_t **pp, const uint8_t *end) {
    if (end - *pp < 8) FAIL(d);
    uint64_t v;
    memcpy(&v, *pp, 8); /* little endian host (x86/arm) */
    *pp += 8;
    return v;
}
static inline uint32_t rd_fixed32(D *d, const uint8_t **pp, const uint8_t *end) {
    if (end - *pp < 4) FAIL(d);
    uint32_t v;
    memcpy(&v, *pp, 4);
    *pp += 4;
    return v;
}
static void skip(D *d, const uint8_t **pp, const uint8_t *end, int wt) {
    const uint8_t *s;
    size_t l;
    switch (wt) {
    case 0: rd_varint(d, pp, end); break;
    case 1: rd_fixed64(d, pp, end); break;
    case 2: rd_len(d, pp, end, &s, &l); break;
    case 5: rd_fixed32(d, pp, end); break;
    default: FAIL(d); /* groups and invalid wire types: let upb decide */
    }
}
#define EXPECT(d, wt, w) do { if ((wt) != (w)) FAIL(d); } while (0)

/* Strict UTF-8 (as upb and Python); returns the number of code points. */
static size_t utf8_check(D *d, const uint8_t *s, size_t n) {
    size_t cp = 0, i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                cp += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            cp++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) need = 1;
        else if (c == 0xe0) { need = 2; lo = 0xa0; }
        else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) need = 2;
        else if (c == 0xed) { need = 2; hi = 0x9f; }
        else if (c == 0xf0) { need = 3; lo = 0x90; }
        else if (c >= 0xf1 && c <= 0xf3) need = 3;
        else if (c == 0xf4) { need = 3; hi = 0x8f; }
        else FAIL(d);
        if (n - i <= need) FAIL(d);
        if (s[i + 1] < lo || s[i + 1] > hi) FAIL(d);
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xc0) != 0x80) FAIL(d);
        i += need + 1;
        cp++;
    }
    return cp;
}
/* Byte length of the first ncp code points of valid UTF-8. */
static size_t utf8_prefix(const uint8_t *s, size_t n, size_t ncp) {
    size_t i = 0, cp = 0;
    while (i < n) {
        if ((s[i] & 0xc0) != 0x80) {
            if (cp == ncp) return i;
            cp++;
        }
        i++;
    }
    return n;
}
static size_t utf8_count(const uint8_t *s, size_t n) {
    size_t cp = 0;
    for (size_t i = 0; i < n; i++) cp += (s[i] & 0xc0) != 0x80;
    return cp;
}

/* Generic validation of sub-messages the decoder does not read (upb checks them all). */
static void validate(D *d, int m, const uint8_t *p, const uint8_t *end, int depth) {
    if (depth > 48) FAIL(d);
    while (p < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &p, end, &fn, &wt);
        int exp = -1, sub = -1, str = 0;
        switch (m) {
        case M_KV:
            if (fn == 1) { exp = 2; str = 1; }
            else if (fn == 2) { exp = 2; sub = M_ANY; }
            else if (fn == 3) exp = 0;
            break;
        case M_ANY:
            if (fn == 1) { exp = 2; str = 1; }
            else if (fn == 2 || fn == 3 || fn == 8) exp = 0;
            else if (fn == 4) exp = 1;
            else if (fn == 5) { exp = 2; sub = M_ARR; }
            else if (fn == 6) { exp = 2; sub = M_KVL; }
            else if (fn == 7) exp = 2;
            break;
        case M_ARR:
            if (fn == 1) { exp = 2; sub = M_ANY; }
            break;
        case M_KVL:
            if (fn == 1) { exp = 2; sub = M_KV; }
            break;
        case M_ENTREF:
            if (fn >= 1 && fn <= 4) { exp = 2; str = 1; }
            break;
        case M_EVENT:
            if (fn == 1) exp = 1;
            else if (fn == 2) { exp = 2; str = 1; }
            else if (fn == 3) { exp = 2; sub = M_KV; }
            else if (fn == 4) exp = 0;
            break;
        case M_LINK:
            if (fn == 1 || fn == 2) exp = 2;
            else if (fn == 3) { exp = 2; str = 1; }
            else if (fn == 4) { exp = 2; sub = M_KV; }
            else if (fn == 5) exp = 0;
            else if (fn == 6) exp = 5;
            break;
        }
        if (exp < 0) {
            skip(d, &p, end, wt);
            continue;
        }
        EXPECT(d, wt, exp);
        if (wt == 2) {
            const uint8_t *s;
            size_t l;
            rd_len(d, &p, end, &s, &l);
            if (str) utf8_check(d, s, l);
            if (sub >= 0) validate(d, sub, s, s + l, depth + 1);
        } else {
            skip(d, &p, end, wt);
        }
    }
}

/* ------------------------------------------------------------------------------------------- */
/* JSON                                                                                           */
/* ------------------------------------------------------------------------------------------- */
static const char HX[] = "0123456789abcdef";

static inline uint8_t *esc_u(uint8_t *o, unsigned v) {
    *o++ = '\\';
    *o++ = 'u';
    *o++ = (uint8_t)HX[(v >> 12) & 15];
    *o++ = (uint8_t)HX[(v >> 8) & 15];
    *o++ = (uint8_t)HX[(v >> 4) & 15];
    *o++ = (uint8_t)HX[v & 15];
    return o;
}

/* A JSON string as json.JSONEncoder writes it (ensure_ascii as given); s is valid UTF-8. */
static void emit_str(D *d, Buf *b, const uint8_t *s, size_t n, int ascii) {
    reserve(d, b, 6 * n + 2);
    uint8_t *o = b->p + b->len;
    *o++ = '"';
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) { /* 8 bytes at a time while none needs escaping */
            const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
            uint64_t x;
            memcpy(&x, s + i, 8);
            uint64_t q = x ^ (ones * 0x22), e = x ^ (ones * 0x5c);
            uint64_t r = ((x - ones * 0x20) & ~x) | ((q - ones) & ~q) | ((e - ones) & ~e);
            if (ascii) {
                uint64_t f = x ^ (ones * 0x7f);
                r |= ((f - ones) & ~f) | x;
            }
            if (!(r & high)) {
                memcpy(o, &x, 8);
                o += 8;
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x7f) {
            *o++ = c;
            i++;
            continue;
        }
        if (c >= 0x7f) {
            if (!ascii) {
                *o++ = c;
                i++;
                continue;
            }
            unsigned cp;
            if (c == 0x7f) { cp = c; i += 1; }
            else if (c < 0xe0) { cp = ((c & 0x1fu) << 6) | (s[i + 1] & 0x3fu); i += 2; }
            else if (c < 0xf0) { cp = ((c & 0x0fu) << 12) | ((s[i + 1] & 0x3fu) << 6) | (s[i + 2] & 0x3fu); i += 3; }
            else {
                cp = ((c & 0x07u) << 18) | ((s[i + 1] & 0x3fu) << 12) | ((s[i + 2] & 0x3fu) << 6) |
                     (s[i + 3] & 0x3fu);
                i += 4;
            }
            if (cp >= 0x10000) {
                unsigned v = cp - 0x10000;
                o = esc_u(o, 0xd800 | ((v >> 10) & 0x3ff));
                o = esc_u(o, 0xdc00 | (v & 0x3ff));
            } else {
                o = esc_u(o, cp);
            }
            continue;
        }
        i++;
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        default:
            o--;
            o = esc_u(o, c);
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
}

static void emit_i64(D *d, Buf *b, int64_t v) {
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    reserve(d, b, (size_t)n + 1);
    if (v < 0) b->p[b->len++] = '-';
    while (n) b->p[b->len++] = (uint8_t)tmp[--n];
}

static void emit_f64(D *d, Buf *b, double v) {
    /* Python's repr of a float, so both decoders write the same text; it needs the GIL, which
       the parse otherwise runs without (doubles in attributes are few). */
    PyGILState_STATE g = PyGILState_Ensure();
    char *s = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!s) {
        PyErr_Clear();
        PyGILState_Release(g);
        FAIL(d);
    }
    size_t n = strlen(s);
    if (n > 64) n = 64; /* repr of a double is at most 24 characters */
    char text[64];
    memcpy(text, s, n);
    PyMem_Free(s);
    PyGILState_Release(g);
    reserve(d, b, n);
    memcpy(b->p + b->len, text, n);
    b->len += n;
}

/* ------------------------------------------------------------------------------------------- */
/* attribute lists                                                                                */
/* ------------------------------------------------------------------------------------------- */
typedef struct {
    Buf *out;
    int ascii;
    int ctx;
    int ev;
    int count;
} AL;

static void stage(D *d, int ctx, int col, int ev, const Cell *c) {
    Staged *s;
    if (ctx == CTX_SPAN) s = VPUSH(d, d->sst, d->nsst, d->capsst);
    else if (ctx == CTX_RES) s = VPUSH(d, d->rst, d->nrst, d->caprst);
    else s = VPUSH(d, d->est, d->nest, d->capest);
    s->col = col;
    s->ev = ev;
    s->c = *c;
}

/* The oneof member of one AnyValue (0: none). Scalars and (unless in_array) arrays. */
static int any_parse(D *d, const uint8_t *p, const uint8_t *end, int in_array, const uint8_t **sp,
                     size_t *lp, uint64_t *ivp) {
    int which = 0;
    while (p < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &p, end, &fn, &wt);
        if (fn >= 1 && fn <= 8 && which) FAIL(d); /* two members of the oneof: rare, let upb merge */
        switch (fn) {
        case 1: EXPECT(d, wt, 2); rd_len(d, &p, end, sp, lp); which = 1; break;
        case 2: EXPECT(d, wt, 0); *ivp = rd_varint(d, &p, end); which = 2; break;
        case 3: EXPECT(d, wt, 0); *ivp = rd_varint(d, &p, end); which = 3; break;
        case 4: EXPECT(d, wt, 1); *ivp = rd_fixed64(d, &p, end); which = 4; break;
        case 5:
            if (in_array) FAIL(d);
            EXPECT(d, wt, 2);
            rd_len(d, &p, end, sp, lp);
            which = 5;
            break;
        case 6: case 7: case 8: FAIL(d); break;
        default: skip(d, &p, end, wt);
        }
    }
    return which;
}

/* One element of an already validated ArrayValue as a Cell (no JSON, no counting). */
static void elem_cell(D *d, const uint8_t *p, const uint8_t *end, Cell *c) {
    const uint8_t *s = NULL;
    size_t l = 0;
    uint64_t iv = 0;
    int which = any_parse(d, p, end, 1, &s, &l, &iv);
    memset(c, 0, sizeof *c);
    switch (which) {
    case 1:
        if (utf8_count(s, l) > d->cfg->max_str) l = utf8_prefix(s, l, d->cfg->max_str);
        c->kind = V_STR;
        c->p = s;
        c->len = l;
        break;
    case 2: c->kind = V_BOOL; c->i = iv != 0; break;
    case 3: c->kind = V_INT; c->i = (int64_t)iv; break;
    case 4: {
        double v;
        memcpy(&v, &iv, 8);
        if (isfinite(v)) {
            c->kind = V_DBL;
            c->d = v;
        }
        break;
    }
    }
}

/* The next element of an already validated ArrayValue's bytes [*q, qe) into *x; 0 at the end. */
static int next_elem(D *d, const uint8_t **q, const uint8_t *qe, Cell *x) {
    while (*q < qe) {
        uint32_t fn;
        int wt;
        rd_tag(d, q, qe, &fn, &wt);
        if (fn != 1) {
            skip(d, q, qe, wt);
            continue;
        }
        const uint8_t *es;
        size_t el;
        rd_len(d, q, qe, &es, &el);
        elem_cell(d, es, es + el, x);
        return 1;
    }
    return 0;
}

/* One AnyValue: JSON into out, the value into *c. Scalars and (top level) arrays of scalars. */
static void any_value(D *d, Buf *out, int ascii, const uint8_t *p, const uint8_t *end, Cell *c,
                      int in_array) {
    const uint8_t *s = NULL;
    size_t l = 0;
    uint64_t iv = 0;
    int which = any_parse(d, p, end, in_array, &s, &l, &iv);
    c->kind = V_NONE;
    switch (which) {
    case 0: PUTS(d, out, "null"); break;
    case 1: {
        size_t cp = utf8_check(d, s, l);
        if (cp > d->cfg->max_str) {
            d->truncated++;
            l = utf8_prefix(s, l, d->cfg->max_str);
        }
        emit_str(d, out, s, l, ascii);
        c->kind = V_STR;
        c->p = s;
        c->len = l;
        break;
    }
    case 2:
        if (iv) PUTS(d, out, "true");
        else PUTS(d, out, "false");
        c->kind = V_BOOL;
        c->i = iv != 0;
        break;
    case 3:
        emit_i64(d, out, (int64_t)iv);
        c->kind = V_INT;
        c->i = (int64_t)iv;
        break;
    case 4: {
        double v;
        memcpy(&v, &iv, 8);
        if (isfinite(v)) {
            emit_f64(d, out, v);
            c->kind = V_DBL;
            c->d = v;
        } else {
            PUTS(d, out, "null");
        }
        break;
    }
    case 5: {
        const uint8_t *q = s, *qe = s + l;
        int first = 1;
        putc_(d, out, '[');
        while (q < qe) {
            uint32_t fn;
            int wt;
            rd_tag(d, &q, qe, &fn, &wt);
            if (fn != 1) {
                skip(d, &q, qe, wt);
                continue;
            }
            EXPECT(d, wt, 2);
            const uint8_t *es;
            size_t el;
            rd_len(d, &q, qe, &es, &el);
            if (!first) PUTS(d, out, ", ");
            first = 0;
            Cell tmp;
            any_value(d, out, ascii, es, es + el, &tmp, 1);
        }
        putc_(d, out, ']');
        c->kind = V_ARR;
        c->p = s;
        c->len = l;
        break;
    }
    }
}

static void al_begin(D *d, AL *al, Buf *out, int ascii, int ctx, int ev) {
    al->out = out;
    al->ascii = ascii;
    al->ctx = ctx;
    al->ev = ev;
    al->count = 0;
    d->nkeys = 0;
}
static void al_end(D *d, AL *al) {
    if (al->count) putc_(d, al->out, '}');
    else PUTS(d, al->out, "{}");
}

/* Whether the key matches a prompt pattern. A key of the configuration (typed, apart, once or a
 * pattern's exact key) had its answer computed by make_config; others are matched here. */
static int is_prompt(const Cfg *cfg, const KEnt *e, const uint8_t *k, size_t kl) {
    if (e) return e->prompt;
    return matches_pattern(cfg, k, kl);
}

/* Whether a typed column of `type` holds the value of `c` exactly: the same kind (no conversion),
 * for a list every element. Such a span attribute is left out of the attributes JSON
 * (raw_span_attributes puts it back); _decode._held_exactly is the Python twin. */
static int held_exactly(D *d, int type, const Cell *c) {
    switch (type) {
    case T_STR: return c->kind == V_STR;
    case T_I64: return c->kind == V_INT;
    case T_F64: return c->kind == V_DBL;
    case T_BOOL: return c->kind == V_BOOL;
    case T_LSTR: case T_LI64: case T_LF64: {
        if (c->kind != V_ARR) return 0;
        int want = type == T_LSTR ? V_STR : type == T_LI64 ? V_INT : V_DBL;
        const uint8_t *q = c->p;
        Cell x;
        while (next_elem(d, &q, c->p + c->len, &x))
            if (x.kind != want) return 0;
        return 1;
    }
    default: return 0;
    }
}

/* One KeyValue message of an attribute list. */
static void al_kv(D *d, AL *al, const uint8_t *p, const uint8_t *end) {
    const uint8_t *k = (const uint8_t *)"", *v = NULL;
    size_t kl = 0, vl = 0;
    int have_v = 0;
    while (p < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &p, end, &fn, &wt);
        switch (fn) {
        case 1: EXPECT(d, wt, 2); rd_len(d, &p, end, &k, &kl); utf8_check(d, k, kl); break;
        case 2:
            EXPECT(d, wt, 2);
            if (have_v) FAIL(d); /* repeated singular message: upb merges */
            rd_len(d, &p, end, &v, &vl);
            have_v = 1;
            break;
        case 3: EXPECT(d, wt, 0); rd_varint(d, &p, end); break;
        default: skip(d, &p, end, wt);
        }
    }
    const Cfg *cfg = d->cfg;
    uint64_t h = fnv(k, kl);
    KEnt *e = cfg_lookup(cfg, h, k, kl);
    if (!d->keep && is_prompt(cfg, e, k, kl)) {
        d->prompts++;
        if (have_v) validate(d, M_ANY, v, v + vl, 1);
        return;
    }
    for (size_t i = 0; i < d->nkeys; i++)
        if (d->keys[i].h == h && d->keys[i].len == kl && memcmp(d->keys[i].p, k, kl) == 0) FAIL(d);
    if (d->nkeys >= 1024) FAIL(d);
    KeyH *kh = VPUSH(d, d->keys, d->nkeys, d->capkeys);
    kh->h = h;
    kh->p = k;
    kh->len = kl;
    if (e && e->apart && al->ctx == CTX_SPAN && e->col[CTX_SPAN] >= 0 && have_v) {
        const uint8_t *s = NULL;
        size_t l = 0;
        uint64_t iv = 0;
        if (any_parse(d, v, v + vl, 0, &s, &l, &iv) == 1) { /* a string: its typed column only */
            if (utf8_check(d, s, l) > cfg->max_apart_str) {
                d->truncated++;
                l = utf8_prefix(s, l, cfg->max_apart_str);
            }
            Cell c = {.kind = V_STR, .p = s, .len = l};
            stage(d, CTX_SPAN, e->col[CTX_SPAN], al->ev, &c);
            return;
        }
    }
    if (e && e->once && al->ctx == CTX_SPAN && e->col[CTX_SPAN] >= 0) {
        /* a typed span attribute: its entry goes to tjson, and stays there (counted towards the
         * span's size, never stored) when the column holds the value exactly */
        Buf *t = &d->tjson;
        size_t t0 = t->len;
        emit_str(d, t, k, kl, al->ascii);
        PUTS(d, t, ": ");
        Cell c;
        memset(&c, 0, sizeof c);
        if (have_v) any_value(d, t, al->ascii, v, v + vl, &c, 0);
        else PUTS(d, t, "null");
        int col = e->col[CTX_SPAN];
        stage(d, CTX_SPAN, col, al->ev, &c);
        if (held_exactly(d, cfg->types[CTX_SPAN][col], &c)) {
            d->ntyped++;
            return;
        }
        if (al->count++) PUTS(d, al->out, ", ");
        else putc_(d, al->out, '{');
        put(d, al->out, t->p + t0, t->len - t0);
        t->len = t0;
        return;
    }
    if (al->count++) PUTS(d, al->out, ", ");
    else putc_(d, al->out, '{');
    emit_str(d, al->out, k, kl, al->ascii);
    PUTS(d, al->out, ": ");
    Cell c;
    memset(&c, 0, sizeof c);
    if (have_v) any_value(d, al->out, al->ascii, v, v + vl, &c, 0);
    else PUTS(d, al->out, "null");
    if (e && al->ctx < 3 && e->col[al->ctx] >= 0) stage(d, al->ctx, e->col[al->ctx], al->ev, &c);
}

/* ------------------------------------------------------------------------------------------- */
/* spans                                                                                          */
/* ------------------------------------------------------------------------------------------- */
static const char *KINDS[] = {"unspecified", "internal", "server", "client", "producer", "consumer"};
static const char *STATUSES[] = {"unset", "ok", "error"};

typedef struct {
    const uint8_t *tid, *sid, *pid, *ts, *name, *smsg;
    size_t tidl, sidl, pidl, tsl, namel, smsgl;
    uint64_t start, end;
    int32_t kind, code;
    uint32_t flags, dropped;
    int has_status;
} SpanHdr;

static int all_zero(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i]) return 0;
    return 1;
}

static void push_cell(D *d, int ctx, int col, int32_t row, const Cell *c) {
    CellVec *cv = &d->tc[ctx][col];
    Cell *dst = VPUSH(d, cv->v, cv->n, cv->cap);
    *dst = *c;
    dst->row = row;
}

static void link_json(D *d, const uint8_t *p, const uint8_t *end) {
    const uint8_t *tid = NULL, *sid = NULL, *ts = NULL, *s;
    size_t tidl = 0, sidl = 0, tsl = 0, l;
    const uint8_t *q = p;
    while (q < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &q, end, &fn, &wt);
        switch (fn) {
        case 1: EXPECT(d, wt, 2); rd_len(d, &q, end, &tid, &tidl); break;
        case 2: EXPECT(d, wt, 2); rd_len(d, &q, end, &sid, &sidl); break;
        case 3: EXPECT(d, wt, 2); rd_len(d, &q, end, &ts, &tsl); utf8_check(d, ts, tsl); break;
        case 4: EXPECT(d, wt, 2); rd_len(d, &q, end, &s, &l); break;
        case 5: EXPECT(d, wt, 0); rd_varint(d, &q, end); break;
        case 6: EXPECT(d, wt, 5); rd_fixed32(d, &q, end); break;
        default: skip(d, &q, end, wt);
        }
    }
    Buf *b = &d->ljson;
    PUTS(d, b, "{\"trace_id\": \"");
    reserve(d, b, 2 * tidl + 2 * sidl + 64);
    for (size_t i = 0; i < tidl; i++) {
        b->p[b->len++] = (uint8_t)HX[tid[i] >> 4];
        b->p[b->len++] = (uint8_t)HX[tid[i] & 15];
    }
    PUTS(d, b, "\", \"span_id\": \"");
    reserve(d, b, 2 * sidl + 64);
    for (size_t i = 0; i < sidl; i++) {
        b->p[b->len++] = (uint8_t)HX[sid[i] >> 4];
        b->p[b->len++] = (uint8_t)HX[sid[i] & 15];
    }
    PUTS(d, b, "\", \"trace_state\": ");
    if (tsl) emit_str(d, b, ts, tsl, 1);
    else PUTS(d, b, "null");
    PUTS(d, b, ", \"attributes\": ");
    AL al;
    al_begin(d, &al, b, 1, CTX_LINK, 0);
    q = p;
    while (q < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &q, end, &fn, &wt);
        if (fn == 4) {
            rd_len(d, &q, end, &s, &l);
            al_kv(d, &al, s, s + l);
        } else {
            skip(d, &q, end, wt);
        }
    }
    al_end(d, &al);
    putc_(d, b, '}');
}

static void span(D *d, const uint8_t *p, const uint8_t *end, const uint8_t *scope, size_t scopel,
                 const uint8_t *scopev, size_t scopevl) {
    const Cfg *cfg = d->cfg;
    SpanHdr h;
    memset(&h, 0, sizeof h);
    const uint8_t *q = p, *s;
    size_t l;
    while (q < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &q, end, &fn, &wt);
        switch (fn) {
        case 1: EXPECT(d, wt, 2); rd_len(d, &q, end, &h.tid, &h.tidl); break;
        case 2: EXPECT(d, wt, 2); rd_len(d, &q, end, &h.sid, &h.sidl); break;
        case 3: EXPECT(d, wt, 2); rd_len(d, &q, end, &h.ts, &h.tsl); utf8_check(d, h.ts, h.tsl); break;
        case 4: EXPECT(d, wt, 2); rd_len(d, &q, end, &h.pid, &h.pidl); break;
        case 5: EXPECT(d, wt, 2); rd_len(d, &q, end, &h.name, &h.namel); utf8_check(d, h.name, h.namel); break;
        case 6: EXPECT(d, wt, 0); h.kind = (int32_t)(uint32_t)rd_varint(d, &q, end); break;
        case 7: EXPECT(d, wt, 1); h.start = rd_fixed64(d, &q, end); break;
        case 8: EXPECT(d, wt, 1); h.end = rd_fixed64(d, &q, end); break;
        case 9: case 11: case 13: EXPECT(d, wt, 2); rd_len(d, &q, end, &s, &l); break;
        case 10: EXPECT(d, wt, 0); h.dropped = (uint32_t)rd_varint(d, &q, end); break;
        case 12: case 14: EXPECT(d, wt, 0); rd_varint(d, &q, end); break;
        case 15: {
            EXPECT(d, wt, 2);
            if (h.has_status) FAIL(d);
            h.has_status = 1;
            rd_len(d, &q, end, &s, &l);
            const uint8_t *r = s, *re = s + l;
            while (r < re) {
                uint32_t f2;
                int w2;
                rd_tag(d, &r, re, &f2, &w2);
                if (f2 == 2) {
                    EXPECT(d, w2, 2);
                    rd_len(d, &r, re, &h.smsg, &h.smsgl);
                    utf8_check(d, h.smsg, h.smsgl);
                } else if (f2 == 3) {
                    EXPECT(d, w2, 0);
                    h.code = (int32_t)(uint32_t)rd_varint(d, &r, re);
                } else {
                    skip(d, &r, re, w2);
                }
            }
            break;
        }
        case 16: EXPECT(d, wt, 5); h.flags = rd_fixed32(d, &q, end); break;
        default: skip(d, &q, end, wt);
        }
    }
    int problem = -1;
    if (h.tidl != 16 || all_zero(h.tid, h.tidl)) problem = R_TRACE;
    else if (h.sidl != 8 || all_zero(h.sid, h.sidl)) problem = R_SPAN;
    else if (h.pidl && h.pidl != 8) problem = R_PARENT;
    else if (!(cfg->min_ns <= h.start && h.start <= cfg->max_ns && cfg->min_ns <= h.end && h.end <= cfg->max_ns))
        problem = R_RANGE;
    else if (h.end < h.start) problem = R_ORDER;
    if (problem >= 0) {
        /* not decoded (as in Python), but upb validates it all */
        q = p;
        while (q < end) {
            uint32_t fn;
            int wt;
            rd_tag(d, &q, end, &fn, &wt);
            if (fn == 9 || fn == 11 || fn == 13) {
                rd_len(d, &q, end, &s, &l);
                validate(d, fn == 9 ? M_KV : fn == 11 ? M_EVENT : M_LINK, s, s + l, 1);
            } else {
                skip(d, &q, end, wt);
            }
        }
        Rej *r = VPUSH(d, d->rej, d->nrej, d->caprej);
        r->what = problem;
        r->sid = h.sid;
        r->sidl = h.sidl;
        r->name = h.name;
        r->namel = h.namel;
        r->a = problem == R_TRACE ? h.tidl : problem == R_SPAN ? h.sidl : problem == R_PARENT ? h.pidl : h.start;
        r->b = h.end;
        return;
    }
    /* attributes */
    d->sjson.len = 0;
    d->tjson.len = 0;
    d->ntyped = 0;
    d->ejson.len = 0;
    d->ljson.len = 0;
    d->nsst = d->nest = d->nev = 0;
    AL al;
    al_begin(d, &al, &d->sjson, 0, CTX_SPAN, 0);
    q = p;
    while (q < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &q, end, &fn, &wt);
        if (fn == 9) {
            rd_len(d, &q, end, &s, &l);
            al_kv(d, &al, s, s + l);
        } else {
            skip(d, &q, end, wt);
        }
    }
    al_end(d, &al);
    int stored_entries = al.count; /* al is reused for the events */
    /* events */
    size_t nlinks = 0;
    q = p;
    while (q < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &q, end, &fn, &wt);
        if (fn == 11) {
            rd_len(d, &q, end, &s, &l);
            EvStage *ev = VPUSH(d, d->evs, d->nev, d->capev);
            memset(ev, 0, sizeof *ev);
            ev->joff = d->ejson.len;
            ev->name = (const uint8_t *)"";
            al_begin(d, &al, &d->ejson, 0, CTX_EV, (int)(d->nev - 1));
            const uint8_t *r = s, *re = s + l, *s2;
            size_t l2;
            while (r < re) {
                uint32_t f2;
                int w2;
                rd_tag(d, &r, re, &f2, &w2);
                switch (f2) {
                case 1: EXPECT(d, w2, 1); ev->time = rd_fixed64(d, &r, re); break;
                case 2: EXPECT(d, w2, 2); rd_len(d, &r, re, &ev->name, &ev->namel); utf8_check(d, ev->name, ev->namel); break;
                case 3: EXPECT(d, w2, 2); rd_len(d, &r, re, &s2, &l2); al_kv(d, &al, s2, s2 + l2); break;
                case 4: EXPECT(d, w2, 0); rd_varint(d, &r, re); break;
                default: skip(d, &r, re, w2);
                }
            }
            /* al_kv may have grown evs: re-fetch the pointer */
            ev = &d->evs[d->nev - 1];
            al_end(d, &al);
            ev->jlen = d->ejson.len - ev->joff;
        } else if (fn == 13) {
            rd_len(d, &q, end, &s, &l);
            if (nlinks++) PUTS(d, &d->ljson, ", ");
            else putc_(d, &d->ljson, '[');
            link_json(d, s, s + l);
        } else {
            skip(d, &q, end, wt);
        }
    }
    if (nlinks) putc_(d, &d->ljson, ']');
    /* the size of the JSON the attributes would take whole: tjson's entries with their ", "
     * (none before the first entry when the stored JSON is "{}") */
    size_t typed_extra = d->ntyped ? 2 * d->ntyped - (stored_entries ? 0 : 2) : 0;
    size_t size = d->sjson.len + d->tjson.len + typed_extra + d->ejson.len;
    if (size > cfg->max_span_bytes) {
        size = utf8_count(d->sjson.p, d->sjson.len) + utf8_count(d->tjson.p, d->tjson.len) + typed_extra
               + utf8_count(d->ejson.p, d->ejson.len);
        if (size > cfg->max_span_bytes) {
            Rej *r = VPUSH(d, d->rej, d->nrej, d->caprej);
            r->what = R_SIZE;
            r->sid = h.sid;
            r->sidl = h.sidl;
            r->name = h.name;
            r->namel = h.namel;
            r->a = size;
            return;
        }
    }
    /* accepted: commit */
    Col *c = d->sc;
    int32_t row = (int32_t)c[SC_TRACE].n;
    col_hex(d, &c[SC_TRACE], h.tid, 16);
    col_hex(d, &c[SC_SPAN], h.sid, 8);
    if (h.pidl && !all_zero(h.pid, h.pidl)) col_hex(d, &c[SC_PARENT], h.pid, h.pidl);
    else col_null(d, &c[SC_PARENT]);
    if (h.tsl) col_str(d, &c[SC_TSTATE], h.ts, h.tsl);
    else col_null(d, &c[SC_TSTATE]);
    col_str(d, &c[SC_NAME], h.name, h.namel);
    const char *k = (h.kind >= 0 && h.kind < 6) ? KINDS[h.kind] : "unspecified";
    col_str(d, &c[SC_KIND], k, strlen(k));
    col_i64(d, &c[SC_START], (int64_t)h.start);
    col_i64(d, &c[SC_END], (int64_t)h.end);
    k = (h.code >= 0 && h.code < 3) ? STATUSES[h.code] : "unset";
    col_str(d, &c[SC_STATUS], k, strlen(k));
    if (h.smsgl) col_str(d, &c[SC_SMSG], h.smsg, h.smsgl);
    else col_null(d, &c[SC_SMSG]);
    col_i64(d, &c[SC_FLAGS], (int64_t)h.flags);
    if (scopel) col_str(d, &c[SC_SCOPE], scope, scopel);
    else col_null(d, &c[SC_SCOPE]);
    if (scopevl) col_str(d, &c[SC_SCOPEV], scopev, scopevl);
    else col_null(d, &c[SC_SCOPEV]);
    col_str(d, &c[SC_ATTRS], d->sjson.p, d->sjson.len);
    if (nlinks) col_str(d, &c[SC_LINKS], d->ljson.p, d->ljson.len);
    else col_null(d, &c[SC_LINKS]);
    col_i64(d, &c[SC_EVCOUNT], (int64_t)d->nev);
    col_i64(d, &c[SC_DROPPED], (int64_t)h.dropped);
    col_i64(d, &c[SC_RECV], d->received_ns);
    col_str(d, &c[SC_RESATTRS], d->resjson.p, d->resjson.len);
    for (size_t i = 0; i < d->nsst; i++) push_cell(d, CTX_SPAN, d->sst[i].col, row, &d->sst[i].c);
    for (size_t i = 0; i < d->nrst; i++) push_cell(d, CTX_RES, d->rst[i].col, row, &d->rst[i].c);
    Col *e = d->ec;
    int32_t ev0 = (int32_t)e[EC_TRACE].n;
    for (size_t i = 0; i < d->nev; i++) {
        EvStage *ev = &d->evs[i];
        col_hex(d, &e[EC_TRACE], h.tid, 16);
        col_hex(d, &e[EC_SPAN], h.sid, 8);
        col_i64(d, &e[EC_IDX], (int64_t)i);
        col_str(d, &e[EC_NAME], ev->name, ev->namel);
        uint64_t t = (cfg->min_ns <= ev->time && ev->time <= cfg->max_ns) ? ev->time : h.start;
        col_i64(d, &e[EC_TIME], (int64_t)t);
        col_str(d, &e[EC_ATTRS], d->ejson.p + ev->joff, ev->jlen);
    }
    for (size_t i = 0; i < d->nest; i++) push_cell(d, CTX_EV, d->est[i].col, ev0 + d->est[i].ev, &d->est[i].c);
}

static void resource_attrs(D *d, const uint8_t *p, const uint8_t *end) {
    AL al;
    al_begin(d, &al, &d->resjson, 0, CTX_RES, 0);
    while (p < end) {
        uint32_t fn;
        int wt;
        const uint8_t *s;
        size_t l;
        rd_tag(d, &p, end, &fn, &wt);
        switch (fn) {
        case 1: EXPECT(d, wt, 2); rd_len(d, &p, end, &s, &l); al_kv(d, &al, s, s + l); break;
        case 2: EXPECT(d, wt, 0); rd_varint(d, &p, end); break;
        case 3: EXPECT(d, wt, 2); rd_len(d, &p, end, &s, &l); validate(d, M_ENTREF, s, s + l, 1); break;
        default: skip(d, &p, end, wt);
        }
    }
    al_end(d, &al);
}

static void scope_spans(D *d, const uint8_t *p, const uint8_t *end) {
    const uint8_t *q = p, *s, *scope = NULL;
    size_t l, scopel = 0;
    int have_scope = 0;
    while (q < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &q, end, &fn, &wt);
        switch (fn) {
        case 1:
            EXPECT(d, wt, 2);
            if (have_scope) FAIL(d);
            have_scope = 1;
            rd_len(d, &q, end, &scope, &scopel);
            break;
        case 2: EXPECT(d, wt, 2); rd_len(d, &q, end, &s, &l); break;
        case 3: EXPECT(d, wt, 2); rd_len(d, &q, end, &s, &l); utf8_check(d, s, l); break;
        default: skip(d, &q, end, wt);
        }
    }
    const uint8_t *name = NULL, *ver = NULL;
    size_t namel = 0, verl = 0;
    if (have_scope) {
        const uint8_t *r = scope, *re = scope + scopel;
        while (r < re) {
            uint32_t fn;
            int wt;
            rd_tag(d, &r, re, &fn, &wt);
            switch (fn) {
            case 1: EXPECT(d, wt, 2); rd_len(d, &r, re, &name, &namel); utf8_check(d, name, namel); break;
            case 2: EXPECT(d, wt, 2); rd_len(d, &r, re, &ver, &verl); utf8_check(d, ver, verl); break;
            case 3: EXPECT(d, wt, 2); rd_len(d, &r, re, &s, &l); validate(d, M_KV, s, s + l, 1); break;
            case 4: EXPECT(d, wt, 0); rd_varint(d, &r, re); break;
            default: skip(d, &r, re, wt);
            }
        }
    }
    q = p;
    while (q < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &q, end, &fn, &wt);
        if (fn == 2) {
            rd_len(d, &q, end, &s, &l);
            span(d, s, s + l, name, namel, ver, verl);
        } else {
            skip(d, &q, end, wt);
        }
    }
}

static void resource_spans(D *d, const uint8_t *p, const uint8_t *end) {
    const uint8_t *q = p, *s, *res = NULL;
    size_t l, resl = 0;
    int have_res = 0;
    while (q < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &q, end, &fn, &wt);
        switch (fn) {
        case 1:
            EXPECT(d, wt, 2);
            if (have_res) FAIL(d);
            have_res = 1;
            rd_len(d, &q, end, &res, &resl);
            break;
        case 2: EXPECT(d, wt, 2); rd_len(d, &q, end, &s, &l); break;
        case 3: EXPECT(d, wt, 2); rd_len(d, &q, end, &s, &l); utf8_check(d, s, l); break;
        default: skip(d, &q, end, wt);
        }
    }
    d->resjson.len = 0;
    d->nrst = 0;
    resource_attrs(d, res, res + resl);
    q = p;
    while (q < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &q, end, &fn, &wt);
        if (fn == 2) {
            rd_len(d, &q, end, &s, &l);
            scope_spans(d, s, s + l);
        } else {
            skip(d, &q, end, wt);
        }
    }
}

static void request(D *d, const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        uint32_t fn;
        int wt;
        rd_tag(d, &p, end, &fn, &wt);
        if (fn == 1) {
            const uint8_t *s;
            size_t l;
            EXPECT(d, wt, 2);
            rd_len(d, &p, end, &s, &l);
            resource_spans(d, s, s + l);
        } else {
            skip(d, &p, end, wt);
        }
    }
}

/* ------------------------------------------------------------------------------------------- */
/* output                                                                                         */
/* ------------------------------------------------------------------------------------------- */
static PyObject *bytes_of(Buf *b) { return PyBytes_FromStringAndSize((const char *)b->p, (Py_ssize_t)b->len); }

/* (kind, n, null_count, validity|None, data, offsets|None); all-null: (kind, n, n, None, None, None) */
static PyObject *col_py(Col *c) {
    if (c->n && c->nulls == c->n)
        return Py_BuildValue("(innOOO)", c->kind, (Py_ssize_t)c->n, (Py_ssize_t)c->n, Py_None, Py_None, Py_None);
    PyObject *valid = c->nulls ? bytes_of(&c->valid) : (Py_INCREF(Py_None), Py_None);
    PyObject *data = bytes_of(&c->data);
    PyObject *offs = c->kind == T_STR ? bytes_of(&c->offs) : (Py_INCREF(Py_None), Py_None);
    PyObject *out = NULL;
    if (valid && data && offs)
        out = Py_BuildValue("(innOOO)", c->kind, (Py_ssize_t)c->n, (Py_ssize_t)c->nulls, valid, data, offs);
    Py_XDECREF(valid);
    Py_XDECREF(data);
    Py_XDECREF(offs);
    return out;
}

static PyObject *cell_py(D *d, const Cell *c) {
    switch (c->kind) {
    case V_STR: return PyUnicode_DecodeUTF8((const char *)c->p, (Py_ssize_t)c->len, NULL);
    case V_INT: return PyLong_FromLongLong(c->i);
    case V_DBL: return PyFloat_FromDouble(c->d);
    case V_BOOL: return PyBool_FromLong((long)c->i);
    case V_ARR: {
        PyObject *list = PyList_New(0);
        if (!list) return NULL;
        const uint8_t *q = c->p, *qe = c->p + c->len;
        if (setjmp(d->jb)) { /* cannot happen: validated before */
            Py_DECREF(list);
            PyErr_SetString(PyExc_RuntimeError, "native decoder: array re-read failed");
            return NULL;
        }
        while (q < qe) {
            uint32_t fn;
            int wt;
            rd_tag(d, &q, qe, &fn, &wt);
            if (fn != 1) {
                skip(d, &q, qe, wt);
                continue;
            }
            const uint8_t *es;
            size_t el;
            rd_len(d, &q, qe, &es, &el);
            Cell x;
            elem_cell(d, es, es + el, &x);
            PyObject *item = x.kind == V_NONE ? (Py_INCREF(Py_None), Py_None) : cell_py(d, &x);
            if (!item || PyList_Append(list, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(item);
        }
        return list;
    }
    default: Py_RETURN_NONE;
    }
}

static int native_ok(int type, int vkind) {
    if (vkind == V_NONE) return 1;
    switch (type) {
    case T_STR: case T_LSTR: return vkind == V_STR;
    case T_I64: case T_LI64: return vkind == V_INT || vkind == V_DBL || vkind == V_BOOL;
    case T_F64: case T_LF64: return vkind == V_DBL || vkind == V_INT;
    case T_BOOL: return vkind == V_BOOL || vkind == V_INT;
    default: return 0;
    }
}

/* One value into a scalar column, converted as _coerce does (native_ok(type, c->kind) holds). */
static void col_value(D *d, Col *col, int type, const Cell *c) {
    if (c->kind == V_NONE) {
        col_null(d, col);
        return;
    }
    switch (type) {
    case T_STR: col_str(d, col, c->p, c->len); break;
    case T_I64:
        if (c->kind == V_DBL) {
            if (fabs(c->d) < 4611686018427387904.0) col_i64(d, col, (int64_t)c->d);
            else col_null(d, col);
        } else {
            col_i64(d, col, c->i);
        }
        break;
    case T_F64: col_f64(d, col, c->kind == V_DBL ? c->d : (double)c->i); break;
    case T_BOOL: col_bool(d, col, c->i != 0); break;
    }
}

/* A typed column: Arrow spec when every value converts as _coerce would (exact types, int <->
 * double, arrays of those), else the raw values as a list (Python runs _coerce_column on it).
 * List columns: (kind, n, nulls, validity|None, child spec, offsets). */
static PyObject *typed_py(D *d, int type, CellVec *cv, size_t n) {
    int nonnull = 0, ok = 1, is_list = type >= T_LSTR && type <= T_LF64;
    int et = is_list ? type - T_LSTR : type; /* element / scalar kind */
    for (size_t i = 0; i < cv->n; i++) {
        if (cv->v[i].kind != V_NONE) nonnull = 1;
        if (cv->v[i].kind == V_ARR ? !is_list : !native_ok(type, cv->v[i].kind)) ok = 0;
    }
    if (!nonnull) return Py_BuildValue("(innOOO)", type, (Py_ssize_t)n, (Py_ssize_t)n, Py_None, Py_None, Py_None);
    Col col, child;
    memset(&col, 0, sizeof col);
    memset(&child, 0, sizeof child);
    PyObject *out = NULL;
    if (ok) {
        if (setjmp(d->jb)) {
            col_free(&col);
            col_free(&child);
            return PyErr_NoMemory();
        }
        if (is_list) {
            col_init(d, &col, T_I64); /* validity only; offsets kept in col.offs */
            col_init(d, &child, et);
            int32_t z = 0;
            put(d, &col.offs, &z, 4);
        } else {
            col_init(d, &col, type);
        }
        size_t j = 0;
        for (size_t r = 0; r < n && ok; r++) {
            const Cell *c = (j < cv->n && (size_t)cv->v[j].row == r) ? &cv->v[j++] : NULL;
            if (!is_list) {
                static const Cell none = {0};
                col_value(d, &col, type, c ? c : &none);
                continue;
            }
            if (!c || c->kind == V_NONE) {
                col_bit(d, &col, 0);
                col.n++;
            } else if (c->kind != V_ARR) {
                col_bit(d, &col, 1);
                col.n++;
                col_value(d, &child, et, c);
            } else {
                col_bit(d, &col, 1);
                col.n++;
                const uint8_t *q = c->p;
                Cell x;
                while (next_elem(d, &q, c->p + c->len, &x)) {
                    if (!native_ok(et, x.kind)) {
                        ok = 0;
                        break;
                    }
                    col_value(d, &child, et, &x);
                }
            }
            if (is_list) {
                if (child.n > 0x7fffffffu) FAIL(d);
                int32_t o = (int32_t)child.n;
                put(d, &col.offs, &o, 4);
            }
        }
        if (ok) {
            if (is_list) {
                PyObject *cs = col_py(&child);
                PyObject *valid = col.nulls ? bytes_of(&col.valid) : (Py_INCREF(Py_None), Py_None);
                PyObject *offs = bytes_of(&col.offs);
                if (cs && valid && offs)
                    out = Py_BuildValue("(innOOO)", type, (Py_ssize_t)n, (Py_ssize_t)col.nulls, valid, cs, offs);
                Py_XDECREF(cs);
                Py_XDECREF(valid);
                Py_XDECREF(offs);
            } else {
                out = col_py(&col);
            }
            col_free(&col);
            col_free(&child);
            return out;
        }
        col_free(&col);
        col_free(&child);
    }
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (size_t i = 0; i < n; i++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(list, (Py_ssize_t)i, Py_None);
    }
    for (size_t i = 0; i < cv->n; i++) {
        PyObject *v = cell_py(d, &cv->v[i]);
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SetItem(list, cv->v[i].row, v);
    }
    return list;
}

static void d_free(D *d) {
    for (int i = 0; i < NSC; i++) col_free(&d->sc[i]);
    for (int i = 0; i < NEC; i++) col_free(&d->ec[i]);
    for (int t = 0; t < 3; t++) {
        if (!d->tc[t]) continue;
        for (int i = 0; i < d->cfg->ncols[t]; i++) free(d->tc[t][i].v);
        free(d->tc[t]);
    }
    free(d->resjson.p);
    free(d->sjson.p);
    free(d->ejson.p);
    free(d->ljson.p);
    free(d->scratch.p);
    free(d->tjson.p);
    free(d->rst);
    free(d->sst);
    free(d->est);
    free(d->evs);
    free(d->keys);
    free(d->rej);
}

/* One decoder state kept between calls (its buffers stay allocated: no page faults, no regrowth).
 * Every call holds the GIL from start to end, so a single slot needs no lock. */
static D *d_cache = NULL;
#define D_CACHE_MAX_BYTES ((size_t)256 << 20)

static size_t d_capacity(D *d) {
    size_t t = d->resjson.cap + d->sjson.cap + d->ejson.cap + d->ljson.cap + d->scratch.cap + d->tjson.cap;
    for (int i = 0; i < NSC; i++) t += d->sc[i].valid.cap + d->sc[i].data.cap + d->sc[i].offs.cap;
    for (int i = 0; i < NEC; i++) t += d->ec[i].valid.cap + d->ec[i].data.cap + d->ec[i].offs.cap;
    return t;
}

static D *d_get(void) {
    D *d = d_cache;
    d_cache = NULL;
    return d ? d : calloc(1, sizeof(D));
}

static void d_release(D *d) {
    for (int t = 0; t < 3; t++) {
        if (!d->tc[t]) continue;
        for (int i = 0; i < d->cfg->ncols[t]; i++) free(d->tc[t][i].v);
        free(d->tc[t]);
        d->tc[t] = NULL;
    }
    if (d_cache != NULL || d_capacity(d) > D_CACHE_MAX_BYTES) {
        d_free(d);
        free(d);
        return;
    }
    Col *cols[2] = {d->sc, d->ec};
    int ncols[2] = {NSC, NEC};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < ncols[k]; i++) {
            Col *c = &cols[k][i];
            c->valid.len = c->data.len = c->offs.len = 0;
            c->n = c->nulls = 0;
        }
    d->resjson.len = d->sjson.len = d->ejson.len = d->ljson.len = d->scratch.len = d->tjson.len = 0;
    d->nrst = d->nsst = d->nest = d->nev = d->nkeys = d->nrej = 0;
    d->truncated = d->prompts = 0;
    d->cfg = NULL;
    d_cache = d;
}

static PyObject *rej_py(const Rej *r, size_t max_span) {
    PyObject *sid = PyUnicode_New((Py_ssize_t)(2 * r->sidl), 127);
    if (!sid) return NULL;
    Py_UCS1 *o = PyUnicode_1BYTE_DATA(sid);
    for (size_t i = 0; i < r->sidl; i++) {
        o[2 * i] = (Py_UCS1)HX[r->sid[i] >> 4];
        o[2 * i + 1] = (Py_UCS1)HX[r->sid[i] & 15];
    }
    if (r->sidl == 0) {
        Py_DECREF(sid);
        sid = PyUnicode_FromString("?");
        if (!sid) return NULL;
    }
    PyObject *name = PyUnicode_DecodeUTF8((const char *)(r->name ? r->name : (const uint8_t *)""),
                                          (Py_ssize_t)r->namel, NULL);
    PyObject *cut = name ? PyUnicode_Substring(name, 0, 60) : NULL;
    PyObject *problem = NULL, *out = NULL;
    if (cut) {
        switch (r->what) {
        case R_TRACE: problem = PyUnicode_FromFormat("trace_id must be 16 non-zero bytes, got %llu", (unsigned long long)r->a); break;
        case R_SPAN: problem = PyUnicode_FromFormat("span_id must be 8 non-zero bytes, got %llu", (unsigned long long)r->a); break;
        case R_PARENT: problem = PyUnicode_FromFormat("parent_span_id must be 8 bytes, got %llu", (unsigned long long)r->a); break;
        case R_RANGE: problem = PyUnicode_FromFormat("timestamps out of range (start %llu, end %llu ns)", (unsigned long long)r->a, (unsigned long long)r->b); break;
        case R_ORDER: problem = PyUnicode_FromFormat("ends before it starts (start %llu, end %llu ns)", (unsigned long long)r->a, (unsigned long long)r->b); break;
        case R_SIZE: problem = PyUnicode_FromFormat("attributes and events are %llu bytes, over %zu", (unsigned long long)r->a, max_span); break;
        }
    }
    if (problem) out = PyUnicode_FromFormat("span %U (%R): %U", sid, cut, problem);
    Py_XDECREF(problem);
    Py_XDECREF(cut);
    Py_XDECREF(name);
    Py_DECREF(sid);
    return out;
}

/* decode(body: bytes-like, cfg, keep_prompts: bool, received_ns: int) -> tuple | None */
static PyObject *native_decode(PyObject *self, PyObject *args) {
    Py_buffer body;
    PyObject *cap;
    int keep;
    long long received;
    if (!PyArg_ParseTuple(args, "y*OpL", &body, &cap, &keep, &received)) return NULL;
    Cfg *cfg = PyCapsule_GetPointer(cap, "routeaudit.native.cfg");
    if (!cfg) {
        PyBuffer_Release(&body);
        return NULL;
    }
    D *d = d_get();
    if (!d) {
        PyBuffer_Release(&body);
        return PyErr_NoMemory();
    }
    d->cfg = cfg;
    d->keep = keep;
    d->received_ns = received;
    PyObject *result = NULL;
    d->released = NULL;
    if (setjmp(d->jb)) {
        if (d->released) {
            PyEval_RestoreThread(d->released);
            d->released = NULL;
        }
        d_release(d);
        PyBuffer_Release(&body);
        Py_RETURN_NONE; /* not handled: fall back */
    }
    for (int t = 0; t < 3; t++) {
        d->tc[t] = calloc(cfg->ncols[t] ? cfg->ncols[t] : 1, sizeof(CellVec));
        if (!d->tc[t]) FAIL(d);
    }
    for (int i = 0; i < NSC; i++) col_init(d, &d->sc[i], SC_KINDS[i]);
    for (int i = 0; i < NEC; i++) col_init(d, &d->ec[i], EC_KINDS[i]);
    const uint8_t *p = body.buf;
    /* The parse touches no Python object (the body is pinned by the buffer): other threads
       (the HTTP loop, other decodes, the writer's Python side) run meanwhile. */
    d->released = PyEval_SaveThread();
    request(d, p, p + body.len);
    PyEval_RestoreThread(d->released);
    d->released = NULL;

    /* build the Python result (the body stays alive until here: cells point into it) */
    size_t ns = d->sc[SC_TRACE].n, ne = d->ec[EC_TRACE].n;
    PyObject *sfixed = PyTuple_New(NSC), *efixed = PyTuple_New(NEC);
    PyObject *typed[3] = {PyList_New(0), PyList_New(0), PyList_New(0)};
    PyObject *rej = PyList_New(0);
    if (!sfixed || !efixed || !typed[0] || !typed[1] || !typed[2] || !rej) goto done;
    for (int i = 0; i < NSC; i++) {
        PyObject *o = col_py(&d->sc[i]);
        if (!o) goto done;
        PyTuple_SET_ITEM(sfixed, i, o);
    }
    for (int i = 0; i < NEC; i++) {
        PyObject *o = col_py(&d->ec[i]);
        if (!o) goto done;
        PyTuple_SET_ITEM(efixed, i, o);
    }
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < cfg->ncols[t]; i++) {
            PyObject *o = typed_py(d, cfg->types[t][i], &d->tc[t][i], t == CTX_EV ? ne : ns);
            if (!o) goto done;
            int rc = PyList_Append(typed[t], o);
            Py_DECREF(o);
            if (rc < 0) goto done;
        }
    }
    for (size_t i = 0; i < d->nrej; i++) {
        PyObject *o = rej_py(&d->rej[i], cfg->max_span_bytes);
        if (!o) goto done;
        int rc = PyList_Append(rej, o);
        Py_DECREF(o);
        if (rc < 0) goto done;
    }
    result = Py_BuildValue("(OOOOOOLL)", sfixed, typed[CTX_RES], typed[CTX_SPAN], efixed, typed[CTX_EV], rej,
                           (long long)d->truncated, (long long)d->prompts);
done:
    Py_XDECREF(sfixed);
    Py_XDECREF(efixed);
    Py_XDECREF(typed[0]);
    Py_XDECREF(typed[1]);
    Py_XDECREF(typed[2]);
    Py_XDECREF(rej);
    d_release(d);
    PyBuffer_Release(&body);
    return result;
}

/* ------------------------------------------------------------------------------------------- */
/* candidates JSON -> candidate event columns                                                     */
/* ------------------------------------------------------------------------------------------- */
/* What collectors/otlp/_candidate_events.py does with the decision spans' candidates attribute
 * (orjson.loads, then one Arrow struct conversion), for the texts where that is plain: strict
 * JSON (RFC 8259), an array of objects whose known keys hold null or a value of their column's
 * exact kind (an integer where a double goes, up to 2^53), nothing nested under a known key.
 * Anything else (NaN, a string where a number goes, a float where an integer goes, integers past
 * int64, depth over 64, a malformed text…) returns None and the Python expansion, the reference,
 * handles the whole batch: the same rule as the decoder, never produce what Python would not.
 * A text that is valid JSON but not an array of objects is counted malformed, as Python does. */
#define CJ_MAX_DEPTH 64
#define CJ_MAX_KEYS 64

static locale_t c_locale; /* "C" numbers whatever the process locale; made at import */

typedef struct {
    uint8_t kind; /* V_NONE (absent or null), V_STR, V_INT, V_DBL, V_BOOL */
    int esc;      /* string unescaped into the scratch buffer at off */
    int64_t i;
    double d;
    const uint8_t *p;
    size_t off, len;
} CCell;

typedef struct {
    D *d;
    int nk;
    const uint8_t *kp[CJ_MAX_KEYS];
    size_t kl[CJ_MAX_KEYS];
    int kind[CJ_MAX_KEYS];
    Col col[CJ_MAX_KEYS];
    Buf rows, idx, scratch, keybuf, keep;
    CCell *cells;
    size_t ncells, capcells;
    int64_t max_cands, malformed;
    int unknown; /* the text being read has a key no column takes */
} CX;

static inline const uint8_t *j_ws(const uint8_t *p, const uint8_t *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

static int j_hex4(const uint8_t *p, const uint8_t *end, unsigned *v) {
    if (end - p < 4) return 0;
    unsigned x = 0;
    for (int k = 0; k < 4; k++) {
        uint8_t c = p[k];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    *v = x;
    return 1;
}

static void j_utf8(D *d, Buf *b, unsigned cp) {
    uint8_t o[4];
    size_t n = utf8_encode(cp, o);
    put(d, b, o, n);
}

/* The JSON string at p (its opening quote): the byte after its closing quote, or NULL when it is
 * not strict JSON (control characters, bad escapes, lone surrogates). *esc tells whether it holds
 * escapes; with out, the unescaped bytes are appended to out. The input is valid UTF-8 (the
 * decoder checked it), so unescaped bytes are copied as they are. */
static const uint8_t *j_str(D *d, const uint8_t *p, const uint8_t *end, Buf *out, int *esc) {
    const uint8_t *s = ++p;
    *esc = 0;
    while (p < end) {
        uint8_t c = *p;
        if (c == '"') {
            if (out) put(d, out, s, (size_t)(p - s));
            return p + 1;
        }
        if (c < 0x20) return NULL;
        if (c != '\\') {
            p++;
            continue;
        }
        *esc = 1;
        if (out) put(d, out, s, (size_t)(p - s));
        if (end - p < 2) return NULL;
        uint8_t e = p[1], ch = 0;
        p += 2;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = 8; break;
        case 'f': ch = 12; break;
        case 'n': ch = 10; break;
        case 'r': ch = 13; break;
        case 't': ch = 9; break;
        case 'u': {
            unsigned cp, lo;
            if (!j_hex4(p, end, &cp)) return NULL;
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !j_hex4(p + 2, end, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return NULL;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return NULL;
            }
            if (out) j_utf8(d, out, cp);
            s = p;
            continue;
        }
        default: return NULL;
        }
        if (out) putc_(d, out, ch);
        s = p;
    }
    return NULL;
}

static inline int j_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* A JSON number's end, or NULL; *isint: no fraction and no exponent. */
static const uint8_t *j_num(const uint8_t *p, const uint8_t *end, int *isint) {
    const uint8_t *q = p;
    if (q < end && *q == '-') q++;
    if (q >= end) return NULL;
    if (*q == '0') q++;
    else if (*q >= '1' && *q <= '9') while (q < end && j_digit(*q)) q++;
    else return NULL;
    *isint = 1;
    if (q < end && *q == '.') {
        q++;
        if (q >= end || !j_digit(*q)) return NULL;
        while (q < end && j_digit(*q)) q++;
        *isint = 0;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (q >= end || !j_digit(*q)) return NULL;
        while (q < end && j_digit(*q)) q++;
        *isint = 0;
    }
    return q;
}

static const uint8_t *j_lit(const uint8_t *p, const uint8_t *end, const char *lit, size_t n) {
    return (size_t)(end - p) >= n && memcmp(p, lit, n) == 0 ? p + n : NULL;
}

static int j_int(const uint8_t *p, const uint8_t *q, int64_t *out);
static int j_dbl(const uint8_t *p, const uint8_t *q, double *out);

/* Skip one JSON value (validating it); NULL when it is not strict JSON or nests too deep. */
static const uint8_t *j_skip(D *d, const uint8_t *p, const uint8_t *end, int depth) {
    int esc, isint;
    if (depth > CJ_MAX_DEPTH || p >= end) return NULL;
    switch (*p) {
    case '"': return j_str(d, p, end, NULL, &esc);
    case 't': return j_lit(p, end, "true", 4);
    case 'f': return j_lit(p, end, "false", 5);
    case 'n': return j_lit(p, end, "null", 4);
    case '{':
        p = j_ws(p + 1, end);
        if (p < end && *p == '}') return p + 1;
        for (;;) {
            if (p >= end || *p != '"' || !(p = j_str(d, p, end, NULL, &esc))) return NULL;
            p = j_ws(p, end);
            if (p >= end || *p != ':') return NULL;
            if (!(p = j_skip(d, j_ws(p + 1, end), end, depth + 1))) return NULL;
            p = j_ws(p, end);
            if (p < end && *p == ',') { p = j_ws(p + 1, end); continue; }
            return p < end && *p == '}' ? p + 1 : NULL;
        }
    case '[':
        p = j_ws(p + 1, end);
        if (p < end && *p == ']') return p + 1;
        for (;;) {
            if (!(p = j_skip(d, p, end, depth + 1))) return NULL;
            p = j_ws(p, end);
            if (p < end && *p == ',') { p = j_ws(p + 1, end); continue; }
            return p < end && *p == ']' ? p + 1 : NULL;
        }
    default: {
        /* a number orjson would refuse (a huge integer, a double overflowing) makes the text
           non-strict for Python: leave it to Python even under a key nobody reads */
        const uint8_t *q = j_num(p, end, &isint);
        int64_t iv;
        double dv;
        if (q && !(isint ? j_int(p, q, &iv) : j_dbl(p, q, &dv))) return NULL;
        return q;
    }
    }
}

static int j_int(const uint8_t *p, const uint8_t *q, int64_t *out) {
    int neg = *p == '-';
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (p += neg; p < q; p++) {
        uint64_t dgt = (uint64_t)(*p - '0');
        if (v > (lim - dgt) / 10) return 0;
        v = v * 10 + dgt;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

static int j_dbl(const uint8_t *p, const uint8_t *q, double *out) {
    /* Clinger's fast path: at most 2^53 as digits and a power of ten up to 22 are both exact
       doubles, so one multiplication or division gives the correctly rounded value. */
    static const double P10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    const uint8_t *r = p;
    int neg = *r == '-';
    uint64_t m = 0;
    int digits = 0, e10 = 0, ok = 1;
    for (r += neg; r < q && j_digit(*r); r++, digits++) m = m * 10 + (uint64_t)(*r - '0');
    if (r < q && *r == '.')
        for (r++; r < q && j_digit(*r); r++, digits++, e10--) m = m * 10 + (uint64_t)(*r - '0');
    if (r < q) { /* exponent */
        int es = 1, ev = 0;
        r++;
        if (*r == '+' || *r == '-') es = *r++ == '-' ? -1 : 1;
        for (; r < q && j_digit(*r); r++) {
            ev = ev * 10 + (*r - '0');
            if (ev > 1000) ok = 0;
        }
        e10 += es * ev;
    }
    if (ok && digits <= 19 && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        double v = (double)m;
        v = e10 < 0 ? v / P10[-e10] : v * P10[e10];
        *out = neg ? -v : v;
        return 1;
    }
    char buf[64];
    size_t n = (size_t)(q - p);
    if (n >= sizeof buf) return 0;
    memcpy(buf, p, n);
    buf[n] = 0;
    /* Runs without the GIL, so not PyOS_string_to_double (its dtoa state is the interpreter's);
       glibc's strtod is correctly rounded like Python's and orjson's, and the C locale fixes
       the decimal point. Underflow and overflow (ERANGE) are left to Python. */
    char *e = NULL;
    errno = 0;
    double v = c_locale ? strtod_l(buf, &e, c_locale) : strtod(buf, &e);
    if (errno == ERANGE) return 0;
    if (e != buf + n || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

/* A known key's value into its cell; 0: leave the batch to Python. */
static const uint8_t *cj_value(CX *x, CCell *c, int kind, const uint8_t *p, const uint8_t *end) {
    int esc, isint;
    const uint8_t *q;
    if (p >= end) return NULL;
    switch (*p) {
    case '"':
        if (kind != T_STR || !(q = j_str(x->d, p, end, NULL, &esc))) return NULL;
        c->kind = V_STR;
        c->esc = esc;
        if (esc) {
            c->off = x->scratch.len;
            j_str(x->d, p, end, &x->scratch, &esc);
            c->len = x->scratch.len - c->off;
        } else {
            c->p = p + 1;
            c->len = (size_t)(q - p - 2);
        }
        return q;
    case 't': case 'f':
        if (kind != T_BOOL) return NULL;
        c->kind = V_BOOL;
        c->i = *p == 't';
        return *p == 't' ? j_lit(p, end, "true", 4) : j_lit(p, end, "false", 5);
    case 'n':
        c->kind = V_NONE;
        return j_lit(p, end, "null", 4);
    case '{': case '[':
        return NULL;
    default:
        if (!(q = j_num(p, end, &isint))) return NULL;
        if (kind == T_I64) {
            if (!isint || !j_int(p, q, &c->i)) return NULL;
            c->kind = V_INT;
        } else if (kind == T_F64) {
            if (isint) {
                int64_t v;
                if (!j_int(p, q, &v) || v > 9007199254740992LL || v < -9007199254740992LL) return NULL;
                c->d = (double)v;
            } else if (!j_dbl(p, q, &c->d)) {
                return NULL;
            }
            c->kind = V_DBL;
        } else {
            return NULL;
        }
        return q;
    }
}

static int cj_key(CX *x, const uint8_t *k, size_t kl) {
    for (int i = 0; i < x->nk; i++)
        if (x->kl[i] == kl && memcmp(x->kp[i], k, kl) == 0) return i;
    return -1;
}

/* One object (at '{') into nk cells (last duplicate wins, as in a dict); NULL: to Python. */
static const uint8_t *cj_object(CX *x, CCell *cells, const uint8_t *p, const uint8_t *end) {
    int esc;
    const uint8_t *q;
    p = j_ws(p + 1, end);
    if (p < end && *p == '}') return p + 1;
    for (;;) {
        if (p >= end || *p != '"' || !(q = j_str(x->d, p, end, NULL, &esc))) return NULL;
        int k;
        if (esc) {
            x->keybuf.len = 0;
            j_str(x->d, p, end, &x->keybuf, &esc);
            k = cj_key(x, x->keybuf.p, x->keybuf.len);
        } else {
            k = cj_key(x, p + 1, (size_t)(q - p - 2));
        }
        p = j_ws(q, end);
        if (p >= end || *p != ':') return NULL;
        p = j_ws(p + 1, end);
        if (k < 0) {
            x->unknown = 1;
            p = j_skip(x->d, p, end, 2);
        } else {
            memset(&cells[k], 0, sizeof(CCell));
            p = cj_value(x, &cells[k], x->kind[k], p, end);
        }
        if (!p) return NULL;
        p = j_ws(p, end);
        if (p < end && *p == ',') { p = j_ws(p + 1, end); continue; }
        return p < end && *p == '}' ? p + 1 : NULL;
    }
}

/* One text: its candidates' cells staged, then committed to the columns, and whether the text
 * must be kept (keep: one byte per text): unless its rows hold all of it, i.e. when it is
 * malformed, empty, has more than max_cands elements or a key no column takes. 0: to Python. */
static int cj_text(CX *x, int32_t row, const uint8_t *p, const uint8_t *end) {
    int notobj = 0;
    int64_t n = 0;
    uint8_t keep = 1;
    x->ncells = 0;
    x->scratch.len = 0;
    x->unknown = 0;
    p = j_ws(p, end);
    if (p >= end || *p != '[') {
        if (!(p = j_skip(x->d, p, end, 0)) || j_ws(p, end) != end) return 0;
        x->malformed++;
        putc_(x->d, &x->keep, keep);
        return 1;
    }
    p = j_ws(p + 1, end);
    if (p < end && *p == ']') {
        if (j_ws(p + 1, end) != end) return 0;
        putc_(x->d, &x->keep, keep);
        return 1;
    }
    for (;;) {
        if (p < end && *p == '{' && n < x->max_cands && !notobj) {
            size_t need = x->ncells + (size_t)x->nk;
            grow(x->d, (void **)&x->cells, &x->capcells, need, sizeof(CCell));
            memset(&x->cells[x->ncells], 0, (size_t)x->nk * sizeof(CCell));
            if (!(p = cj_object(x, &x->cells[x->ncells], p, end))) return 0;
            x->ncells = need;
        } else {
            if (p >= end || *p != '{') notobj = 1;
            if (!(p = j_skip(x->d, p, end, 1))) return 0;
        }
        n++;
        p = j_ws(p, end);
        if (p < end && *p == ',') { p = j_ws(p + 1, end); continue; }
        if (p >= end || *p != ']' || j_ws(p + 1, end) != end) return 0;
        break;
    }
    if (notobj) {
        x->malformed++;
        putc_(x->d, &x->keep, keep);
        return 1;
    }
    keep = x->unknown || n > x->max_cands;
    putc_(x->d, &x->keep, keep);
    size_t m = x->ncells / (size_t)(x->nk ? x->nk : 1);
    for (size_t i = 0; i < m; i++) {
        int64_t ci = (int64_t)i;
        put(x->d, &x->rows, &row, 4);
        put(x->d, &x->idx, &ci, 8);
        for (int k = 0; k < x->nk; k++) {
            CCell *c = &x->cells[i * (size_t)x->nk + (size_t)k];
            Col *col = &x->col[k];
            switch (c->kind) {
            case V_NONE: col_null(x->d, col); break;
            case V_STR: col_str(x->d, col, c->esc ? x->scratch.p + c->off : c->p, c->len); break;
            case V_INT: col_i64(x->d, col, c->i); break;
            case V_DBL: col_f64(x->d, col, c->d); break;
            case V_BOOL: col_bool(x->d, col, (int)c->i); break;
            }
        }
    }
    return 1;
}

static void cx_free(CX *x) {
    for (int k = 0; k < CJ_MAX_KEYS; k++) col_free(&x->col[k]);
    free(x->rows.p);
    free(x->idx.p);
    free(x->scratch.p);
    free(x->keybuf.p);
    free(x->keep.p);
    free(x->cells);
}

/* expand_candidates(offsets, data, offset, n, keys, max_candidates) -> None | (rows, index, count,
 * malformed, [column spec per key], keep). offsets/data: the Arrow buffers of a string array without
 * nulls (offset: the array's offset), keys: [(short key bytes, column kind)]. rows (int32) and
 * index (int64) give each candidate's text and position in it; keep (one byte per text) whether
 * the text must be kept beside its rows (cj_text). */
static PyObject *native_expand_candidates(PyObject *self, PyObject *args) {
    Py_buffer offs, data;
    Py_ssize_t off, n;
    PyObject *keys;
    long long maxc;
    if (!PyArg_ParseTuple(args, "y*y*nnO!L", &offs, &data, &off, &n, &PyList_Type, &keys, &maxc)) return NULL;
    PyObject *result = NULL;
    D *d = calloc(1, sizeof(D));
    CX *x = calloc(1, sizeof(CX));
    Py_ssize_t nk = PyList_GET_SIZE(keys);
    if (!d || !x) {
        result = PyErr_NoMemory();
        goto out;
    }
    if (off < 0 || n < 0 || (size_t)offs.len < (size_t)(off + n + 1) * 4) {
        PyErr_SetString(PyExc_ValueError, "expand_candidates: bad buffers");
        goto out;
    }
    if (nk == 0 || nk > CJ_MAX_KEYS) { /* rows are counted per key cell: leave these to Python */
        Py_INCREF(Py_None);
        result = Py_None;
        goto out;
    }
    x->d = d;
    x->nk = (int)nk;
    x->max_cands = maxc;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *item = PyList_GET_ITEM(keys, k);
        char *kp;
        Py_ssize_t kl;
        int kind;
        if (!PyArg_ParseTuple(item, "y#i", &kp, &kl, &kind)) goto out;
        if (kind < T_STR || kind > T_BOOL) {
            PyErr_SetString(PyExc_ValueError, "expand_candidates: a key's kind must be a scalar kind");
            goto out;
        }
        x->kp[k] = (const uint8_t *)kp; /* owned by keys, which outlives this call */
        x->kl[k] = (size_t)kl;
        x->kind[k] = kind;
    }
    d->released = NULL; /* in d, not a local: a local changed after setjmp is lost by longjmp */
    if (setjmp(d->jb)) { /* out of memory: leave it to Python */
        if (d->released) PyEval_RestoreThread(d->released);
        d->released = NULL;
        Py_INCREF(Py_None);
        result = Py_None;
        goto out;
    }
    for (int k = 0; k < x->nk; k++) col_init(d, &x->col[k], x->kind[k]);
    const int32_t *o = (const int32_t *)offs.buf + off;
    const uint8_t *base = data.buf;
    int ok = 1;
    d->released = PyEval_SaveThread();
    for (Py_ssize_t r = 0; r < n && ok; r++) {
        if (o[r] < 0 || o[r + 1] < o[r] || (Py_ssize_t)o[r + 1] > data.len) ok = 0;
        else ok = cj_text(x, (int32_t)r, base + o[r], base + o[r + 1]);
    }
    PyEval_RestoreThread(d->released);
    d->released = NULL;
    if (!ok) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto out;
    }
    PyObject *specs = PyList_New(x->nk);
    if (!specs) goto out;
    for (int k = 0; k < x->nk; k++) {
        PyObject *spec = col_py(&x->col[k]);
        if (!spec) {
            Py_DECREF(specs);
            goto out;
        }
        PyList_SET_ITEM(specs, k, spec);
    }
    PyObject *rows = bytes_of(&x->rows), *idx = bytes_of(&x->idx), *keep = bytes_of(&x->keep);
    if (rows && idx && keep)
        result = Py_BuildValue("(OOnLOO)", rows, idx, (Py_ssize_t)(x->rows.len / 4), (long long)x->malformed,
                               specs, keep);
    Py_XDECREF(rows);
    Py_XDECREF(idx);
    Py_XDECREF(keep);
    Py_DECREF(specs);
out:
    if (x) cx_free(x);
    free(x);
    free(d);
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"make_config", make_config, METH_VARARGS, "Build the decoder configuration (typed keys, prompt keys, limits)."},
    {"decode", native_decode, METH_VARARGS,
     "decode(body, config, keep_prompts, received_ns) -> column data, or None when not handled."},
    {"expand_candidates", native_expand_candidates, METH_VARARGS,
     "expand_candidates(offsets, data, offset, n, keys, max_candidates) -> candidate columns, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_native", "Native OTLP trace decoder.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (!c_locale) c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    return PyModule_Create(&moddef);
}
