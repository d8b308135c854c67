#ifndef STOREKEEPER_CMICROHTTPD_SHIM_H
#define STOREKEEPER_CMICROHTTPD_SHIM_H
#include <sys/types.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>
#include <microhttpd.h>

/// Decodes %XX escapes in place, as libmicrohttpd's default does, except those that would change how a path
/// splits or ends: %00, %2F (/), %3F (?), %23 (#) and %25 (%) stay encoded. A decoded NUL would cut the C
/// string (`/admin/v1/apps/%00/x` becoming `/admin/v1/apps/`), a decoded ? or / would move segment and query
/// boundaries; the router and the query decoding finish the job once, per segment and per value.
static inline size_t shim_unescape_keeping_structure(void *cls, struct MHD_Connection *connection, char *text) {
    (void)cls; (void)connection;
    size_t read = 0, written = 0;
    while (text[read] != '\0') {
        char c = text[read];
        if (c == '%' && text[read + 1] != '\0' && text[read + 2] != '\0') {
            int high = text[read + 1], low = text[read + 2], value = 0, valid = 1;
            for (int i = 0; i < 2; i++) {
                int digit = i == 0 ? high : low;
                value <<= 4;
                if (digit >= '0' && digit <= '9') value |= digit - '0';
                else if (digit >= 'a' && digit <= 'f') value |= digit - 'a' + 10;
                else if (digit >= 'A' && digit <= 'F') value |= digit - 'A' + 10;
                else valid = 0;
            }
            if (valid && value != 0 && value != '/' && value != '?' && value != '#' && value != '%') {
                text[written++] = (char)value;
                read += 3;
                continue;
            }
        }
        text[written++] = c;
        read++;
    }
    text[written] = '\0';
    return written;
}

/// MHD_start_daemon is variadic; Swift cannot call it, so this wrapper passes the options we use.
static inline struct MHD_Daemon *shim_mhd_start(unsigned int flags, uint16_t port, const char *host,
                                                MHD_AccessHandlerCallback handler, void *handler_cls,
                                                MHD_RequestCompletedCallback completed, void *completed_cls,
                                                MHD_NotifyConnectionCallback notify, void *notify_cls,
                                                unsigned int connection_timeout, unsigned int connection_limit,
                                                unsigned int thread_pool_size, unsigned int per_ip_limit) {
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) { return NULL; }
    return MHD_start_daemon(flags, port, NULL, NULL, handler, handler_cls,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, completed_cls,
                            MHD_OPTION_CONNECTION_TIMEOUT, connection_timeout,
                            MHD_OPTION_CONNECTION_LIMIT, connection_limit,
                            MHD_OPTION_THREAD_POOL_SIZE, thread_pool_size,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip_limit,
                            MHD_OPTION_UNESCAPE_CALLBACK, shim_unescape_keeping_structure, NULL,
                            MHD_OPTION_NOTIFY_CONNECTION, notify, notify_cls,
                            MHD_OPTION_END);
}

/// The socket of a connection (MHD_get_connection_info is variadic).
static inline int shim_mhd_connection_fd(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info == NULL ? -1 : info->connect_fd;
}

/// The per-connection pointer set when the connection started (see MHD_OPTION_NOTIFY_CONNECTION).
static inline void *shim_mhd_socket_context(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info == NULL ? NULL : info->socket_context;
}

/// The port the daemon is bound to (useful after binding port 0).
static inline uint16_t shim_mhd_bound_port(struct MHD_Daemon *daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info == NULL ? 0 : info->port;
}
#endif
