/* UTF-8 encoding of one code point, shared by the OTLP decoder and the OTLP/JSON transcoder. */
#ifndef ROUTEAUDIT_UTF8_H
#define ROUTEAUDIT_UTF8_H
#include <stddef.h>
#include <stdint.h>

/* Writes cp (at most U+10FFFF) to o; returns the number of bytes, 1 to 4. */
static inline size_t utf8_encode(uint32_t cp, uint8_t o[4]) {
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = (uint8_t)(0xC0 | (cp >> 6)); o[1] = (uint8_t)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12)); o[1] = (uint8_t)(0x80 | ((cp >> 6) & 63));
        o[2] = (uint8_t)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18)); o[1] = (uint8_t)(0x80 | ((cp >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 63)); o[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}
#endif
