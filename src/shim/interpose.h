/*
 * interpose.h - how a wrapper of a libc function reaches the real one.
 */
#ifndef SMCLO_INTERPOSE_H
#define SMCLO_INTERPOSE_H

#include <dlfcn.h>

#define EXPORT __attribute__((visibility("default")))

/* Resolve libc's definition on first use.  Threads may race to fill the
 * cache, all with the same value: relaxed atomics make that race defined. */
#define REAL(name)                                                          \
	static __typeof__(&name) real_##name##_cache;                       \
	__typeof__(&name) real_##name =                                     \
		__atomic_load_n(&real_##name##_cache, __ATOMIC_RELAXED);    \
	if (!real_##name) {                                                 \
		real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name);   \
		__atomic_store_n(&real_##name##_cache, real_##name, __ATOMIC_RELAXED); \
	}

#endif
