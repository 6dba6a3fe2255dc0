/* OTLP/JSON text -> ExportTraceServiceRequest protobuf bytes, without Python objects.
 *
 * The reference is collectors/otlp/_otlp_json.py: for a body B, transcode(B) returns exactly
 * build_request(json.loads(B)).SerializeToString(), or None. None means "leave it to Python":
 * the caller then runs json.loads and build_request (and ParseDict after it), which give the
 * answer and every error message. So this file only needs to be right where it answers, and it
 * answers only for documents of the shape build_request builds: lowerCamelCase keys, hex ids,
 * int64 as numbers or strings of digits, enums as names or known numbers, no nulls. Anything
 * else - a snake_case or unknown key, a duplicate key, a null, a value of another type, an escape
 * giving a lone surrogate, invalid UTF-8, a BOM, NaN, an integer beyond 64 bits, nesting deeper
 * than max_depth, text json.loads would refuse - returns None.
 *
 * Why: json.loads + build_request cost about 100 us of CPU per span, under the GIL (four decode
 * threads cannot overlap them); this runs without the GIL in a few microseconds.
 *
 * Output layout: fields in field-number order with proto3 defaults left out, as upb writes them;
 * a sub-message present in the document is written even when empty (build_request passes it to
 * the constructor). JSON objects may list keys in any order, so each message records where each
 * field's bytes went and rewrites its bytes in field order when they came out of order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_utf8.h"

typedef struct {
    uint8_t *d;
    size_t n, cap;
} Buf;

typedef struct {
    const unsigned char *p, *end;
    Buf out; /* the wire bytes */
    Buf str; /* the last string decoded (escapes resolved, UTF-8) */
    int max_depth;
} J;

typedef enum { FAIL = -1, OK = 0 } R;
#define TRY(x) do { if ((x) != OK) return FAIL; } while (0)

static locale_t c_locale; /* "C" numbers whatever the process locale; made at import */

/* ------------------------------------------------------------------------------------------- */
/* output                                                                                        */
/* ------------------------------------------------------------------------------------------- */
static R grow(Buf *b, size_t more) {
    if (b->n + more <= b->cap) return OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more) cap *= 2;
    uint8_t *d = realloc(b->d, cap);
    if (!d) return FAIL;
    b->d = d;
    b->cap = cap;
    return OK;
}

static R reserve(J *j, size_t more) { return grow(&j->out, more); }

static R put_varint(J *j, uint64_t v) {
    TRY(reserve(j, 10));
    while (v >= 0x80) {
        j->out.d[j->out.n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    j->out.d[j->out.n++] = (uint8_t)v;
    return OK;
}

static R put_tag(J *j, int field, int wire) { return put_varint(j, ((uint64_t)field << 3) | (uint64_t)wire); }

static R put_fixed(J *j, int field, uint64_t v, int bytes) {
    TRY(put_tag(j, field, bytes == 8 ? 1 : 5));
    TRY(reserve(j, 8));
    for (int i = 0; i < bytes; i++) j->out.d[j->out.n++] = (uint8_t)(v >> (8 * i));
    return OK;
}

static R put_len(J *j, int field, const uint8_t *data, size_t len) {
    TRY(put_tag(j, field, 2));
    TRY(put_varint(j, len));
    TRY(reserve(j, len));
    memcpy(j->out.d + j->out.n, data, len);
    j->out.n += len;
    return OK;
}

static int varint_size(uint64_t v) {
    int s = 1;
    while (v >= 0x80) { v >>= 7; s++; }
    return s;
}

/* A length-delimited sub-message: the tag and one byte for its length now; the body is written
 * after it, then the length is filled in (and the body moved when it needs more bytes). */
static R open_msg(J *j, int field, size_t *body) {
    TRY(put_tag(j, field, 2));
    TRY(reserve(j, 1));
    j->out.n++;
    *body = j->out.n;
    return OK;
}

static R close_msg(J *j, size_t body) {
    size_t len = j->out.n - body;
    int vs = varint_size(len);
    if (vs > 1) {
        TRY(reserve(j, (size_t)vs - 1));
        memmove(j->out.d + body + vs - 1, j->out.d + body, len);
        j->out.n += (size_t)vs - 1;
    }
    uint8_t *q = j->out.d + body - 1;
    uint64_t v = len;
    while (v >= 0x80) { *q++ = (uint8_t)(v | 0x80); v >>= 7; }
    *q = (uint8_t)v;
    return OK;
}

/* Where each field of one message went, to put them in field order at the end. */
#define MAX_FIELDS 16
typedef struct {
    int field[MAX_FIELDS];
    size_t start[MAX_FIELDS], end[MAX_FIELDS];
    int nf;
    uint32_t seen; /* keys met in this object: a duplicate returns None (json.loads keeps the last) */
} Fields;

static R mark(Fields *f, int field, size_t start, size_t end) {
    if (f->nf == MAX_FIELDS) return FAIL;
    f->field[f->nf] = field;
    f->start[f->nf] = start;
    f->end[f->nf] = end;
    f->nf++;
    return OK;
}

static R in_field_order(J *j, Fields *f, size_t base) {
    int sorted = 1;
    for (int i = 1; i < f->nf; i++)
        if (f->field[i] < f->field[i - 1]) sorted = 0;
    if (sorted) return OK;
    size_t len = j->out.n - base;
    uint8_t *tmp = malloc(len ? len : 1);
    if (!tmp) return FAIL;
    memcpy(tmp, j->out.d + base, len);
    size_t at = base;
    for (int want = 0; want < f->nf; want++) {
        int best = -1; /* the next field in order (each field appears once) */
        for (int i = 0; i < f->nf; i++)
            if (f->field[i] >= 0 && (best < 0 || f->field[i] < f->field[best])) best = i;
        size_t n = f->end[best] - f->start[best];
        memcpy(j->out.d + at, tmp + (f->start[best] - base), n);
        at += n;
        f->field[best] = -1;
    }
    free(tmp);
    return OK;
}

/* ------------------------------------------------------------------------------------------- */
/* JSON text (RFC 8259, the grammar json.loads reads)                                           */
/* ------------------------------------------------------------------------------------------- */
static void ws(J *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int peek(J *j) {
    ws(j);
    return j->p < j->end ? *j->p : -1;
}

static R eat(J *j, int c) {
    if (peek(j) != c) return FAIL;
    j->p++;
    return OK;
}

static R str_push(J *j, const uint8_t *s, size_t n) {
    TRY(grow(&j->str, n));
    memcpy(j->str.d + j->str.n, s, n);
    j->str.n += n;
    return OK;
}

static int hex4(const unsigned char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The length of the valid UTF-8 sequence at s (no surrogates, no overlongs), or 0. */
static int utf8_len(const unsigned char *s, const unsigned char *end) {
    unsigned c = s[0];
    int n;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if (end - s < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    return n;
}

static R push_cp(J *j, uint32_t cp) {
    uint8_t b[4];
    return str_push(j, b, utf8_encode(cp, b));
}

/* A JSON string into j->str. A lone surrogate (json.loads keeps it; upb then refuses the str)
 * and control characters (json.loads refuses them) return None. */
static R string(J *j) {
    if (eat(j, '"') != OK) return FAIL;
    j->str.n = 0;
    for (;;) {
        const unsigned char *run = j->p;
        while (j->p < j->end && *j->p != '"' && *j->p != '\\' && *j->p >= 0x20) {
            if (*j->p < 0x80) { j->p++; continue; }
            int n = utf8_len(j->p, j->end);
            if (!n) return FAIL;
            j->p += n;
        }
        if (j->p > run) TRY(str_push(j, run, (size_t)(j->p - run)));
        if (j->p >= j->end || *j->p < 0x20) return FAIL;
        if (*j->p == '"') { j->p++; return OK; }
        /* an escape */
        if (j->end - j->p < 2) return FAIL;
        unsigned char e = j->p[1];
        j->p += 2;
        uint8_t c;
        switch (e) {
        case '"': c = '"'; break;
        case '\\': c = '\\'; break;
        case '/': c = '/'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        case 'u': {
            if (j->end - j->p < 4) return FAIL;
            int u = hex4(j->p);
            if (u < 0) return FAIL;
            j->p += 4;
            if (u >= 0xDC00 && u <= 0xDFFF) return FAIL;
            if (u >= 0xD800 && u <= 0xDBFF) {
                if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u') return FAIL;
                int lo = hex4(j->p + 2);
                if (lo < 0xDC00 || lo > 0xDFFF) return FAIL;
                j->p += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            TRY(push_cp(j, (uint32_t)u));
            continue;
        }
        default: return FAIL;
        }
        TRY(str_push(j, &c, 1));
    }
}

static int str_is(J *j, const char *s) {
    size_t n = strlen(s);
    return j->str.n == n && memcmp(j->str.d, s, n) == 0;
}

/* A JSON number as json.loads types it: an int (no fraction, no exponent) or a float. */
typedef struct {
    int is_int;
    int big; /* an int beyond 64 bits: every use refuses it */
    int neg;
    uint64_t mag;
    double d;
} Num;

static R number(J *j, Num *out) {
    ws(j);
    const unsigned char *s = j->p, *q = j->p;
    memset(out, 0, sizeof *out);
    out->is_int = 1;
    if (q < j->end && *q == '-') { out->neg = 1; q++; }
    if (q >= j->end || *q < '0' || *q > '9') return FAIL;
    if (*q == '0') q++;
    else
        while (q < j->end && *q >= '0' && *q <= '9') {
            unsigned d = (unsigned)(*q - '0');
            if (out->mag > (UINT64_MAX - d) / 10) out->big = 1;
            else out->mag = out->mag * 10 + d;
            q++;
        }
    if (q < j->end && *q == '.') {
        out->is_int = 0;
        q++;
        if (q >= j->end || *q < '0' || *q > '9') return FAIL;
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        out->is_int = 0;
        q++;
        if (q < j->end && (*q == '+' || *q == '-')) q++;
        if (q >= j->end || *q < '0' || *q > '9') return FAIL;
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    j->p = q;
    if (!out->is_int) {
        char buf[64]; /* glibc's strtod is correctly rounded like Python's float() */
        size_t n = (size_t)(q - s);
        if (n >= sizeof buf) return FAIL;
        memcpy(buf, s, n);
        buf[n] = 0;
        out->d = c_locale ? strtod_l(buf, NULL, c_locale) : strtod(buf, NULL);
    }
    return OK;
}

/* Skips "true"/"false", giving its value. */
static R boolean(J *j, int *v) {
    ws(j);
    if (j->end - j->p >= 4 && memcmp(j->p, "true", 4) == 0) { j->p += 4; *v = 1; return OK; }
    if (j->end - j->p >= 5 && memcmp(j->p, "false", 5) == 0) { j->p += 5; *v = 0; return OK; }
    return FAIL;
}

/* Object and array walking: open, then for each member next() until it says there are none. */
static R open_(J *j, int open, int close, int *more) {
    TRY(eat(j, open));
    *more = peek(j) != close;
    if (!*more) j->p++;
    return OK;
}

static R next_(J *j, int close, int *more) {
    int c = peek(j);
    if (c == ',') { j->p++; *more = 1; return OK; }
    if (c == close) { j->p++; *more = 0; return OK; }
    return FAIL;
}

static R obj_open(J *j, int *more) { return open_(j, '{', '}', more); }
static R obj_next(J *j, int *more) { return next_(j, '}', more); }
static R arr_open(J *j, int *more) { return open_(j, '[', ']', more); }
static R arr_next(J *j, int *more) { return next_(j, ']', more); }

/* The next key (into j->str) and its colon. */
static R obj_key(J *j) {
    TRY(string(j));
    return eat(j, ':');
}

/* Which of `keys` the key in j->str is; a second sighting in one object returns None. */
static int key_index(J *j, const char *const *keys, Fields *f) {
    for (int i = 0; keys[i]; i++)
        if (str_is(j, keys[i])) {
            if (f->seen & (1u << i)) return -1;
            f->seen |= 1u << i;
            return i;
        }
    return -1;
}

/* ------------------------------------------------------------------------------------------- */
/* scalar fields, as build_request's _str, _u32, _nanos, _id, _enum read them                  */
/* ------------------------------------------------------------------------------------------- */
static R f_string(J *j, int field) { /* proto3 string: "" is left out */
    TRY(string(j));
    return j->str.n ? put_len(j, field, j->str.d, j->str.n) : OK;
}

static R int_of(const Num *n, int64_t lo, uint64_t hi_excl, int64_t *neg_out, uint64_t *pos_out) {
    /* an int literal within [lo, hi): negatives come back in *neg_out, others in *pos_out */
    if (!n->is_int || n->big) return FAIL;
    if (n->neg && n->mag) {
        if (lo >= 0 || n->mag > (uint64_t)(-(lo + 1)) + 1) return FAIL;
        *neg_out = (int64_t)(0 - n->mag);
        *pos_out = 0;
        return OK;
    }
    if (n->mag >= hi_excl) return FAIL;
    *neg_out = 0;
    *pos_out = n->mag;
    return OK;
}

static R u32_value(J *j, uint32_t *v) {
    Num n;
    int64_t neg;
    uint64_t pos;
    TRY(number(j, &n));
    TRY(int_of(&n, 0, (uint64_t)1 << 32, &neg, &pos));
    *v = (uint32_t)pos;
    return OK;
}

static R f_u32(J *j, int field) {
    uint32_t v;
    TRY(u32_value(j, &v));
    return v ? (put_tag(j, field, 0) == OK ? put_varint(j, v) : FAIL) : OK;
}

static R f_fixed32(J *j, int field) {
    uint32_t v;
    TRY(u32_value(j, &v));
    return v ? put_fixed(j, field, v, 4) : OK;
}

/* A string of ASCII digits (str.isdigit() and str.isascii()), with an optional minus when
 * `signed_ok`, as an integer: its magnitude, or FAIL beyond 64 bits. */
static R digits(J *j, int signed_ok, int *neg, uint64_t *mag) {
    size_t i = 0;
    *neg = 0;
    *mag = 0;
    if (signed_ok && j->str.n && j->str.d[0] == '-') { *neg = 1; i = 1; }
    if (i == j->str.n) return FAIL;
    for (; i < j->str.n; i++) {
        unsigned c = j->str.d[i];
        if (c < '0' || c > '9') return FAIL;
        if (*mag > (UINT64_MAX - (c - '0')) / 10) return FAIL;
        *mag = *mag * 10 + (c - '0');
    }
    return OK;
}

static R f_nanos(J *j, int field) { /* fixed64: a number, or a string of digits */
    uint64_t v;
    if (peek(j) == '"') {
        int neg;
        TRY(string(j));
        TRY(digits(j, 0, &neg, &v));
    } else {
        Num n;
        TRY(number(j, &n));
        if (!n.is_int || n.big || (n.neg && n.mag)) return FAIL;
        v = n.mag;
    }
    return v ? put_fixed(j, field, v, 8) : OK;
}

static int hexval(unsigned c) {
    if (c >= '0' && c <= '9') return (int)(c - '0');
    if (c >= 'a' && c <= 'f') return (int)(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return (int)(c - 'A' + 10);
    return -1;
}

static R f_id(J *j, int field) { /* bytes.fromhex; spaced or odd forms go to Python */
    TRY(string(j));
    if (j->str.n % 2) return FAIL;
    size_t n = j->str.n / 2;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(j->str.d[2 * i]), lo = hexval(j->str.d[2 * i + 1]);
        if (hi < 0 || lo < 0) return FAIL;
        j->str.d[i] = (uint8_t)(hi * 16 + lo); /* in place: the write trails the read */
    }
    return n ? put_len(j, field, j->str.d, n) : OK;
}

static R f_enum(J *j, int field, const char *const *names, int count) {
    int v = -1;
    if (peek(j) == '"') {
        TRY(string(j));
        for (int i = 0; i < count; i++)
            if (str_is(j, names[i])) v = i;
    } else {
        Num n;
        int64_t neg;
        uint64_t pos;
        TRY(number(j, &n));
        if (int_of(&n, 0, (uint64_t)count, &neg, &pos) == OK) v = (int)pos;
    }
    if (v < 0) return FAIL;
    return v ? (put_tag(j, field, 0) == OK ? put_varint(j, (uint64_t)v) : FAIL) : OK;
}

/* ------------------------------------------------------------------------------------------- */
/* messages                                                                                      */
/* ------------------------------------------------------------------------------------------- */
typedef R (*MsgFn)(J *j, int depth);

/* A JSON array of objects, each one sub-message `field` written by fn. */
static R repeated(J *j, int field, MsgFn fn, int depth) {
    int more;
    TRY(arr_open(j, &more));
    while (more) {
        size_t body;
        TRY(open_msg(j, field, &body));
        TRY(fn(j, depth));
        TRY(close_msg(j, body));
        TRY(arr_next(j, &more));
    }
    return OK;
}

static R one(J *j, int field, MsgFn fn, int depth) { /* a singular sub-message, present */
    size_t body;
    TRY(open_msg(j, field, &body));
    TRY(fn(j, depth));
    return close_msg(j, body);
}

static R key_value(J *j, int depth);

static R values_of(J *j, int field, MsgFn fn, int depth) { /* {"values": [...]} */
    static const char *const keys[] = {"values", NULL};
    Fields f = {0};
    int more;
    TRY(obj_open(j, &more));
    while (more) {
        TRY(obj_key(j));
        if (key_index(j, keys, &f) != 0) return FAIL;
        TRY(repeated(j, field, fn, depth));
        TRY(obj_next(j, &more));
    }
    return OK;
}

static R any_value(J *j, int depth);

static R array_value(J *j, int depth) { return values_of(j, 1, any_value, depth); }
static R kvlist_value(J *j, int depth) { return values_of(j, 1, key_value, depth); }

static R any_value(J *j, int depth) {
    int more;
    if (depth > j->max_depth) return FAIL;
    TRY(obj_open(j, &more));
    if (!more) return OK; /* {}: an AnyValue with nothing set */
    TRY(obj_key(j));
    if (str_is(j, "stringValue")) {
        TRY(string(j));
        TRY(put_len(j, 1, j->str.d, j->str.n)); /* a oneof member is written even when empty */
    } else if (str_is(j, "boolValue")) {
        int v;
        TRY(boolean(j, &v));
        TRY(put_tag(j, 2, 0));
        TRY(put_varint(j, (uint64_t)v));
    } else if (str_is(j, "intValue")) {
        int64_t neg;
        uint64_t pos;
        if (peek(j) == '"') {
            int sign;
            uint64_t mag;
            TRY(string(j));
            TRY(digits(j, 1, &sign, &mag));
            Num n = {1, 0, sign, mag, 0};
            TRY(int_of(&n, INT64_MIN, (uint64_t)INT64_MAX + 1, &neg, &pos));
        } else {
            Num n;
            TRY(number(j, &n));
            TRY(int_of(&n, INT64_MIN, (uint64_t)INT64_MAX + 1, &neg, &pos));
        }
        TRY(put_tag(j, 3, 0));
        TRY(put_varint(j, neg ? (uint64_t)neg : pos));
    } else if (str_is(j, "doubleValue")) {
        Num n;
        double d;
        TRY(number(j, &n));
        if (n.is_int) { /* an int, within 2**53, as float(int): -0 is +0.0 */
            if (n.big || n.mag > ((uint64_t)1 << 53)) return FAIL;
            d = n.neg ? -(double)n.mag : (double)n.mag;
            if (d == 0) d = 0.0;
        } else {
            d = n.d;
            if (!isfinite(d)) return FAIL;
        }
        uint64_t bits;
        memcpy(&bits, &d, 8);
        TRY(put_fixed(j, 4, bits, 8));
    } else if (str_is(j, "arrayValue")) {
        TRY(one(j, 5, array_value, depth + 1));
    } else if (str_is(j, "kvlistValue")) {
        TRY(one(j, 6, kvlist_value, depth + 1));
    } else {
        return FAIL;
    }
    TRY(obj_next(j, &more));
    return more ? FAIL : OK; /* two values in one AnyValue */
}

static R attributes(J *j, int field, int depth) { return repeated(j, field, key_value, depth); }

/* One message of fixed fields: a key table and, per key, how its value is written. */
enum { K_STR, K_U32, K_FIXED32, K_NANOS, K_ID, K_ATTRS, K_KIND, K_CODE, K_MSG, K_MSGS, K_ANY };
typedef struct {
    const char *key;
    int field;
    int how;
    MsgFn fn; /* K_MSG / K_MSGS */
} Key;

static const char *const span_kinds[] = {"SPAN_KIND_UNSPECIFIED", "SPAN_KIND_INTERNAL", "SPAN_KIND_SERVER",
                                         "SPAN_KIND_CLIENT", "SPAN_KIND_PRODUCER", "SPAN_KIND_CONSUMER"};
static const char *const status_codes[] = {"STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR"};

/* `depth` is the nesting of the AnyValue a K_ANY key holds (KeyValue); other messages are at 0. */
static R message(J *j, const Key *keys, int nkeys, int depth) {
    Fields f = {0};
    size_t base = j->out.n;
    int more;
    TRY(obj_open(j, &more));
    while (more) {
        TRY(obj_key(j));
        int k = -1;
        for (int i = 0; i < nkeys; i++)
            if (str_is(j, keys[i].key)) { k = i; break; }
        if (k < 0 || (f.seen & (1u << k))) return FAIL;
        f.seen |= 1u << k;
        const Key *key = &keys[k];
        size_t start = j->out.n;
        switch (key->how) {
        case K_STR: TRY(f_string(j, key->field)); break;
        case K_U32: TRY(f_u32(j, key->field)); break;
        case K_FIXED32: TRY(f_fixed32(j, key->field)); break;
        case K_NANOS: TRY(f_nanos(j, key->field)); break;
        case K_ID: TRY(f_id(j, key->field)); break;
        case K_ATTRS: TRY(attributes(j, key->field, 0)); break;
        case K_KIND: TRY(f_enum(j, key->field, span_kinds, 6)); break;
        case K_CODE: TRY(f_enum(j, key->field, status_codes, 3)); break;
        case K_MSG: TRY(one(j, key->field, key->fn, 0)); break;
        case K_MSGS: TRY(repeated(j, key->field, key->fn, 0)); break;
        case K_ANY: TRY(one(j, key->field, any_value, depth)); break;
        default: return FAIL;
        }
        TRY(mark(&f, key->field, start, j->out.n));
        TRY(obj_next(j, &more));
    }
    return in_field_order(j, &f, base);
}

#define MESSAGE(name, ...)                                                 \
    static R name(J *j, int depth) {                                        \
        static const Key keys[] = {__VA_ARGS__};                            \
        return message(j, keys, (int)(sizeof keys / sizeof keys[0]), depth); \
    }

MESSAGE(key_value, {"key", 1, K_STR, NULL}, {"value", 2, K_ANY, NULL})
MESSAGE(span_status, {"message", 2, K_STR, NULL}, {"code", 3, K_CODE, NULL})
MESSAGE(span_event, {"timeUnixNano", 1, K_NANOS, NULL}, {"name", 2, K_STR, NULL}, {"attributes", 3, K_ATTRS, NULL},
        {"droppedAttributesCount", 4, K_U32, NULL})
MESSAGE(span_link, {"traceId", 1, K_ID, NULL}, {"spanId", 2, K_ID, NULL}, {"traceState", 3, K_STR, NULL},
        {"attributes", 4, K_ATTRS, NULL}, {"droppedAttributesCount", 5, K_U32, NULL},
        {"flags", 6, K_FIXED32, NULL})
MESSAGE(span, {"traceId", 1, K_ID, NULL}, {"spanId", 2, K_ID, NULL}, {"traceState", 3, K_STR, NULL},
        {"parentSpanId", 4, K_ID, NULL}, {"name", 5, K_STR, NULL}, {"kind", 6, K_KIND, NULL},
        {"startTimeUnixNano", 7, K_NANOS, NULL}, {"endTimeUnixNano", 8, K_NANOS, NULL},
        {"attributes", 9, K_ATTRS, NULL}, {"droppedAttributesCount", 10, K_U32, NULL},
        {"events", 11, K_MSGS, span_event}, {"droppedEventsCount", 12, K_U32, NULL},
        {"links", 13, K_MSGS, span_link}, {"droppedLinksCount", 14, K_U32, NULL},
        {"status", 15, K_MSG, span_status}, {"flags", 16, K_FIXED32, NULL})
MESSAGE(scope, {"name", 1, K_STR, NULL}, {"version", 2, K_STR, NULL}, {"attributes", 3, K_ATTRS, NULL},
        {"droppedAttributesCount", 4, K_U32, NULL})
MESSAGE(scope_spans, {"scope", 1, K_MSG, scope}, {"spans", 2, K_MSGS, span}, {"schemaUrl", 3, K_STR, NULL})
MESSAGE(resource, {"attributes", 1, K_ATTRS, NULL}, {"droppedAttributesCount", 2, K_U32, NULL})
MESSAGE(resource_spans, {"resource", 1, K_MSG, resource}, {"scopeSpans", 2, K_MSGS, scope_spans},
        {"schemaUrl", 3, K_STR, NULL})
MESSAGE(request, {"resourceSpans", 1, K_MSGS, resource_spans})

static R transcode_all(J *j) {
    TRY(request(j, 0));
    ws(j);
    return j->p == j->end ? OK : FAIL; /* json.loads refuses trailing text */
}

static PyObject *transcode(PyObject *self, PyObject *args) {
    Py_buffer body;
    int max_depth;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*i", &body, &max_depth)) return NULL;
    if (max_depth < 0 || max_depth > 64) { /* the recursion follows the nesting: keep the C stack small */
        PyBuffer_Release(&body);
        PyErr_SetString(PyExc_ValueError, "max_depth must be within 0..64");
        return NULL;
    }
    J j = {0};
    j.p = body.buf;
    j.end = j.p + body.len;
    j.max_depth = max_depth;
    R r;
    Py_BEGIN_ALLOW_THREADS
    r = transcode_all(&j);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&body);
    PyObject *out = r == OK ? PyBytes_FromStringAndSize((const char *)j.out.d, (Py_ssize_t)j.out.n) : NULL;
    free(j.out.d);
    free(j.str.d);
    if (r == OK) return out;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"transcode", transcode, METH_VARARGS,
     "transcode(body, max_depth) -> the request's protobuf bytes, or None to leave it to Python."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_json_native", "OTLP/JSON to protobuf, in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__json_native(void) {
    if (!c_locale) c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    return PyModule_Create(&moddef);
}
