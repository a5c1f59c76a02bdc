/*
 * runtime.h - the library's start and its fork handlers, one of each
 * (init.c, fork.c): the only place where the layers are started, in an
 * order written down, and where fork() is met, in an order written down.
 */
#ifndef SMCLO_RUNTIME_H
#define SMCLO_RUNTIME_H

/* fork.c: register the one set of fork handlers (once, from init.c). */
void runtime_fork_register(void);

#endif
