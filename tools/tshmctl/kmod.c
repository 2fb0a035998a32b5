// SPDX-License-Identifier: GPL-2.0
/*
 * tshmctl: loading and unloading tshm.ko through libkmod.
 *
 * The module file is, in order: the one given with --module; one built
 * next to this binary for the running kernel (build/tools/tshmctl ->
 * build/kmod or build/kmod-K, whichever tshm.ko has a vermagic that names
 * uname -r: build/kmod is 6.1's, build/kmod-6.12 6.12's; the newest if
 * several); the one installed for the running kernel (modules.dep, as
 * modprobe finds it).  PARAM=VALUE arguments are checked against the
 * parameters the file declares (its modinfo), so a typo is an error
 * instead of the kernel's "unknown parameter ignored"; integer values take
 * K, M, G, T suffixes (powers of 1024).
 */
#include <errno.h>
#include <glob.h>
#include <libgen.h>
#include <libkmod.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <syslog.h>
#include <unistd.h>

#include "tshmctl.h"

#define MAX_PARMS	32

struct parm {
	char name[64];
	char type[16];
};

static struct kmod_ctx *ctx_new(void)
{
	struct kmod_ctx *ctx = kmod_new(NULL, NULL);

	if (!ctx) {
		errmsg("libkmod: cannot initialise (kmod_new failed)");
		return NULL;
	}
	/* Its errors are ours to explain; TSHMCTL_DEBUG=1 shows them. */
	kmod_set_log_priority(ctx, getenv("TSHMCTL_DEBUG") ? LOG_DEBUG : LOG_CRIT);
	kmod_load_resources(ctx);
	return ctx;
}

/* The parameters @mod declares: "parmtype" entries are "name:type". */
static int module_parms(struct kmod_module *mod, struct parm *p, int max)
{
	struct kmod_list *info = NULL, *l;
	int n = 0;

	if (kmod_module_get_info(mod, &info) < 0)
		return -1;
	kmod_list_foreach(l, info) {
		const char *key = kmod_module_info_get_key(l);
		const char *val = kmod_module_info_get_value(l);
		const char *colon = val ? strchr(val, ':') : NULL;

		if (strcmp(key, "parmtype") || !colon || n == max)
			continue;
		snprintf(p[n].name, sizeof(p[n].name), "%.*s",
			 (int)(colon - val), val);
		snprintf(p[n].type, sizeof(p[n].type), "%s", colon + 1);
		n++;
	}
	kmod_module_info_free_list(info);
	return n;
}

/* "8G" -> "8589934592"; false if not a number. */
static bool scale_number(const char *v, char *out, size_t len)
{
	unsigned long long n, mul = 1;
	char *end;

	if (*v < '0' || *v > '9')
		return false;
	errno = 0;
	n = strtoull(v, &end, 0);
	if (errno)
		return false;
	switch (*end) {
	case 'T': case 't': mul <<= 10; /* fall through */
	case 'G': case 'g': mul <<= 10; /* fall through */
	case 'M': case 'm': mul <<= 10; /* fall through */
	case 'K': case 'k': mul <<= 10; end++; break;
	case 0: break;
	default: return false;
	}
	if (*end == 'i' && end[1] == 'B')
		end += 2;
	else if (*end == 'B' && mul > 1)
		end++;
	if (*end || (n && mul > ULLONG_MAX / n))
		return false;
	snprintf(out, len, "%llu", n * mul);
	return true;
}

/* Joins and checks PARAM=VALUE arguments into @opts. */
static int build_options(struct kmod_module *mod, const char *path,
			 char **params, int nparams, char *opts, size_t len)
{
	struct parm parms[MAX_PARMS];
	int np, i, j;
	size_t o = 0;

	np = module_parms(mod, parms, MAX_PARMS);
	opts[0] = 0;
	for (i = 0; i < nparams; i++) {
		const char *eq = strchr(params[i], '=');
		char val[64];
		const char *type = NULL;
		int nl;

		if (!eq || eq == params[i]) {
			errmsg("load: '%s' is not PARAM=VALUE", params[i]);
			return EXIT_USAGE;
		}
		nl = eq - params[i];
		for (j = 0; j < np; j++)
			if ((int)strlen(parms[j].name) == nl &&
			    !strncmp(parms[j].name, params[i], nl))
				type = parms[j].type;
		if (np > 0 && !type) {
			errmsg("load: %s has no parameter '%.*s'; it has:",
			       path, nl, params[i]);
			for (j = 0; j < np; j++)
				fprintf(stderr, "  %s (%s)\n", parms[j].name,
					parms[j].type);
			return EXIT_USAGE;
		}
		snprintf(val, sizeof(val), "%s", eq + 1);
		if (type && (strstr(type, "int") || strstr(type, "long") ||
			     !strcmp(type, "short") || !strcmp(type, "ushort"))) {
			if (!scale_number(eq + 1, val, sizeof(val))) {
				errmsg("load: %.*s wants a number (%s), not '%s'",
				       nl, params[i], type, eq + 1);
				return EXIT_USAGE;
			}
		}
		if (o + nl + strlen(val) + 3 > len) {
			errmsg("load: parameters too long");
			return EXIT_USAGE;
		}
		o += snprintf(opts + o, len - o, "%s%.*s=%s", o ? " " : "",
			      nl, params[i], val);
	}
	return 0;
}

/* True if @mod was built for kernel @release: its vermagic is "RELEASE ...". */
static bool built_for(struct kmod_module *mod, const char *release)
{
	struct kmod_list *info = NULL, *l;
	size_t n = strlen(release);
	bool match = false;

	if (kmod_module_get_info(mod, &info) < 0)
		return false;
	kmod_list_foreach(l, info) {
		const char *val = kmod_module_info_get_value(l);

		if (!strcmp(kmod_module_info_get_key(l), "vermagic") && val &&
		    !strncmp(val, release, n) && val[n] == ' ')
			match = true;
	}
	kmod_module_info_free_list(info);
	return match;
}

/*
 * The newest tshm.ko built next to this binary (build/kmod, build/kmod-K)
 * for the running kernel, into @where and @mod; false if none.
 */
static bool find_built(struct kmod_ctx *ctx, struct kmod_module **mod,
		       char *where, size_t len)
{
	char exe[PATH_MAX], pat[PATH_MAX + 32], real[PATH_MAX];
	struct timespec newest = { 0 };
	bool found = false;
	struct utsname u;
	glob_t g;
	size_t i;
	ssize_t n;

	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0 || uname(&u))
		return false;
	exe[n] = 0;
	snprintf(pat, sizeof(pat), "%s/../kmod*/%s.ko", dirname(exe),
		 TSHM_MODNAME);
	if (glob(pat, 0, NULL, &g))
		return false;
	for (i = 0; i < g.gl_pathc; i++) {
		struct kmod_module *m = NULL;
		struct stat st;
		bool match;

		if (!realpath(g.gl_pathv[i], real) || stat(real, &st))
			continue;
		if (found && (st.st_mtim.tv_sec < newest.tv_sec ||
			      (st.st_mtim.tv_sec == newest.tv_sec &&
			       st.st_mtim.tv_nsec <= newest.tv_nsec)))
			continue;
		/* libkmod keeps one module per name: look, then let go. */
		if (kmod_module_new_from_path(ctx, real, &m))
			continue;
		match = built_for(m, u.release);
		kmod_module_unref(m);
		if (match) {
			snprintf(where, len, "%s", real);
			newest = st.st_mtim;
			found = true;
		}
	}
	globfree(&g);
	return found && !kmod_module_new_from_path(ctx, where, mod);
}

/* The module file to load: see the comment at the top. */
static int find_module(struct kmod_ctx *ctx, const char *path,
		       struct kmod_module **mod, char *where, size_t len)
{
	struct kmod_list *list = NULL, *l;

	if (path) {
		if (access(path, R_OK)) {
			errmsg("load: %s: %s", path, strerror(errno));
			return EXIT_FAIL;
		}
		snprintf(where, len, "%s", path);
		return kmod_module_new_from_path(ctx, path, mod) ? EXIT_FAIL : 0;
	}
	if (find_built(ctx, mod, where, len))
		return 0;
	if (kmod_module_new_from_lookup(ctx, TSHM_MODNAME, &list) >= 0) {
		kmod_list_foreach(l, list) {
			struct kmod_module *m = kmod_module_get_module(l);
			const char *p = kmod_module_get_path(m);

			if (p && !*mod) {
				snprintf(where, len, "%s", p);
				*mod = m;
			} else {
				kmod_module_unref(m);
			}
		}
		kmod_module_unref_list(list);
	}
	if (!*mod) {
		struct utsname u;

		uname(&u);
		errmsg("load: no %s.ko for kernel %s: none built next to tshmctl for it and none installed (make kmod KVER=..., make install, or --module FILE)",
		       TSHM_MODNAME, u.release);
		return EXIT_FAIL;
	}
	return 0;
}

/**
 * kmod_do_load() - tshmctl load
 * Return: an exit code.
 */
int kmod_do_load(const char *path, char **params, int nparams)
{
	struct kmod_module *mod = NULL;
	char where[PATH_MAX], opts[1024];
	struct kmod_ctx *ctx;
	struct utsname u;
	int ret, err;

	for (ret = 0; ret < nparams; ret++) {
		if (params[ret][0] == '=' || !strchr(params[ret], '=')) {
			errmsg("load: '%s' is not PARAM=VALUE", params[ret]);
			return EXIT_USAGE;
		}
	}
	ctx = ctx_new();
	if (!ctx)
		return EXIT_FAIL;
	ret = find_module(ctx, path, &mod, where, sizeof(where));
	if (ret)
		goto out;
	ret = build_options(mod, where, params, nparams, opts, sizeof(opts));
	if (ret)
		goto out;
	if (module_loaded()) {
		errmsg("load: %s is already loaded; unload it first to load it with other parameters (limits can also be changed under /sys/module/%s/parameters)",
		       TSHM_MODNAME, TSHM_MODNAME);
		ret = EXIT_BUSY;
		goto out;
	}
	err = kmod_module_insert_module(mod, 0, opts);
	uname(&u);
	switch (err) {
	case 0:
		printf("%s: loaded %s%s%s\n", TSHM_MODNAME, where,
		       *opts ? " " : "", opts);
		break;
	case -EEXIST:
		errmsg("load: %s is already loaded", TSHM_MODNAME);
		ret = EXIT_BUSY;
		break;
	case -EPERM:
		errmsg("load: permission denied: loading a module needs root (CAP_SYS_MODULE)");
		ret = EXIT_FAIL;
		break;
	case -ENOEXEC:
		errmsg("load: %s is not a module the running kernel %s accepts (built for another kernel?); see dmesg",
		       where, u.release);
		ret = EXIT_FAIL;
		break;
	case -EKEYREJECTED:
		errmsg("load: %s: signature rejected (Secure Boot?); see dmesg",
		       where);
		ret = EXIT_FAIL;
		break;
	default:
		errmsg("load: the kernel refused %s%s%s: %s; see dmesg", where,
		       *opts ? " with " : "", opts, strerror(-err));
		ret = EXIT_FAIL;
	}
out:
	kmod_module_unref(mod);
	kmod_unref(ctx);
	return ret;
}

/**
 * kmod_do_unload() - remove the module
 * Return: 0, -ENOENT if not loaded, or the kernel's -errno
 * (-EWOULDBLOCK/-EBUSY while in use, -EPERM).
 */
int kmod_do_unload(void)
{
	struct kmod_module *mod = NULL;
	struct kmod_ctx *ctx;
	int err;

	ctx = ctx_new();
	if (!ctx)
		return -ENOMEM;
	err = kmod_module_new_from_name(ctx, TSHM_MODNAME, &mod);
	if (!err && kmod_module_get_initstate(mod) < 0)
		err = -ENOENT;
	if (!err)
		err = kmod_module_remove_module(mod, KMOD_REMOVE_NOWAIT);
	kmod_module_unref(mod);
	kmod_unref(ctx);
	return err;
}

bool module_loaded(void)
{
	return !access("/sys/module/" TSHM_MODNAME "/initstate", F_OK);
}

/**
 * kmod_status_info() - state, reference count and file of the loaded module
 * Return: 0, or -ENOENT if not loaded.
 */
int kmod_status_info(char *path, size_t pathlen, char *state, size_t statelen,
		     long *refcnt)
{
	struct kmod_module *mod = NULL;
	struct kmod_ctx *ctx;
	const char *p;
	int st, ret = 0;

	ctx = ctx_new();
	if (!ctx)
		return -ENOMEM;
	if (kmod_module_new_from_name(ctx, TSHM_MODNAME, &mod)) {
		kmod_unref(ctx);
		return -ENOMEM;
	}
	st = kmod_module_get_initstate(mod);
	if (st < 0) {
		ret = -ENOENT;
	} else {
		snprintf(state, statelen, "%s", kmod_module_initstate_str(st));
		*refcnt = kmod_module_get_refcnt(mod);
		p = kmod_module_get_path(mod);
		snprintf(path, pathlen, "%s", p ? p : "");
	}
	kmod_module_unref(mod);
	kmod_unref(ctx);
	return ret;
}
