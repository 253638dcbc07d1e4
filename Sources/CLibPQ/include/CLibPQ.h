#ifndef LOCKSTEP_CLIBPQ_H
#define LOCKSTEP_CLIBPQ_H

// The part of libpq, PostgreSQL's C client library, that LockstepJournal uses: its types and constants as
// libpq-fe.h declares them (a stable ABI since PostgreSQL 9), and one `lockstep_` function per libpq function.
// libpq is not linked: lockstep_libpq_load() opens libpq.so.5 the first time a PostgreSQL journal is opened, so a
// daemon on SQLite never maps libpq and the libraries it pulls in (OpenSSL, LDAP, Kerberos: ~5 MB resident).
// The pipeline functions (a commit's statements in one round trip) need libpq 14 or newer.

#include <stddef.h>

typedef unsigned int Oid;
typedef struct pg_conn PGconn;
typedef struct pg_result PGresult;

typedef enum { CONNECTION_OK, CONNECTION_BAD } ConnStatusType;
typedef enum {
    PGRES_EMPTY_QUERY = 0,
    PGRES_COMMAND_OK,
    PGRES_TUPLES_OK,
    PGRES_COPY_OUT,
    PGRES_COPY_IN,
    PGRES_BAD_RESPONSE,
    PGRES_NONFATAL_ERROR,
    PGRES_FATAL_ERROR,
    PGRES_COPY_BOTH,
    PGRES_SINGLE_TUPLE,
    PGRES_PIPELINE_SYNC,
    PGRES_PIPELINE_ABORTED
} ExecStatusType;
typedef enum { PQTRANS_IDLE, PQTRANS_ACTIVE, PQTRANS_INTRANS, PQTRANS_INERROR, PQTRANS_UNKNOWN } PGTransactionStatusType;
typedef enum { PQPING_OK, PQPING_REJECT, PQPING_NO_RESPONSE, PQPING_NO_ATTEMPT } PGPing;

typedef struct _PQconninfoOption {
    char *keyword;
    char *envvar;
    char *compiled;
    char *val;
    char *label;
    char *dispchar;
    int dispsize;
} PQconninfoOption;

typedef void (*PQnoticeProcessor)(void *arg, const char *message);

/// Opens libpq.so.5 and finds every function below, once per process; NULL when it did, else what failed.
const char *lockstep_libpq_load(void);

// Each calls the libpq function of the same name without the prefix; call lockstep_libpq_load() first.
PGconn *lockstep_PQconnectdbParams(const char *const *keywords, const char *const *values, int expand_dbname);
ConnStatusType lockstep_PQstatus(const PGconn *conn);
char *lockstep_PQerrorMessage(const PGconn *conn);
void lockstep_PQfinish(PGconn *conn);
PQnoticeProcessor lockstep_PQsetNoticeProcessor(PGconn *conn, PQnoticeProcessor proc, void *arg);
PGTransactionStatusType lockstep_PQtransactionStatus(const PGconn *conn);
int lockstep_PQbackendPID(const PGconn *conn);
void lockstep_PQreset(PGconn *conn);
PGresult *lockstep_PQexec(PGconn *conn, const char *query);
PGresult *lockstep_PQexecParams(PGconn *conn, const char *command, int nParams, const Oid *paramTypes,
                                const char *const *paramValues, const int *paramLengths, const int *paramFormats,
                                int resultFormat);
PGresult *lockstep_PQprepare(PGconn *conn, const char *stmtName, const char *query, int nParams,
                             const Oid *paramTypes);
PGresult *lockstep_PQexecPrepared(PGconn *conn, const char *stmtName, int nParams, const char *const *paramValues,
                                  const int *paramLengths, const int *paramFormats, int resultFormat);
int lockstep_PQenterPipelineMode(PGconn *conn);
int lockstep_PQexitPipelineMode(PGconn *conn);
int lockstep_PQpipelineSync(PGconn *conn);
int lockstep_PQsendQueryParams(PGconn *conn, const char *command, int nParams, const Oid *paramTypes,
                               const char *const *paramValues, const int *paramLengths, const int *paramFormats,
                               int resultFormat);
int lockstep_PQsendQueryPrepared(PGconn *conn, const char *stmtName, int nParams, const char *const *paramValues,
                                 const int *paramLengths, const int *paramFormats, int resultFormat);
PGresult *lockstep_PQgetResult(PGconn *conn);
ExecStatusType lockstep_PQresultStatus(const PGresult *res);
char *lockstep_PQresultErrorField(const PGresult *res, int fieldcode);
char *lockstep_PQresultErrorMessage(const PGresult *res);
void lockstep_PQclear(PGresult *res);
int lockstep_PQntuples(const PGresult *res);
int lockstep_PQgetisnull(const PGresult *res, int tup_num, int field_num);
int lockstep_PQgetlength(const PGresult *res, int tup_num, int field_num);
char *lockstep_PQgetvalue(const PGresult *res, int tup_num, int field_num);
char *lockstep_PQcmdStatus(PGresult *res);
PQconninfoOption *lockstep_PQconninfoParse(const char *conninfo, char **errmsg);
void lockstep_PQconninfoFree(PQconninfoOption *connOptions);
void lockstep_PQfreemem(void *ptr);
PGPing lockstep_PQping(const char *conninfo);

#endif
