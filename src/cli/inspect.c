/*
 * inspect.c - `smclo run` looks at the program before starting it and says
 * so when the preload library cannot work in it.
 *
 * smclo works by LD_PRELOAD, so a program is out of its reach when the
 * dynamic loader never runs (a static executable), when its sockets bypass
 * libc (Go's net package makes raw system calls), when the loader ignores
 * LD_PRELOAD (set-user-ID, set-group-ID or file capabilities gained at exec:
 * secure-execution mode), or when something between smclo and the program
 * drops the variable (sudo, pkexec, env -i).  The program still runs, on
 * plain TCP; one line on stderr names the reason, so nobody has to find out
 * from `smclo stat` that nothing was accelerated.
 *
 * Everything here is advice: whatever cannot be read is not warned about,
 * and the program is started the same way in every case.  Launchers are
 * followed as far as they can be read: a `#!` script's interpreter, and the
 * program `env` starts (argument vector or `#!/usr/bin/env ...` line).
 */
#include "cli.h"

#include "elfinfo.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#define CHAIN_MAX 4             /* launchers followed, as the kernel's #! depth */
#define SHEBANG_MAX 256         /* the kernel reads this much of a #! line */

static const char not_reached[] = "; it runs on plain TCP, not accelerated";

/* The chain of programs followed so far ("./launch -> /usr/bin/env"), named
 * in the warning so the reader sees which link is the problem. */
struct chain {
	char who[3 * PATH_MAX];
	int depth;
};

static void warn(const struct chain *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void warn(const struct chain *c, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "smclo: warning: %s: ", c->who);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", not_reached);
}

static void chain_add(struct chain *c, const char *name)
{
	size_t n = strlen(c->who);

	snprintf(c->who + n, sizeof(c->who) - n, "%s%s", n ? " -> " : "", name);
	c->depth++;
}

/*
 * Find @file as execvp() would: a name with a slash as is, otherwise the
 * first executable regular file of that name in $PATH (glibc's default
 * when PATH is unset).  0 and the path in @out, or -1.
 */
int resolve_program(const char *file, char *out, size_t len)
{
	const char *path = getenv("PATH");
	struct stat st;

	if (strchr(file, '/')) {
		snprintf(out, len, "%s", file);
		return access(file, F_OK) == 0 ? 0 : -1;
	}
	if (!path)
		path = "/bin:/usr/bin";
	while (*file) {
		const char *end = strchrnul(path, ':');
		int n = (int)(end - path);

		/* an empty entry is the current directory */
		snprintf(out, len, "%.*s%s%s", n, path, n ? "/" : "", file);
		if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0)
			return 0;
		if (!*end)
			break;
		path = end + 1;
	}
	errno = ENOENT;
	return -1;
}

/* "name (uid N)" of a user, or "uid N" alone. */
static const char *user_name(uid_t uid, char *out, size_t len)
{
	struct passwd pw, *found = NULL;
	char buf[1024];

	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found)
		snprintf(out, len, "%s (uid %u)", found->pw_name, (unsigned)uid);
	else
		snprintf(out, len, "uid %u", (unsigned)uid);
	return out;
}

/* "name (gid N)" of a group, or "gid N" alone. */
static const char *group_name(gid_t gid, char *out, size_t len)
{
	struct group gr, *found = NULL;
	char buf[1024];

	if (getgrgid_r(gid, &gr, buf, sizeof(buf), &found) == 0 && found)
		snprintf(out, len, "%s (gid %u)", found->gr_name, (unsigned)gid);
	else
		snprintf(out, len, "gid %u", (unsigned)gid);
	return out;
}

/*
 * Would exec run @path in secure-execution mode, where the loader ignores
 * LD_PRELOAD?  As the kernel decides it: a set-ID bit that changes the
 * effective id away from our real one, or file capabilities for anyone
 * but root - unless the mount is nosuid or no_new_privs is set, which make
 * the kernel ignore both.  Warns and returns 1 if so.
 */
static int check_secure_exec(const struct chain *c, const char *path, const struct stat *st)
{
	struct statvfs vfs;
	char name[300];

	if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1)
		return 0;
	if (statvfs(path, &vfs) == 0 && (vfs.f_flag & ST_NOSUID))
		return 0;
	if ((st->st_mode & S_ISUID) && st->st_uid != getuid()) {
		warn(c, "set-user-ID %s: the dynamic loader ignores LD_PRELOAD in it",
		     user_name(st->st_uid, name, sizeof(name)));
		return 1;
	}
	if ((st->st_mode & S_ISGID) && (st->st_mode & S_IXGRP) && st->st_gid != getgid()) {
		warn(c, "set-group-ID %s: the dynamic loader ignores LD_PRELOAD in it",
		     group_name(st->st_gid, name, sizeof(name)));
		return 1;
	}
	if (getuid() != 0 && getxattr(path, "security.capability", NULL, 0) > 0) {
		warn(c, "file capabilities (security.capability): the dynamic loader "
		     "ignores LD_PRELOAD in it");
		return 1;
	}
	return 0;
}

/* ---- launchers ------------------------------------------------------------ */

static void inspect_path(struct chain *c, const char *path, char *const argv[]);

/* Start inspecting the program @file names (resolved through PATH). */
static void inspect_file(struct chain *c, const char *file, char *const argv[])
{
	char path[PATH_MAX];

	if (c->depth >= CHAIN_MAX || resolve_program(file, path, sizeof(path)) < 0)
		return;
	chain_add(c, path);
	inspect_path(c, path, argv);
}

/*
 * One option word of `env`: 1 if it drops LD_PRELOAD (-i, -, -u LD_PRELOAD),
 * else 0; *@skip is set when the option's argument is the next word.
 * Short options may be grouped (-iv) and take their argument attached
 * (-uNAME) or as the next word, as getopt does.
 */
static int env_option_drops(const char *a, const char *next, int *skip)
{
	if (!strcmp(a, "-") || !strcmp(a, "--ignore-environment"))
		return 1;
	if (!strcmp(a, "--unset"))
		return *skip = 1, next && !strcmp(next, "LD_PRELOAD");
	if (!strncmp(a, "--", 2)) {
		/* long options with a separate argument */
		*skip = !strcmp(a, "--chdir") || !strcmp(a, "--split-string") || !strcmp(a, "--argv0");
		return !strcmp(a, "--unset=LD_PRELOAD");
	}
	for (const char *p = a + 1; *p; p++) {
		if (*p == 'i')
			return 1;
		if (strchr("uCSa", *p)) {
			const char *optarg = p[1] ? p + 1 : next;

			*skip = !p[1];
			return *p == 'u' && optarg && !strcmp(optarg, "LD_PRELOAD");
		}
	}
	return 0;
}

/*
 * `env [OPTION]... [NAME=VALUE]... [COMMAND [ARG]...]` (GNU coreutils):
 * does it drop or replace LD_PRELOAD?  If not, follow COMMAND.
 */
static void inspect_env(struct chain *c, char *const argv[])
{
	int i;

	for (i = 1; argv[i] && argv[i][0] == '-'; i++) {
		int skip = 0;

		if (!strcmp(argv[i], "--")) {
			i++;
			break;
		}
		if (env_option_drops(argv[i], argv[i + 1], &skip)) {
			warn(c, "env %s%s: its program starts without LD_PRELOAD", argv[i],
			     skip ? " LD_PRELOAD" : "");
			return;
		}
		if (skip && argv[i + 1])
			i++;
	}
	for (; argv[i] && strchr(argv[i], '='); i++) {
		if (!strncmp(argv[i], "LD_PRELOAD=", 11)) {
			warn(c, "env LD_PRELOAD=...: replaces smclo's library");
			return;
		}
	}
	if (argv[i])
		inspect_file(c, argv[i], argv + i);
}

/* Programs known to start their command without the caller's LD_PRELOAD. */
static int inspect_launcher(struct chain *c, const char *path, char *const argv[])
{
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;

	if (!strcmp(base, "sudo")) {
		warn(c, "sudo: removes LD_PRELOAD from the environment of the program it starts");
		return 1;
	}
	if (!strcmp(base, "pkexec")) {
		warn(c, "pkexec: starts its program in a fresh environment, without LD_PRELOAD");
		return 1;
	}
	if (!strcmp(base, "env") && argv) {
		inspect_env(c, argv);
		return 1;
	}
	return 0;
}

/*
 * A `#!` script: the kernel runs "INTERPRETER [ARG] SCRIPT"; ARG is one
 * word-less string unless the interpreter is `env -S`, which splits it.
 */
static void inspect_script(struct chain *c, const char *path, const unsigned char *img,
                           size_t size)
{
	char line[SHEBANG_MAX], *interp, *arg, *words[SHEBANG_MAX / 2 + 3], *save = NULL;
	size_t n = size - 2 < sizeof(line) - 1 ? size - 2 : sizeof(line) - 1;    /* size >= 4 */
	int w = 0;

	memcpy(line, img + 2, n);
	line[n] = '\0';
	line[strcspn(line, "\n")] = '\0';
	interp = line + strspn(line, " \t");
	arg = interp + strcspn(interp, " \t");
	if (*arg)
		*arg++ = '\0';
	arg += strspn(arg, " \t");
	arg[strcspn(arg, "\r")] = '\0';
	if (!*interp)
		return;
	words[w++] = interp;
	if (!strncmp(arg, "-S", 2) || !strncmp(arg, "--split-string", 14)) {
		arg += strcspn(arg, " \t=");
		for (char *t = strtok_r(arg, " \t=", &save); t; t = strtok_r(NULL, " \t", &save))
			words[w++] = t;
	} else if (*arg) {
		words[w++] = arg;
	}
	words[w++] = (char *)path;
	words[w] = NULL;
	inspect_file(c, interp, words);
}

/* Look at the program file @path (already resolved), run with @argv. */
static void inspect_path(struct chain *c, const char *path, char *const argv[])
{
	struct elf_facts f;
	unsigned char *img;
	struct stat st;
	int fd;

	if (inspect_launcher(c, path, argv))
		return;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < 4) {
		if (fd >= 0)
			close(fd);
		return;
	}
	if (check_secure_exec(c, path, &st)) {
		close(fd);
		return;
	}
	img = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (img == MAP_FAILED)
		return;
	if (img[0] == '#' && img[1] == '!')
		inspect_script(c, path, img, (size_t)st.st_size);
	else if (elf_facts(img, (size_t)st.st_size, &f) == 0) {
		if (f.go)
			warn(c, "a Go program: Go's net package makes raw system calls, "
			     "which no preload library sees");
		else if (!f.interp && !f.soname)
			warn(c, "statically linked: no dynamic loader runs in it to preload smclo");
	}
	munmap(img, (size_t)st.st_size);
}

void inspect_program(const char *file, char *const argv[])
{
	struct chain c = { .who = "", .depth = 0 };

	inspect_file(&c, file, argv);
}
