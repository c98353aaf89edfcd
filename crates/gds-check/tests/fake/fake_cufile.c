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
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

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

/* Compat off in the config libcufile was pointed at (the probe's strict copy). */
static int compat_off(void) {
    const char *cfg = getenv("CUFILE_ENV_PATH_JSON");
    char buf[8192] = {0};
    if (!cfg) return 0;
    int fd = open(cfg, O_RDONLY);
    if (fd >= 0) { (void)!read(fd, buf, sizeof buf - 1); close(fd); }
    return strstr(buf, "\"allow_compat_mode\": false") != NULL;
}
/* Does this fd's device have a GDS path? FAKE_CUFILE_GDS_DEVS lists "maj:min" entries
 * (the NVMe namespaces nvidia-fs would serve); anything else is like a loop device. */
static int gds_dev(int fd) {
    struct stat st; char me[32]; const char *l = getenv("FAKE_CUFILE_GDS_DEVS");
    if (!l || fstat(fd, &st)) return 0;
    snprintf(me, sizeof me, "%u:%u", major(st.st_dev), minor(st.st_dev));
    for (const char *p = strstr(l, me); p; p = strstr(p + 1, me)) {
        char e = p[strlen(me)];
        if ((p == l || p[-1] == ',') && (e == 0 || e == ',')) return 1;
    }
    return 0;
}
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
    /* compat off and no GDS path for this file: CU_FILE_IO_NOT_SUPPORTED (troubleshooting
     * guide, API errors 2.3) */
    int fl = fcntl(d->handle.fd, F_GETFL);
    if (fl < 0) return R(5018);            /* fd not where cufile.h puts it */
    if (!(fl & O_DIRECT)) return R(5019);
    int e = envi("FAKE_CUFILE_REG_ERR", 0);
    if (e) return R(e);
    /* dstatusflags bit 4 (NVMe) or bit 2 (NFS): the driver has some GDS path */
    if (compat_off() && !((envi("FAKE_CUFILE_DSTATUS", 0) & (16 | 4)) && gds_dev(d->handle.fd)))
        return R(5008);
    *fh = (void *)(intptr_t)(d->handle.fd + 1);
    return R(0);
}
long cuFileRead(void *fh, void *buf, size_t n, long off, long boff) {
    int fd = (int)(intptr_t)fh - 1;
    /* O_DIRECT wants aligned memory; read through a second, buffered descriptor. */
    char path[64]; snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int f2 = open(path, O_RDONLY);
    if (f2 < 0) return -5;
    long r = pread(f2, (char *)buf + boff, n, off);
    close(f2);
    if (r > 12345 && getenv("FAKE_CUFILE_READ_CORRUPT")) ((char *)buf)[12345] ^= 1;
    return r;
}

/* The CUDA driver calls the probe's read check makes; "GPU memory" is host memory here. */
int cuInit(unsigned f) { (void)f; return envi("FAKE_CUDA_INIT_ERR", 0); }
int cuDeviceGet(int *d, int o) { *d = o; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = (void *)0x1; return 0; }
int cuCtxSetCurrent(void *c) { (void)c; return 0; }
int cuMemAlloc_v2(unsigned long long *p, size_t n) { void *m = malloc(n); *p = (uintptr_t)m; return m ? 0 : 2; }
int cuMemFree_v2(unsigned long long p) { free((void *)(uintptr_t)p); return 0; }
int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return 0; }
void cuFileHandleDeregister(void *fh) { (void)fh; }
CUfileError_t cuFileDriverClose_v2(void) { return R(0); }
