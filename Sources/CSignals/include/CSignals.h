#ifndef STOREKEEPER_CSIGNALS_H
#define STOREKEEPER_CSIGNALS_H
/// From this call on, SIGINT and SIGTERM each write one byte (the signal's number) to a pipe instead of ending the
/// process, whichever thread they land on. Returns the pipe's read end (close-on-exec), or -1 with errno set.
/// Call it once; a second call returns -1 with errno EALREADY.
int storekeeper_catch_shutdown_signals(void);
#endif
