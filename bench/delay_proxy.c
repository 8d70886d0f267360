/*
 * A TCP proxy that holds every chunk for a fixed time in each direction (issue 45's injected
 * network round trip). The kernel here has no netem qdisc, and a Python proxy rounds its holds up
 * to the event loop's timer tick and spends the benchmark's CPU; this one spends almost none.
 *
 *     cc -O2 -pthread -o bench/.delay_proxy bench/delay_proxy.c
 *     bench/.delay_proxy LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT DELAY_US
 *
 * Per connection and direction, a reader stamps each chunk with (arrival + DELAY_US) and queues it;
 * a writer sleeps until that instant (clock_nanosleep on CLOCK_MONOTONIC, absolute) and sends it.
 * Order is kept and a pipelined flight is not serialised: the reader keeps reading while the writer
 * waits. A round trip through the proxy is therefore 2 x DELAY_US more than without it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct chunk {
    struct chunk *next;
    struct timespec due;
    ssize_t len;
    char data[];
} chunk;

typedef struct {
    int from, to;
    long delay_ns;
    pthread_mutex_t lock;
    pthread_cond_t ready;
    chunk *head, *tail;
    int closed;
} pipe_t;

static void add_ns(struct timespec *t, long ns) {
    t->tv_nsec += ns;
    while (t->tv_nsec >= 1000000000L) {
        t->tv_nsec -= 1000000000L;
        t->tv_sec += 1;
    }
}

static void *reader(void *arg) {
    pipe_t *p = arg;
    char buf[65536];
    for (;;) {
        ssize_t n = read(p->from, buf, sizeof buf);
        chunk *c = NULL;
        if (n > 0) {
            c = malloc(sizeof(chunk) + (size_t)n);
            c->next = NULL;
            c->len = n;
            memcpy(c->data, buf, (size_t)n);
            clock_gettime(CLOCK_MONOTONIC, &c->due);
            add_ns(&c->due, p->delay_ns);
        }
        pthread_mutex_lock(&p->lock);
        if (c == NULL) {
            p->closed = 1;
        } else if (p->tail) {
            p->tail->next = c;
            p->tail = c;
        } else {
            p->head = p->tail = c;
        }
        pthread_cond_signal(&p->ready);
        pthread_mutex_unlock(&p->lock);
        if (c == NULL) return NULL;
    }
}

static void *writer(void *arg) {
    pipe_t *p = arg;
    prctl(PR_SET_TIMERSLACK, 1UL);  /* the default 50 us slack would be added to every hold */
    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (!p->head && !p->closed) pthread_cond_wait(&p->ready, &p->lock);
        chunk *c = p->head;
        if (c) {
            p->head = c->next;
            if (!p->head) p->tail = NULL;
        }
        pthread_mutex_unlock(&p->lock);
        if (!c) {
            shutdown(p->to, SHUT_WR);
            return NULL;
        }
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &c->due, NULL) != 0) {
        }
        ssize_t off = 0;
        while (off < c->len) {
            ssize_t w = write(p->to, c->data + off, (size_t)(c->len - off));
            if (w <= 0) break;
            off += w;
        }
        free(c);
    }
}

typedef struct {
    int client;
    struct sockaddr_in upstream;
    long delay_ns;
} conn_t;

static void start_pipe(pipe_t *p, int from, int to, long delay_ns, pthread_t th[2]) {
    memset(p, 0, sizeof *p);
    p->from = from;
    p->to = to;
    p->delay_ns = delay_ns;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->ready, NULL);
    pthread_create(&th[0], NULL, reader, p);
    pthread_create(&th[1], NULL, writer, p);
}

static void *serve(void *arg) {
    conn_t *c = arg;
    int one = 1;
    int up = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(up, (struct sockaddr *)&c->upstream, sizeof c->upstream) != 0) {
        perror("connect upstream");
        close(c->client);
        free(c);
        return NULL;
    }
    setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(c->client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pipe_t out, back;
    pthread_t t_out[2], t_back[2];
    start_pipe(&out, c->client, up, c->delay_ns, t_out);
    start_pipe(&back, up, c->client, c->delay_ns, t_back);
    for (int i = 0; i < 2; i++) {
        pthread_join(t_out[i], NULL);
        pthread_join(t_back[i], NULL);
    }
    close(up);
    close(c->client);
    free(c);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT DELAY_US\n", argv[0]);
        return 2;
    }
    struct sockaddr_in upstream = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
    if (inet_pton(AF_INET, argv[2], &upstream.sin_addr) != 1) {
        fprintf(stderr, "upstream host must be an IPv4 address\n");
        return 2;
    }
    long delay_ns = atol(argv[4]) * 1000L;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, 256) != 0) {
        perror("listen");
        return 1;
    }
    printf("listening on 127.0.0.1:%s, %ld us each way\n", argv[1], delay_ns / 1000);
    fflush(stdout);
    for (;;) {
        int client = accept(s, NULL, NULL);
        if (client < 0) continue;
        conn_t *c = malloc(sizeof *c);
        c->client = client;
        c->upstream = upstream;
        c->delay_ns = delay_ns;
        pthread_t t;
        pthread_create(&t, NULL, serve, c);
        pthread_detach(t);
    }
}
