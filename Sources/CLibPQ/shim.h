#ifndef LOCKSTEP_CLIBPQ_SHIM_H
#define LOCKSTEP_CLIBPQ_SHIM_H

// libpq, PostgreSQL's C client library (Debian: libpq-dev). Imported only by LockstepJournal.
#include <libpq-fe.h>

#endif
