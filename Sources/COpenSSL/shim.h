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
#endif
