/*
 * interpose.h - how a wrapper of a libc function reaches the real one.
 */
#ifndef SMCLO_INTERPOSE_H
#define SMCLO_INTERPOSE_H

#include <dlfcn.h>

#define EXPORT __attribute__((visibility("default")))

/* Resolve libc's definition on first use. */
#define REAL(name)                                                          \
	static __typeof__(&name) real_##name;                               \
	if (!real_##name)                                                   \
		real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

#endif
