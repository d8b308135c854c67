// The serve commands stop gracefully on SIGINT or SIGTERM. The handler is C because a signal handler may only do
// async-signal-safe work: here one write(2) to a pipe, which a thread of the program reads. It is installed with
// sigaction before the program announces its address, so a signal sent as soon as a client sees that address is
// never lost: it either arrives before the handler (and ends the process, as the default does) or is caught.
#define _GNU_SOURCE  // pipe2
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include "CSignals.h"

static int write_end = -1;

static void on_shutdown_signal(int number) {
    int saved = errno;
    unsigned char byte = (unsigned char)number;
    // A full pipe (many signals unread) drops the byte: one is enough to wake the reader.
    ssize_t ignored = write(write_end, &byte, 1);
    (void)ignored;
    errno = saved;
}

int storekeeper_catch_shutdown_signals(void) {
    if (write_end >= 0) {
        errno = EALREADY;
        return -1;
    }
    int ends[2];
    if (pipe2(ends, O_CLOEXEC) != 0) return -1;
    // The writer never blocks in a handler; the reader blocks in read(2) on its own thread.
    if (fcntl(ends[1], F_SETFL, O_NONBLOCK) != 0) {
        int saved = errno;
        close(ends[0]);
        close(ends[1]);
        errno = saved;
        return -1;
    }
    write_end = ends[1];
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_shutdown_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (sigaction(SIGINT, &action, NULL) != 0 || sigaction(SIGTERM, &action, NULL) != 0) {
        int saved = errno;
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        write_end = -1;
        close(ends[0]);
        close(ends[1]);
        errno = saved;
        return -1;
    }
    return ends[0];
}
