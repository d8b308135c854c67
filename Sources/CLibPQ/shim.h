#ifndef STOREKEEPER_CLIBPQ_SHIM_H
#define STOREKEEPER_CLIBPQ_SHIM_H
#include <libpq-fe.h>
#include <sys/select.h>
#include <poll.h>

/// Waits until the connection's socket is readable or `timeout_ms` passes; returns poll()'s result.
static inline int shim_pq_wait_readable(PGconn *conn, int timeout_ms) {
    struct pollfd fd;
    fd.fd = PQsocket(conn);
    fd.events = POLLIN;
    fd.revents = 0;
    if (fd.fd < 0) { return -1; }
    return poll(&fd, 1, timeout_ms);
}
#endif
