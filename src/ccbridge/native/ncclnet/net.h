/* Internals of the ccbridge NCCL net plugin (hidden; see plugin.c). */
#ifndef CCB_NET_INTERNAL_H
#define CCB_NET_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ncclnet.h"
#include "plan.h" /* RECORD_MIN, RECORD_MAX, record_plan */

#define KEY_BYTES 32
#define TAG_BYTES 16

/* logging through NCCL's logger (plugin.c); messages never carry key material */
void net_log(int warn, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* crypto.c: OpenSSL's libcrypto.so.3, loaded at run time (no build-time headers) */
int crypto_load(char *err, size_t errlen);
int crypto_random(void *buf, size_t n);
void crypto_sha256(const void *in, size_t n, uint8_t out[32]);
int crypto_hmac(const uint8_t *key, size_t keylen, const void *in, size_t n, uint8_t out[32]);
int crypto_hkdf(const uint8_t *ikm, size_t ikmlen, const uint8_t salt[32], const void *info, size_t infolen,
                uint8_t out[32]);
typedef struct gcm gcm;
gcm *gcm_new(void);
void gcm_free(gcm *g);
/* key g for sealing (enc) or opening: once per key, not per record (the key schedule and GHASH
 * tables cost about a microsecond) */
int gcm_key(gcm *g, const uint8_t key[32], int enc);
/* seal/open one record under g's key: in may equal out; open returns -1 on a bad tag */
int gcm_seal(gcm *g, const uint8_t iv[12], const void *aad, size_t aadlen, const void *in, size_t n, void *out,
             uint8_t tag[TAG_BYTES]);
int gcm_open(gcm *g, const uint8_t iv[12], const void *aad, size_t aadlen, const void *in, size_t n, void *out,
             const uint8_t tag[TAG_BYTES]);
void wipe(void *p, size_t n);

/* keys.c: the group secret, with ccbridge.secure's formats and rules */
const char *key_weakness(const uint8_t key[KEY_BYTES]);
/* 0 and the secret, or -1 and why in err (never quoting the material) */
int key_load(uint8_t key[KEY_BYTES], char *err, size_t errlen);


/* ---- connections (conn.c) ---- */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <netinet/in.h>

/* A connection is NLANES TCP sockets ("lanes"), each with its own worker
 * threads (T with CCBRIDGE_NET_TURNS, default 2; with turns off, two with
 * CCBRIDGE_NET_PIPELINE, one at 0), keys and record sequence: large
 * messages are cut into records spread over the lanes so that several
 * cores seal, send, receive and open at once; a message of one record
 * always takes lane 0. */
#define MAX_LANES 16
#define DEFAULT_LANES 8   /* CCBRIDGE_NET_LANES: 8 held >= 0.9 of tuned NCCL sockets on 2x H200, 4 did not */
#define DEFAULT_SPIN_US 50     /* CCBRIDGE_NET_SPIN_US, on machines of SPIN_CORES or more (else 0) */
#define SPIN_CORES 8
#define MAX_SPIN_US 100000
/* CCBRIDGE_NET_PIPELINE, read only with CCBRIDGE_NET_TURNS=0 or 1: records a lane holds between its
 * crypto and its socket stage (two threads a lane, so that sealing overlaps sending and reading overlaps
 * opening); 0: one thread a lane, each record sealed then sent (read then opened) in turn. Each
 * send-side slot is a record buffer. */
#define DEFAULT_PIPELINE 2
#define MAX_PIPELINE 8
/* CCBRIDGE_NET_TURNS (unset or empty: DEFAULT_TURNS; 0 or 1: off, the stages above): threads a lane
 * that take turns at its socket, each sealing (opening) the records it wrote (read) itself, with its
 * own key context, so that a record's bytes stay on the core that touched them and a lane's crypto
 * runs on up to TURNS cores at once (a lone one-record message stays with the thread that took it, the
 * turn kept: no wake-up) */
#define DEFAULT_TURNS 2 /* 4 MiB 0-19% faster than the pipeline, 8 B-64 KiB no slower: bench/RESULTS.md 2026-11-27 session 19 */
#define MAX_TURNS 8
#define HEADER_BYTES 40         /* le64 seq | le64 msg | le64 size | le64 offset | le32 n | le32 flags: the AAD */
#define SLOT_BYTES (HEADER_BYTES + RECORD_MAX + TAG_BYTES) /* one record on the wire, at most */
#define FLAG_FIN 1u             /* the sender's clean end of a lane (no payload) */
#define EARLY_WAIT_MS 20        /* recv: how long a record whose receive is not posted yet waits in the socket */
#define EPOCH_SHIFT 16          /* a fresh record key every 2^16 records of a lane (<= 32 GiB per key) */
#define MAX_REQS NCCL_NET_MAX_REQUESTS

typedef union { struct sockaddr sa; struct sockaddr_in in; struct sockaddr_in6 in6; } net_addr;

/* The listen handle NCCL carries to the connecting rank (<= 128 bytes), over
 * NCCL's bootstrap (plain TCP: nothing in it is trusted, the handshake checks
 * what matters). stage names the connecting side's own progress (connect is
 * called again with the same buffer until it returns a comm): a random token
 * that plugin.c looks up among its own half-made connections, never a
 * pointer, so a handle altered on the wire cannot point the plugin at memory
 * of the attacker's choosing; listen leaves it 0. */
typedef struct {
    uint32_t magic, version;
    uint8_t listen_id[16];   /* bound into every lane's handshake transcript */
    net_addr addr;           /* offset 24: where to connect */
    uint32_t nlanes;         /* the listener's choice; the connecting side follows it */
    uint64_t stage;          /* offset 56: a token of the connecting side, 0 for none */
} net_handle;

enum { REQ_FREE = 0, REQ_PENDING, REQ_DONE };
struct req;
/* a record between a lane's two stages: send: sealed in the lane's buffer slot, n bytes to write;
 * recv: read in place (dst, n payload bytes), to be opened */
typedef struct slot {
    struct req *r;
    uint8_t *dst;
    size_t n;
    uint64_t seq, size;
    uint32_t k;              /* records in r's message */
    uint8_t h[HEADER_BYTES], tag[TAG_BYTES];
} slot;
typedef struct req {
    struct comm *c;
    void *data;
    size_t size;             /* send: message length; recv: buffer capacity, then bytes received */
    uint64_t msg;            /* the message's number on this connection (sends and receives pair in order) */
    uint32_t k;              /* records in the message (send: known at post; recv: from the first record) */
    _Atomic uint32_t done;   /* records moved; the lane that moves the k-th completes the request */
    uint32_t first;          /* the lane of record 0 (recv: implied by the first record to arrive) */
    uint64_t total;          /* recv: the message's size, from its first record */
    _Atomic int state;
} req;

/* a record key context: the lane's key for one epoch, held by one thread at a time */
typedef struct keyed {
    gcm *g;
    uint64_t epoch;          /* g's epoch (UINT64_MAX: none yet) */
    int t;                   /* its index in its lane's kx */
} keyed;

typedef struct lane {
    struct comm *c;
    int fd, idx;             /* idx: the sender's lane number (recv: from its hello) */
    pthread_t th;
    int started;
    pthread_cond_t cv;       /* sender: new messages in q; recv: message `want` was posted */
    /* sender: the messages with records for this lane, in order (comm_post pushes under c->mu, the
     * lane pops without a lock): a lane never visits a message it has no share of */
    uint64_t q[MAX_REQS];
    _Atomic uint64_t qhead;
    uint64_t qtail;
    uint64_t want;           /* recv: the message this lane waits to see posted (a record came first) */
    int waiting;
    uint8_t next[HEADER_BYTES]; /* recv: the next record's header, `have` bytes of it read with the last payload */
    size_t have;
    /* recv, under c->mu: how the peer ended the lane (at a record boundary) and the last record it carried
     * (end_any 0: none), which bound the records it ever brought */
    int ended;
    uint64_t end_msg, end_j;
    int end_any;
    uint8_t data_key[KEY_BYTES];
    uint64_t seq;            /* the next record's number on this lane */
    keyed kx[MAX_TURNS];     /* kx[0]: the lane thread's (and its stage's); kx[t]: turn thread t's */
    uint8_t *buf;            /* sender: max(pipeline, turns, 1) sealed records (slot i at i * SLOT_BYTES); recv: a
                              * record that arrived before its receive was posted */
    /* the record in turn, carried from one record to the next (by the lane thread, or the turn's holder).
     * send: the message being cut (sk records, this lane's next one sj, srec bytes each); recv: the last
     * record's place (rany: one came) and the receive it belongs to once claimed (rcur) */
    req *sreq;
    uint32_t sj, sk;
    size_t srec;
    uint64_t rmsg, rj;
    uint32_t rk;
    int rany;
    req *rcur;
    /* the pipeline: the lane thread (sealing, or reading) fills ring[rhead % depth], the stage thread
     * (sending, or opening) drains ring[rtail % depth]; both under rmu. depth 0: no stage thread */
    int depth, staged, quit;
    pthread_t th2;
    pthread_mutex_t rmu;
    pthread_cond_t rcv;
    uint64_t rhead, rtail;
    slot ring[MAX_PIPELINE];
    /* turns (under rmu, waits on rcv): held: a thread has the socket; over: the lane ended (its threads
     * leave); wseq: send: the record whose turn it is to be written; opening: recv: records read and not
     * yet opened and counted; crew: threads running the lane (the lane thread one of them) */
    int turns, held, over, opening, crew;
    uint64_t wseq;
    pthread_t tth[MAX_TURNS];
} lane;

enum { LANE_OPEN = 0, LANE_FIN, LANE_EOF }; /* recv: a lane's end: none yet, a FIN, its socket's end */
enum { COMM_HANDSHAKE = 0, COMM_READY = 1, COMM_FAILED = -1 };
typedef struct comm {
    int sender, nlanes, accepted, ready, told;
    int ended;               /* recv: lanes the peer ended (a FIN, or its socket's end at a record boundary) */
    net_addr peer;           /* sender: where to connect */
    uint8_t secret[KEY_BYTES], listen_id[16], conn_id[16];
    int conn_id_set;
    uint32_t lanes_seen;     /* recv: the lane numbers whose handshakes passed */
    _Atomic int state;
    pthread_mutex_t mu;
    _Atomic int stop;
    req reqs[MAX_REQS];
    _Atomic uint64_t posted; /* messages posted (the next message's number) */
    uint64_t rr;             /* send: the lane of the next multi-record message's record 0 */
    int depth;               /* CCBRIDGE_NET_PIPELINE at comm_new */
    int turns;               /* CCBRIDGE_NET_TURNS at comm_new (0: off) */
    _Atomic int err;         /* ncclResult_t: the first failure, for every later request */
    char why[256];
    lane lanes[MAX_LANES];
} comm;

int lanes_wanted(void);
int pipeline_wanted(void);
int turns_wanted(void);
long spin_us_wanted(void); /* CCBRIDGE_NET_SPIN_US, as lane 0 reads it */
comm *comm_new(int sender, int nlanes, const net_addr *peer, const uint8_t secret[KEY_BYTES],
               const uint8_t listen_id[16]);
/* sender: start every lane (connect + handshake); recv: one accepted socket */
int comm_start_lanes(comm *c);
int comm_add_socket(comm *c, int fd);
void comm_close(comm *c);
req *comm_post(comm *c, void *data, size_t size);
/* the connection's failure (logged once), or ncclSuccess */
ncclResult_t comm_error(comm *c);
int handshake_timeout_s(void);
#endif
