/*
 * elfinfo.c - what an executable's ELF headers say about running it under a
 * preload library.
 *
 * Two places need the same answers: `smclo run` warns about programs smclo
 * cannot reach (src/cli/inspect.c), and the library decides at exec whether
 * the new program will take its connections over (src/handover/handover.c).  Both
 * ask: does the dynamic loader run (PT_INTERP), is it a Go program (whose
 * net package makes raw system calls, so the interposed socket calls never
 * see its reads), is it 64-bit.  The image may be anything a user can put
 * in a file: every offset and size is checked against it before use.
 */
#include "elfinfo.h"

#include <elf.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* @len bytes at @off within the @size-byte image, or NULL. */
static const unsigned char *at(const unsigned char *img, size_t size, uint64_t off, uint64_t len)
{
	return off <= size && len <= size - off ? img + off : NULL;
}

/* Does a note segment hold Go's build id (owner "Go", type 4)? */
static int go_note(const unsigned char *p, uint64_t len)
{
	while (len >= 12) {
		uint32_t namesz, descsz, type;
		uint64_t step;

		memcpy(&namesz, p, 4);
		memcpy(&descsz, p + 4, 4);
		memcpy(&type, p + 8, 4);
		step = 12 + (((uint64_t)namesz + 3) & ~3ULL) + (((uint64_t)descsz + 3) & ~3ULL);
		if (step > len)
			return 0;
		/* Go's linker writes the name "Go" padded with NULs to 4 bytes */
		if ((namesz == 3 || namesz == 4) && !memcmp(p + 12, "Go", 3) && type == 4)
			return 1;
		p += step;
		len -= step;
	}
	return 0;
}


/* One program header, either class: type, file offset, size in the file,
 * address in memory. */
static int phdr(const unsigned char *img, size_t size, int is64, uint64_t off,
                uint32_t *type, uint64_t *foff, uint64_t *fsz, uint64_t *vaddr)
{
	const unsigned char *p = at(img, size, off, is64 ? sizeof(Elf64_Phdr) : sizeof(Elf32_Phdr));

	if (!p)
		return -1;
	if (is64) {
		Elf64_Phdr h;
		memcpy(&h, p, sizeof(h));
		*type = h.p_type, *foff = h.p_offset, *fsz = h.p_filesz, *vaddr = h.p_vaddr;
	} else {
		Elf32_Phdr h;
		memcpy(&h, p, sizeof(h));
		*type = h.p_type, *foff = h.p_offset, *fsz = h.p_filesz, *vaddr = h.p_vaddr;
	}
	return 0;
}

/* One dynamic entry, either class: 0 at the end of @len bytes. */
static int dyn_at(const unsigned char *p, uint64_t len, int is64, uint64_t i,
                  int64_t *tag, uint64_t *val)
{
	size_t esz = is64 ? sizeof(Elf64_Dyn) : sizeof(Elf32_Dyn);

	if ((i + 1) * esz > len)
		return 0;
	if (is64) {
		Elf64_Dyn d;
		memcpy(&d, p + i * esz, sizeof(d));
		*tag = d.d_tag, *val = d.d_un.d_val;
	} else {
		Elf32_Dyn d;
		memcpy(&d, p + i * esz, sizeof(d));
		*tag = d.d_tag, *val = d.d_un.d_val;
	}
	return *tag != DT_NULL;
}

/* The file offset of memory address @vaddr, by the PT_LOAD segments. */
static int file_offset(const unsigned char *img, size_t size, int is64, uint64_t phoff,
                       unsigned phnum, unsigned phentsize, uint64_t vaddr, uint64_t *off)
{
	for (unsigned i = 0; i < phnum; i++) {
		uint64_t foff, fsz, va;
		uint32_t type;

		if (phdr(img, size, is64, phoff + (uint64_t)i * phentsize, &type, &foff, &fsz, &va) < 0)
			return -1;
		if (type == PT_LOAD && vaddr >= va && vaddr - va < fsz) {
			*off = foff + (vaddr - va);
			return 0;
		}
	}
	return -1;
}

/* One section header, either class: name offset, file offset, size. */
static int shdr(const unsigned char *img, size_t size, int is64, uint64_t off,
                uint32_t *name, uint64_t *foff, uint64_t *fsz)
{
	const unsigned char *p = at(img, size, off, is64 ? sizeof(Elf64_Shdr) : sizeof(Elf32_Shdr));

	if (!p)
		return -1;
	if (is64) {
		Elf64_Shdr h;
		memcpy(&h, p, sizeof(h));
		*name = h.sh_name, *foff = h.sh_offset, *fsz = h.sh_size;
	} else {
		Elf32_Shdr h;
		memcpy(&h, p, sizeof(h));
		*name = h.sh_name, *foff = h.sh_offset, *fsz = h.sh_size;
	}
	return 0;
}

/* The header fields used here, either class. */
struct elf_hdr {
	uint64_t phoff, shoff;
	unsigned phnum, phentsize, shnum, shentsize, shstrndx, machine;
};

static int elf_header(const unsigned char *img, size_t size, int is64, struct elf_hdr *h)
{
	if (is64) {
		Elf64_Ehdr e;
		if (size < sizeof(e))
			return -1;
		memcpy(&e, img, sizeof(e));
		*h = (struct elf_hdr){ e.e_phoff, e.e_shoff, e.e_phnum, e.e_phentsize,
		                       e.e_shnum, e.e_shentsize, e.e_shstrndx, e.e_machine };
	} else {
		Elf32_Ehdr e;
		if (size < sizeof(e))
			return -1;
		memcpy(&e, img, sizeof(e));
		*h = (struct elf_hdr){ e.e_phoff, e.e_shoff, e.e_phnum, e.e_phentsize,
		                       e.e_shnum, e.e_shentsize, e.e_shstrndx, e.e_machine };
	}
	return 0;
}

/* The dynamic segment @p of @len bytes: a DT_SONAME, a DT_NEEDED of ours? */
static void scan_dynamic(const unsigned char *img, size_t size, int is64,
                         const struct elf_hdr *h, const unsigned char *p, uint64_t len,
                         struct elf_facts *f)
{
	uint64_t strtab = 0, strsz = 0, val, off;
	const unsigned char *names;
	int64_t tag;

	for (uint64_t i = 0; dyn_at(p, len, is64, i, &tag, &val); i++) {
		if (tag == DT_SONAME)
			f->soname = 1;
		else if (tag == DT_STRTAB)
			strtab = val;
		else if (tag == DT_STRSZ)
			strsz = val;
	}
	if (!strtab || file_offset(img, size, is64, h->phoff, h->phnum, h->phentsize, strtab,
	                           &off) < 0 || !(names = at(img, size, off, strsz)))
		return;
	for (uint64_t i = 0; dyn_at(p, len, is64, i, &tag, &val); i++)
		if (tag == DT_NEEDED && val < strsz && memchr(names + val, '\0', strsz - val) &&
		    !strncmp((const char *)names + val, "libsmclo.so", 11))
			f->needs_smclo = 1;
}

static void scan_segments(const unsigned char *img, size_t size, int is64,
                          const struct elf_hdr *h, struct elf_facts *f)
{
	for (unsigned i = 0; i < h->phnum; i++) {
		uint64_t foff, fsz, vaddr;
		const unsigned char *p;
		uint32_t type;

		if (phdr(img, size, is64, h->phoff + (uint64_t)i * h->phentsize, &type, &foff, &fsz,
		         &vaddr) < 0)
			return;
		p = at(img, size, foff, fsz);
		if (type == PT_INTERP)
			f->interp = 1;
		else if (type == PT_NOTE && p && go_note(p, fsz))
			f->go = 1;
		else if (type == PT_DYNAMIC && p)
			scan_dynamic(img, size, is64, h, p, fsz, f);
	}
}

/* Go's sections, also where the notes were left out of every segment. */
static void scan_sections(const unsigned char *img, size_t size, int is64,
                          const struct elf_hdr *h, struct elf_facts *f)
{
	uint64_t stroff, strsz, foff, fsz;
	uint32_t name;
	const unsigned char *names;

	if (!h->shnum || h->shstrndx >= h->shnum ||
	    shdr(img, size, is64, h->shoff + (uint64_t)h->shstrndx * h->shentsize,
	         &name, &stroff, &strsz) < 0 || !(names = at(img, size, stroff, strsz)))
		return;
	for (unsigned i = 0; i < h->shnum && !f->go; i++) {
		if (shdr(img, size, is64, h->shoff + (uint64_t)i * h->shentsize, &name, &foff, &fsz) < 0)
			return;
		if (name < strsz && memchr(names + name, '\0', strsz - name) &&
		    (!strcmp((const char *)names + name, ".note.go.buildid") ||
		     !strcmp((const char *)names + name, ".go.buildinfo")))
			f->go = 1;
	}
}

int elf_facts(const unsigned char *img, size_t size, struct elf_facts *f)
{
	struct elf_hdr h;
	int is64;

	if (size < EI_NIDENT || memcmp(img, ELFMAG, SELFMAG) ||
	    img[EI_DATA] != (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB))
		return -1;
	if (img[EI_CLASS] != ELFCLASS64 && img[EI_CLASS] != ELFCLASS32)
		return -1;
	is64 = img[EI_CLASS] == ELFCLASS64;
	if (elf_header(img, size, is64, &h) < 0)
		return -1;
	memset(f, 0, sizeof(*f));
	f->is64 = is64;
	f->machine = h.machine;
	scan_segments(img, size, is64, &h, f);
	scan_sections(img, size, is64, &h, f);
	return 0;
}

/*
 * Read, not mapped: a file someone truncates meanwhile must not raise
 * SIGBUS in the program that is about to exec it.  The buffer is anonymous
 * memory, not malloc's: this runs in vfork children, where a child that
 * dies inside malloc would leave the parent's arena locked.  The headers,
 * the program headers and Go's note sit at the start of every executable
 * linkers make; what lies past ELF_PREFIX (section headers) is not seen.
 */
#define ELF_PREFIX (64u << 10)

int elf_facts_fd(int fd, struct elf_facts *f)
{
	unsigned char *img = mmap(NULL, ELF_PREFIX, PROT_READ | PROT_WRITE,
	                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ssize_t n;
	int r = -1;

	if (img == MAP_FAILED)
		return -1;
	n = pread(fd, img, ELF_PREFIX, 0);
	if (n > 0)
		r = elf_facts(img, (size_t)n, f);
	munmap(img, ELF_PREFIX);
	return r;
}
