#ifndef STOREKEEPER_COPENSSL_SHIM_H
#define STOREKEEPER_COPENSSL_SHIM_H
#include <openssl/evp.h>
#include <openssl/rsa.h>
#include <openssl/ec.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/pem.h>
#include <openssl/err.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/ecdsa.h>
#include <openssl/core_names.h>
#include <openssl/ssl.h>
#include <openssl/hmac.h>
#include <openssl/ocsp.h>
#include <openssl/tls1.h>

/// Macros and stack helpers that Swift cannot import directly.
static inline STACK_OF(X509) *shim_sk_X509_new_null(void) { return sk_X509_new_null(); }
static inline int shim_sk_X509_push(STACK_OF(X509) *stack, X509 *cert) { return sk_X509_push(stack, cert); }
static inline void shim_sk_X509_pop_free(STACK_OF(X509) *stack) { sk_X509_pop_free(stack, X509_free); }
static inline void shim_sk_X509_free(STACK_OF(X509) *stack) { sk_X509_free(stack); }
static inline int shim_sk_X509_num(const STACK_OF(X509) *stack) { return sk_X509_num(stack); }
static inline X509 *shim_sk_X509_value(const STACK_OF(X509) *stack, int index) { return sk_X509_value(stack, index); }
static inline long shim_BIO_get_mem_data(BIO *bio, char **data) { return BIO_get_mem_data(bio, data); }
static inline int shim_EVP_PKEY_CTX_set_rsa_padding(EVP_PKEY_CTX *ctx, int pad) { return EVP_PKEY_CTX_set_rsa_padding(ctx, pad); }
static inline long shim_SSL_set_tlsext_host_name(SSL *ssl, const char *name) { return SSL_set_tlsext_host_name(ssl, name); }
static inline long shim_SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int version) { return SSL_CTX_set_min_proto_version(ctx, version); }
static inline long shim_SSL_CTX_add_extra_chain_cert(SSL_CTX *ctx, X509 *cert) { return SSL_CTX_add_extra_chain_cert(ctx, cert); }
/// A peer closing without close_notify is an end of stream, not an error; no renegotiation (a CPU lever for clients).
static inline uint64_t shim_SSL_CTX_set_server_options(SSL_CTX *ctx) {
    return SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
}
static inline long shim_SSL_CTX_set_mode(SSL_CTX *ctx, long mode) { return SSL_CTX_set_mode(ctx, mode); }
/// SNI: the callback sees each ClientHello's server name before a certificate is chosen.
static inline long shim_SSL_CTX_set_servername_callback(SSL_CTX *ctx, int (*callback)(SSL *, int *, void *), void *argument) {
    SSL_CTX_set_tlsext_servername_arg(ctx, argument);
    return SSL_CTX_set_tlsext_servername_callback(ctx, callback);
}
#endif
