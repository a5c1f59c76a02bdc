/*
 * exec.h - one way into a new program, with the handover (exec.c).
 */
#ifndef SMCLO_EXEC_H
#define SMCLO_EXEC_H

enum exec_kind {
	EXEC_PATH,      /* execve */
	EXEC_SEARCH,    /* execvpe: a PATH search */
	EXEC_FD,        /* fexecve */
	EXEC_AT,        /* execveat */
};

struct exec_call {
	enum exec_kind kind;
	const char *path;       /* or file name to search */
	char *const *argv;
	int fd;                 /* EXEC_FD, EXEC_AT */
	int flags;              /* EXEC_AT */
};

/*
 * Hand over or reset this process's inheritable accelerated connections
 * for the program @x starts, then start it with @envp (plus the handover
 * record).  Returns only on failure, with everything taken back.
 */
int exec_with_handover(const struct exec_call *x, char *const envp[]);

#endif
