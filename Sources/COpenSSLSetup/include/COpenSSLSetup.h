#ifndef STOREKEEPER_COPENSSL_SETUP_H
#define STOREKEEPER_COPENSSL_SETUP_H
/// Always 1. The module's work is a load-time constructor (OpenSSL without its atexit cleanup); this symbol
/// lets a target name the module and a test check that it is linked.
int storekeeper_openssl_setup_linked(void);
#endif
