/* An LD_PRELOAD shim for the read-fallback test: every mmap of a file
 * descriptor fails with ENODEV, as on file systems that cannot map files
 * (some FUSE and network file systems). Anonymous mappings still work. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/types.h>

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  static void* (*real)(void*, size_t, int, int, int, off_t);
  if (!real) real = (void* (*)(void*, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
  if (fd >= 0 && !(flags & MAP_ANONYMOUS)) {
    errno = ENODEV;
    return MAP_FAILED;
  }
  return real(addr, len, prot, flags, fd, off);
}
