/* A stand-in libcufile for tests: same symbols and struct layouts as cufile.h, behaviour
 * steered by environment variables. Lets the probe's FFI and the parent's deadline handling be
 * tested without a GPU. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>
#include <stddef.h>

typedef struct { int err; int cu_err; } CUfileError_t;
typedef struct {
    struct { unsigned major_version, minor_version; size_t poll_thresh_size, max_direct_io_size;
             unsigned dstatusflags, dcontrolflags; } nvfs;
    unsigned fflags, max_device_cache_size, per_buffer_cache_size, max_device_pinned_mem_size,
             max_batch_io_size, max_batch_io_timeout_msecs;
} CUfileDrvProps_t;
typedef struct { int type; union { int fd; void *handle; } handle; const void *fs_ops; } CUfileDescr_t;

static int envi(const char *k, int d) { const char *v = getenv(k); return v ? atoi(v) : d; }
static CUfileError_t R(int e) { CUfileError_t r = { e, 0 }; return r; }

CUfileError_t cuFileGetVersion(int *v) { *v = 1200; return R(0); }
CUfileError_t cuFileDriverOpen(void) {
    if (getenv("FAKE_CUFILE_HANG")) for (;;) pause();
    if (getenv("FAKE_CUFILE_CRASH")) *(volatile int *)0 = 1; /* a real fault: Rust's runtime ignores raise(SIGSEGV) */
    return R(envi("FAKE_CUFILE_OPEN_ERR", 0));
}
CUfileError_t cuFileDriverGetProperties(CUfileDrvProps_t *p) {
    memset(p, 0, sizeof *p);
    p->nvfs.major_version = 2; p->nvfs.minor_version = 20;
    p->nvfs.dstatusflags = (unsigned)envi("FAKE_CUFILE_DSTATUS", 0);
    /* compat allowed unless the config in CUFILE_ENV_PATH_JSON turns it off */
    p->nvfs.dcontrolflags = 2;
    const char *cfg = getenv("CUFILE_ENV_PATH_JSON");
    if (cfg) {
        int fd = open(cfg, O_RDONLY); char buf[8192] = {0};
        if (fd >= 0) { (void)!read(fd, buf, sizeof buf - 1); close(fd); }
        if (strstr(buf, "\"allow_compat_mode\": false")) p->nvfs.dcontrolflags = 0;
    }
    p->fflags = 0xf;
    return R(0);
}
CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *d) {
    if (d->type != 1) return R(5018);
    int fl = fcntl(d->handle.fd, F_GETFL);
    if (fl < 0) return R(5018);            /* fd not where cufile.h puts it */
    if (!(fl & O_DIRECT)) return R(5019);
    int e = envi("FAKE_CUFILE_REG_ERR", 0);
    if (e) return R(e);
    *fh = (void *)0x1;
    return R(0);
}
void cuFileHandleDeregister(void *fh) { (void)fh; }
CUfileError_t cuFileDriverClose_v2(void) { return R(0); }
