/*
 * Linux's epoll(7), eventfd(2) and signalfd(2), which Swift's Glibc module does not include. The
 * server's DaemonLoop and SubscriberWatcher wait on the first two, the executable reads its
 * signals from the third (Sources/forge-push-token-server/main.swift says why); nothing here links
 * a library. Also the name of
 * the calling thread (prctl(2) PR_SET_NAME: prctl is variadic, which Swift cannot call), for the
 * loops' threads (LoopThread).
 */
#ifndef FORGE_PUSH_TOKEN_CLINUXEVENTS_SHIM_H
#define FORGE_PUSH_TOKEN_CLINUXEVENTS_SHIM_H

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/prctl.h>

/* Names the calling thread (at most 15 bytes are kept); 0 on success. */
static inline int fpt_name_this_thread(const char *name) {
    return prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0);
}

#endif
