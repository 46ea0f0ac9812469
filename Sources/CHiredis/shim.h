/*
 * shim.h: the C surface of hiredis that Swift uses (hiredis 0.14.1, Debian 12 libhiredis-dev).
 *
 * hiredis' command entry points redisCommand and redisAppendCommand are variadic printf-style
 * functions, which Swift cannot call and which are not binary-safe for arbitrary arguments; this
 * package uses only the argv forms (redisAppendCommandArgv), which take explicit lengths. The
 * context's error text is a fixed char array (errstr[128]) that Swift imports as a tuple; the
 * accessor below returns it as a C string. Nothing here adds behaviour of its own.
 *
 * Limits of hiredis 0.14 that the Swift side works around (see Sources/RedisTokenStore):
 * - a blocking context whose socket timeout fired cannot be reused (its reader state is lost),
 *   so waits are done with poll() on the context's fd before redisBufferRead, never with a
 *   socket timeout, and a connection whose reply is overdue is freed and made again;
 * - redisConnectWithTimeout bounds the TCP connect only, not the host name lookup;
 * - no TLS;
 * - it writes with write(), so SIGPIPE must be ignored by the process.
 * Reference: hiredis 0.14.1 hiredis.h, read.h and README.md.
 */
#ifndef FORGE_PUSH_TOKEN_CHIREDIS_SHIM_H
#define FORGE_PUSH_TOKEN_CHIREDIS_SHIM_H

#include <stddef.h>
#include <sys/time.h>
#include <hiredis/hiredis.h>

/* The context's error text (empty when err is 0). Valid until the context is used again. */
static inline const char *fpt_redis_errstr(const redisContext *c) {
    return c->errstr;
}

/* The context's socket, for poll(). */
static inline int fpt_redis_fd(const redisContext *c) {
    return c->fd;
}

/* The i-th element of an array reply (i < reply->elements). */
static inline const redisReply *fpt_redis_element(const redisReply *reply, size_t i) {
    return reply->element[i];
}

#endif
