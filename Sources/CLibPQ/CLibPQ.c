#include "CLibPQ.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

// Every libpq function LockstepJournal calls: X(return type, name, (parameters), (arguments)); XV for void ones.
#define LOCKSTEP_LIBPQ(X, XV)                                                                                    \
    X(PGconn *, PQconnectdbParams, (const char *const *keywords, const char *const *values, int expand_dbname), \
      (keywords, values, expand_dbname))                                                                       \
    X(ConnStatusType, PQstatus, (const PGconn *conn), (conn))                                                  \
    X(char *, PQerrorMessage, (const PGconn *conn), (conn))                                                    \
    XV(PQfinish, (PGconn * conn), (conn))                                                                      \
    X(PQnoticeProcessor, PQsetNoticeProcessor, (PGconn * conn, PQnoticeProcessor proc, void *arg),             \
      (conn, proc, arg))                                                                                       \
    X(PGTransactionStatusType, PQtransactionStatus, (const PGconn *conn), (conn))                              \
    X(int, PQbackendPID, (const PGconn *conn), (conn))                                                         \
    XV(PQreset, (PGconn * conn), (conn))                                                                       \
    X(PGresult *, PQexec, (PGconn * conn, const char *query), (conn, query))                                   \
    X(PGresult *, PQexecParams,                                                                                \
      (PGconn * conn, const char *command, int nParams, const Oid *paramTypes, const char *const *paramValues, \
       const int *paramLengths, const int *paramFormats, int resultFormat),                                    \
      (conn, command, nParams, paramTypes, paramValues, paramLengths, paramFormats, resultFormat))             \
    X(PGresult *, PQprepare,                                                                                   \
      (PGconn * conn, const char *stmtName, const char *query, int nParams, const Oid *paramTypes),            \
      (conn, stmtName, query, nParams, paramTypes))                                                            \
    X(PGresult *, PQexecPrepared,                                                                              \
      (PGconn * conn, const char *stmtName, int nParams, const char *const *paramValues,                      \
       const int *paramLengths, const int *paramFormats, int resultFormat),                                    \
      (conn, stmtName, nParams, paramValues, paramLengths, paramFormats, resultFormat))                        \
    X(int, PQenterPipelineMode, (PGconn * conn), (conn))                                                       \
    X(int, PQexitPipelineMode, (PGconn * conn), (conn))                                                        \
    X(int, PQpipelineSync, (PGconn * conn), (conn))                                                            \
    X(int, PQsendQueryParams,                                                                                  \
      (PGconn * conn, const char *command, int nParams, const Oid *paramTypes, const char *const *paramValues, \
       const int *paramLengths, const int *paramFormats, int resultFormat),                                    \
      (conn, command, nParams, paramTypes, paramValues, paramLengths, paramFormats, resultFormat))             \
    X(int, PQsendQueryPrepared,                                                                                \
      (PGconn * conn, const char *stmtName, int nParams, const char *const *paramValues,                      \
       const int *paramLengths, const int *paramFormats, int resultFormat),                                    \
      (conn, stmtName, nParams, paramValues, paramLengths, paramFormats, resultFormat))                        \
    X(PGresult *, PQgetResult, (PGconn * conn), (conn))                                                        \
    X(ExecStatusType, PQresultStatus, (const PGresult *res), (res))                                            \
    X(char *, PQresultErrorField, (const PGresult *res, int fieldcode), (res, fieldcode))                      \
    X(char *, PQresultErrorMessage, (const PGresult *res), (res))                                              \
    XV(PQclear, (PGresult * res), (res))                                                                       \
    X(int, PQntuples, (const PGresult *res), (res))                                                            \
    X(int, PQgetisnull, (const PGresult *res, int tup_num, int field_num), (res, tup_num, field_num))          \
    X(int, PQgetlength, (const PGresult *res, int tup_num, int field_num), (res, tup_num, field_num))          \
    X(char *, PQgetvalue, (const PGresult *res, int tup_num, int field_num), (res, tup_num, field_num))        \
    X(char *, PQcmdStatus, (PGresult * res), (res))                                                            \
    X(PQconninfoOption *, PQconninfoParse, (const char *conninfo, char **errmsg), (conninfo, errmsg))          \
    XV(PQconninfoFree, (PQconninfoOption * connOptions), (connOptions))                                        \
    XV(PQfreemem, (void *ptr), (ptr))                                                                          \
    X(PGPing, PQping, (const char *conninfo), (conninfo))

#define LOCKSTEP_FIELD(type, name, parameters, arguments) type(*name) parameters;
#define LOCKSTEP_FIELD_VOID(name, parameters, arguments) void(*name) parameters;
static struct {
    LOCKSTEP_LIBPQ(LOCKSTEP_FIELD, LOCKSTEP_FIELD_VOID)
} libpq;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char failure[512];

static void load(void) {
    void *library = dlopen("libpq.so.5", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        snprintf(failure, sizeof failure, "%s", dlerror());
        return;
    }
#define LOCKSTEP_LOAD(type, name, parameters, arguments)                                   \
    if ((*(void **)&libpq.name = dlsym(library, #name)) == NULL) {                        \
        snprintf(failure, sizeof failure, "libpq.so.5 has no function %s", #name);         \
        return;                                                                           \
    }
#define LOCKSTEP_LOAD_VOID(name, parameters, arguments) LOCKSTEP_LOAD(void, name, parameters, arguments)
    LOCKSTEP_LIBPQ(LOCKSTEP_LOAD, LOCKSTEP_LOAD_VOID)
}

const char *lockstep_libpq_load(void) {
    pthread_once(&once, load);
    return failure[0] == 0 ? NULL : failure;
}

#define LOCKSTEP_WRAP(type, name, parameters, arguments) \
    type lockstep_##name parameters { return libpq.name arguments; }
#define LOCKSTEP_WRAP_VOID(name, parameters, arguments) \
    void lockstep_##name parameters { libpq.name arguments; }
LOCKSTEP_LIBPQ(LOCKSTEP_WRAP, LOCKSTEP_WRAP_VOID)
