// SPDX-License-Identifier: GPL-2.0
/*
 * tshmctl: load, unload and audit tshm.ko.  See tshmctl(8).
 *
 *   tshmctl load [--module FILE] [PARAM=VALUE...]
 *   tshmctl unload
 *   tshmctl status [--json]
 *   tshmctl list [--user U] [--pid P] [--sort KEY] [--holders] [--json]
 *   tshmctl top [--user U] [--pid P] [--sort KEY] [--holders] [-d S] [-n N]
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tshmctl.h"

const char *prog = "tshmctl";

void errmsg(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

void usage(FILE *f)
{
	fprintf(f,
"usage: tshmctl COMMAND [OPTIONS]\n"
"  load [--module FILE] [PARAM=VALUE...]   load tshm.ko through libkmod\n"
"  unload                                  remove it; says who holds what if in use\n"
"  status [--json]                         loaded or not, limits, totals\n"
"  list [OPTIONS]                          the segments in /proc/tshm\n"
"      --user USER     created by USER (name or uid)\n"
"      --pid PID       created or held by PID\n"
"      --sort KEY      id (default), size, resident or age (largest, oldest first)\n"
"      --holders       find the processes holding each segment (fds, mappings, grants)\n"
"      --json          JSON for scripts\n"
"  top [list OPTIONS but --json] [-d SECONDS] [-n ITERATIONS]\n"
"                                          the list, every second; q quits\n"
"  help, --help; version, --version\n"
"exit status: 0 ok, 1 failed, 2 usage, 3 not loaded, 4 busy or already loaded,\n"
"5 /proc/tshm in an unknown format; see tshmctl(8)\n");
}

int bad_usage(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'tshmctl --help'.\n");
	return EXIT_USAGE;
}

/* getopt's error, in our words: run with opterr = 0 and ":" first. */
int opt_error(const char *cmd, int c, char **argv)
{
	const char *arg = argv[optind - 1];

	if (c == ':')
		return bad_usage("%s: option '%s' needs a value", cmd, arg);
	if (optopt && optopt != '?')
		return bad_usage("%s: unknown option '-%c'", cmd, optopt);
	return bad_usage("%s: unknown option '%s'", cmd, arg);
}

/**
 * load_list() - /proc/tshm, holders resolved if asked, filtered and sorted
 * @quiet_notes: do not report "not loaded" nor uninspectable processes
 * Return: an exit code; on 0, @t is to be freed with segtab_free().
 */
int load_list(struct segtab *t, const struct list_opts *o, bool quiet_notes)
{
	struct holders_scan scan;
	char err[512];
	int ret;

	ret = proc_read(t, err, sizeof(err));
	if (ret == -ENOENT && !getenv("TSHMCTL_PROC")) {
		if (!quiet_notes)
			errmsg("tshm is not loaded (no /proc/tshm); load it with 'tshmctl load'");
		return EXIT_NOTLOADED;
	}
	if (ret) {
		errmsg("%s", err);
		return ret == -EPROTO ? EXIT_FORMAT : EXIT_FAIL;
	}
	if (o->holders || o->pid) {
		ret = holders_resolve(t, o->holders ? 0 : o->pid, &scan);
		if (ret) {
			errmsg("cannot walk /proc: %s", strerror(-ret));
			segtab_free(t);
			return EXIT_FAIL;
		}
		if (scan.denied && o->holders && !quiet_notes)
			errmsg("note: %u processes could not be inspected (not yours); holders may be missing, run as root to see all",
			       scan.denied);
		holders_scan_free(&scan);
	}
	segtab_filter_sort(t, o);
	return 0;
}

static int parse_user(const char *s, uint32_t *uid)
{
	struct passwd *pw = getpwnam(s);
	char *end;
	unsigned long v;

	if (pw) {
		*uid = pw->pw_uid;
		return 0;
	}
	errno = 0;
	v = strtoul(s, &end, 10);
	if (*s < '0' || *s > '9' || *end || errno || v > UINT32_MAX)
		return -1;
	*uid = v;
	return 0;
}

/* Options common to list and top; returns 0, or an exit code. */
static int list_options(int argc, char **argv, struct list_opts *o,
			bool top, double *delay, long *iterations)
{
	static const struct option lo[] = {
		{ "user", required_argument, NULL, 'u' },
		{ "pid", required_argument, NULL, 'p' },
		{ "sort", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "holders", no_argument, NULL, 'H' },
		{ "delay", required_argument, NULL, 'd' },
		{ "iterations", required_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	char *end;
	int c;

	while ((c = getopt_long(argc, argv, top ? "+:u:p:s:Hd:n:h" : "+:u:p:s:jHh",
				lo, NULL)) != -1) {
		switch (c) {
		case 'u':
			if (parse_user(optarg, &o->uid))
				return bad_usage("--user: no user '%s'", optarg);
			o->have_uid = true;
			break;
		case 'p':
			errno = 0;
			o->pid = strtol(optarg, &end, 10);
			if (*end || errno || o->pid <= 0)
				return bad_usage("--pid: '%s' is not a process id",
						 optarg);
			break;
		case 's':
			if (!strcmp(optarg, "id"))
				o->sort = SORT_ID;
			else if (!strcmp(optarg, "size"))
				o->sort = SORT_SIZE;
			else if (!strcmp(optarg, "age"))
				o->sort = SORT_AGE;
			else if (!strcmp(optarg, "resident"))
				o->sort = SORT_RESIDENT;
			else
				return bad_usage("--sort: '%s' is not id, size, resident or age",
						 optarg);
			break;
		case 'j':
			if (top)
				return bad_usage("top: --json is for list");
			o->json = true;
			break;
		case 'H':
			o->holders = true;
			break;
		case 'd':
			*delay = strtod(optarg, &end);
			if (*end || !(*delay >= 0.1 && *delay <= 3600))
				return bad_usage("--delay: '%s' is not 0.1 to 3600 seconds",
						 optarg);
			break;
		case 'n':
			errno = 0;
			*iterations = strtol(optarg, &end, 10);
			if (*end || errno || *iterations <= 0)
				return bad_usage("--iterations: '%s' is not a positive number",
						 optarg);
			break;
		case 'h':
			usage(stdout);
			exit(EXIT_OK);
		default:
			return opt_error(top ? "top" : "list", c, argv);
		}
	}
	if (optind < argc)
		return bad_usage("%s: unexpected argument '%s'",
				 top ? "top" : "list", argv[optind]);
	return 0;
}

static int cmd_list(int argc, char **argv)
{
	struct list_opts o = { 0 };
	struct segtab t;
	int ret;

	ret = list_options(argc, argv, &o, false, NULL, NULL);
	if (ret)
		return ret;
	ret = load_list(&t, &o, false);
	if (ret)
		return ret;
	if (o.json)
		print_json(stdout, &t, &o);
	else
		print_table(stdout, &t, &o);
	segtab_free(&t);
	return fflush(stdout) ? EXIT_FAIL : EXIT_OK;
}

static int cmd_top_args(int argc, char **argv)
{
	struct list_opts o = { .sort = SORT_RESIDENT };
	double delay = 1;
	long iterations = 0;
	int ret;

	ret = list_options(argc, argv, &o, true, &delay, &iterations);
	return ret ? ret : cmd_top(&o, delay, iterations);
}

static int cmd_load(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "module", required_argument, NULL, 'm' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	const char *path = NULL;
	int c;

	while ((c = getopt_long(argc, argv, "+:m:h", lo, NULL)) != -1) {
		if (c == 'm') {
			path = optarg;
		} else if (c == 'h') {
			usage(stdout);
			return EXIT_OK;
		} else {
			return opt_error("load", c, argv);
		}
	}
	return kmod_do_load(path, argv + optind, argc - optind);
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} cmds[] = {
		{ "load", cmd_load }, { "unload", cmd_unload },
		{ "status", cmd_status }, { "list", cmd_list },
		{ "ls", cmd_list }, { "top", cmd_top_args },
	};
	size_t i;

	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
	    !strcmp(argv[1], "help")) {
		usage(stdout);
		return EXIT_OK;
	}
	if (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version") ||
	    !strcmp(argv[1], "version")) {
		printf("tshmctl %s\n", TSHMCTL_VERSION);
		return EXIT_OK;
	}
	for (i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		if (!strcmp(argv[1], cmds[i].name)) {
			optind = 1;
			opterr = 0;
			return cmds[i].fn(argc - 1, argv + 1);
		}
	}
	if (argv[1][0] == '-')
		return bad_usage("unknown option '%s'", argv[1]);
	return bad_usage("unknown command '%s'", argv[1]);
}
