// lockstep-cload: lockstepd measured from outside. C clients that speak the wire protocol (docs/protocol.md), each
// a thread with its own socket, dispatching and checking every reply; and a raw libzmq ROUTER echo in C to measure
// them against, so that neither side of the comparison pays for Swift.
//
//   lockstep-cload echo ENDPOINT [--curve-server SECRET]
//       Binds a ROUTER that sends every message back as it came; prints "ready", runs until killed.
//   lockstep-cload load ENDPOINT CLIENTS SECONDS STORE VERSION ACTION [--echo] [--in-flight N]
//                       [--curve SERVERPUBLIC,CLIENTSECRET]
//       CLIENTS threads each connect, dispatch once, wait for all the others, then dispatch ACTION to STORE (domain
//       VERSION) for SECONDS: one request in flight each on a REQ socket, or N on a DEALER. Every reply must be
//       ACCEPTED of one action, answer a request in flight, carry the same epoch for every client and a seq of at
//       least 1 — on a REQ, above the client's last; on a DEALER, above its connecting one's (the protocol orders a
//       DEALER's replies in no way); against --echo, the frames of the DISPATCH sent, the header whole.
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
#include <unistd.h>
#include <zmq.h>

enum { HEADER_BYTES = 32, MAX_FRAMES = 4, REPLY_TIMEOUT_MS = 30000 };

// The first failure of any thread is said, and the process ends at once (`exit` from two threads at a time is
// undefined, and libzmq's teardown would run under sockets still in use).
static void fail(const char *what, const char *detail) {
    static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&once);
    fprintf(stderr, "lockstep-cload: %s: %s\n", what, detail);
    fflush(stderr);
    _exit(1);
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
    int inflight;  // 1: a REQ socket; more: a DEALER with that many requests in flight
    double seconds;
    void *context;
    pthread_barrier_t connected, go;
    uint64_t started_ns;
    pthread_mutex_t epoch_lock;
    bool epoch_known;
    uint64_t epoch;  // the first ACCEPTED's, once `epoch_known`
};

// A growing array of samples.
struct samples {
    uint64_t *items;
    size_t count, capacity;
};

static void push(struct samples *samples, uint64_t value) {
    if (samples->count == samples->capacity) {
        samples->capacity = samples->capacity ? samples->capacity * 2 : 4096;
        samples->items = realloc(samples->items, samples->capacity * sizeof(uint64_t));
        if (!samples->items) fail("load", "out of memory for the samples");
    }
    samples->items[samples->count++] = value;
}

struct client {
    struct load *load;
    pthread_t thread;
    uint8_t client_id[16];
    struct samples latencies;  // one per measured round trip, in ns
    struct samples seqs;       // one per acknowledged action, the warm-up's included, in request order
    uint64_t elapsed_ns;
};

// What a reply answers: its request id, and the seq it acknowledged (the id, from the echo).
struct answer {
    uint64_t request, seq;
};

// Checks a reply body: from the echo, the DISPATCH frames of some request (its header whole, but for the id); from lockstepd, ACCEPTED of one action in
// the run's one epoch. Exits, naming what was wrong, at the first that is not.
static struct answer check_reply(struct load *load, const uint8_t *sent, zmq_msg_t *reply, int count) {
    char detail[256];
    const uint8_t *h = zmq_msg_data(&reply[0]);
    size_t size = zmq_msg_size(&reply[0]);
    if (size < 12 || h[0] != 'L' || h[1] != 'S' || h[2] != 1) fail("reply", "not a protocol-1 header");
    uint64_t id = get_u64(h + 4);
    if (load->echo) {
        size_t store = strlen(load->store), action = strlen(load->action);
        uint8_t header[HEADER_BYTES];
        memcpy(header, sent, HEADER_BYTES);
        put_u64(header + 4, id);
        if (count != 3 || size != HEADER_BYTES || memcmp(h, header, HEADER_BYTES) != 0 || zmq_msg_size(&reply[1]) != store
            || memcmp(zmq_msg_data(&reply[1]), load->store, store) != 0 || zmq_msg_size(&reply[2]) != action
            || memcmp(zmq_msg_data(&reply[2]), load->action, action) != 0)
            fail("echo reply", "not the frames of a DISPATCH sent");
        return (struct answer){id, id};
    }
    if (h[3] != 0x81) {
        snprintf(detail, sizeof detail, "type 0x%02x to request %" PRIu64 ", not ACCEPTED (0x81)%s%.*s", h[3], id,
            count > 1 ? ": " : "", count > 1 ? (int)zmq_msg_size(&reply[1]) : 0,
            count > 1 ? (const char *)zmq_msg_data(&reply[1]) : "");
        fail("reply", detail);
    }
    if (count != 1 || size != 32) fail("ACCEPTED", "not one frame of 32 bytes");
    uint64_t epoch = get_u64(h + 12), first = get_u64(h + 20);
    if (get_u32(h + 28) != 1) fail("ACCEPTED", "a count other than the one action sent");
    if (first == 0) fail("ACCEPTED", "seq 0: the first seq of a store is 1");
    pthread_mutex_lock(&load->epoch_lock);
    if (!load->epoch_known) {
        load->epoch = epoch;
        load->epoch_known = true;
    }
    uint64_t known = load->epoch;
    pthread_mutex_unlock(&load->epoch_lock);
    if (known != epoch) {
        snprintf(detail, sizeof detail, "epoch %" PRIu64 " after %" PRIu64 " in the same run", epoch, known);
        fail("ACCEPTED", detail);
    }
    return (struct answer){id, first};
}

// Sends request `id`'s DISPATCH (after the empty delimiter, on a DEALER).
static void send_request(void *socket, struct load *load, uint8_t *header, uint64_t id) {
    put_u64(header + 4, id);
    zmq_msg_t frames[4];
    int count = 0;
    if (load->inflight > 1) zmq_msg_init(&frames[count++]);
    const void *bodies[3] = {header, load->store, load->action};
    size_t sizes[3] = {HEADER_BYTES, strlen(load->store), strlen(load->action)};
    for (int i = 0; i < 3; i++) {
        if (zmq_msg_init_size(&frames[count], sizes[i]) < 0) fail_zmq("message");
        memcpy(zmq_msg_data(&frames[count++]), bodies[i], sizes[i]);
    }
    send_frames(socket, frames, count);
}

// Receives one reply body (the delimiter taken off, on a DEALER) and checks it; `sent` is the client's DISPATCH header.
static struct answer receive_answer(void *socket, struct load *load, const uint8_t *sent) {
    zmq_msg_t reply[MAX_FRAMES];
    int count = receive_frames(socket, reply);
    if (count < 0) fail("reply", "none within 30 s");
    int first = 0;
    if (load->inflight > 1) {
        if (count < 2 || zmq_msg_size(&reply[0]) != 0) fail("reply", "no empty delimiter before the body");
        first = 1;
    }
    struct answer answer = check_reply(load, sent, reply + first, count - first);
    close_frames(reply, count);
    return answer;
}

static void *run_client(void *argument) {
    struct client *c = argument;
    struct load *load = c->load;
    void *socket = zmq_socket(load->context, load->inflight > 1 ? ZMQ_DEALER : ZMQ_REQ);
    if (!socket) fail_zmq("socket");
    int timeout = REPLY_TIMEOUT_MS, linger = 0;
    if (zmq_setsockopt(socket, ZMQ_RCVTIMEO, &timeout, sizeof timeout) < 0
        || zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger) < 0)
        fail_zmq("socket options");
    if (load->curve_server_public) {
        if (zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, load->curve_server_public, 40) < 0
            || zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, load->curve_client_public, 40) < 0
            || zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, load->curve_client_secret, 40) < 0)
            fail_zmq("CURVE client keys");
    }
    if (zmq_connect(socket, load->endpoint) < 0) fail_zmq(load->endpoint);

    uint8_t header[HEADER_BYTES] = {'L', 'S', 1, 0x01};
    put_u32(header + 12, load->version);
    memcpy(header + 16, c->client_id, 16);
    char detail[256];

    // The first round trip connects; then every client starts together, once the start is noted.
    send_request(socket, load, header, 1);
    struct answer warmup = receive_answer(socket, load, header);
    if (warmup.request != 1) fail("reply", "the first reply answers another request");
    push(&c->seqs, warmup.seq);
    pthread_barrier_wait(&load->connected);
    pthread_barrier_wait(&load->go);
    uint64_t deadline = load->started_ns + (uint64_t)(load->seconds * 1e9);

    // Requests oldest…next-1 are in flight; slot id % inflight holds each one's send time and, once answered, seq.
    int window = load->inflight;
    uint64_t *sent_ns = calloc((size_t)window, sizeof *sent_ns), *seq = calloc((size_t)window, sizeof *seq);
    bool *answered = calloc((size_t)window, sizeof *answered);
    uint64_t oldest = 2, next = 2;
    while (next - oldest < (uint64_t)window && now_ns() < deadline) {
        sent_ns[next % window] = now_ns();
        send_request(socket, load, header, next++);
    }
    while (oldest < next) {
        struct answer answer = receive_answer(socket, load, header);
        uint64_t end = now_ns();
        if (answer.request < oldest || answer.request >= next || answered[answer.request % window]) {
            snprintf(detail, sizeof detail, "an answer to request %" PRIu64 ", which is not in flight", answer.request);
            fail("reply", detail);
        }
        if (end > deadline + 60 * (uint64_t)1000000000) fail("reply", "requests still in flight 60 s after the end");
        answered[answer.request % window] = true;
        seq[answer.request % window] = answer.seq;
        push(&c->latencies, end - sent_ns[answer.request % window]);
        // One at a time, each seq above the one before; several in flight, each above the connecting one's (the
        // protocol orders a DEALER's replies in no way; the seqs are checked distinct across every client at the end).
        while (oldest < next && answered[oldest % window]) {
            uint64_t acknowledged = seq[oldest % window];
            uint64_t floor = c->seqs.items[window == 1 ? c->seqs.count - 1 : 0];
            if (!load->echo && acknowledged <= floor) {
                snprintf(detail, sizeof detail, "seq %" PRIu64 " for request %" PRIu64 " after this client's %" PRIu64,
                    acknowledged, oldest, floor);
                fail("ACCEPTED", detail);
            }
            push(&c->seqs, acknowledged);
            answered[oldest % window] = false;
            oldest++;
        }
        while (next - oldest < (uint64_t)window && end < deadline) {
            sent_ns[next % window] = now_ns();
            send_request(socket, load, header, next++);
        }
    }
    c->elapsed_ns = now_ns() - load->started_ns;
    free(sent_ns);
    free(seq);
    free(answered);
    zmq_close(socket);
    return NULL;
}

static int compare_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int run_load(struct load *load, int clients) {
    load->context = zmq_ctx_new();
    pthread_mutex_init(&load->epoch_lock, NULL);
    struct client *all = calloc((size_t)clients, sizeof *all);
    // The main thread joins both barriers: it notes the start once every client has connected, then lets them go.
    pthread_barrier_init(&load->connected, NULL, (unsigned)clients + 1);
    pthread_barrier_init(&load->go, NULL, (unsigned)clients + 1);
    for (int i = 0; i < clients; i++) {
        all[i].load = load;
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
        measured += all[i].latencies.count;
        acknowledged += all[i].seqs.count;
        if (all[i].elapsed_ns > elapsed) elapsed = all[i].elapsed_ns;
    }
    uint64_t *latencies = malloc((measured + 1) * sizeof(uint64_t));
    uint64_t *seqs = malloc((acknowledged + 1) * sizeof(uint64_t));
    if (!latencies || !seqs) fail("load", "out of memory for the samples");
    size_t l = 0, s = 0;
    for (int i = 0; i < clients; i++) {
        memcpy(latencies + l, all[i].latencies.items, all[i].latencies.count * sizeof(uint64_t));
        l += all[i].latencies.count;
        memcpy(seqs + s, all[i].seqs.items, all[i].seqs.count * sizeof(uint64_t));
        s += all[i].seqs.count;
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
        "       lockstep-cload load ENDPOINT CLIENTS SECONDS STORE VERSION ACTION [--echo] [--in-flight N]"
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
    struct load load = {.endpoint = argv[2], .store = argv[5], .action = argv[7], .inflight = 1};
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
        } else if (strcmp(argv[i], "--in-flight") == 0 && i + 1 < argc) {
            load.inflight = (int)strtol(argv[++i], &end, 10);
            if (*end || load.inflight < 1 || load.inflight > 4096) fail("--in-flight", "not a number from 1 to 4096");
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
