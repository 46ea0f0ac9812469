/*
 * Linux's epoll(7) and eventfd(2), which Swift's Glibc module does not include. The server's
 * DaemonLoop and SubscriberWatcher wait on them; nothing here links a library.
 */
#ifndef FORGE_PUSH_TOKEN_CLINUXEVENTS_SHIM_H
#define FORGE_PUSH_TOKEN_CLINUXEVENTS_SHIM_H

#include <sys/epoll.h>
#include <sys/eventfd.h>

#endif
