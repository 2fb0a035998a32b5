// SPDX-License-Identifier: GPL-2.0
/*
 * producer-consumer: the first libtshm program to read.
 *
 * A producer fills buffers from a pool and sends them through a queue to a
 * consumer process, which checks and releases them; each buffer goes back
 * to the pool by itself once the consumer lets go.  A plain segment carries
 * the consumer's report back.  No bytes of the buffers are copied.
 *
 *   build/examples/producer-consumer            consumer started by fork()
 *   build/examples/producer-consumer --exec     fork() + exec() of this
 *                                               program (the queue and the
 *                                               context cross the exec)
 *
 * TSHM_BACKEND=memfd forces the fallback; otherwise /dev/tshm is used when
 * the module is loaded.  Exits 0 when every buffer arrived intact and came
 * back.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tshm.h>

#define NBUFS		4		/* buffers in the pool */
#define BUF_SIZE	(1 << 20)	/* 1 MiB each */
#define NJOBS		16		/* messages the producer sends */

/* The bytes of a message; the buffer itself travels as a segment. */
struct job {
	uint32_t seq;
	uint32_t len;
	uint64_t sum;
};

/* What the consumer writes into the report segment. */
struct report {
	struct tshm_event done;
	uint32_t received;
	uint32_t bad;
	uint64_t bytes;
};

static uint64_t checksum(const unsigned char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;	/* FNV-1a */

	while (n--)
		h = (h ^ *p++) * 0x100000001b3ULL;
	return h;
}

static void fill(unsigned char *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761U + 1;
	size_t i;

	for (i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = x;
	}
}

#define TRY(call) do {							\
	int __r = (call);						\
	if (__r < 0) {							\
		fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__,	\
			#call, tshm_strerror(__r));			\
		exit(1);						\
	}								\
} while (0)

/*
 * The consumer: the first message brings the report segment, the others
 * one buffer each, until the producer closes the queue.
 */
static int consume(struct tshm_queue *q)
{
	struct tshm_seg *seg, *rseg = NULL;
	struct report *rep = NULL;
	struct job job;
	unsigned n;
	size_t len;
	int ret;

	for (;;) {
		n = 1;
		ret = tshm_queue_recv(q, &job, sizeof(job), &len, &seg, &n,
				      10000);
		if (ret == -EPIPE)	/* closed and drained: done */
			break;
		if (ret < 0) {
			fprintf(stderr, "consumer: recv: %s\n",
				tshm_strerror(ret));
			return 1;
		}
		if (!rseg) {
			/* The first message: the report segment. */
			rseg = seg;
			rep = tshm_seg_data(rseg);
			printf("consumer[%d]: got the report segment (id %" PRIu64 ")\n",
			       getpid(), tshm_seg_id(rseg));
			continue;
		}
		if (n != 1 || len != sizeof(job)) {
			rep->bad++;
			continue;
		}
		if (job.len > tshm_seg_size(seg) ||
		    checksum(tshm_seg_data(seg), job.len) != job.sum)
			rep->bad++;
		rep->received++;
		rep->bytes += job.len;
		if (job.seq < 3 || job.seq == NJOBS - 1)
			printf("consumer[%d]: job %u: %u bytes in segment %" PRIu64 ", checksum ok\n",
			       getpid(), job.seq, job.len, tshm_seg_id(seg));
		/* Done with it: the buffer goes back to the producer's pool. */
		tshm_seg_unref(seg);
	}
	if (!rep)
		return 1;
	printf("consumer[%d]: queue closed, %u jobs, %u bad\n", getpid(),
	       rep->received, rep->bad);
	tshm_event_set(&rep->done);
	tshm_seg_unref(rseg);
	return 0;
}

/* Started by exec: --consumer CTX_FD QUEUE_DESCRIPTOR */
static int consumer_main(char **argv)
{
	struct tshm_queue *q;
	struct tshm_ctx *ctx;
	int ret;

	TRY(tshm_ctx_open_fd(atoi(argv[2]), 0, &ctx));
	close(atoi(argv[2]));	/* the context keeps its own duplicate */
	TRY(tshm_queue_import(ctx, argv[3], &q));
	printf("consumer[%d]: exec'ed, imported %s\n", getpid(), argv[3]);
	ret = consume(q);
	tshm_queue_unref(q);
	tshm_ctx_close(ctx);
	return ret;
}

static pid_t start_consumer(struct tshm_ctx *ctx, struct tshm_queue *q,
			    const char *self, int use_exec)
{
	char desc[TSHM_QUEUE_DESC_MAX], cfd[16];
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(1);
	}
	if (pid > 0)
		return pid;
	if (!use_exec)
		_exit(consume(q));	/* the queue works as is after fork() */

	/* Hand the queue and the context over the exec. */
	if (tshm_queue_export(q, desc, sizeof(desc)) < 0 ||
	    fcntl(tshm_ctx_fd(ctx), F_SETFD, 0) < 0)
		_exit(1);
	snprintf(cfd, sizeof(cfd), "%d", tshm_ctx_fd(ctx));
	execl(self, self, "--consumer", cfd, desc, (char *)NULL);
	perror("exec");
	_exit(1);
}

int main(int argc, char **argv)
{
	struct tshm_seg *rseg, *buf, *bufs[NBUFS];
	struct tshm_queue *q;
	struct tshm_pool *pool;
	struct tshm_ctx *ctx;
	struct report *rep;
	struct job job;
	int use_exec, status, ok;
	unsigned i, back;
	pid_t pid;

	if (argc == 4 && !strcmp(argv[1], "--consumer"))
		return consumer_main(argv);
	use_exec = argc > 1 && !strcmp(argv[1], "--exec");
	setvbuf(stdout, NULL, _IOLBF, 0);

	/* 1. A context: the module when it is loaded, else memfd. */
	TRY(tshm_ctx_open(&ctx, 0));
	printf("producer[%d]: backend %s\n", getpid(), tshm_ctx_backend(ctx));

	/* 2. A queue (8 messages of at most one struct job) and a pool. */
	TRY(tshm_queue_create(ctx, 8, sizeof(struct job), &q));
	TRY(tshm_pool_create(ctx, NBUFS, BUF_SIZE, "example-buf", 0, &pool));
	printf("producer[%d]: pool of %u x %u KiB buffers, queue of 8\n",
	       getpid(), NBUFS, BUF_SIZE >> 10);

	/* 3. A plain segment for the consumer's report. */
	TRY(tshm_seg_create(ctx, sizeof(*rep), "example-report", 0, &rseg));
	rep = tshm_seg_data(rseg);
	TRY(tshm_event_init(&rep->done));

	/* 4. The consumer, by fork() or by fork() + exec(). */
	pid = start_consumer(ctx, q, "/proc/self/exe", use_exec);
	printf("producer[%d]: consumer %d started by %s\n", getpid(), pid,
	       use_exec ? "fork+exec" : "fork");

	/* 5. Send the report segment, then NJOBS buffers. */
	TRY(tshm_queue_send(q, NULL, 0, &rseg, 1, 10000));
	for (i = 0; i < NJOBS; i++) {
		/* Waits while all NBUFS buffers are out with the consumer. */
		TRY(tshm_pool_get(pool, 10000, &buf));
		job.seq = i;
		job.len = BUF_SIZE - i * 1000;
		fill(tshm_seg_data(buf), job.len, i);
		job.sum = checksum(tshm_seg_data(buf), job.len);
		if (i < 3 || i == NJOBS - 1)
			printf("producer[%d]: sending job %u in segment %" PRIu64 "\n",
			       getpid(), i, tshm_seg_id(buf));
		TRY(tshm_queue_send(q, &job, sizeof(job), &buf, 1, 10000));
		/* Our reference goes; the consumer still holds the buffer. */
		tshm_seg_unref(buf);
	}

	/* 6. Close: the consumer drains what is queued, then sees -EPIPE. */
	TRY(tshm_queue_close(q));
	TRY(tshm_event_wait(&rep->done, 10000));
	if (waitpid(pid, &status, 0) != pid) {
		perror("waitpid");
		return 1;
	}

	/*
	 * 7. Every buffer comes back once the consumer released it: take
	 * them all (holding each, so that the next get finds another one).
	 */
	for (back = 0; back < NBUFS; back++)
		if (tshm_pool_get(pool, 5000, &bufs[back]) < 0)
			break;
	for (i = 0; i < back; i++)
		tshm_seg_unref(bufs[i]);
	printf("producer[%d]: consumer exited %d; it got %u jobs (%" PRIu64 " bytes), %u bad; %u of %u buffers back\n",
	       getpid(), WIFEXITED(status) ? WEXITSTATUS(status) : -1,
	       rep->received, rep->bytes, rep->bad, back, NBUFS);
	ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
	     rep->received == NJOBS && !rep->bad && back == NBUFS;

	tshm_seg_unref(rseg);
	tshm_pool_destroy(pool);
	tshm_queue_unref(q);
	tshm_ctx_close(ctx);
	printf("%s\n", ok ? "OK" : "FAILED");
	return ok ? 0 : 1;
}
