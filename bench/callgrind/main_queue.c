// Preloaded by bench/callgrind.sh into a Swift program run under valgrind. An `async` main ends in dispatch_main(),
// which exits the main thread and leaves a signal-waiting thread behind; valgrind (3.19 and 3.24 alike) fails with an
// internal SIGSEGV at the next thread the program starts. This dispatch_main() keeps the main thread and drains the
// main queue on it instead, as Foundation's run loop does on Linux: the program runs as it would, valgrind follows it.
#include <poll.h>
#include <stdint.h>
#include <unistd.h>

extern int _dispatch_get_main_queue_handle_4CF(void);
extern void _dispatch_main_queue_callback_4CF(void *message);

void dispatch_main(void) {
    int handle = _dispatch_get_main_queue_handle_4CF();
    for (;;) {
        struct pollfd wake = {.fd = handle, .events = POLLIN};
        if (poll(&wake, 1, 100) > 0 && (wake.revents & POLLIN)) {
            uint64_t count;
            (void)read(handle, &count, sizeof count);
        }
        _dispatch_main_queue_callback_4CF(0);
    }
}
