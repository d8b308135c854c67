#ifndef STOREKEEPER_CSYSTEM_SHIM_H
#define STOREKEEPER_CSYSTEM_SHIM_H
/// Linux headers Glibc's Swift module leaves out: epoll, eventfd, TCP options, getrandom.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <netdb.h>
#include <sys/random.h>
#endif
