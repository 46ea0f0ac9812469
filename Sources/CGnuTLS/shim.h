/*
 * shim.h: the C surface of GnuTLS that Swift uses (GnuTLS 3.7, Debian 12 libgnutls28-dev).
 *
 * gnutls_transport_set_int and gnutls_free are function-like macros, which Swift cannot call; the
 * inline functions below are those macros spelled as functions. Nothing here adds behaviour of its own.
 * Reference: GnuTLS 3.7 manual, gnutls/gnutls.h and gnutls/x509.h.
 */
#ifndef FORGE_PUSH_TOKEN_CGNUTLS_SHIM_H
#define FORGE_PUSH_TOKEN_CGNUTLS_SHIM_H

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

/* gnutls_transport_set_int(session, fd): the session reads and writes the socket fd. */
static inline void fpt_gnutls_transport_set_int(gnutls_session_t session, int fd) {
    gnutls_transport_set_int2(session, fd, fd);
}

/* gnutls_free(pointer): frees memory GnuTLS allocated (a datum's data). */
static inline void fpt_gnutls_free(void *pointer) {
    gnutls_free(pointer);
}

#endif
