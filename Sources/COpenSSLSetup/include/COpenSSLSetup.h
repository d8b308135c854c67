#ifndef STOREKEEPER_COPENSSL_SETUP_H
#define STOREKEEPER_COPENSSL_SETUP_H
/// Always 1. The module's work is a load-time constructor (OpenSSL without its atexit cleanup, see no_atexit.c);
/// this declaration only gives the C target the public header SwiftPM requires.
int storekeeper_openssl_setup_linked(void);
#endif
