/*
 * sse_fanout: Server-Sent-Events fan-out load client (single thread, epoll).
 *
 * 1. Opens N subscriber connections to GET <stream-path> (Accept:
 *    text/event-stream), at most --inflight not-yet-ready at a time.
 * 2. Waits until every subscriber has received its first event (the server's
 *    current value; --no-initial: until the 200 header block instead).
 * 3. Sends M publishes, POST <register-path> with a new 64-hex token each,
 *    spaced --interval-ms apart, and records for every subscriber when the
 *    event carrying that token arrived.
 * 4. Reports per publish and over all publishes: p50 / p99 / max of the delay
 *    from the POST to the event at each subscriber, subscribers that missed
 *    it, and the server's RSS (from /proc/PID/status, the pid and its
 *    descendants) before and after connecting the N subscribers.
 *
 * Two delays are measured for each delivery, both from the moment just before
 * the POST bytes are written (CLOCK_REALTIME):
 *   read : when this client's recvmsg() returned the bytes (what a consumer
 *          sees; includes this single-threaded client's own drain time),
 *   kern : the kernel's receive timestamp of those bytes (SO_TIMESTAMPNS;
 *          on loopback ~ when the server wrote them, i.e. the server's own
 *          fan-out time, without the client's queueing).
 *
 * An event is matched to a publish by the 64-hex token found in its data
 * line(s), so both `data: <hex>` (nchan) and `data: {"token":"<hex>"}` work.
 * Handles plain and chunked transfer encoding, CRLF or LF line ends.
 *
 * --listen-only (bench/scale.sh, issue 32 §3): several of these processes,
 * each under the per-process file limit, share one run; none publishes. The
 * publisher (bench/scale/publish.py) puts the publish time into the token:
 * <40 hex run prefix><16 hex CLOCK_REALTIME ns just before the POST><8 hex
 * publish index>, so that every process measures the delay on the one clock
 * from the same publish moment. The process connects its N subscribers,
 * writes --ready-file, then waits up to --drain-timeout s for M events at
 * every subscriber; missed = events a ready subscriber did not get. --raw FILE
 * writes every delivery's read and kernel delay (ms), one "read kern" line
 * each, so that the run's p50/p99/max are taken over all processes at once.
 *
 * Only loopback targets are accepted; every phase is bounded in time.
 * Build: make   Run: ./sse_fanout --help
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ options */
#define MAX_URLS 16
static const char *opt_urls[MAX_URLS] = {"http://127.0.0.1:8081"};
static int n_urls = 0; /* how many --url were given (0: the default above) */
static const char *opt_publish_url = NULL; /* default: the first --url */
static const char *opt_stream = "/token/stream";
static const char *opt_register = "/register";
static int opt_n = 100, opt_m = 5, opt_interval_ms = 100, opt_inflight = 256;
static double opt_ready_timeout = 60, opt_drain_timeout = 5, opt_max_seconds = 300;
static int opt_settle_ms = 500, opt_no_initial = 0, opt_seed = 0, opt_quiet = 0;
static int opt_rss_self_only = 0, opt_linger0 = 1;
static long opt_pid = 0;
static const char *opt_pidfile = NULL, *opt_json = NULL, *opt_label = NULL;
static int opt_listen_only = 0;
static const char *opt_run_prefix = NULL, *opt_ready_file = NULL, *opt_raw = NULL;

/* ------------------------------------------------------------------ targets */
/* one server address: subscribers are spread over sub_eps round-robin, publishes go to pub_ep */
typedef struct {
  struct sockaddr_storage addr;
  socklen_t len;
  char host_hdr[300];
  char *sub_req;
  size_t sub_req_len;
} endpoint_t;
static endpoint_t sub_eps[MAX_URLS], pub_ep;

/* ------------------------------------------------------------------ state */
enum { ST_IDLE, ST_CONNECTING, ST_HEADERS, ST_STREAM, ST_DEAD };
enum { CS_SIZE, CS_EXT, CS_DATA, CS_DATA_END, CS_DONE };

typedef struct {
  int fd;
  uint8_t state, ready, chunked, cstate, ev_has_data, was_ready;
  uint32_t crem;
  char *buf;
  uint32_t len, cap;
  int32_t ev_pub; /* -1: none yet, -2: data without our token, >=0 publish */
  uint32_t events;
} sub_t;

typedef struct {
  int fd;
  double t_pub;   /* realtime, just before the POST is written */
  double t_ack;   /* realtime, response complete (EOF) */
  int status;
  char rbuf[64];
  int rlen;
} pub_t;

static sub_t *subs;
static pub_t *pubs;
static float *d_read, *d_kern; /* [m * N + i], ms; < 0 = not received */
static char run_prefix[57];    /* 56 hex, shared by every publish token */
static int epfd;
static long n_ready, n_failed, n_pending, n_opened, n_dropped, n_non200, n_connfail;
static long n_dup, n_unknown, n_events;
static int publishing_started;
static long ready_at_publish;
static int first_status_bad;

#define TAG_PUB (1ULL << 40)

static double now_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static double now_real(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *msg) {
  fprintf(stderr, "sse_fanout: %s\n", msg);
  exit(1);
}

/* ------------------------------------------------------------------ RSS */
typedef struct { long vmrss, anon, file, shmem; int nproc; } rss_t;

static int read_status(long pid, rss_t *r) {
  char p[64], line[256];
  snprintf(p, sizeof p, "/proc/%ld/status", pid);
  FILE *f = fopen(p, "r");
  if (!f) return -1;
  while (fgets(line, sizeof line, f)) {
    long v;
    if (sscanf(line, "VmRSS: %ld", &v) == 1) r->vmrss += v;
    else if (sscanf(line, "RssAnon: %ld", &v) == 1) r->anon += v;
    else if (sscanf(line, "RssFile: %ld", &v) == 1) r->file += v;
    else if (sscanf(line, "RssShmem: %ld", &v) == 1) r->shmem += v;
  }
  fclose(f);
  r->nproc++;
  return 0;
}

static long parent_of(long pid) {
  char p[64], b[1024];
  snprintf(p, sizeof p, "/proc/%ld/stat", pid);
  FILE *f = fopen(p, "r");
  if (!f) return -1;
  size_t n = fread(b, 1, sizeof b - 1, f);
  fclose(f);
  b[n] = 0;
  char *rp = strrchr(b, ')');
  if (!rp) return -1;
  char st;
  long ppid;
  if (sscanf(rp + 1, " %c %ld", &st, &ppid) != 2) return -1;
  return ppid;
}

/* sum over pid and (unless --rss-self-only) all its descendants */
static rss_t read_rss(long pid) {
  rss_t r = {0, 0, 0, 0, 0};
  if (pid <= 0) return r;
  if (read_status(pid, &r) != 0) { r.nproc = 0; return r; }
  if (opt_rss_self_only) return r;
  long fam[4096];
  int nf = 1;
  fam[0] = pid;
  for (int pass = 0; pass < 8; pass++) { /* a few passes catch grandchildren */
    int added = 0;
    DIR *d = opendir("/proc");
    if (!d) break;
    struct dirent *e;
    while ((e = readdir(d))) {
      if (!isdigit((unsigned char)e->d_name[0])) continue;
      long p = atol(e->d_name), pp;
      int known = 0;
      for (int k = 0; k < nf; k++) if (fam[k] == p) { known = 1; break; }
      if (known) continue;
      pp = parent_of(p);
      for (int k = 0; k < nf; k++)
        if (fam[k] == pp && nf < 4096) { fam[nf++] = p; added = 1; read_status(p, &r); break; }
    }
    closedir(d);
    if (!added) break;
  }
  return r;
}

/* ------------------------------------------------------------------ helpers */
static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static void sub_close(sub_t *s, int dead_state) {
  if (s->fd >= 0) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    s->fd = -1;
  }
  s->state = (uint8_t)dead_state;
  free(s->buf);
  s->buf = NULL;
  s->len = s->cap = 0;
}

static void sub_fail(sub_t *s) {
  if (s->state == ST_DEAD) return;
  if (s->ready) { n_dropped++; n_ready--; s->ready = 0; }
  else { n_failed++; n_pending--; }
  sub_close(s, ST_DEAD);
}

static int buf_append(sub_t *s, const char *p, size_t n) {
  if (s->len + n + 1 > s->cap) {
    uint32_t nc = s->cap ? s->cap : 512;
    while (s->len + n + 1 > nc) nc *= 2;
    if (nc > (1u << 20)) return -1; /* runaway line / header block */
    char *nb = realloc(s->buf, nc);
    if (!nb) return -1;
    s->buf = nb;
    s->cap = nc;
  }
  memcpy(s->buf + s->len, p, n);
  s->len += (uint32_t)n;
  s->buf[s->len] = 0;
  return 0;
}

static void mark_ready(sub_t *s) {
  if (s->ready) return;
  s->ready = 1;
  s->was_ready = 1;
  n_ready++;
  n_pending--;
}

/* find the first run of >= 64 hex chars; map it to a publish index */
static int32_t match_token(const char *v, size_t n) {
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    if (isxdigit((unsigned char)v[i])) {
      if (++run == 64) {
        const char *t = v + i - 63;
        if (strncasecmp(t, run_prefix, opt_listen_only ? 40 : 56) != 0) return -2;
        char idx[9];
        memcpy(idx, t + 56, 8);
        idx[8] = 0;
        unsigned long k = strtoul(idx, NULL, 16);
        if (k >= (unsigned long)opt_m) return -2;
        if (opt_listen_only && pubs[k].t_pub == 0) { /* the publish time the token carries */
          char ns[17];
          memcpy(ns, t + 40, 16);
          ns[16] = 0;
          pubs[k].t_pub = (double)strtoull(ns, NULL, 16) / 1e9;
        }
        return (int32_t)k;
      }
    } else run = 0;
  }
  return -2;
}

static void dispatch_event(sub_t *s, int idx, double t_read, double t_kern) {
  if (!s->ev_has_data) return;
  s->events++;
  n_events++;
  int32_t k = s->ev_pub;
  if (!s->ready) {
    mark_ready(s); /* first event = current value on connect */
    if (k < 0 || !publishing_started) goto reset;
  }
  if (k >= 0) {
    size_t at = (size_t)k * opt_n + idx;
    if (d_read[at] < 0) {
      double tp = pubs[k].t_pub;
      d_read[at] = (float)((t_read - tp) * 1e3);
      d_kern[at] = t_kern > 0 ? (float)((t_kern - tp) * 1e3) : -1.0f;
      if (d_kern[at] < 0 && t_kern > 0) d_kern[at] = 0; /* clock granularity */
    } else n_dup++;
  } else n_unknown++;
reset:
  s->ev_has_data = 0;
  s->ev_pub = -1;
}

static void sse_line(sub_t *s, int idx, char *l, size_t n, double tr, double tk) {
  if (n && l[n - 1] == '\r') n--;
  if (n == 0) { dispatch_event(s, idx, tr, tk); return; }
  if (l[0] == ':') return; /* comment */
  size_t c = 0;
  while (c < n && l[c] != ':') c++;
  if (c == 4 && memcmp(l, "data", 4) == 0) {
    const char *v = l + (c < n ? c + 1 : n);
    size_t vn = n - (size_t)(v - l);
    if (vn && *v == ' ') { v++; vn--; }
    s->ev_has_data = 1;
    if (s->ev_pub < 0) s->ev_pub = match_token(v, vn);
  }
  /* id:, event:, retry: are not needed for the measurement */
}

/* feed decoded body bytes; returns -1 on overflow */
static int sse_feed(sub_t *s, int idx, const char *p, size_t n, double tr, double tk) {
  if (buf_append(s, p, n) < 0) return -1;
  size_t start = 0;
  for (size_t i = 0; i < s->len; i++) {
    if (s->buf[i] == '\n') {
      sse_line(s, idx, s->buf + start, i - start, tr, tk);
      start = i + 1;
    }
  }
  if (start) {
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= (uint32_t)start;
  }
  return 0;
}

/* chunked transfer decoding, streaming */
static int body_feed(sub_t *s, int idx, const char *p, size_t n, double tr, double tk) {
  if (!s->chunked) return sse_feed(s, idx, p, n, tr, tk);
  size_t i = 0;
  while (i < n) {
    char ch = p[i];
    switch (s->cstate) {
    case CS_SIZE:
      if (isxdigit((unsigned char)ch)) {
        s->crem = s->crem * 16 + (uint32_t)(isdigit((unsigned char)ch) ? ch - '0' : (tolower(ch) - 'a' + 10));
        i++;
      } else if (ch == '\n') {
        i++;
        s->cstate = s->crem ? CS_DATA : CS_DONE;
      } else { s->cstate = CS_EXT; i++; }
      break;
    case CS_EXT:
      if (ch == '\n') s->cstate = s->crem ? CS_DATA : CS_DONE;
      i++;
      break;
    case CS_DATA: {
      size_t take = n - i < s->crem ? n - i : s->crem;
      if (sse_feed(s, idx, p + i, take, tr, tk) < 0) return -1;
      i += take;
      s->crem -= (uint32_t)take;
      if (!s->crem) s->cstate = CS_DATA_END;
      break;
    }
    case CS_DATA_END:
      if (ch == '\n') { s->cstate = CS_SIZE; s->crem = 0; }
      i++;
      break;
    case CS_DONE:
    default:
      return -1; /* stream ended by the server */
    }
  }
  return 0;
}

static int headers_feed(sub_t *s, int idx, const char *p, size_t n, double tr, double tk) {
  if (buf_append(s, p, n) < 0) return -1;
  char *end = strstr(s->buf, "\r\n\r\n");
  size_t hl = 4;
  if (!end) { end = strstr(s->buf, "\n\n"); hl = 2; }
  if (!end) return s->len > 16384 ? -1 : 0;
  *end = 0;
  int status = 0;
  if (sscanf(s->buf, "HTTP/%*d.%*d %d", &status) != 1) status = -1;
  if (status != 200) {
    n_non200++;
    if (!first_status_bad) {
      first_status_bad = status;
      fprintf(stderr, "sse_fanout: subscriber got status %d; header block:\n%s\n", status, s->buf);
    }
    return -1;
  }
  for (char *q = s->buf; *q; q++) *q = (char)tolower((unsigned char)*q);
  s->chunked = strstr(s->buf, "transfer-encoding: chunked") != NULL;
  s->cstate = CS_SIZE;
  s->crem = 0;
  size_t body_off = (size_t)(end - s->buf) + hl;
  size_t rest = s->len - body_off;
  char tmp[16384];
  if (rest > sizeof tmp) return -1;
  memcpy(tmp, s->buf + body_off, rest);
  s->len = 0;
  s->state = ST_STREAM;
  if (opt_no_initial) mark_ready(s);
  return rest ? body_feed(s, idx, tmp, rest, tr, tk) : 0;
}

/* ------------------------------------------------------------------ sockets */
static int open_sub(int i) {
  sub_t *s = &subs[i];
  const endpoint_t *ep = &sub_eps[i % n_urls];
  int fd = socket(ep->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
  if (opt_linger0) { /* close with RST: no TIME_WAIT pile-up between runs */
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  }
  int r = connect(fd, (const struct sockaddr *)&ep->addr, ep->len);
  if (r < 0 && errno != EINPROGRESS) { close(fd); return -1; }
  s->fd = fd;
  s->state = ST_CONNECTING;
  s->ev_pub = -1;
  struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = (uint64_t)i};
  epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
  n_pending++;
  return 0;
}

static char rbuf[65536];

static void on_sub_event(int i, uint32_t evs) {
  sub_t *s = &subs[i];
  if (s->state == ST_CONNECTING) {
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err || (evs & (EPOLLERR | EPOLLHUP))) { n_connfail++; sub_fail(s); return; }
    const endpoint_t *ep = &sub_eps[i % n_urls];
    ssize_t w = send(s->fd, ep->sub_req, ep->sub_req_len, MSG_NOSIGNAL);
    if (w != (ssize_t)ep->sub_req_len) { n_connfail++; sub_fail(s); return; }
    s->state = ST_HEADERS;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = (uint64_t)i};
    epoll_ctl(epfd, EPOLL_CTL_MOD, s->fd, &ev);
    return;
  }
  char cbuf[CMSG_SPACE(sizeof(struct timespec)) * 2];
  struct iovec iov = {rbuf, sizeof rbuf};
  struct msghdr mh = {0};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = sizeof cbuf;
  ssize_t n = recvmsg(s->fd, &mh, 0);
  double tr = now_real();
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return;
    sub_fail(s);
    return;
  }
  if (n == 0) { sub_fail(s); return; }
  double tk = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
      struct timespec ts;
      memcpy(&ts, CMSG_DATA(c), sizeof ts);
      tk = ts.tv_sec + ts.tv_nsec * 1e-9;
    }
  int r = (s->state == ST_HEADERS) ? headers_feed(s, i, rbuf, (size_t)n, tr, tk)
                                   : body_feed(s, i, rbuf, (size_t)n, tr, tk);
  if (r < 0) sub_fail(s);
}

/* one POST on a new blocking connection (Connection: close); returns the fd
 * once the request is written, *t_pub = realtime just before the write */
static int send_post(const char *token, double *t_pub) {
  int fd = socket(pub_ep.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, (const struct sockaddr *)&pub_ep.addr, pub_ep.len) < 0) { close(fd); return -1; }
  char req[1024];
  int len = snprintf(req, sizeof req,
                     "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: text/plain\r\n"
                     "Content-Length: 64\r\nConnection: close\r\n\r\n%s",
                     opt_register, pub_ep.host_hdr, token);
  *t_pub = now_real();
  if (send(fd, req, (size_t)len, MSG_NOSIGNAL) != len) { close(fd); return -1; }
  return fd;
}

static int start_publish(int k, const char *token) {
  pub_t *p = &pubs[k];
  p->fd = -1;
  p->status = 0;
  p->rlen = 0;
  int fd = send_post(token, &p->t_pub);
  if (fd < 0) return -1;
  set_nonblock(fd);
  p->fd = fd;
  struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_PUB | (uint64_t)k};
  epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
  return 0;
}

static void on_pub_event(int k) {
  pub_t *p = &pubs[k];
  char b[4096];
  ssize_t n = read(p->fd, b, sizeof b);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) {
    int take = (int)n;
    if (take > (int)sizeof p->rbuf - 1 - p->rlen) take = (int)sizeof p->rbuf - 1 - p->rlen;
    memcpy(p->rbuf + p->rlen, b, (size_t)take);
    p->rlen += take;
    p->rbuf[p->rlen] = 0;
    if (!p->status) sscanf(p->rbuf, "HTTP/%*d.%*d %d", &p->status);
    return;
  }
  p->t_ack = now_real();
  epoll_ctl(epfd, EPOLL_CTL_DEL, p->fd, NULL);
  close(p->fd);
  p->fd = -1;
}

/* blocking seed publish (before any subscriber) */
static int seed_publish(void) {
  char tok[65];
  double t;
  for (int i = 0; i < 64; i++) tok[i] = "0123456789abcdef"[rand() & 15];
  tok[64] = 0;
  int fd = send_post(tok, &t);
  if (fd < 0) return -1;
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char b[1024];
  ssize_t n = read(fd, b, sizeof b - 1);
  int st = 0;
  if (n > 0) { b[n] = 0; sscanf(b, "HTTP/%*d.%*d %d", &st); }
  close(fd);
  if (!opt_quiet) fprintf(stderr, "seed publish: HTTP %d\n", st);
  return (st >= 200 && st < 300) ? 0 : -1;
}

/* ------------------------------------------------------------------ loop */
static struct epoll_event evbuf[4096];

static void pump(double until_mono) {
  double now = now_mono();
  int to = (int)((until_mono - now) * 1000.0);
  if (to < 0) to = 0;
  if (to > 50) to = 50;
  int ne = epoll_wait(epfd, evbuf, 4096, to);
  for (int e = 0; e < ne; e++) {
    uint64_t u = evbuf[e].data.u64;
    if (u & TAG_PUB) on_pub_event((int)(u & 0xffffffff));
    else on_sub_event((int)u, evbuf[e].events);
  }
}

/* ------------------------------------------------------------------ stats */
typedef struct { long n; double p50, p99, max, mean; } dist_t;

static int cmpf(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}
static dist_t dist(float *v, long n) {
  dist_t d = {n, NAN, NAN, NAN, NAN};
  if (n <= 0) return d;
  qsort(v, (size_t)n, sizeof *v, cmpf);
  double s = 0;
  for (long i = 0; i < n; i++) s += v[i];
  long i50 = (long)ceil(0.50 * n) - 1, i99 = (long)ceil(0.99 * n) - 1;
  if (i50 < 0) i50 = 0;
  if (i99 < 0) i99 = 0;
  d.p50 = v[i50];
  d.p99 = v[i99];
  d.max = v[n - 1];
  d.mean = s / n;
  return d;
}
/* collect non-negative entries of src[k] for k in [k0,k1) */
static long gather(float *src, int k0, int k1, float *out) {
  long c = 0;
  for (int k = k0; k < k1; k++)
    for (int i = 0; i < opt_n; i++) {
      float v = src[(size_t)k * opt_n + i];
      if (v >= 0) out[c++] = v;
    }
  return c;
}

static void jnum(FILE *f, const char *k, double v, int comma) {
  if (isnan(v)) fprintf(f, "\"%s\":null", k);
  else fprintf(f, "\"%s\":%.3f", k, v);
  if (comma) fputc(',', f);
}
static void jrss(FILE *f, const char *k, rss_t r, int comma) {
  fprintf(f, "\"%s\":{\"vmrss_kb\":%ld,\"anon_kb\":%ld,\"file_kb\":%ld,\"shmem_kb\":%ld,\"nproc\":%d}%s",
          k, r.vmrss, r.anon, r.file, r.shmem, r.nproc, comma ? "," : "");
}

/* ------------------------------------------------------------------ main */
static void usage(void) {
  fprintf(stderr,
    "usage: sse_fanout [options]\n"
    "  --url URL             base URL, loopback only (default http://127.0.0.1:8081); repeat it\n"
    "                        to spread the subscribers round-robin over several servers\n"
    "  --publish-url URL     where the publishes go (default: the first --url)\n"
    "  --stream-path P       SSE route (default /token/stream)\n"
    "  --register-path P     publish route, POST body = 64 hex (default /register)\n"
    "  -n N                  subscribers (default 100)\n"
    "  -m M                  publishes (default 5)\n"
    "  --interval-ms MS      spacing between publishes (default 100)\n"
    "  --inflight K          max subscribers connecting / not yet ready at once (default 256)\n"
    "  --no-initial          server sends no event on connect: ready = 200 headers received\n"
    "  --seed                POST one token before connecting (so there is a current value)\n"
    "  --pid PID | --pidfile FILE   server process for RSS (descendants included)\n"
    "  --rss-self-only       do not add descendants' RSS\n"
    "  --settle-ms MS        pause before reading RSS after connect / close (default 500)\n"
    "  --ready-timeout S     bound on the connect phase (default 60)\n"
    "  --drain-timeout S     wait for late events after the last publish (default 5)\n"
    "  --max-seconds S       hard bound on the whole run (default 300)\n"
    "  --no-rst              close subscribers with FIN instead of RST\n"
    "  --label NAME          label in the output\n"
    "  --json FILE           write the JSON summary to FILE ('-' = stdout)\n"
    "  --quiet               no progress lines\n"
    "  --listen-only         publish nothing; wait for M events from another process (bench/scale.sh)\n"
    "  --run-prefix HEX40    with --listen-only: the run's 40-hex token prefix\n"
    "  --ready-file FILE     write \"<ready> <connect seconds>\" there once connected\n"
    "  --raw FILE            write every delivery's \"read kern\" delays (ms), one per line\n");
}

static int parse_url(const char *u, endpoint_t *ep) {
  if (strncmp(u, "http://", 7) != 0) return -1;
  const char *h = u + 7, *e;
  char host[256];
  int port = 80;
  if (*h == '[') {
    e = strchr(h, ']');
    if (!e || e - h - 1 >= (long)sizeof host) return -1;
    memcpy(host, h + 1, (size_t)(e - h - 1));
    host[e - h - 1] = 0;
    e++;
  } else {
    e = h;
    while (*e && *e != ':' && *e != '/') e++;
    if (e - h >= (long)sizeof host) return -1;
    memcpy(host, h, (size_t)(e - h));
    host[e - h] = 0;
  }
  if (*e == ':') port = atoi(e + 1);
  if (!strcmp(host, "localhost")) strcpy(host, "127.0.0.1");
  memset(&ep->addr, 0, sizeof ep->addr);
  struct sockaddr_in *s4 = (struct sockaddr_in *)&ep->addr;
  struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ep->addr;
  if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
    if ((ntohl(s4->sin_addr.s_addr) >> 24) != 127) return -2;
    s4->sin_family = AF_INET;
    s4->sin_port = htons((uint16_t)port);
    ep->len = sizeof *s4;
    snprintf(ep->host_hdr, sizeof ep->host_hdr, "%s:%d", host, port);
  } else if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
    if (!IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr)) return -2;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons((uint16_t)port);
    ep->len = sizeof *s6;
    snprintf(ep->host_hdr, sizeof ep->host_hdr, "[%s]:%d", host, port);
  } else return -1;
  return 0;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && ++i)
    if (OPT("--url")) {
      if (n_urls == MAX_URLS) die("at most 16 --url");
      opt_urls[n_urls++] = v;
    }
    else if (OPT("--publish-url")) opt_publish_url = v;
    else if (OPT("--stream-path")) opt_stream = v;
    else if (OPT("--register-path")) opt_register = v;
    else if (OPT("-n")) opt_n = atoi(v);
    else if (OPT("-m")) opt_m = atoi(v);
    else if (OPT("--interval-ms")) opt_interval_ms = atoi(v);
    else if (OPT("--inflight")) opt_inflight = atoi(v);
    else if (OPT("--pid")) opt_pid = atol(v);
    else if (OPT("--pidfile")) opt_pidfile = v;
    else if (OPT("--settle-ms")) opt_settle_ms = atoi(v);
    else if (OPT("--ready-timeout")) opt_ready_timeout = atof(v);
    else if (OPT("--drain-timeout")) opt_drain_timeout = atof(v);
    else if (OPT("--max-seconds")) opt_max_seconds = atof(v);
    else if (OPT("--json")) opt_json = v;
    else if (OPT("--label")) opt_label = v;
    else if (!strcmp(a, "--no-initial")) opt_no_initial = 1;
    else if (!strcmp(a, "--seed")) opt_seed = 1;
    else if (!strcmp(a, "--rss-self-only")) opt_rss_self_only = 1;
    else if (!strcmp(a, "--no-rst")) opt_linger0 = 0;
    else if (!strcmp(a, "--quiet")) opt_quiet = 1;
    else if (!strcmp(a, "--listen-only")) opt_listen_only = 1;
    else if (OPT("--run-prefix")) opt_run_prefix = v;
    else if (OPT("--ready-file")) opt_ready_file = v;
    else if (OPT("--raw")) opt_raw = v;
    else { usage(); return 2; }
  }
  if (opt_n < 1 || opt_m < 1 || opt_m > 100000 || opt_inflight < 1) { usage(); return 2; }
  if (n_urls == 0) n_urls = 1;
  if (!opt_publish_url) opt_publish_url = opt_urls[0];
  for (int u = 0; u <= n_urls; u++) {
    int pu = u < n_urls ? parse_url(opt_urls[u], &sub_eps[u]) : parse_url(opt_publish_url, &pub_ep);
    if (pu == -2) die("refusing a non-loopback target");
    if (pu < 0) die("bad --url or --publish-url (want http://127.0.0.1:PORT or http://[::1]:PORT)");
  }
  if (opt_pidfile) {
    FILE *f = fopen(opt_pidfile, "r");
    if (!f || fscanf(f, "%ld", &opt_pid) != 1) die("cannot read --pidfile");
    fclose(f);
  }
  signal(SIGPIPE, SIG_IGN);

  /* file descriptors: N subscribers + publishers + slack */
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rlim_t need = (rlim_t)opt_n + 64;
  if (rl.rlim_cur < need) {
    rl.rlim_cur = rl.rlim_max < need ? rl.rlim_max : need;
    if (rl.rlim_max < need) { rl.rlim_max = need; rl.rlim_cur = need; }
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      getrlimit(RLIMIT_NOFILE, &rl);
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < need) {
      fprintf(stderr, "sse_fanout: need %lu fds, limit is %lu (raise ulimit -n)\n",
              (unsigned long)need, (unsigned long)rl.rlim_cur);
      return 1;
    }
  }

  for (int u = 0; u < n_urls; u++) {
    endpoint_t *ep = &sub_eps[u];
    size_t rl_len = strlen(opt_stream) + strlen(ep->host_hdr) + 200;
    ep->sub_req = malloc(rl_len);
    if (!ep->sub_req) die("out of memory");
    ep->sub_req_len = (size_t)snprintf(ep->sub_req, rl_len,
        "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n",
        opt_stream, ep->host_hdr);
  }

  subs = calloc((size_t)opt_n, sizeof *subs);
  pubs = calloc((size_t)opt_m, sizeof *pubs);
  d_read = malloc(sizeof(float) * (size_t)opt_n * opt_m);
  d_kern = malloc(sizeof(float) * (size_t)opt_n * opt_m);
  if (!subs || !pubs || !d_read || !d_kern) die("out of memory");
  for (size_t i = 0; i < (size_t)opt_n * opt_m; i++) d_read[i] = d_kern[i] = -1;
  for (int i = 0; i < opt_n; i++) subs[i].fd = -1;
  {
    unsigned seed = (unsigned)(now_real() * 1e6) ^ (unsigned)getpid();
    srand(seed);
    for (int i = 0; i < 56; i++) run_prefix[i] = "0123456789abcdef"[rand() & 15];
    run_prefix[56] = 0;
  }
  if (opt_listen_only) {
    if (!opt_run_prefix || strlen(opt_run_prefix) != 40) die("--listen-only needs --run-prefix (40 hex)");
    memcpy(run_prefix, opt_run_prefix, 40);
  }
  epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) die("epoll_create1");

  const char *label = opt_label ? opt_label : opt_urls[0];
  double t_begin = now_mono(), hard_end = t_begin + opt_max_seconds;
  int aborted = 0;

  if (opt_seed && seed_publish() < 0) die("seed publish failed");

  rss_t rss_before = read_rss(opt_pid);
  if (opt_pid && !rss_before.nproc) fprintf(stderr, "sse_fanout: warning: pid %ld not readable\n", opt_pid);

  /* ---- connect phase */
  double t_c0 = now_mono(), ready_end = t_c0 + opt_ready_timeout, t_all_ready = 0;
  long next_progress = 1000;
  while (n_ready + n_failed + n_dropped < opt_n) {
    while (n_opened < opt_n && n_pending < opt_inflight) {
      if (open_sub((int)n_opened) < 0) { n_failed++; n_connfail++; subs[n_opened].state = ST_DEAD; }
      n_opened++;
    }
    double now = now_mono();
    if (now > ready_end || now > hard_end) { aborted = now > hard_end; break; }
    pump(now + 0.05);
    if (!opt_quiet && n_ready >= next_progress) {
      fprintf(stderr, "  ready %ld/%d (%.1f s)\n", n_ready, opt_n, now_mono() - t_c0);
      next_progress += 1000;
    }
  }
  t_all_ready = now_mono();
  long ready_count = n_ready;
  if (!opt_quiet)
    fprintf(stderr, "connect phase: %ld/%d ready, %ld failed (%ld connect, %ld non-200) in %.2f s\n",
            n_ready, opt_n, n_failed, n_connfail, n_non200, t_all_ready - t_c0);

  /* settle, keep reading */
  double settle_end = now_mono() + opt_settle_ms / 1000.0;
  while (now_mono() < settle_end) pump(settle_end);
  rss_t rss_connected = read_rss(opt_pid);

  /* ---- publish phase */
  int n_published = 0;
  if (opt_ready_file) {
    FILE *rf = fopen(opt_ready_file, "w");
    if (!rf) die("cannot write --ready-file");
    fprintf(rf, "%ld %.6f\n", n_ready, t_all_ready - t_c0);
    fclose(rf);
  }
  if (opt_listen_only && n_ready > 0 && !aborted) {
    /* the publisher is another process: wait for its M events at every ready subscriber */
    publishing_started = 1;
    ready_at_publish = n_ready;
    n_published = opt_m;
    double drain_end = now_mono() + opt_drain_timeout;
    if (drain_end > hard_end) drain_end = hard_end;
    for (;;) {
      long got = 0;
      for (size_t at = 0; at < (size_t)opt_m * opt_n; at++) got += d_read[at] >= 0;
      if (got >= (long)opt_m * ready_at_publish || now_mono() >= drain_end) break;
      double step = now_mono() + 0.05;
      while (now_mono() < step) pump(step);
    }
  } else if (n_ready > 0 && !aborted) {
    publishing_started = 1;
    ready_at_publish = n_ready;
    double t0 = now_mono();
    for (int k = 0; k < opt_m; k++) {
      double due = t0 + k * (opt_interval_ms / 1000.0);
      while (now_mono() < due && now_mono() < hard_end) pump(due);
      if (now_mono() >= hard_end) { aborted = 1; break; }
      char tok[65];
      snprintf(tok, sizeof tok, "%s%08x", run_prefix, (unsigned)k);
      if (start_publish(k, tok) < 0) { fprintf(stderr, "sse_fanout: publish %d failed to send\n", k); continue; }
      n_published++;
    }
    /* drain: until every ready subscriber has every event, or timeout */
    double drain_end = now_mono() + opt_drain_timeout;
    if (drain_end > hard_end) drain_end = hard_end;
    for (;;) {
      long got = 0;
      for (int k = 0; k < opt_m; k++)
        for (int i = 0; i < opt_n; i++) got += d_read[(size_t)k * opt_n + i] >= 0;
      int pubs_open = 0;
      for (int k = 0; k < opt_m; k++) pubs_open += pubs[k].fd > 0;
      if (got >= (long)n_published * ready_at_publish && !pubs_open) break;
      if (now_mono() >= drain_end) break;
      double step = now_mono() + 0.05;
      while (now_mono() < step) pump(step);
    }
  }
  rss_t rss_published = read_rss(opt_pid);
  double t_pub_done = now_mono();

  /* ---- close everything */
  for (int i = 0; i < opt_n; i++)
    if (subs[i].fd >= 0) sub_close(&subs[i], ST_IDLE);
  for (int k = 0; k < opt_m; k++)
    if (pubs[k].fd > 0) { close(pubs[k].fd); pubs[k].fd = -1; }
  usleep((useconds_t)opt_settle_ms * 1000);
  rss_t rss_closed = read_rss(opt_pid);

  /* ---- stats */
  if (opt_raw) {
    FILE *rf = fopen(opt_raw, "w");
    if (!rf) die("cannot write --raw");
    for (size_t at = 0; at < (size_t)opt_m * opt_n; at++)
      if (d_read[at] >= 0) fprintf(rf, "%.4f %.4f\n", d_read[at], d_kern[at]);
    fclose(rf);
  }
  float *tmp = malloc(sizeof(float) * (size_t)opt_n * opt_m);
  long missed_total = 0, subs_missing_any = 0;
  for (int i = 0; i < opt_n; i++) {
    if (!subs[i].was_ready) continue;
    int miss = 0;
    for (int k = 0; k < n_published; k++) miss += d_read[(size_t)k * opt_n + i] < 0;
    missed_total += miss;
    subs_missing_any += miss > 0;
  }
  double per_sub_vm = ready_count ? (double)(rss_connected.vmrss - rss_before.vmrss) / ready_count : NAN;
  double per_sub_anon = ready_count ? (double)(rss_connected.anon - rss_before.anon) / ready_count : NAN;
  double per_sub_shm = ready_count ? (double)(rss_connected.shmem - rss_before.shmem) / ready_count : NAN;

  printf("== sse_fanout %s  N=%d M=%d interval=%d ms\n", label, opt_n, opt_m, opt_interval_ms);
  printf("subscribers: %ld ready of %d (failed %ld, dropped later %ld), connect phase %.2f s\n",
         ready_count, opt_n, n_failed, n_dropped, t_all_ready - t_c0);
  if (opt_pid)
    printf("server RSS (pid %ld + %d procs): before %ld kB, connected %ld kB, after publishes %ld kB, "
           "after close %ld kB\nRSS per subscriber: %.2f kB (anon %.2f kB, shmem %.2f kB)\n",
           opt_pid, rss_before.nproc - 1, rss_before.vmrss, rss_connected.vmrss,
           rss_published.vmrss, rss_closed.vmrss, per_sub_vm, per_sub_anon, per_sub_shm);
  printf("%-4s %-6s %-7s %-7s | %-28s | %-28s | %s\n", "pub", "status", "recv", "missed",
         "read delay ms p50/p99/max", "kernel delay ms p50/p99/max", "POST ack ms");
  for (int k = 0; k < n_published; k++) {
    long c = gather(d_read, k, k + 1, tmp);
    dist_t dr = dist(tmp, c);
    long ck = gather(d_kern, k, k + 1, tmp);
    dist_t dk = dist(tmp, ck);
    double ack = pubs[k].t_ack > 0 ? (pubs[k].t_ack - pubs[k].t_pub) * 1e3 : NAN;
    printf("%-4d %-6d %-7ld %-7ld | %8.2f %8.2f %9.2f | %8.2f %8.2f %9.2f | %.2f\n", k, pubs[k].status, c,
           ready_at_publish - c < 0 ? 0 : ready_at_publish - c, dr.p50, dr.p99, dr.max, dk.p50, dk.p99,
           dk.max, ack);
  }
  long ca = gather(d_read, 0, n_published, tmp);
  dist_t all_r = dist(tmp, ca);
  long cka = gather(d_kern, 0, n_published, tmp);
  dist_t all_k = dist(tmp, cka);
  printf("all  deliveries %ld of %ld | read p50 %.2f p99 %.2f max %.2f ms | kernel p50 %.2f p99 %.2f max %.2f ms\n",
         ca, (long)n_published * ready_at_publish, all_r.p50, all_r.p99, all_r.max, all_k.p50, all_k.p99,
         all_k.max);
  printf("missed events %ld (subscribers missing any: %ld), duplicates %ld, unmatched data events %ld%s\n",
         missed_total, subs_missing_any, n_dup, n_unknown, aborted ? "  [ABORTED: --max-seconds]" : "");

  if (opt_json) {
    FILE *f = strcmp(opt_json, "-") ? fopen(opt_json, "w") : stdout;
    if (!f) die("cannot write --json file");
    fprintf(f, "{\"label\":\"%s\",\"url\":\"%s\",\"urls\":%d,\"publish_url\":\"%s\",\"stream_path\":\"%s\","
               "\"register_path\":\"%s\",", label, opt_urls[0], n_urls, opt_publish_url, opt_stream, opt_register);
    fprintf(f, "\"n\":%d,\"m\":%d,\"interval_ms\":%d,\"ready\":%ld,\"failed\":%ld,\"dropped\":%ld,"
               "\"non200\":%ld,\"connect_s\":%.3f,\"published\":%d,\"aborted\":%s,",
            opt_n, opt_m, opt_interval_ms, ready_count, n_failed, n_dropped, n_non200, t_all_ready - t_c0,
            n_published, aborted ? "true" : "false");
    fprintf(f, "\"pid\":%ld,\"rss\":{", opt_pid);
    jrss(f, "before", rss_before, 1);
    jrss(f, "connected", rss_connected, 1);
    jrss(f, "published", rss_published, 1);
    jrss(f, "closed", rss_closed, 0);
    fprintf(f, "},");
    jnum(f, "rss_per_sub_kb", per_sub_vm, 1);
    jnum(f, "anon_per_sub_kb", per_sub_anon, 1);
    jnum(f, "shmem_per_sub_kb", per_sub_shm, 1);
    fprintf(f, "\"missed\":%ld,\"subs_missing_any\":%ld,\"duplicates\":%ld,\"unmatched\":%ld,", missed_total,
            subs_missing_any, n_dup, n_unknown);
    fprintf(f, "\"all\":{\"deliveries\":%ld,", ca);
    jnum(f, "read_p50_ms", all_r.p50, 1);
    jnum(f, "read_p99_ms", all_r.p99, 1);
    jnum(f, "read_max_ms", all_r.max, 1);
    jnum(f, "read_mean_ms", all_r.mean, 1);
    jnum(f, "kern_p50_ms", all_k.p50, 1);
    jnum(f, "kern_p99_ms", all_k.p99, 1);
    jnum(f, "kern_max_ms", all_k.max, 0);
    fprintf(f, "},\"publishes\":[");
    for (int k = 0; k < n_published; k++) {
      long c = gather(d_read, k, k + 1, tmp);
      dist_t dr = dist(tmp, c);
      long ck = gather(d_kern, k, k + 1, tmp);
      dist_t dk = dist(tmp, ck);
      fprintf(f, "%s{\"status\":%d,\"received\":%ld,\"missed\":%ld,", k ? "," : "", pubs[k].status, c,
              ready_at_publish - c < 0 ? 0 : ready_at_publish - c);
      jnum(f, "ack_ms", pubs[k].t_ack > 0 ? (pubs[k].t_ack - pubs[k].t_pub) * 1e3 : NAN, 1);
      jnum(f, "read_p50_ms", dr.p50, 1);
      jnum(f, "read_p99_ms", dr.p99, 1);
      jnum(f, "read_max_ms", dr.max, 1);
      jnum(f, "kern_p50_ms", dk.p50, 1);
      jnum(f, "kern_p99_ms", dk.p99, 1);
      jnum(f, "kern_max_ms", dk.max, 0);
      fprintf(f, "}");
    }
    fprintf(f, "],\"elapsed_s\":%.3f}\n", t_pub_done - t_begin);
    if (f != stdout) fclose(f);
  }
  free(tmp);
  int ok = !aborted && ready_count == opt_n && missed_total == 0 && n_published == opt_m;
  return ok ? 0 : 3;
}
