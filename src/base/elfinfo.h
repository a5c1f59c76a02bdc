/*
 * elfinfo.h - facts of an executable's ELF headers (see elfinfo.c).
 */
#ifndef SMCLO_ELFINFO_H
#define SMCLO_ELFINFO_H

#include <stddef.h>

/* What matters of an executable, whatever its class. */
struct elf_facts {
	int interp;             /* PT_INTERP: the dynamic loader runs */
	int soname;             /* DT_SONAME: a shared object run as a program (ld.so) */
	int needs_smclo;        /* DT_NEEDED names libsmclo.so (linked with -lsmclo) */
	int go;                 /* Go's build id note or build info section */
	int is64;               /* ELFCLASS64 (a 32-bit program cannot load our library) */
	unsigned machine;       /* e_machine: another architecture's runs under an emulator */
};

/* e_machine of the programs this build's library can be loaded into. */
#if defined(__x86_64__)
#define ELF_MACHINE_NATIVE 62   /* EM_X86_64 */
#elif defined(__aarch64__)
#define ELF_MACHINE_NATIVE 183  /* EM_AARCH64 */
#else
#define ELF_MACHINE_NATIVE 0    /* unknown: not checked */
#endif

/*
 * The facts of the ELF image @img of @size bytes, of this machine's byte
 * order; -1 if it is no such ELF (a script, another architecture's binary).
 */
int elf_facts(const unsigned char *img, size_t size, struct elf_facts *f);

/* The same for the first 64 KiB of the file open on @fd (read, not mapped):
 * needs_smclo only where the dynamic string table lies within them, as in
 * every program the linker laid out in the usual order. */
int elf_facts_fd(int fd, struct elf_facts *f);

#endif
