// SPDX-License-Identifier: GPL-2.0
/*
 * tshmctl status, and unload (which on refusal says who holds what).
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tshmctl.h"

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* /sys/module/tshm/parameters/NAME, sorted by name. */
static void print_params(bool json)
{
	const char *dir = "/sys/module/" TSHM_MODNAME "/parameters";
	char *names[64], path[512], val[64], human[32];
	struct dirent *de;
	int n = 0, i;
	DIR *d;

	d = opendir(dir);
	while (d && (de = readdir(d)) && n < 64)
		if (de->d_name[0] != '.')
			names[n++] = strdup(de->d_name);
	if (d)
		closedir(d);
	qsort(names, n, sizeof(names[0]), name_cmp);
	if (!json)
		printf("parameters (%s):\n", dir);
	for (i = 0; i < n; i++) {
		FILE *f;

		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		f = fopen(path, "re");
		if (!f || !fgets(val, sizeof(val), f))
			snprintf(val, sizeof(val), "?");
		if (f)
			fclose(f);
		val[strcspn(val, "\n")] = 0;
		if (json) {
			printf("%s", i ? "," : "");
			json_str(stdout, names[i]);
			if (strspn(val, "0123456789") == strlen(val) && *val)
				printf(":%s", val);
			else {
				putchar(':');
				json_str(stdout, val);
			}
		} else {
			human[0] = 0;
			if (!strcmp(val, "0") && strstr(names[i], "max_"))
				snprintf(human, sizeof(human), "(no limit)");
			else if (strstr(names[i], "bytes") && *val != '?')
				fmt_bytes(human, sizeof(human),
					  strtoull(val, NULL, 10));
			printf("  %-20s %-20s %s\n", names[i], val, human);
		}
		free(names[i]);
	}
}

int cmd_status(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	char path[PATH_MAX], state[32], err[512], size[32], res[32];
	bool json = false;
	struct segtab t;
	struct stat st;
	long refcnt = 0;
	int c, ret;

	while ((c = getopt_long(argc, argv, "+:jh", lo, NULL)) != -1) {
		if (c == 'j') {
			json = true;
		} else if (c == 'h') {
			usage(stdout);
			return EXIT_OK;
		} else {
			return opt_error("status", c, argv);
		}
	}
	if (optind < argc)
		return bad_usage("status: unexpected argument '%s'", argv[optind]);
	if (kmod_status_info(path, sizeof(path), state, sizeof(state), &refcnt)) {
		if (json)
			printf("{\"loaded\":false}\n");
		else
			printf("%s: not loaded (load it with 'tshmctl load')\n",
			       TSHM_MODNAME);
		return EXIT_NOTLOADED;
	}
	ret = proc_read(&t, err, sizeof(err));
	if (ret)
		errmsg("%s", err);
	if (json) {
		printf("{\"loaded\":true,\"state\":");
		json_str(stdout, state);
		printf(",\"refcnt\":%ld,\"parameters\":{", refcnt);
		print_params(true);
		printf("}");
		if (!ret)
			printf(",\"total\":{\"segments\":%" PRIu64 ",\"size\":%"
			       PRIu64 ",\"resident\":%" PRIu64 "}",
			       t.total_segs, t.total_size, t.total_resident);
		printf("}\n");
	} else {
		printf("%s: loaded (%s), module refcount %ld%s%s\n", TSHM_MODNAME,
		       state, refcnt, *path ? ", file " : "", path);
		if (!stat(TSHM_DEVICE_PATH, &st))
			printf("device: %s mode %04o uid %u gid %u\n",
			       TSHM_DEVICE_PATH, st.st_mode & 07777, st.st_uid,
			       st.st_gid);
		else
			printf("device: %s missing (%s)\n", TSHM_DEVICE_PATH,
			       strerror(errno));
		print_params(false);
		if (!ret) {
			fmt_bytes(size, sizeof(size), t.total_size);
			fmt_bytes(res, sizeof(res), t.total_resident);
			printf("segments: %" PRIu64 ", %s, %s resident (%s)\n",
			       t.total_segs, size, res,
			       geteuid() ? "yours only; root sees every user's" :
			       "all users");
		}
	}
	if (!ret)
		segtab_free(&t);
	return ret == -EPROTO ? EXIT_FORMAT : ret ? EXIT_FAIL : EXIT_OK;
}

/* Why unloading was refused: every holder, context and grant we can see. */
static void explain_busy(void)
{
	char path[PATH_MAX], state[32], err[512], sz[32];
	struct holders_scan scan = { 0 };
	long refcnt = 0;
	struct segtab t;
	size_t i, j;

	if (!kmod_status_info(path, sizeof(path), state, sizeof(state), &refcnt))
		fprintf(stderr, "  module refcount: %ld\n", refcnt);
	if (proc_read(&t, err, sizeof(err))) {
		fprintf(stderr, "  (cannot read the segments: %s)\n", err);
		return;
	}
	holders_resolve(&t, 0, &scan);
	for (i = 0; i < t.n; i++) {
		struct seg *s = &t.segs[i];

		fmt_bytes(sz, sizeof(sz), s->size);
		fprintf(stderr, "  segment %" PRIu64 " \"%s\" (%s, %u holder%s, %u grant%s), created by pid %d (%s):\n",
			s->id, s->name, sz, s->holders,
			s->holders == 1 ? "" : "s", s->grants,
			s->grants == 1 ? "" : "s", s->pid, s->comm);
		if (!s->nr_held)
			fprintf(stderr, "      no holder found in the processes we may inspect\n");
		for (j = 0; j < s->nr_held; j++) {
			struct holder *h = &s->held[j];

			fmt_bytes(sz, sizeof(sz), h->mapped);
			fprintf(stderr, "      pid %d (%s):", h->pid, h->comm);
			if (h->nr_fds)
				fprintf(stderr, " has it open as fd %d%s", h->fds[0],
					h->nr_fds > 1 ? " and more" : "");
			if (h->maps)
				fprintf(stderr, "%s maps %s of it", h->nr_fds ? "," : "", sz);
			if (h->grants)
				fprintf(stderr, "%s owns %" PRIu64 " grant(s) through context fd %d",
					h->nr_fds || h->maps ? "," : "", h->grants, h->ctx_fd);
			fputc('\n', stderr);
		}
	}
	for (i = 0; i < scan.nr_ctx; i++)
		fprintf(stderr, "  context: pid %d (%s) has %s open as fd %d\n",
			scan.ctx[i].pid, scan.ctx[i].comm, TSHM_DEVICE_PATH,
			scan.ctx[i].fd);
	if (!t.n && !scan.nr_ctx)
		fprintf(stderr, "  no segment or open %s found%s; segments being freed, or a module that depends on tshm?\n",
			TSHM_DEVICE_PATH, scan.denied ? " in the processes we may inspect" : "");
	if (scan.denied)
		fprintf(stderr, "  (%u processes could not be inspected; run as root to see all)\n",
			scan.denied);
	fprintf(stderr, "Those processes must exit, or close and unmap what they hold; then unload again.\n");
	holders_scan_free(&scan);
	segtab_free(&t);
}

int cmd_unload(int argc, char **argv)
{
	int err;

	if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		usage(stdout);
		return EXIT_OK;
	}
	if (argc > 1)
		return bad_usage("unload: unexpected argument '%s'", argv[1]);
	err = kmod_do_unload();
	switch (err) {
	case 0:
		printf("%s: unloaded\n", TSHM_MODNAME);
		return EXIT_OK;
	case -ENOENT:
		errmsg("unload: %s is not loaded", TSHM_MODNAME);
		return EXIT_NOTLOADED;
	case -EPERM:
		errmsg("unload: permission denied: unloading a module needs root (CAP_SYS_MODULE)");
		return EXIT_FAIL;
	case -EWOULDBLOCK:
	case -EBUSY:
		errmsg("unload: refused, %s is in use:", TSHM_MODNAME);
		explain_busy();
		return EXIT_BUSY;
	default:
		errmsg("unload: %s", strerror(-err));
		return EXIT_FAIL;
	}
}

