/*
 * version.h - the version and the installed library's place, as CMake
 * generated them (smclo_version.h, in the build tree).  tools/lint.sh
 * compiles src/ without the build tree; it gets stand-ins.
 */
#ifndef SMCLO_CLI_VERSION_H
#define SMCLO_CLI_VERSION_H

#if __has_include("smclo_version.h")
#include "smclo_version.h"
#else
#define SMCLO_VERSION "unknown"
#define SMCLO_LIBDIR_FROM_BINDIR "../lib"
#endif

#endif
