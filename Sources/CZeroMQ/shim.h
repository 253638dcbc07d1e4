#ifndef LOCKSTEP_CZEROMQ_SHIM_H
#define LOCKSTEP_CZEROMQ_SHIM_H

#include <zmq.h>
#include <errno.h>

// ZMQ_ZAP_ENFORCE_DOMAIN is a draft option in libzmq 4.3's stable header, though every 4.3 release honours it.
#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93
#endif

#endif
