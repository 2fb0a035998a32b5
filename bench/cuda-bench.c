// SPDX-License-Identifier: GPL-2.0
/*
 * cuda-bench: handoff latency of a device buffer from one process to
 * another, until the consumer holds a usable device pointer and said so.
 *
 *   tshm-vmm fresh   a new VMM buffer each time: send, receiver imports
 *                    (cuMemImportFromShareableHandle + map), releases, acks
 *   tshm-vmm cached  the same VMM buffer re-sent: the receiver's cache hit
 *   tshm-legacy      cudaMalloc memory wrapped (cuIpcGetMemHandle at wrap
 *                    time); the receiver opens and closes the IPC handle
 *   raw-ipc          cudaIpcGetMemHandle + a pipe + cudaIpcOpenMemHandle +
 *                    cudaIpcCloseMemHandle, the baseline
 *
 * Medians of -r REPS (default 20) round trips in microseconds; the
 * allocation itself is outside the timed part everywhere.  Without a GPU it
 * prints a kselftest-style SKIP line and exits 4.
 *
 *   cuda-bench [-r REPS] [-s MiB[,MiB...]]     (default 2,64,1024)
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tshm.h>
#include <tshm-cuda.h>

#include "bench-util.h"
#include "tk-kernels.h"

enum { OP_TSHM = 1, OP_IPC = 2, OP_QUIT = 3 };

struct ctl {
	uint32_t op;
	uint32_t pad;
	uint64_t size;
	unsigned char handle[64];
};

static struct tshm_cuda_chan *ch;
static struct tshm_queue *ctlq, *ackq;

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what, int err)
{
	fprintf(stderr, "cuda-bench: %s: %d %s [%s]\n", what, err,
		tshm_cuda_strerror(err), tshm_cuda_last_error());
	exit(1);
}

static int consumer(void)
{
	struct tshm_cuda *cu;
	struct tshm_cuda_buf *b;
	struct ctl c;
	size_t len;
	void *p;
	int ret;
	char ack = 1;

	ret = tshm_cuda_open(0, &cu);
	if (ret)
		die("consumer open", ret);
	tk_set_device(0);
	for (;;) {
		ret = tshm_queue_recv(ctlq, &c, sizeof(c), &len, NULL, NULL, -1);
		if (ret)
			die("ctl recv", ret);
		if (c.op == OP_QUIT)
			break;
		if (c.op == OP_TSHM) {
			ret = tshm_cuda_recv(ch, cu, &b, NULL, 0, NULL, 60000);
			if (ret)
				die("tshm_cuda_recv", ret);
			tshm_cuda_buf_unref(b);
		} else {
			ret = tk_ipc_open(c.handle, &p);
			if (ret) {
				fprintf(stderr, "cudaIpcOpenMemHandle: %s\n",
					tk_errstr(ret));
				exit(1);
			}
			tk_ipc_close(p);
		}
		ret = tshm_queue_send(ackq, &ack, 1, NULL, 0, -1);
		if (ret)
			die("ack", ret);
	}
	tshm_cuda_close(cu);
	return 0;
}

static void ctl_send(uint32_t op, uint64_t size, const void *handle)
{
	struct ctl c = { .op = op, .size = size };
	int ret;

	if (handle)
		memcpy(c.handle, handle, 64);
	ret = tshm_queue_send(ctlq, &c, sizeof(c), NULL, 0, -1);
	if (ret)
		die("ctl send", ret);
}

static void ack_wait(void)
{
	size_t len;
	char a;
	int ret = tshm_queue_recv(ackq, &a, 1, &len, NULL, NULL, 60000);

	if (ret)
		die("ack wait", ret);
}

/* One tshm handoff of @b: ctl first (untimed), then send .. ack. */
static double tshm_handoff(struct tshm_cuda_buf *b)
{
	double t0;
	int ret;

	ctl_send(OP_TSHM, 0, NULL);
	t0 = now_us();
	ret = tshm_cuda_send(ch, b, NULL, 0, 60000);
	if (ret)
		die("tshm_cuda_send", ret);
	ack_wait();
	return now_us() - t0;
}

int main(int argc, char **argv)
{
	size_t sizes[16] = { 2UL << 20, 64UL << 20, 1024UL << 20 };
	int nsizes = 3, reps = 20, opt, i, r, ret;
	struct tshm_cuda *cu;
	struct tshm_ctx *ctx;
	struct tshm_cuda_buf *b;
	double *t, res[4];
	int64_t gran;
	char dev[48];
	uint8_t u[16];
	pid_t pid;
	int pfd[2], st;

	while ((opt = getopt(argc, argv, "r:s:")) != -1) {
		if (opt == 'r') {
			reps = atoi(optarg);
		} else if (opt == 's') {
			char *s = optarg, *e;

			for (nsizes = 0; *s && nsizes < 16; s = *e ? e + 1 : e)
				sizes[nsizes++] = strtoul(s, &e, 10) << 20;
		} else {
			fprintf(stderr, "usage: %s [-r REPS] [-s MiB,...]\n",
				argv[0]);
			return 2;
		}
	}
	if (reps < 1)
		reps = 1;

	/* probe in a child: CUDA must not exist before fork() */
	if (pipe(pfd))
		return 1;
	pid = fork();
	if (pid == 0) {
		char msg[400] = "";

		ret = tshm_cuda_open(0, &cu);
		if (ret)
			snprintf(msg, sizeof(msg), "%s", tshm_cuda_last_error());
		else if (!tshm_cuda_vmm_supported(cu))
			snprintf(msg, sizeof(msg),
				 "GPU cannot export VMM memory as fds");
		if (write(pfd[1], msg, sizeof(msg)) < 0)
			_exit(1);
		_exit(0);
	} else {
		char msg[400] = "probe failed";

		close(pfd[1]);
		if (read(pfd[0], msg, sizeof(msg)) < 0)
			msg[0] = 0;
		waitpid(pid, NULL, 0);
		if (msg[0]) {
			printf("# SKIP cuda-bench: no usable GPU: %s\n", msg);
			return 4;
		}
	}

	ret = tshm_ctx_open(&ctx, 0);
	if (ret)
		die("ctx", ret);
	if ((ret = tshm_cuda_chan_create(ctx, 4, 0, &ch)) ||
	    (ret = tshm_queue_create(ctx, 4, sizeof(struct ctl), &ctlq)) ||
	    (ret = tshm_queue_create(ctx, 4, 1, &ackq)))
		die("queues", ret);
	pid = fork();
	if (pid == 0)
		_exit(consumer());

	ret = tshm_cuda_open(0, &cu);
	if (ret)
		die("open", ret);
	tk_set_device(0);
	gran = tshm_cuda_granularity(cu);
	tshm_cuda_uuid(cu, u);
	tshm_cuda_uuid_str(u, dev, sizeof(dev));
	printf("# cuda-bench: device 0 %s, backend %s, granularity %lld, "
	       "%d reps, median microseconds\n", dev, tshm_ctx_backend(ctx),
	       (long long)gran, reps);
	printf("%10s %16s %16s %14s %12s\n", "size", "tshm-vmm-fresh",
	       "tshm-vmm-cached", "tshm-legacy", "raw-ipc");
	t = calloc(reps, sizeof(*t));
	for (i = 0; i < nsizes; i++) {
		size_t size = (sizes[i] + gran - 1) / gran * gran;
		void *d;

		/* VMM, a new buffer each time */
		for (r = 0; r < reps; r++) {
			ret = tshm_cuda_buf_alloc(cu, ctx, size, &b);
			if (ret)
				die("alloc", ret);
			t[r] = tshm_handoff(b);
			tshm_cuda_buf_unref(b);
		}
		res[0] = median(t, reps);
		/* VMM, the same buffer: one import, then cache hits */
		ret = tshm_cuda_buf_alloc(cu, ctx, size, &b);
		if (ret)
			die("alloc", ret);
		tshm_handoff(b);	/* warm the cache */
		for (r = 0; r < reps; r++) {
			tshm_cuda_buf_wait_released(b, 60000);
			t[r] = tshm_handoff(b);
		}
		tshm_cuda_buf_wait_released(b, 60000);
		tshm_cuda_buf_unref(b);
		res[1] = median(t, reps);
		/* legacy: cudaMalloc + wrap */
		if ((ret = tk_malloc(&d, size))) {
			fprintf(stderr, "cudaMalloc: %s\n", tk_errstr(ret));
			return 1;
		}
		for (r = 0; r < reps; r++) {
			ret = tshm_cuda_buf_wrap(cu, ctx, d, size, &b);
			if (ret)
				die("wrap", ret);
			t[r] = tshm_handoff(b);
			tshm_cuda_buf_wait_released(b, 60000);
			tshm_cuda_buf_unref(b);
		}
		res[2] = median(t, reps);
		/* raw cudaIpc*MemHandle */
		for (r = 0; r < reps; r++) {
			unsigned char h[64];
			double t0 = now_us();

			ret = tk_ipc_get(d, h);
			if (ret) {
				fprintf(stderr, "cudaIpcGetMemHandle: %s\n",
					tk_errstr(ret));
				return 1;
			}
			ctl_send(OP_IPC, size, h);
			ack_wait();
			t[r] = now_us() - t0;
		}
		res[3] = median(t, reps);
		tk_free(d);
		printf("%8zuMi %16.1f %16.1f %14.1f %12.1f\n", size >> 20,
		       res[0], res[1], res[2], res[3]);
		fflush(stdout);
	}
	ctl_send(OP_QUIT, 0, NULL);
	waitpid(pid, &st, 0);
	free(t);
	tshm_cuda_close(cu);
	return WIFEXITED(st) && !WEXITSTATUS(st) ? 0 : 1;
}
