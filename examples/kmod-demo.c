// SPDX-License-Identifier: GPL-2.0
/*
 * kmod-demo: the module's job end to end, on the raw UAPI.
 *
 * A producer creates a segment, fills it, grants it to its context and
 * starts a consumer (a separate program image: fork + exec) that inherits
 * only the context fd.  The consumer attaches by id, checks the data and
 * keeps holding it.  The producer shows /proc/tshm, SIGKILLs the consumer
 * and sleeps in poll() until it is the sole holder again.
 *
 *   kmod-demo                      producer (starts the consumer itself)
 *   kmod-demo consume CTXFD ID READYFD   consumer
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/tshm.h>

#define DEVICE	"/dev/tshm"

#define SEG_SIZE (64UL << 20)

static void die(const char *what)
{
	fprintf(stderr, "kmod-demo: %s: %s\n", what, strerror(errno));
	exit(1);
}

static uint64_t checksum(const unsigned char *p, size_t n)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < n; i += 4096)
		sum = sum * 31 + p[i];
	return sum;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int consume(int ctx, uint64_t id, int ready)
{
	struct tshm_attach at = { .argsz = sizeof(at), .id = id };
	unsigned char *p;
	int fd;

	/* ATTACH returns the new segment fd. */
	fd = ioctl(ctx, TSHM_IOC_ATTACH, &at);
	if (fd < 0)
		die("ATTACH");
	p = mmap(NULL, at.size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		die("mmap");
	/* The mapping alone keeps this process a holder: no fd needed. */
	close(fd);
	printf("consumer %d: attached segment %" PRIu64 " by id (%llu MiB), checksum %016" PRIx64 "\n",
	       getpid(), id, (unsigned long long)at.size >> 20, checksum(p, at.size));
	fflush(stdout);
	/* Tell the producer, then hold the segment until killed. */
	if (write(ready, "", 1) != 1)
		die("write");
	close(ready);
	for (;;)
		pause();
	return 0;
}

int main(int argc, char **argv)
{
	struct tshm_create cr = { .argsz = sizeof(cr), .size = SEG_SIZE };
	struct tshm_grant gr = { .argsz = sizeof(gr), .count = 1 };
	struct tshm_info info = { .argsz = sizeof(info) };
	struct pollfd pfd;
	unsigned char *p;
	char arg_ctx[16], arg_id[32], arg_ready[16], byte;
	int ready[2];
	double t0;
	pid_t child;
	int ctx, status;

	if (argc == 5 && !strcmp(argv[1], "consume"))
		return consume(atoi(argv[2]), strtoull(argv[3], NULL, 0),
			       atoi(argv[4]));

	ctx = open(DEVICE, O_RDWR);	/* no O_CLOEXEC: the consumer inherits it */
	if (ctx < 0)
		die("open " DEVICE);
	strcpy(cr.name, "demo-frames");
	if (ioctl(ctx, TSHM_IOC_CREATE, &cr))
		die("CREATE");
	p = mmap(NULL, SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, cr.fd, 0);
	if (p == MAP_FAILED)
		die("mmap");
	for (size_t i = 0; i < SEG_SIZE; i++)
		p[i] = (unsigned char)(i * 7 + 1);
	printf("producer %d: created segment %" PRIu64 " \"%s\" (64 MiB), checksum %016" PRIx64 "\n",
	       getpid(), (uint64_t)cr.id, cr.name, checksum(p, SEG_SIZE));

	/* GRANT is issued on the receiving context, naming the segment. */
	gr.seg_fd = cr.fd;
	if (ioctl(ctx, TSHM_IOC_GRANT, &gr) < 0)
		die("GRANT");
	if (pipe(ready))
		die("pipe");
	snprintf(arg_ready, sizeof(arg_ready), "%d", ready[1]);
	snprintf(arg_ctx, sizeof(arg_ctx), "%d", ctx);
	snprintf(arg_id, sizeof(arg_id), "%" PRIu64, (uint64_t)cr.id);
	fflush(stdout);
	child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		close(ready[0]);
		execl("/proc/self/exe", argv[0], "consume", arg_ctx, arg_id,
		      arg_ready, (char *)NULL);
		die("exec");
	}

	/* Wait until the consumer holds it: two holders, no grant left. */
	close(ready[1]);
	if (read(ready[0], &byte, 1) != 1) {
		fprintf(stderr, "kmod-demo: the consumer failed\n");
		return 1;
	}
	if (ioctl(cr.fd, TSHM_IOC_INFO, &info))
		die("INFO");
	printf("producer: segment has %u holders, %u grants; /proc/tshm now:\n",
	       info.holders, info.grants);
	fflush(stdout);
	if (system("sed 's/^/    /' /proc/tshm") != 0)
		fprintf(stderr, "kmod-demo: cannot show /proc/tshm\n");

	printf("producer: SIGKILL consumer %d, then poll() until I am the sole holder\n", child);
	fflush(stdout);
	t0 = now_ms();
	kill(child, SIGKILL);
	pfd = (struct pollfd){ .fd = cr.fd, .events = POLLIN };
	if (poll(&pfd, 1, 10000) != 1)
		die("poll (no wake-up within 10 s)");
	printf("producer: poll woke after %.1f ms: consumer gone, I am the sole holder\n",
	       now_ms() - t0);
	waitpid(child, &status, 0);
	printf("producer: consumer ended by %s; producer exits, dropping the last holder\n",
	       WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "exit");
	return 0;
}
