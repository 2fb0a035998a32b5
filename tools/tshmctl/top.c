// SPDX-License-Identifier: GPL-2.0
/*
 * tshmctl top: the list, redrawn every second.  Plain terminal output
 * (home + clear, no curses), so it works over ssh and in any terminal;
 * q or Ctrl-C quits, s changes the sort order.  Output that is not a
 * terminal gets one list after another, without escapes.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "tshmctl.h"

static volatile sig_atomic_t stop;
static struct termios saved;
static bool raw;

static void on_signal(int sig)
{
	stop = 1;
}

static void restore_tty(void)
{
	if (raw)
		tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved);
	raw = false;
}

/* Keys without Enter, no echo; Ctrl-C still raises SIGINT. */
static void raw_tty(void)
{
	struct termios t;

	if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved))
		return;
	t = saved;
	t.c_lflag &= ~(ICANON | ECHO);
	t.c_cc[VMIN] = 1;
	t.c_cc[VTIME] = 0;
	if (!tcsetattr(STDIN_FILENO, TCSAFLUSH, &t)) {
		raw = true;
		atexit(restore_tty);
	}
}

static const char *const sort_names[] = {
	[SORT_ID] = "id", [SORT_SIZE] = "size", [SORT_AGE] = "age",
	[SORT_RESIDENT] = "resident",
};

static int draw(struct list_opts *o, bool tty)
{
	struct winsize ws = { 0 };
	struct segtab t;
	char clock[16];
	time_t now = time(NULL);
	int ret;

	if (tty && !ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) && ws.ws_row > 4) {
		o->width = ws.ws_col;
		o->rows = ws.ws_row - 3;	/* title, totals, cursor line */
	}
	strftime(clock, sizeof(clock), "%H:%M:%S", localtime(&now));
	fputs(tty ? "\033[H\033[2J" : "\n", stdout);
	printf("tshmctl top - %s - sorted by %s - q quits, s sorts\n", clock,
	       sort_names[o->sort]);
	ret = load_list(&t, o, true);
	if (ret == EXIT_NOTLOADED) {
		printf("tshm is not loaded (waiting for it)\n");
		ret = 0;
	} else if (!ret) {
		print_table(stdout, &t, o);
		segtab_free(&t);
	}
	fflush(stdout);
	return ret;
}

/**
 * cmd_top() - tshmctl top
 * @delay: seconds between refreshes
 * @iterations: stop after this many (0: until q or a signal)
 * Return: an exit code.
 */
int cmd_top(struct list_opts *o, double delay, long iterations)
{
	struct sigaction sa = { .sa_handler = on_signal };
	bool tty = isatty(STDOUT_FILENO), keys = true;
	struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
	long n = 0;
	int ret = 0;

	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	raw_tty();
	while (!stop) {
		ret = draw(o, tty);
		if (ret || (iterations && ++n >= iterations))
			break;
		for (int left = delay * 1000; left > 0 && !stop;) {
			struct timespec a, b;
			char c;
			int r;

			clock_gettime(CLOCK_MONOTONIC, &a);
			r = poll(&pfd, keys ? 1 : 0, left);
			clock_gettime(CLOCK_MONOTONIC, &b);
			left -= (b.tv_sec - a.tv_sec) * 1000 +
				(b.tv_nsec - a.tv_nsec) / 1000000;
			if (r <= 0)
				continue;
			if (read(STDIN_FILENO, &c, 1) != 1) {
				keys = false;	/* EOF: only the clock now */
				continue;
			}
			if (c == 'q' || c == 'Q' || c == 3)
				stop = 1;
			else if (c == 's') {
				o->sort = (o->sort + 1) % 4;
				break;
			}
		}
	}
	restore_tty();
	if (tty && !ret)
		fputs("\n", stdout);
	return ret;
}
