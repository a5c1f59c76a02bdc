/*
 * log.h - SMCLO_DEBUG=1 decision log on stderr.
 */
#ifndef SMCLO_LOG_H
#define SMCLO_LOG_H

#include "config.h"

void log_write(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define DBG(...) do { if (cfg.debug) log_write(__VA_ARGS__); } while (0)

#endif
