// lockstep-cload: lockstepd measured from outside. C clients that speak the wire protocol (docs/protocol.md), each
// a thread with its own REQ socket, dispatching one action at a time and checking every reply; and a raw libzmq
// ROUTER echo in C to measure them against, so that neither side of the comparison pays for Swift.
//
//   lockstep-cload echo ENDPOINT [--curve-server SECRET]
//       Binds a ROUTER that sends every message back as it came; prints "ready", runs until killed.
//   lockstep-cload load ENDPOINT CLIENTS SECONDS STORE VERSION ACTION [--echo] [--curve SERVERPUBLIC,CLIENTSECRET]
//       CLIENTS threads each connect, dispatch once, wait for all the others, then dispatch ACTION to STORE (domain
//       VERSION) for SECONDS, one request in flight each. Every reply must be ACCEPTED, with the request's id, one
//       action, the same epoch for every client and a seq above the client's last; against --echo, the frames sent.
//       Then prints one JSON line: counts, rate, latencies, this process's CPU, and the seqs acknowledged (all
//       distinct: the bench compares their number with what the daemon committed). Exits 1 at the first reply
//       that fails a check, naming it.

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <zmq.h>

enum { HEADER_BYTES = 32, MAX_FRAMES = 4, REPLY_TIMEOUT_MS = 30000 };

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "lockstep-cload: %s: %s\n", what, detail);
    exit(1);
}

static void fail_zmq(const char *what) { fail(what, zmq_strerror(zmq_errno())); }

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static uint64_t process_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 3; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (uint8_t)v;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    return v;
}

static uint32_t get_u32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | p[2] << 8 | p[3]; }

// One socket call, checked: every libzmq call of this file that can fail goes through these two.
static void send_frames(void *socket, zmq_msg_t *frames, int count) {
    for (int i = 0; i < count; i++) {
        if (zmq_msg_send(&frames[i], socket, i + 1 < count ? ZMQ_SNDMORE : 0) < 0) fail_zmq("send");
    }
}

// Receives one message into `frames` (at most MAX_FRAMES); returns how many, or -1 when the reply timed out.
static int receive_frames(void *socket, zmq_msg_t *frames) {
    int count = 0;
    while (true) {
        if (count == MAX_FRAMES) fail("receive", "a reply with more frames than any this tool expects");
        zmq_msg_init(&frames[count]);
        if (zmq_msg_recv(&frames[count], socket, 0) < 0) {
            if (zmq_errno() == EAGAIN) return -1;
            fail_zmq("receive");
        }
        count++;
        if (!zmq_msg_more(&frames[count - 1])) return count;
    }
}

static void close_frames(zmq_msg_t *frames, int count) {
    for (int i = 0; i < count; i++) zmq_msg_close(&frames[i]);
}

// MARK: - echo

static int run_echo(const char *endpoint, const char *curve_secret) {
    void *context = zmq_ctx_new();
    void *router = zmq_socket(context, ZMQ_ROUTER);
    if (!router) fail_zmq("socket");
    if (curve_secret) {
        int on = 1;
        if (zmq_setsockopt(router, ZMQ_CURVE_SERVER, &on, sizeof on) < 0
            || zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, curve_secret, strlen(curve_secret)) < 0)
            fail_zmq("CURVE server key");
    }
    if (zmq_bind(router, endpoint) < 0) fail_zmq(endpoint);
    printf("ready\n");
    fflush(stdout);
    zmq_msg_t frames[MAX_FRAMES + 2];
    while (true) {
        int count = 0;
        do {
            if (count == MAX_FRAMES + 2) fail("echo", "a request with more frames than a DISPATCH of one action");
            zmq_msg_init(&frames[count]);
            if (zmq_msg_recv(&frames[count], router, 0) < 0) fail_zmq("echo receive");
            count++;
        } while (zmq_msg_more(&frames[count - 1]));
        send_frames(router, frames, count);
        close_frames(frames, count);
    }
}

// MARK: - load

struct load {
    const char *endpoint;
    const char *store;
    const char *action;
    const char *curve_server_public;
    char curve_client_public[41];
    char curve_client_secret[41];
    uint32_t version;
    bool echo;
    double seconds;
    void *context;
    pthread_barrier_t connected, go;
    uint64_t started_ns;
    atomic_uint_fast64_t epoch;  // 0 until the first ACCEPTED names it
};

struct client {
    struct load *load;
    pthread_t thread;
    uint8_t client_id[16];
    uint64_t *latencies_ns;  // one per measured round trip
    uint64_t *seqs;          // one per acknowledged action, the warm-up's included
    size_t capacity, measured, acknowledged;
    uint64_t elapsed_ns;
};

static void check_reply(struct client *c, uint64_t request, zmq_msg_t *sent, zmq_msg_t *reply, int count) {
    char detail[256];
    if (c->load->echo) {
        if (count != 3) fail("echo reply", "not the three frames sent");
        for (int i = 0; i < 3; i++) {
            if (zmq_msg_size(&reply[i]) != zmq_msg_size(&sent[i])
                || memcmp(zmq_msg_data(&reply[i]), zmq_msg_data(&sent[i]), zmq_msg_size(&sent[i])) != 0)
                fail("echo reply", "a frame other than the one sent");
        }
        c->seqs[c->acknowledged++] = request;
        return;
    }
    const uint8_t *h = zmq_msg_data(&reply[0]);
    size_t size = zmq_msg_size(&reply[0]);
    if (size < 4 || h[0] != 'L' || h[1] != 'S' || h[2] != 1) fail("reply", "not a protocol-1 header");
    if (h[3] != 0x81) {
        snprintf(detail, sizeof detail, "type 0x%02x to request %" PRIu64 ", not ACCEPTED (0x81)%s%.*s", h[3],
            request, count > 1 ? ": " : "", count > 1 ? (int)zmq_msg_size(&reply[1]) : 0,
            count > 1 ? (const char *)zmq_msg_data(&reply[1]) : "");
        fail("reply", detail);
    }
    if (count != 1 || size != 32) fail("ACCEPTED", "not one frame of 32 bytes");
    uint64_t id = get_u64(h + 4), epoch = get_u64(h + 12), first = get_u64(h + 20);
    uint32_t actions = get_u32(h + 28);
    if (id != request) {
        snprintf(detail, sizeof detail, "request id %" PRIu64 " answers request %" PRIu64, id, request);
        fail("ACCEPTED", detail);
    }
    if (actions != 1) fail("ACCEPTED", "a count other than the one action sent");
    uint_fast64_t expected = 0;
    if (!atomic_compare_exchange_strong(&c->load->epoch, &expected, epoch) && expected != epoch) {
        snprintf(detail, sizeof detail, "epoch %" PRIu64 " after %" PRIu64 " in the same run", epoch,
            (uint64_t)expected);
        fail("ACCEPTED", detail);
    }
    if (c->acknowledged > 0 && first <= c->seqs[c->acknowledged - 1]) {
        snprintf(detail, sizeof detail, "seq %" PRIu64 " after this client's %" PRIu64, first,
            c->seqs[c->acknowledged - 1]);
        fail("ACCEPTED", detail);
    }
    if (c->acknowledged == c->capacity) fail("load", "more round trips than the room reserved for them");
    c->seqs[c->acknowledged++] = first;
}

static void *run_client(void *argument) {
    struct client *c = argument;
    struct load *load = c->load;
    void *req = zmq_socket(load->context, ZMQ_REQ);
    if (!req) fail_zmq("socket");
    int timeout = REPLY_TIMEOUT_MS, linger = 0;
    zmq_setsockopt(req, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof linger);
    if (load->curve_server_public) {
        if (zmq_setsockopt(req, ZMQ_CURVE_SERVERKEY, load->curve_server_public, 40) < 0
            || zmq_setsockopt(req, ZMQ_CURVE_PUBLICKEY, load->curve_client_public, 40) < 0
            || zmq_setsockopt(req, ZMQ_CURVE_SECRETKEY, load->curve_client_secret, 40) < 0)
            fail_zmq("CURVE client keys");
    }
    if (zmq_connect(req, load->endpoint) < 0) fail_zmq(load->endpoint);

    uint8_t header[HEADER_BYTES] = {'L', 'S', 1, 0x01};
    put_u32(header + 12, load->version);
    memcpy(header + 16, c->client_id, 16);
    uint64_t request = 0, deadline = 0;
    bool measuring = false;
    while (true) {
        request++;
        put_u64(header + 4, request);
        zmq_msg_t sent[3], kept[3], reply[MAX_FRAMES];
        zmq_msg_init_size(&sent[0], HEADER_BYTES);
        memcpy(zmq_msg_data(&sent[0]), header, HEADER_BYTES);
        zmq_msg_init_size(&sent[1], strlen(load->store));
        memcpy(zmq_msg_data(&sent[1]), load->store, strlen(load->store));
        zmq_msg_init_size(&sent[2], strlen(load->action));
        memcpy(zmq_msg_data(&sent[2]), load->action, strlen(load->action));
        if (load->echo) {
            for (int i = 0; i < 3; i++) {
                zmq_msg_init(&kept[i]);
                zmq_msg_copy(&kept[i], &sent[i]);
            }
        }
        uint64_t start = now_ns();
        send_frames(req, sent, 3);
        int count = receive_frames(req, reply);
        if (count < 0) fail("reply", "none within 30 s");
        uint64_t end = now_ns();
        check_reply(c, request, kept, reply, count);
        close_frames(reply, count);
        if (load->echo) close_frames(kept, 3);
        if (!measuring) {
            // The first round trip connects; then every client starts together, once the start is noted.
            pthread_barrier_wait(&load->connected);
            pthread_barrier_wait(&load->go);
            deadline = load->started_ns + (uint64_t)(load->seconds * 1e9);
            measuring = true;
            continue;
        }
        c->latencies_ns[c->measured++] = end - start;
        if (end >= deadline) break;
    }
    c->elapsed_ns = now_ns() - load->started_ns;
    zmq_close(req);
    return NULL;
}

static int compare_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int run_load(struct load *load, int clients) {
    load->context = zmq_ctx_new();
    // Room for a round trip every 2 µs: far beyond what one REQ socket does.
    size_t capacity = (size_t)(load->seconds * 500000) + 16;
    struct client *all = calloc((size_t)clients, sizeof *all);
    // The main thread joins both barriers: it notes the start once every client has connected, then lets them go.
    pthread_barrier_init(&load->connected, NULL, (unsigned)clients + 1);
    pthread_barrier_init(&load->go, NULL, (unsigned)clients + 1);
    for (int i = 0; i < clients; i++) {
        all[i].load = load;
        all[i].capacity = capacity;
        all[i].latencies_ns = malloc(capacity * sizeof(uint64_t));
        all[i].seqs = malloc(capacity * sizeof(uint64_t));
        if (!all[i].latencies_ns || !all[i].seqs) fail("load", "out of memory for the samples");
        if (getrandom(all[i].client_id, 16, 0) != 16) fail("getrandom", strerror(errno));
        if (pthread_create(&all[i].thread, NULL, run_client, &all[i]) != 0) fail("pthread_create", "failed");
    }
    pthread_barrier_wait(&load->connected);
    uint64_t cpu_before = process_cpu_ns();
    load->started_ns = now_ns();
    pthread_barrier_wait(&load->go);
    for (int i = 0; i < clients; i++) pthread_join(all[i].thread, NULL);
    uint64_t cpu = process_cpu_ns() - cpu_before;

    size_t measured = 0, acknowledged = 0;
    uint64_t elapsed = 0;
    for (int i = 0; i < clients; i++) {
        measured += all[i].measured;
        acknowledged += all[i].acknowledged;
        if (all[i].elapsed_ns > elapsed) elapsed = all[i].elapsed_ns;
    }
    uint64_t *latencies = malloc((measured + 1) * sizeof(uint64_t));
    uint64_t *seqs = malloc((acknowledged + 1) * sizeof(uint64_t));
    size_t l = 0, s = 0;
    for (int i = 0; i < clients; i++) {
        memcpy(latencies + l, all[i].latencies_ns, all[i].measured * sizeof(uint64_t));
        l += all[i].measured;
        memcpy(seqs + s, all[i].seqs, all[i].acknowledged * sizeof(uint64_t));
        s += all[i].acknowledged;
    }
    qsort(latencies, measured, sizeof(uint64_t), compare_u64);
    size_t duplicates = 0;
    if (!load->echo) {
        qsort(seqs, acknowledged, sizeof(uint64_t), compare_u64);
        for (size_t i = 1; i < acknowledged; i++) duplicates += seqs[i] == seqs[i - 1];
        if (duplicates > 0) fail("ACCEPTED", "one seq acknowledged to two requests");
    }
    // Nearest rank, as the bench takes its own: the ceil(q × n)-th smallest.
    uint64_t p50 = measured ? latencies[(measured + 1) / 2 - 1] : 0;
    uint64_t p99 = measured ? latencies[(measured * 99 + 99) / 100 - 1] : 0;
    printf("{\"clients\":%d,\"acknowledged\":%zu,\"measured\":%zu,\"elapsedNanos\":%" PRIu64
           ",\"p50Nanos\":%" PRIu64 ",\"p99Nanos\":%" PRIu64 ",\"cpuNanos\":%" PRIu64
           ",\"firstSeq\":%" PRIu64 ",\"lastSeq\":%" PRIu64 "}\n",
        clients, acknowledged, measured, elapsed, p50, p99, cpu, load->echo || !acknowledged ? 0 : seqs[0],
        load->echo || !acknowledged ? 0 : seqs[acknowledged - 1]);
    fflush(stdout);
    zmq_ctx_term(load->context);
    return 0;
}

static void usage(void) {
    fprintf(stderr,
        "usage: lockstep-cload echo ENDPOINT [--curve-server SECRET]\n"
        "       lockstep-cload load ENDPOINT CLIENTS SECONDS STORE VERSION ACTION [--echo]"
        " [--curve SERVERPUBLIC,CLIENTSECRET]\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "echo") == 0) {
        const char *secret = NULL;
        if (argc == 5 && strcmp(argv[3], "--curve-server") == 0) secret = argv[4];
        else if (argc != 3) usage();
        return run_echo(argv[2], secret);
    }
    if (argc < 8 || strcmp(argv[1], "load") != 0) usage();
    struct load load = {.endpoint = argv[2], .store = argv[5], .action = argv[7]};
    char *end;
    long clients = strtol(argv[3], &end, 10);
    if (*end || clients < 1 || clients > 1024) fail("CLIENTS", "not a number from 1 to 1024");
    load.seconds = strtod(argv[4], &end);
    if (*end || !(load.seconds > 0 && load.seconds <= 3600)) fail("SECONDS", "not a number above 0, up to 3600");
    unsigned long version = strtoul(argv[6], &end, 10);
    if (*end || version > UINT32_MAX) fail("VERSION", "not a u32");
    load.version = (uint32_t)version;
    for (int i = 8; i < argc; i++) {
        if (strcmp(argv[i], "--echo") == 0) {
            load.echo = true;
        } else if (strcmp(argv[i], "--curve") == 0 && i + 1 < argc) {
            const char *keys = argv[++i];
            if (strlen(keys) != 81 || keys[40] != ',') fail("--curve", "not SERVERPUBLIC,CLIENTSECRET in Z85");
            static char server[41];
            memcpy(server, keys, 40);
            load.curve_server_public = server;
            memcpy(load.curve_client_secret, keys + 41, 40);
            if (zmq_curve_public(load.curve_client_public, load.curve_client_secret) < 0) fail_zmq("--curve");
        } else {
            usage();
        }
    }
    return run_load(&load, (int)clients);
}
