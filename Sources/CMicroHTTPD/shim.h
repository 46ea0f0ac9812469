/*
 * shim.h: the C surface of libmicrohttpd that Swift uses.
 *
 * libmicrohttpd's MHD_start_daemon, MHD_get_connection_info, MHD_get_daemon_info and
 * MHD_set_connection_option are variadic, which Swift cannot call. The static inline functions
 * below give them fixed arguments (daemon options travel as an MHD_OPTION_ARRAY). They add no
 * behaviour of their own. Reference: the libmicrohttpd manual, "microhttpd-init" and
 * "microhttpd-info" sections, and microhttpd.h of libmicrohttpd 0.9.75.
 */
#ifndef FORGE_PUSH_TOKEN_CMICROHTTPD_SHIM_H
#define FORGE_PUSH_TOKEN_CMICROHTTPD_SHIM_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <microhttpd.h>

/* Receives one formatted libmicrohttpd error message (no trailing newline guaranteed). */
typedef void (*fpt_log_callback)(void *cls, const char *message);

struct fpt_logger {
    fpt_log_callback callback;
    void *cls;
};

/* MHD_LogCallback that formats the message and hands it to an fpt_logger. */
static inline void fpt_log_trampoline(void *cls, const char *fmt, va_list ap) {
    const struct fpt_logger *logger = (const struct fpt_logger *)cls;
    char buffer[1024];
    vsnprintf(buffer, sizeof buffer, fmt, ap);
    logger->callback(logger->cls, buffer);
}

/*
 * MHD_start_daemon with fixed arguments: the accept policy (may be NULL), the access handler, the
 * request-completed callback, the connection-notification callback, the URI-log callback (whose
 * result becomes the request's first *con_cls), an already listening socket (the caller binds it,
 * so it can report bind errors precisely), an error logger, and any further options as an
 * MHD_OPTION_END-terminated array.
 */
static inline struct MHD_Daemon *fpt_start_daemon(unsigned int flags,
                                                  MHD_AcceptPolicyCallback accept_policy,
                                                  void *accept_policy_cls,
                                                  MHD_AccessHandlerCallback handler,
                                                  void *handler_cls,
                                                  MHD_RequestCompletedCallback completed,
                                                  MHD_NotifyConnectionCallback notify_connection,
                                                  void *(*uri_log)(void *cls, const char *uri,
                                                                   struct MHD_Connection *connection),
                                                  void *callbacks_cls,
                                                  int listen_fd,
                                                  const struct fpt_logger *logger,
                                                  const struct MHD_OptionItem *options) {
    return MHD_start_daemon(flags, 0, accept_policy, accept_policy_cls, handler, handler_cls,
                            MHD_OPTION_EXTERNAL_LOGGER, fpt_log_trampoline, (void *)logger,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, callbacks_cls,
                            MHD_OPTION_NOTIFY_CONNECTION, notify_connection, callbacks_cls,
                            MHD_OPTION_URI_LOG_CALLBACK, uri_log, callbacks_cls,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)listen_fd,
                            MHD_OPTION_ARRAY, options,
                            MHD_OPTION_END);
}

/* The client's address of a connection (MHD_CONNECTION_INFO_CLIENT_ADDRESS), or NULL. */
static inline const struct sockaddr *fpt_connection_address(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    return info == NULL ? NULL : info->client_addr;
}

/* What one pass over a request's header fields found (fpt_count_framing_fields). */
struct fpt_framing_counts {
    unsigned int host;
    unsigned int content_length;
    unsigned int transfer_encoding;
    unsigned int authorization;
    /* Fields whose name is empty or holds a space or tab: "Content-Length : 4" is not a
       Content-Length field to libmicrohttpd, but may be one to a proxy in front (RFC 9112 §5.1). */
    unsigned int malformed_names;
    /* libmicrohttpd's records of the head: one per header field, query argument and cookie. */
    unsigned int records;
    /* Whether a Cookie field came, and the length of the first one's value (which libmicrohttpd
       copies into the connection's pool to parse it). */
    unsigned int has_cookie;
    size_t cookie_bytes;
    /* MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE: the head's bytes as sent, from the method to the
       end of the blank line. */
    size_t head_bytes;
    /* Fields whose name or value holds a bare CR (libmicrohttpd ends lines at CRLF or LF only, so
       "Host: x\rContent-Length: 43" is one Host field to it; RFC 9112 §2.2). */
    unsigned int bare_cr;
    /* Expect fields asking for anything but 100-continue (RFC 9110 §10.1.1). */
    unsigned int unmet_expectations;
    /* The first header field's name as it lies in libmicrohttpd's read buffer (NULL when there is
       none): where the line after the request line starts. */
    const char *first_name;
};

/* Whether value (of value_size bytes) is "100-continue", ASCII case-insensitive, with optional
   whitespace around it. */
static inline int fpt_is_100_continue(const char *value, size_t value_size) {
    while (value_size > 0 && (value[0] == ' ' || value[0] == '\t')) { value++; value_size--; }
    while (value_size > 0 && (value[value_size - 1] == ' ' || value[value_size - 1] == '\t')) value_size--;
    return value_size == 12 && strncasecmp(value, "100-continue", 12) == 0;
}

static enum MHD_Result fpt_framing_iterator(void *cls, enum MHD_ValueKind kind, const char *key,
                                            size_t key_size, const char *value, size_t value_size) {
    struct fpt_framing_counts *counts = (struct fpt_framing_counts *)cls;
    counts->records++;
    if (key == NULL || kind != MHD_HEADER_KIND) return MHD_YES;
    if (counts->first_name == NULL) counts->first_name = key;
    if (memchr(key, '\r', key_size) != NULL || (value != NULL && memchr(value, '\r', value_size) != NULL))
        counts->bare_cr++;
    if (key_size == 0 || strnlen(key, key_size) != key_size || strpbrk(key, " \t") != NULL) counts->malformed_names++;
    if (strcasecmp(key, "Host") == 0) counts->host++;
    else if (strcasecmp(key, "Content-Length") == 0) counts->content_length++;
    else if (strcasecmp(key, "Transfer-Encoding") == 0) counts->transfer_encoding++;
    else if (strcasecmp(key, "Authorization") == 0) counts->authorization++;
    else if (strcasecmp(key, "Expect") == 0) {
        if (value == NULL || !fpt_is_100_continue(value, value_size)) counts->unmet_expectations++;
    }
    else if (!counts->has_cookie && strcasecmp(key, "Cookie") == 0) {
        counts->has_cookie = 1;
        counts->cookie_bytes = value_size;
    }
    return MHD_YES;
}

/*
 * Counts, in one pass over a request's header fields, query arguments and cookies, the Host,
 * Content-Length, Transfer-Encoding and Authorization fields (MHD_lookup_connection_value returns
 * only the first of a name; a repeated one must be seen to be refused, RFC 9112 §3.2, §6.3), the
 * malformed names, bare CRs, unmet expectations, where the first field's name lies,
 * libmicrohttpd's records and the first Cookie field's length; and reads the head's size (what
 * RequestHeadBudget needs). (A raw NUL in a value cannot be seen
 * here: libmicrohttpd has already cut the value there.)
 */
static inline struct fpt_framing_counts fpt_count_framing_fields(struct MHD_Connection *connection) {
    struct fpt_framing_counts counts = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL};
    MHD_get_connection_values_n(connection,
                                (enum MHD_ValueKind)(MHD_HEADER_KIND | MHD_COOKIE_KIND | MHD_GET_ARGUMENT_KIND),
                                fpt_framing_iterator, &counts);
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    counts.head_bytes = info == NULL ? 0 : info->header_size;
    return counts;
}

/* Whether this libmicrohttpd was built with HTTPS support (GnuTLS). */
static inline int fpt_supports_tls(void) {
    return MHD_is_feature_supported(MHD_FEATURE_TLS) == MHD_YES;
}

/* The socket of a connection (MHD_CONNECTION_INFO_CONNECTION_FD), or -1. */
static inline int fpt_connection_fd(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info == NULL ? -1 : (int)info->connect_fd;
}

/* Sets a connection's idle timeout in seconds; 0 means none (MHD_CONNECTION_OPTION_TIMEOUT). */
static inline enum MHD_Result fpt_set_connection_timeout(struct MHD_Connection *connection,
                                                         unsigned int seconds) {
    return MHD_set_connection_option(connection, MHD_CONNECTION_OPTION_TIMEOUT, seconds);
}

#endif
