/*
 * init.c - the library's one constructor (and its destructor).
 *
 * The library starts in the order of the steps below, each a layer's own
 * start; the first that fails stops the start, takes back what the steps
 * before it set up, and leaves the process on plain TCP with one line on
 * stderr saying why.  Whatever happens, connections handed over by the
 * program that exec'd us are taken (handover_adopt) - adopted when the
 * library is up, reset when it is not, never read as end-of-file.
 *
 * Runs for every process smclo is loaded into (LD_PRELOAD, -lsmclo, a
 * dlopen), before main() and before any wrapper can be called by the
 * program; a wrapper called from another library's constructor before this
 * one passes everything through (smclo_active is 0).
 */
#include "runtime.h"

#include "config.h"
#include "deferred.h"
#include "epoll_early.h"
#include "epoll_watch.h"
#include "fdtab.h"
#include "handshake.h"
#include "handover.h"
#include "inbox.h"
#include "io.h"
#include "log.h"
#include "pairs.h"
#include "registry.h"
#include "sockopt.h"
#include "spin.h"
#include "stats.h"
#include "sys.h"

#include <stdio.h>
#include <unistd.h>

/* What a spinning waiter does first (spin.h): closes put off, a pair made ahead. */
static int runtime_idle_work(void)
{
	return deferred_run() + pairs_refill();
}

/* Another socket goes to @fd (the switch, or a move to TCP): epoll
 * registrations made before connect() and those of an accelerated
 * connection follow it. */
static void runtime_swap_begin(int fd)
{
	epoll_early_swap_begin(fd);
	epoll_watch_swap_begin(fd);
}

static void runtime_swap_end(int fd)
{
	epoll_early_swap_end(fd);
	epoll_watch_swap_end(fd);
}

/* What the data path (core) asks of the layers above it (io.h). */
static const struct io_hooks runtime_io_hooks = {
	.thread_sleeps = epoll_watch_thread_sleeps,
	.rcvtimeo_ms = sockopt_rcvtimeo_ms,
	.keep_fd = fd_hide,
	.keep_copy = fd_keep_copy,
	.is_kept = fd_is_hidden,
	.swap_begin = runtime_swap_begin,
	.swap_end = runtime_swap_end,
	.bell_watch = epoll_early_bell_watch,
	.bell_unwatch = epoll_early_bell_unwatch,
};

/* SMCLO_DISABLE ends the start here, quietly (1). */
static int runtime_start_config(char *err, size_t len)
{
	if (config_load(&cfg, err, len) < 0)
		return -1;
	return cfg.disabled ? 1 : 0;
}

static int runtime_start_fdtab(char *err, size_t len)
{
	(void)sys_getpid();     /* cached by us, not by a vfork child (sys_in_vfork_child) */
	if (fdtab_init() == 0)
		return 0;
	snprintf(err, len, "cannot allocate the descriptor table");
	return -1;
}

static int runtime_start_registry(char *err, size_t len)
{
	if (registry_attach(cfg.dir, cfg.dir_is_default, fd_hide, err, len) < 0)
		return -1;
	stats_attach_totals(cfg.dir);   /* without them connections go uncounted, no more */
	stats_set_fd_keeper(fd_hide);
	return 0;
}

static void runtime_stop_registry(void)
{
	stats_detach_totals();
	if (registry_fd >= 0)
		fd_forget_ours(registry_fd);    /* the number is free for the program again */
	registry_detach();
}

static int runtime_start_hooks(char *err, size_t len)
{
	spin_set_idle_work(runtime_idle_work);
	io_set_hooks(&runtime_io_hooks);
	return 0;
}

static const struct runtime_step {
	/* 0: go on; 1: stop here, quietly; -1: failed, the reason in @err */
	int (*start)(char *err, size_t len);
	void (*stop)(void);                     /* takes back a started step; NULL: nothing to */
} runtime_steps[] = {
	{ runtime_start_config, NULL },
	{ runtime_start_fdtab, NULL },          /* kept: handover_adopt resets through it */
	{ runtime_start_registry, runtime_stop_registry },
	{ runtime_start_hooks, NULL },
};

/* Every step in order; on a failure, the started ones stopped in reverse. */
static int runtime_start(void)
{
	size_t n = sizeof(runtime_steps) / sizeof(runtime_steps[0]);
	char err[300];

	for (size_t i = 0; i < n; i++) {
		int rc = runtime_steps[i].start(err, sizeof(err));

		if (rc == 0)
			continue;
		if (rc < 0)
			fprintf(stderr, "smclo: %s; acceleration disabled for this process\n", err);
		while (i-- > 0)
			if (runtime_steps[i].stop)
				runtime_steps[i].stop();
		return -1;
	}
	return 0;
}

__attribute__((constructor)) static void runtime_init(void)
{
	inbox_init();
	runtime_fork_register();
	if (runtime_start() == 0) {
		fdtab_activate();
		DBG("active, registry %s, ring %u, handshake %d ms", cfg.dir, cfg.tx_size,
		    cfg.handshake_ms);
	}
	handover_adopt();
}

/* A process that exits normally takes its connection table with it. */
__attribute__((destructor)) static void runtime_fini(void)
{
	/* under a seccomp filter nothing but the program's own calls (moved.c) */
	if (smclo_active && !hs_sandboxed())
		stats_table_remove_at_exit(registry_fd);
}
