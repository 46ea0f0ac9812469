/*
 * shim.h: the C surface of hiredis that Swift uses (hiredis 0.14.1, Debian 12 libhiredis-dev).
 *
 * The package uses hiredis for the Redis protocol alone: its reply reader (redisReaderCreate,
 * redisReaderFeed, redisReaderGetReply) and its command formatter (redisFormatCommandArgv, the
 * binary-safe argv form; redisCommand's printf-style forms are variadic, which Swift cannot
 * call). The connection owns its socket (plain TCP, Unix socket, or TLS through GnuTLS, which
 * hiredis 0.14 lacks) and feeds the reader the bytes it receives (see Sources/RedisTokenStore).
 * The reader's error text is a fixed char array (errstr[128]) that Swift imports as a tuple; the
 * accessor below returns it as a C string. Nothing here adds behaviour of its own.
 * Reference: hiredis 0.14.1 hiredis.h, read.h and README.md.
 */
#ifndef FORGE_PUSH_TOKEN_CHIREDIS_SHIM_H
#define FORGE_PUSH_TOKEN_CHIREDIS_SHIM_H

#include <stddef.h>
#include <sys/time.h>
#include <hiredis/hiredis.h>

/* The reader's error text (empty when err is 0), after redisReaderGetReply failed. */
static inline const char *fpt_redis_reader_errstr(const redisReader *r) {
    return r->errstr;
}

/* The i-th element of an array reply (i < reply->elements). */
static inline const redisReply *fpt_redis_element(const redisReply *reply, size_t i) {
    return reply->element[i];
}

#endif
