/*
 * shim.h: the C surface of libmicrohttpd that Swift uses.
 *
 * libmicrohttpd's MHD_start_daemon, MHD_get_connection_info, MHD_get_daemon_info and
 * MHD_set_connection_option are variadic, and its log callback takes a va_list, neither of which
 * Swift can call or take. The static inline functions below give them fixed arguments (daemon
 * options travel as an MHD_OPTION_ARRAY), format the log message, read one field of an info
 * union, or pass a combination of enum MHD_ValueKind values (a closed enum to Swift). They add no behaviour of their own: every decision (the framing checks included) is made
 * in Swift. Reference: the libmicrohttpd manual, "microhttpd-init" and
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

/* MHD_get_connection_values_n over the header fields, cookies and query arguments at once: Swift
   imports enum MHD_ValueKind as a closed enum, which cannot hold the combination of its values. */
static inline int fpt_get_head_records(struct MHD_Connection *connection, MHD_KeyValueIteratorN iterator,
                                       void *iterator_cls) {
    return MHD_get_connection_values_n(connection,
                                       (enum MHD_ValueKind)(MHD_HEADER_KIND | MHD_COOKIE_KIND | MHD_GET_ARGUMENT_KIND),
                                       iterator, iterator_cls);
}

/* The head's bytes as sent, from the method to the end of the blank line
   (MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE), or 0. */
static inline size_t fpt_request_header_size(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    return info == NULL ? 0 : info->header_size;
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

/* The word the connection-notify callback stored for a connection (MHD_CONNECTION_INFO_SOCKET_CONTEXT),
   or NULL. */
static inline void *fpt_socket_context(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info == NULL ? NULL : info->socket_context;
}

/* Sets a connection's idle timeout in seconds; 0 means none (MHD_CONNECTION_OPTION_TIMEOUT). */
static inline enum MHD_Result fpt_set_connection_timeout(struct MHD_Connection *connection,
                                                         unsigned int seconds) {
    return MHD_set_connection_option(connection, MHD_CONNECTION_OPTION_TIMEOUT, seconds);
}

#endif
