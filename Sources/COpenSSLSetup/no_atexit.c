// OpenSSL registers an atexit handler on its first use that frees its global state (providers, method
// stores, thread keys). A server exits while other threads may still be inside libcrypto (a signature being
// checked, a TLS read), and those threads then crash on freed memory. Initialising it first with
// OPENSSL_INIT_NO_ATEXIT, before main and before any library (libpq, libmicrohttpd) touches it, leaves that
// state in place until the process is gone; the kernel reclaims it.
#include <openssl/crypto.h>
#include "COpenSSLSetup.h"

__attribute__((constructor)) static void storekeeper_openssl_without_atexit(void) {
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}

int storekeeper_openssl_setup_linked(void) { return 1; }
