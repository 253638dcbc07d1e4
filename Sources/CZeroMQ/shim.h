#ifndef LOCKSTEP_CZEROMQ_SHIM_H
#define LOCKSTEP_CZEROMQ_SHIM_H

#include <zmq.h>
#include <errno.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

// ZMQ_ZAP_ENFORCE_DOMAIN is a draft option in libzmq 4.3's stable header, though every 4.3 release honours it.
#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93
#endif

// prctl is variadic, which Swift cannot call: names the calling thread (at most 15 bytes are kept).
static inline int lockstep_name_current_thread(const char *name) {
    return prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0);
}

// Lowers the calling thread's priority to `nice` (on Linux, setpriority on a thread id affects that thread alone);
// syscall is variadic too.
static inline int lockstep_nice_current_thread(int nice) {
    return setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice);
}

#endif
