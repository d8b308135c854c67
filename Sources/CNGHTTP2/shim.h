#ifndef STOREKEEPER_CNGHTTP2_SHIM_H
#define STOREKEEPER_CNGHTTP2_SHIM_H
#include <nghttp2/nghttp2.h>
#endif
