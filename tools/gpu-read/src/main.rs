//! gpu-read: how fast a file on a volume gets into GPU memory.
//!
//! ```text
//! gpu-read write FILE SIZE                 # SIZE bytes of a known pattern, O_DIRECT, fsync
//! gpu-read bench FILE [--runs N] [--chunk BYTES] [--threads N] [--device N] [--cufile-lib PATH]
//!                     [--modes cufile,cpu-pinned,cpu-pageable,odirect,odirect-mt] [--no-drop] [--no-buf-register]
//! ```
//!
//! `bench` reads the whole file, N times per path, the paths interleaved, dropping the page cache
//! (`sync; echo 3 > /proc/sys/vm/drop_caches`, needs root) before every read:
//!
//! * `cufile`: `cuFileRead` into `cuMemAlloc`'d GPU memory (libcufile.so.0, dlopened). True GDS
//!   on a node with nvidia_fs (or P2PDMA); compat mode (POSIX reads through host bounce buffers)
//!   otherwise. The buffer is registered with `cuFileBufRegister` when that succeeds.
//! * `cpu-pinned`: buffered `pread` of a chunk into pinned host memory (`cuMemHostAlloc`), then
//!   `cuMemcpyHtoD`, chunk after chunk (no overlap): the plain CPU path.
//! * `cpu-pageable`: the same with ordinary (pageable, page-aligned) host memory.
//! * `odirect`: `O_DIRECT` `pread` into host memory only: what the storage gives, the ceiling.
//!
//! After every GPU read, three 1 MiB samples are copied back and checked against the pattern
//! `write` laid down (the device buffer is cleared before each read). The CUDA driver API
//! (libcuda.so.1) is dlopened, so the binary needs no CUDA toolkit to build or run.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

type Res<T> = Result<T, String>;

const PATTERN_SEED: u64 = 0xA5A5_5A5A_0123_4567;
const SAMPLE: usize = 1 << 20;
const ALIGN: usize = 4096;

fn pattern_word(byte_offset: u64) -> u64 {
    (byte_offset / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ PATTERN_SEED
}

fn fill_pattern(buf: &mut [u8], file_offset: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&pattern_word(file_offset + 8 * i as u64).to_le_bytes());
    }
}

fn check_pattern(buf: &[u8], file_offset: u64) -> Res<()> {
    for (i, w) in buf.chunks_exact(8).enumerate() {
        let off = file_offset + 8 * i as u64;
        let got = u64::from_le_bytes(w.try_into().unwrap());
        if got != pattern_word(off) {
            return Err(format!(
                "data mismatch at file offset {off}: {got:#x} != {:#x}",
                pattern_word(off)
            ));
        }
    }
    Ok(())
}

/// Page-aligned host memory from the allocator (pageable).
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Res<Self> {
        let layout = std::alloc::Layout::from_size_align(len, ALIGN).map_err(|e| e.to_string())?;
        // SAFETY: len > 0 (callers pass a chunk size), layout valid.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!("cannot allocate {len} bytes"));
        }
        Ok(Self { ptr, len })
    }
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr owns len initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, ALIGN).unwrap();
        // SAFETY: allocated with this layout in new().
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

// ---------------------------------------------------------------- CUDA driver API (libcuda.so.1)

type CuDevPtr = u64;

struct Cuda {
    init: unsafe extern "C" fn(c_uint) -> c_int,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> c_int,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    primary_ctx_retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int,
    ctx_set_current: unsafe extern "C" fn(*mut c_void) -> c_int,
    ctx_synchronize: unsafe extern "C" fn() -> c_int,
    mem_alloc: unsafe extern "C" fn(*mut CuDevPtr, usize) -> c_int,
    mem_free: unsafe extern "C" fn(CuDevPtr) -> c_int,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> c_int,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> c_int,
    memcpy_htod: unsafe extern "C" fn(CuDevPtr, *const c_void, usize) -> c_int,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevPtr, usize) -> c_int,
    memset_d8: unsafe extern "C" fn(CuDevPtr, u8, usize) -> c_int,
}

fn sym<T: Copy>(lib: &'static libloading::Library, name: &str) -> Res<T> {
    let cname = format!("{name}\0");
    // SAFETY: the caller names the C signature T of the symbol.
    unsafe { lib.get::<T>(cname.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{name}: {e}"))
}

fn cu(what: &str, rc: c_int) -> Res<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed: CUresult {rc}"))
    }
}

impl Cuda {
    fn load() -> Res<Self> {
        // SAFETY: loading the NVIDIA driver library runs its initialisers only.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }
            .map_err(|e| format!("libcuda.so.1: {e}"))?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        Ok(Self {
            init: sym(lib, "cuInit")?,
            device_get: sym(lib, "cuDeviceGet")?,
            device_get_name: sym(lib, "cuDeviceGetName")?,
            driver_get_version: sym(lib, "cuDriverGetVersion")?,
            primary_ctx_retain: sym(lib, "cuDevicePrimaryCtxRetain")?,
            ctx_set_current: sym(lib, "cuCtxSetCurrent")?,
            ctx_synchronize: sym(lib, "cuCtxSynchronize")?,
            mem_alloc: sym(lib, "cuMemAlloc_v2")?,
            mem_free: sym(lib, "cuMemFree_v2")?,
            mem_host_alloc: sym(lib, "cuMemHostAlloc")?,
            mem_free_host: sym(lib, "cuMemFreeHost")?,
            memcpy_htod: sym(lib, "cuMemcpyHtoD_v2")?,
            memcpy_dtoh: sym(lib, "cuMemcpyDtoH_v2")?,
            memset_d8: sym(lib, "cuMemsetD8_v2")?,
        })
    }

    /// cuInit, the device's primary context made current; returns (name, driver version).
    fn open(&self, ordinal: c_int) -> Res<(String, c_int)> {
        let mut dev = 0;
        let mut ctx = std::ptr::null_mut();
        let mut ver = 0;
        let mut name = [0 as c_char; 256];
        // SAFETY: out-pointers are valid locals.
        unsafe {
            cu("cuInit", (self.init)(0))?;
            cu("cuDeviceGet", (self.device_get)(&mut dev, ordinal))?;
            cu(
                "cuDevicePrimaryCtxRetain",
                (self.primary_ctx_retain)(&mut ctx, dev),
            )?;
            cu("cuCtxSetCurrent", (self.ctx_set_current)(ctx))?;
            cu("cuDriverGetVersion", (self.driver_get_version)(&mut ver))?;
            cu(
                "cuDeviceGetName",
                (self.device_get_name)(name.as_mut_ptr(), 255, dev),
            )?;
            Ok((
                CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
                ver,
            ))
        }
    }
}

/// Pinned host memory from cuMemHostAlloc.
struct PinnedBuf<'a> {
    cuda: &'a Cuda,
    ptr: *mut u8,
    len: usize,
}

impl<'a> PinnedBuf<'a> {
    fn new(cuda: &'a Cuda, len: usize) -> Res<Self> {
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer valid.
        cu("cuMemHostAlloc", unsafe {
            (cuda.mem_host_alloc)(&mut p, len, 0)
        })?;
        Ok(Self {
            cuda,
            ptr: p.cast(),
            len,
        })
    }
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr owns len bytes of pinned memory.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuf<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc.
        unsafe { (self.cuda.mem_free_host)(self.ptr.cast()) };
    }
}

// ---------------------------------------------------------------- cuFile (libcufile.so.0)

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CuFileError {
    err: c_int,
    cu_err: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Nvfs {
    major_version: c_uint,
    minor_version: c_uint,
    poll_thresh_size: usize,
    max_direct_io_size: usize,
    dstatusflags: c_uint,
    dcontrolflags: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DrvProps {
    nvfs: Nvfs,
    fflags: c_uint,
    max_device_cache_size: c_uint,
    per_buffer_cache_size: c_uint,
    max_device_pinned_mem_size: c_uint,
    max_batch_io_size: c_uint,
    max_batch_io_timeout_msecs: c_uint,
}

/// Slack in case a newer library writes a larger struct.
#[repr(C)]
struct PaddedProps {
    props: DrvProps,
    _slack: [u64; 64],
}

#[repr(C)]
union DescrHandle {
    fd: c_int,
    handle: *mut c_void,
}

/// CUfileDescr_t: the union sits at offset 8 (fd at offset 4 gives 5018 INVALID_FILE_TYPE).
#[repr(C)]
struct Descr {
    type_: c_int,
    handle: DescrHandle,
    fs_ops: *const c_void,
}

const _: () = assert!(std::mem::size_of::<DrvProps>() == 56);
const _: () = assert!(std::mem::offset_of!(Descr, handle) == 8);

struct CuFile {
    driver_open: unsafe extern "C" fn() -> CuFileError,
    get_props: unsafe extern "C" fn(*mut DrvProps) -> CuFileError,
    get_version: Option<unsafe extern "C" fn(*mut c_int) -> CuFileError>,
    handle_register: unsafe extern "C" fn(*mut *mut c_void, *mut Descr) -> CuFileError,
    handle_deregister: unsafe extern "C" fn(*mut c_void),
    buf_register: unsafe extern "C" fn(*const c_void, usize, c_int) -> CuFileError,
    buf_deregister: unsafe extern "C" fn(*const c_void) -> CuFileError,
    read: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, i64, i64) -> isize,
}

fn cf(what: &str, e: CuFileError) -> Res<()> {
    if e.err == 0 {
        Ok(())
    } else {
        Err(format!(
            "{what} failed: {} {} (cu_err {})",
            e.err,
            cufile_error_name(e.err),
            e.cu_err
        ))
    }
}

fn cufile_error_name(code: c_int) -> &'static str {
    match code {
        5001 => "DRIVER_NOT_INITIALIZED",
        5007 => "PLATFORM_NOT_SUPPORTED",
        5008 => "IO_NOT_SUPPORTED",
        5009 => "DEVICE_NOT_SUPPORTED",
        5010 => "NVFS_DRIVER_ERROR",
        5011 => "CUDA_DRIVER_ERROR",
        5018 => "INVALID_FILE_TYPE",
        5019 => "INVALID_FILE_OPEN_FLAG",
        5020 => "DIO_NOT_SET",
        5022 => "INVALID_VALUE",
        5025 => "PERMISSION_DENIED",
        5026 => "DRIVER_ALREADY_OPEN",
        5027 => "HANDLE_NOT_REGISTERED (udev database entry missing?)",
        5028 => "HANDLE_ALREADY_REGISTERED",
        5029 => "DEVICE_NOT_FOUND",
        5030 => "INTERNAL_ERROR",
        5033 => "NVFS_SETUP_ERROR",
        5034 => "IO_DISABLED (denylisted)",
        _ => "",
    }
}

impl CuFile {
    fn load(path: &str) -> Res<Self> {
        // SAFETY: loading libcufile runs its initialisers only.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("{path}: {e}"))?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        Ok(Self {
            driver_open: sym(lib, "cuFileDriverOpen")?,
            get_props: sym(lib, "cuFileDriverGetProperties")?,
            get_version: sym(lib, "cuFileGetVersion").ok(),
            handle_register: sym(lib, "cuFileHandleRegister")?,
            handle_deregister: sym(lib, "cuFileHandleDeregister")?,
            buf_register: sym(lib, "cuFileBufRegister")?,
            buf_deregister: sym(lib, "cuFileBufDeregister")?,
            read: sym(lib, "cuFileRead")?,
        })
    }
}

/// cuFile opened once per process.
struct CuFileState {
    api: CuFile,
    summary: String,
    buf_registered: Option<CuDevPtr>,
    buf_note: String,
}

fn open_cufile(path: &str) -> Res<CuFileState> {
    let api = CuFile::load(path)?;
    let mut ver = 0;
    let version = match api.get_version {
        // SAFETY: out-pointer valid.
        Some(f) if unsafe { f(&mut ver) }.err == 0 => {
            format!("libcufile {}.{}", ver / 1000, (ver % 1000) / 10)
        }
        _ => "libcufile (version unknown)".into(),
    };
    let t = Instant::now();
    // SAFETY: no arguments.
    cf("cuFileDriverOpen", unsafe { (api.driver_open)() })?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut pp = PaddedProps {
        props: DrvProps::default(),
        _slack: [0; 64],
    };
    // SAFETY: the struct is large enough, with slack.
    let props = match unsafe { (api.get_props)(&mut pp.props) } {
        e if e.err == 0 => pp.props,
        _ => DrvProps::default(),
    };
    let n = props.nvfs;
    let paths = [
        (0, "lustre"),
        (1, "wekafs"),
        (2, "nfs"),
        (3, "gpfs"),
        (4, "nvme"),
        (5, "nvmeof"),
        (6, "scsi"),
        (7, "scaleflux"),
        (8, "nvmesh"),
        (9, "beegfs"),
        (12, "scatefs"),
        (13, "virtiofs"),
    ]
    .iter()
    .filter(|(b, _)| n.dstatusflags & (1 << b) != 0)
    .map(|(_, s)| *s)
    .collect::<Vec<_>>();
    let summary = format!(
        "{version}; cuFileDriverOpen ok ({open_ms:.0} ms); nvidia-fs {}.{}; true-GDS paths [{}]; \
         compat allowed: {}; max_direct_io {} KiB, per_buffer_cache {} KiB, pinned mem {} KiB",
        n.major_version,
        n.minor_version,
        paths.join(","),
        n.dcontrolflags & 2 != 0,
        n.max_direct_io_size,
        props.per_buffer_cache_size,
        props.max_device_pinned_mem_size
    );
    Ok(CuFileState {
        api,
        summary,
        buf_registered: None,
        buf_note: String::new(),
    })
}

// ---------------------------------------------------------------- the measured reads

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    CuFile,
    CpuPinned,
    CpuPageable,
    ODirect,
    ODirectParallel,
}

impl Mode {
    fn parse(s: &str) -> Res<Self> {
        Ok(match s {
            "cufile" | "a" => Mode::CuFile,
            "cpu-pinned" | "b" => Mode::CpuPinned,
            "cpu-pageable" | "b2" => Mode::CpuPageable,
            "odirect" | "c" => Mode::ODirect,
            "odirect-mt" | "c2" => Mode::ODirectParallel,
            _ => return Err(format!("unknown mode {s}")),
        })
    }
    fn label(self) -> &'static str {
        match self {
            Mode::CuFile => "(a) cuFileRead -> GPU",
            Mode::CpuPinned => "(b) pread -> pinned host -> cuMemcpyHtoD",
            Mode::CpuPageable => "(b2) pread -> pageable host -> cuMemcpyHtoD",
            Mode::ODirect => "(c) O_DIRECT pread -> host (no GPU)",
            Mode::ODirectParallel => "(c2) O_DIRECT pread, --threads -> host",
        }
    }
    fn gpu(self) -> bool {
        !matches!(self, Mode::ODirect | Mode::ODirectParallel)
    }
}

struct Bench<'a> {
    cuda: &'a Cuda,
    file: String,
    size: usize,
    chunk: usize,
    threads: usize,
    dptr: CuDevPtr,
    cufile: Option<CuFileState>,
}

fn open_direct(path: &str) -> Res<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("open {path} O_DIRECT: {e}"))
}

fn pread_full(f: &File, buf: &mut [u8], off: u64) -> Res<()> {
    f.read_exact_at(buf, off)
        .map_err(|e| format!("pread at {off}: {e}"))
}

impl Bench<'_> {
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.size)
            .step_by(self.chunk)
            .map(|o| (o, self.chunk.min(self.size - o)))
    }

    /// One timed read of the whole file by `mode`; returns the time of the read loop.
    fn run(&mut self, mode: Mode) -> Res<Duration> {
        if mode.gpu() {
            // SAFETY: dptr holds size bytes.
            cu("cuMemsetD8", unsafe {
                (self.cuda.memset_d8)(self.dptr, 0, self.size)
            })?;
            // SAFETY: no arguments.
            cu("cuCtxSynchronize", unsafe { (self.cuda.ctx_synchronize)() })?;
        }
        let elapsed = match mode {
            Mode::CuFile => self.run_cufile()?,
            Mode::CpuPinned => {
                let mut buf = PinnedBuf::new(self.cuda, self.chunk)?;
                self.run_cpu(buf.slice())?
            }
            Mode::CpuPageable => {
                let mut buf = AlignedBuf::new(self.chunk)?;
                self.run_cpu(buf.slice())?
            }
            Mode::ODirect => {
                let mut buf = AlignedBuf::new(self.chunk)?;
                let f = open_direct(&self.file)?;
                let t = Instant::now();
                let mut last = 0;
                for (off, len) in self.chunks().collect::<Vec<_>>() {
                    pread_full(&f, &mut buf.slice()[..len], off as u64)?;
                    last = off;
                }
                let el = t.elapsed();
                let n = SAMPLE.min(self.size - last);
                check_pattern(&buf.slice()[..n], last as u64)?;
                el
            }
            Mode::ODirectParallel => self.run_odirect_parallel()?,
        };
        if mode.gpu() {
            self.verify_gpu()?;
        }
        Ok(elapsed)
    }

    /// O_DIRECT reads from `threads` threads, chunk i read by thread i % threads: the queue depth
    /// a single reader does not reach, for the storage's ceiling.
    fn run_odirect_parallel(&self) -> Res<Duration> {
        let f = open_direct(&self.file)?;
        let chunks: Vec<_> = self.chunks().collect();
        let t = Instant::now();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.threads)
                .map(|i| {
                    let (f, chunks) = (&f, &chunks);
                    s.spawn(move || -> Res<()> {
                        let mut buf = AlignedBuf::new(self.chunk)?;
                        for (off, len) in chunks.iter().skip(i).step_by(self.threads) {
                            pread_full(f, &mut buf.slice()[..*len], *off as u64)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .try_for_each(|h| h.join().map_err(|_| "reader thread panicked".to_string())?)
        })?;
        let el = t.elapsed();
        // Check one sample after the clock stopped (a re-read, from the page cache or not).
        let mut buf = AlignedBuf::new(SAMPLE)?;
        let n = SAMPLE.min(self.size);
        pread_full(&f, &mut buf.slice()[..n], 0)?;
        check_pattern(&buf.slice()[..n], 0)?;
        Ok(el)
    }

    fn run_cpu(&self, buf: &mut [u8]) -> Res<Duration> {
        let f = File::open(&self.file).map_err(|e| format!("open {}: {e}", self.file))?;
        // SAFETY: plain advice on an open fd.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
        let t = Instant::now();
        for (off, len) in self.chunks().collect::<Vec<_>>() {
            pread_full(&f, &mut buf[..len], off as u64)?;
            // SAFETY: dptr + off .. + len lies in the device buffer; buf holds len bytes.
            cu("cuMemcpyHtoD", unsafe {
                (self.cuda.memcpy_htod)(self.dptr + off as u64, buf.as_ptr().cast(), len)
            })?;
        }
        // SAFETY: no arguments.
        cu("cuCtxSynchronize", unsafe { (self.cuda.ctx_synchronize)() })?;
        Ok(t.elapsed())
    }

    fn run_cufile(&mut self) -> Res<Duration> {
        let st = self
            .cufile
            .as_ref()
            .ok_or("cuFile not available (see above)")?;
        let f = open_direct(&self.file)?;
        let mut descr = Descr {
            type_: 1, // CU_FILE_HANDLE_TYPE_OPAQUE_FD
            handle: DescrHandle { fd: f.as_raw_fd() },
            fs_ops: std::ptr::null(),
        };
        let mut fh = std::ptr::null_mut();
        // SAFETY: descr valid, fd open with O_DIRECT.
        cf("cuFileHandleRegister", unsafe {
            (st.api.handle_register)(&mut fh, &mut descr)
        })?;
        let t = Instant::now();
        let mut result = Ok(());
        for (off, len) in self.chunks().collect::<Vec<_>>() {
            // With a registered buffer pass its base and the offset in it; otherwise the
            // chunk's own address.
            let (base, boff) = match st.buf_registered {
                Some(b) => (b, off as i64),
                None => (self.dptr + off as u64, 0),
            };
            // SAFETY: the device buffer holds size bytes; fh registered.
            let n = unsafe { (st.api.read)(fh, base as *mut c_void, len, off as i64, boff) };
            if n != len as isize {
                result = Err(format!(
                    "cuFileRead({len} at {off}) returned {n}{}",
                    if n < 0 {
                        format!(" ({})", cufile_error_name(-n as c_int))
                    } else {
                        String::new()
                    }
                ));
                break;
            }
        }
        // SAFETY: no arguments.
        let sync = unsafe { (self.cuda.ctx_synchronize)() };
        let el = t.elapsed();
        // SAFETY: registered above.
        unsafe { (st.api.handle_deregister)(fh) };
        result?;
        cu("cuCtxSynchronize", sync)?;
        Ok(el)
    }

    /// Copies three 1 MiB samples (start, middle, end) back and checks the pattern.
    fn verify_gpu(&self) -> Res<()> {
        let mut host = vec![0u8; SAMPLE];
        let mid = (self.size / 2) & !(ALIGN - 1);
        for off in [0, mid, self.size.saturating_sub(SAMPLE)] {
            let n = SAMPLE.min(self.size - off);
            // SAFETY: host holds SAMPLE bytes; the range lies in the device buffer.
            cu("cuMemcpyDtoH", unsafe {
                (self.cuda.memcpy_dtoh)(host.as_mut_ptr().cast(), self.dptr + off as u64, n)
            })?;
            check_pattern(&host[..n], off as u64)?;
        }
        Ok(())
    }
}

fn drop_caches() -> Res<()> {
    // SAFETY: sync(2) has no arguments.
    unsafe { libc::sync() };
    let mut f = OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .map_err(|e| format!("/proc/sys/vm/drop_caches: {e}"))?;
    f.write_all(b"3\n")
        .map_err(|e| format!("/proc/sys/vm/drop_caches: {e}"))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn parse_size(s: &str) -> Res<usize> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let mul = match s[i..]
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                u => return Err(format!("bad size unit {u} in {s}")),
            };
            (&s[..i], mul)
        }
        None => (s, 1),
    };
    num.parse::<usize>()
        .map(|n| n * mul)
        .map_err(|e| format!("bad size {s}: {e}"))
}

fn cmd_write(path: &str, size: usize) -> Res<()> {
    if size % ALIGN != 0 {
        return Err(format!("SIZE must be a multiple of {ALIGN}"));
    }
    let chunk = 16 << 20;
    let mut buf = AlignedBuf::new(chunk)?;
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("create {path}: {e}"))?;
    let t = Instant::now();
    let mut off = 0;
    while off < size {
        let len = chunk.min(size - off);
        fill_pattern(&mut buf.slice()[..len], off as u64);
        f.write_all_at(&buf.slice()[..len], off as u64)
            .map_err(|e| format!("write at {off}: {e}"))?;
        off += len;
    }
    f.sync_all().map_err(|e| format!("fsync: {e}"))?;
    let s = t.elapsed().as_secs_f64();
    println!(
        "wrote {path}: {} MiB in {s:.2} s ({:.0} MiB/s, O_DIRECT, fsync)",
        size >> 20,
        (size >> 20) as f64 / s
    );
    Ok(())
}

fn cmd_bench(args: &[String]) -> Res<()> {
    let mut file = None;
    let mut runs = 3;
    let mut chunk = 16 << 20;
    let mut device = 0;
    let mut threads = 4;
    let mut modes = vec![
        Mode::CuFile,
        Mode::CpuPinned,
        Mode::CpuPageable,
        Mode::ODirect,
        Mode::ODirectParallel,
    ];
    let mut cufile_lib =
        std::env::var("GPU_READ_CUFILE").unwrap_or_else(|_| "libcufile.so.0".into());
    let mut drop = true;
    let mut buf_register = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--runs" => runs = val()?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--chunk" => chunk = parse_size(&val()?)?,
            "--threads" => threads = val()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--device" => device = val()?.parse().map_err(|e| format!("--device: {e}"))?,
            "--modes" => {
                modes = val()?
                    .split(',')
                    .map(Mode::parse)
                    .collect::<Res<Vec<_>>>()?
            }
            "--cufile-lib" => cufile_lib = val()?,
            "--no-drop" => drop = false,
            "--no-buf-register" => buf_register = false,
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s => file = Some(s.to_string()),
        }
    }
    let file = file.ok_or("bench needs FILE")?;
    if chunk == 0 || chunk % ALIGN != 0 {
        return Err(format!("--chunk must be a positive multiple of {ALIGN}"));
    }
    let len = std::fs::metadata(&file)
        .map_err(|e| format!("{file}: {e}"))?
        .len() as usize;
    let size = len & !(ALIGN - 1);
    if size == 0 {
        return Err(format!("{file} is smaller than {ALIGN} bytes"));
    }

    let cuda = Cuda::load()?;
    let (gpu, drv) = cuda.open(device)?;
    println!(
        "GPU {device}: {gpu}; CUDA driver API {}.{}",
        drv / 1000,
        (drv % 1000) / 10
    );
    let mut dptr = 0;
    // SAFETY: out-pointer valid.
    cu("cuMemAlloc", unsafe { (cuda.mem_alloc)(&mut dptr, size) })?;
    let mut cufile = None;
    if modes.contains(&Mode::CuFile) {
        match open_cufile(&cufile_lib) {
            Ok(mut st) => {
                println!("cuFile: {}", st.summary);
                if buf_register {
                    // SAFETY: dptr is a device allocation of size bytes.
                    match cf("cuFileBufRegister", unsafe {
                        (st.api.buf_register)(dptr as *const c_void, size, 0)
                    }) {
                        Ok(()) => {
                            st.buf_registered = Some(dptr);
                            st.buf_note = format!("GPU buffer registered ({} MiB)", size >> 20);
                        }
                        Err(e) => st.buf_note = format!("GPU buffer not registered: {e}"),
                    }
                } else {
                    st.buf_note = "GPU buffer not registered (--no-buf-register)".into();
                }
                println!("cuFile: {}", st.buf_note);
                cufile = Some(st);
            }
            Err(e) => println!("cuFile: not available: {e}"),
        }
    }
    let dropped = if drop {
        match drop_caches() {
            Ok(()) => true,
            Err(e) => {
                println!("warning: cannot drop the page cache ({e}); the buffered CPU path may read from memory");
                false
            }
        }
    } else {
        false
    };
    println!(
        "file {file}: {} MiB read in {} KiB requests ((c2): {threads} threads), {runs} runs per path, \
         paths interleaved; page cache dropped before every read: {}",
        size >> 20,
        chunk >> 10,
        if dropped { "yes" } else { "no" }
    );
    let mut bench = Bench {
        cuda: &cuda,
        file,
        size,
        chunk,
        threads: threads.max(1),
        dptr,
        cufile,
    };
    let mut results: Vec<(Mode, Vec<f64>, Option<String>)> =
        modes.iter().map(|m| (*m, Vec::new(), None)).collect();
    for r in 1..=runs {
        for (mode, speeds, err) in results.iter_mut() {
            if err.is_some() {
                continue;
            }
            if dropped {
                drop_caches()?;
            }
            match bench.run(*mode) {
                Ok(el) => {
                    let mibs = (size as f64 / (1 << 20) as f64) / el.as_secs_f64();
                    println!(
                        "run {r} {:<46} {:>8.3} s {:>8.0} MiB/s (data verified)",
                        mode.label(),
                        el.as_secs_f64(),
                        mibs
                    );
                    speeds.push(mibs);
                }
                Err(e) => {
                    println!("run {r} {:<46} FAILED: {e}", mode.label());
                    *err = Some(e);
                }
            }
        }
    }
    let base = results
        .iter()
        .find(|(m, s, _)| *m == Mode::CpuPinned && !s.is_empty())
        .map(|(_, s, _)| median(s));
    println!();
    println!("| path | runs (MiB/s) | median MiB/s | vs (b) |");
    println!("|---|---|---|---|");
    for (mode, speeds, err) in &results {
        let runs_s = speeds
            .iter()
            .map(|s| format!("{s:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        match err {
            Some(e) if speeds.is_empty() => {
                println!("| {} | failed: {e} | - | - |", mode.label())
            }
            _ => {
                let m = median(speeds);
                let ratio = base.map_or("-".into(), |b| format!("{:.2} x", m / b));
                println!("| {} | {runs_s} | {m:.0} | {ratio} |", mode.label());
            }
        }
    }
    if let Some(st) = &bench.cufile {
        if let Some(b) = st.buf_registered {
            // SAFETY: registered above.
            unsafe { (st.api.buf_deregister)(b as *const c_void) };
        }
    }
    // SAFETY: allocated above.
    unsafe { (cuda.mem_free)(dptr) };
    if results.iter().any(|(_, s, e)| e.is_some() && s.is_empty()) {
        return Err("some paths failed".into());
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: gpu-read write FILE SIZE | gpu-read bench FILE [--runs N] [--chunk BYTES] \
                 [--modes cufile,cpu-pinned,cpu-pageable,odirect,odirect-mt] [--threads N] [--device N] [--cufile-lib PATH] \
                 [--no-drop] [--no-buf-register]";
    let res = match args.first().map(String::as_str) {
        Some("write") if args.len() == 3 => {
            parse_size(&args[2]).and_then(|n| cmd_write(&args[1], n))
        }
        Some("bench") => cmd_bench(&args[1..]),
        _ => Err(usage.into()),
    };
    if let Err(e) = res {
        eprintln!("gpu-read: {e}");
        std::process::exit(1);
    }
}
