//! cuFile probe. libcufile is loaded with dlopen in a *child* process: `cuFileDriverOpen` has
//! been seen to hang for over 60 s on a node without a GPU, and a crash inside the library must
//! not take the CSI plugin down. The parent ([`run_probe`]) puts the child in its own process
//! group, kills the group at the deadline and always returns a [`ProbeOutcome`].
//!
//! Protocol: the child prints exactly one JSON [`ProbeOutcome`] line on stdout, and
//! `gds-probe stage: <name>` lines on stderr as it goes, so a timeout can say where it hung.

use crate::parse::strip_json_comments;
use crate::{Backend, Check};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::ffi::{c_int, c_uint, c_void, CString};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const DEFAULT_LIBRARY: &str = "libcufile.so.0";
const STAGE_PREFIX: &str = "gds-probe stage: ";
const INFO_PREFIX: &str = "gds-probe info: ";

/// What the child is asked to do. Round-trips through argv ([`ProbeArgs::to_args`],
/// [`ProbeArgs::parse`]) so the main binary's hidden `cufile-probe` subcommand can forward it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeArgs {
    /// libcufile to dlopen; default: `libcufile.so.0` from the loader's search path.
    pub library: Option<PathBuf>,
    /// A file on the volume to register, or a directory on it (a scratch file is created there
    /// and removed). None: only open the driver and read its properties.
    pub path: Option<PathBuf>,
    pub backend: Backend,
    /// Run with compat mode off (private cufile.json with `allow_compat_mode: false`), so a
    /// successful registration cannot be a silent POSIX fallback. On by default: the only
    /// per-file answer cuFile gives (`cuFileDriverGetProperties` is driver-wide). When the
    /// strict run finds no GDS path, [`run_probe`] runs a second, compat-allowed child to tell
    /// compat mode from "cuFile does not work here".
    pub strict: bool,
    /// libcuda for the read check (GPU memory); default `libcuda.so.1` from the loader path.
    pub cuda_library: Option<PathBuf>,
    /// cufile.json to start from; default `$CUFILE_ENV_PATH_JSON` or `/etc/cufile.json`.
    pub cufile_json: Option<PathBuf>,
    /// Where cufile.log (and the strict config) go; default: a fresh temp dir, removed after.
    pub work_dir: Option<PathBuf>,
}

impl ProbeArgs {
    pub fn new(backend: Backend) -> Self {
        ProbeArgs {
            library: None,
            path: None,
            backend,
            strict: true,
            cuda_library: None,
            cufile_json: None,
            work_dir: None,
        }
    }

    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec!["--backend".to_string(), self.backend.to_string()];
        let mut push = |flag: &str, p: &Option<PathBuf>| {
            if let Some(p) = p {
                v.push(flag.to_string());
                v.push(p.to_string_lossy().into_owned());
            }
        };
        push("--library", &self.library);
        push("--path", &self.path);
        push("--cufile-json", &self.cufile_json);
        push("--work-dir", &self.work_dir);
        push("--cuda-library", &self.cuda_library);
        if !self.strict {
            v.push("--no-strict".to_string());
        }
        v
    }

    pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Self, String> {
        let mut a = ProbeArgs::new(Backend::Nvme);
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let mut val = |f: &str| it.next().ok_or_else(|| format!("{f} needs a value"));
            match flag.as_str() {
                "--backend" => a.backend = val(&flag)?.parse()?,
                "--library" => a.library = Some(val(&flag)?.into()),
                "--path" => a.path = Some(val(&flag)?.into()),
                "--cufile-json" => a.cufile_json = Some(val(&flag)?.into()),
                "--work-dir" => a.work_dir = Some(val(&flag)?.into()),
                "--strict" => a.strict = true,
                "--no-strict" => a.strict = false,
                "--cuda-library" => a.cuda_library = Some(val(&flag)?.into()),
                other => return Err(format!("unknown probe argument {other:?}")),
            }
        }
        Ok(a)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeStatus {
    /// The child ran every step; see `mode` and the per-call results.
    Completed,
    LibraryMissing,
    SymbolMissing,
    /// The file or directory to register could not be opened with O_DIRECT.
    FileError,
    BadArgs,
    TimedOut,
    /// Killed by a signal (segfault, abort) without answering.
    Crashed,
    SpawnFailed,
    /// Exited without a parsable answer.
    NoOutput,
}

/// What a volume gets from cuFile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GdsMode {
    /// DMA straight to GPU memory.
    TrueGds,
    /// cuFile works but through POSIX bounce buffers.
    Compat,
    /// cuFile does not work on this volume at all.
    Unavailable,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CuFileResult {
    pub code: i32,
    pub name: String,
    /// CUDA driver error, meaningful when `code` is 5011 CUDA_DRIVER_ERROR.
    pub cu_err: i32,
}

impl CuFileResult {
    fn from_raw(e: RawError) -> Self {
        CuFileResult {
            code: e.err,
            name: error_name(e.err).to_string(),
            cu_err: e.cu_err,
        }
    }
    pub fn ok(&self) -> bool {
        self.code == 0
    }
}

impl std::fmt::Display for CuFileResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.ok() {
            f.write_str("ok")
        } else if self.code == 5011 {
            write!(
                f,
                "{} {} (CUDA error {})",
                self.code, self.name, self.cu_err
            )
        } else {
            write!(f, "{} {}", self.code, self.name)
        }
    }
}

/// `CUfileDrvProps_t`, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverProps {
    pub nvfs_major: u32,
    pub nvfs_minor: u32,
    pub poll_thresh_size: u64,
    pub max_direct_io_size: u64,
    pub dstatusflags: u32,
    pub dcontrolflags: u32,
    pub fflags: u32,
    pub max_device_cache_size: u32,
    pub per_buffer_cache_size: u32,
    pub max_device_pinned_mem_size: u32,
    pub max_batch_io_size: u32,
    pub max_batch_io_timeout_msecs: u32,
    /// Names of the `dstatusflags` bits set: filesystems/devices with a true GDS path.
    pub supported: Vec<String>,
    pub compat_allowed: bool,
    pub poll_mode: bool,
    pub p2pdma: bool,
}

const STATUS_BITS: &[(u32, &str)] = &[
    (0, "lustre"),
    (1, "wekafs"),
    (2, "nfs"),
    (3, "gpfs"),
    (4, "nvme"),
    (5, "nvmeof"),
    (6, "scsi"),
    (7, "scaleflux_csd"),
    (8, "nvmesh"),
    (9, "beegfs"),
    (11, "nvme_p2p"),
    (12, "scatefs"),
    (13, "virtiofs"),
    (14, "panfs"),
];

impl DriverProps {
    fn from_raw(p: &RawDrvProps) -> Self {
        let bit = |v: u32, b: u32| v & (1 << b) != 0;
        DriverProps {
            nvfs_major: p.nvfs.major_version,
            nvfs_minor: p.nvfs.minor_version,
            poll_thresh_size: p.nvfs.poll_thresh_size as u64,
            max_direct_io_size: p.nvfs.max_direct_io_size as u64,
            dstatusflags: p.nvfs.dstatusflags,
            dcontrolflags: p.nvfs.dcontrolflags,
            fflags: p.fflags,
            max_device_cache_size: p.max_device_cache_size,
            per_buffer_cache_size: p.per_buffer_cache_size,
            max_device_pinned_mem_size: p.max_device_pinned_mem_size,
            max_batch_io_size: p.max_batch_io_size,
            max_batch_io_timeout_msecs: p.max_batch_io_timeout_msecs,
            supported: STATUS_BITS
                .iter()
                .filter(|(b, _)| bit(p.nvfs.dstatusflags, *b))
                .map(|(_, n)| n.to_string())
                .collect(),
            poll_mode: bit(p.nvfs.dcontrolflags, 0),
            compat_allowed: bit(p.nvfs.dcontrolflags, 1),
            p2pdma: bit(p.fflags, 4),
        }
    }

    /// Whether the driver has a true GDS path for this backend.
    pub fn supports(&self, backend: Backend) -> bool {
        let bit = |b: u32| self.dstatusflags & (1 << b) != 0;
        match backend {
            // Bit 5 (NVMe-oF) says nothing about the pool's PCIe namespaces (issue 17 #4).
            Backend::Nvme => bit(4) || self.p2pdma,
            Backend::NfsRdma => bit(2),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeOutcome {
    pub status: ProbeStatus,
    pub mode: GdsMode,
    /// One sentence on why `status`/`mode` are what they are.
    pub detail: String,
    pub backend: Backend,
    pub strict: bool,
    pub library: Option<String>,
    /// `cuFileGetVersion`: 1000*major + 10*minor (1200 = 1.20).
    pub library_version: Option<i32>,
    pub driver_open: Option<CuFileResult>,
    pub props: Option<DriverProps>,
    pub file: Option<String>,
    pub registration: Option<CuFileResult>,
    /// The last step the child reported before it answered, hung or died.
    pub stage: Option<String>,
    pub elapsed_ms: u64,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Last lines of cufile.log (it often names the real cause, e.g. a missing udev property).
    pub log_tail: Vec<String>,
    pub stderr_tail: Option<String>,
    /// cuFileRead of the file's first bytes into GPU memory, compared with a POSIX read.
    #[serde(default)]
    pub read: Option<ReadCheck>,
    /// With [`ProbeArgs::strict`]: what the compat-off run said, when this outcome is the
    /// second, compat-allowed run.
    #[serde(default)]
    pub strict_pass: Option<String>,
}

/// The data-path proof: bytes read by cuFile into GPU memory match the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadCheck {
    pub bytes: u64,
    /// cuFileRead's return value (bytes read, or a negative error).
    pub returned: i64,
    pub matches: bool,
    pub first_mismatch: Option<u64>,
    /// Why the read could not run (no CUDA, no GPU memory, ...).
    pub error: Option<String>,
    /// Which path the read took: TrueGds when compat mode was off for this run (cuFile could
    /// not have fallen back to POSIX), Compat otherwise.
    pub mode: GdsMode,
    pub elapsed_us: u64,
}

impl ReadCheck {
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.matches && self.returned == self.bytes as i64
    }
    fn summary(&self) -> String {
        match &self.error {
            Some(e) => format!("cuFileRead check not run: {e}"),
            None if self.ok() => format!(
                "cuFileRead {} KiB into GPU memory: bytes match ({:?} path, {} us)",
                self.bytes / 1024,
                self.mode,
                self.elapsed_us
            ),
            None => format!(
                "cuFileRead {} KiB returned {}{}",
                self.bytes / 1024,
                self.returned,
                self.first_mismatch
                    .map_or(String::new(), |o| format!(", wrong byte at offset {o}"))
            ),
        }
    }
}

impl ProbeOutcome {
    fn new(args: &ProbeArgs, status: ProbeStatus, detail: impl Into<String>) -> Self {
        ProbeOutcome {
            status,
            mode: GdsMode::Unknown,
            detail: detail.into(),
            backend: args.backend,
            strict: args.strict,
            library: None,
            library_version: None,
            driver_open: None,
            props: None,
            file: None,
            registration: None,
            stage: None,
            elapsed_ms: 0,
            exit_code: None,
            signal: None,
            log_tail: Vec::new(),
            stderr_tail: None,
            read: None,
            strict_pass: None,
        }
    }

    /// One line for check evidence and logs.
    pub fn summary(&self) -> String {
        let mut s = vec![format!("{:?}: {}", self.status, self.detail)];
        if let Some(v) = self.library_version {
            s.push(format!("libcufile {}.{}", v / 1000, (v % 1000) / 10));
        }
        if let Some(r) = &self.driver_open {
            s.push(format!("cuFileDriverOpen {r}"));
        }
        if let Some(p) = &self.props {
            s.push(format!(
                "nvfs {}.{}, true-GDS paths [{}], compat {}",
                p.nvfs_major,
                p.nvfs_minor,
                p.supported.join(","),
                if p.compat_allowed { "allowed" } else { "off" }
            ));
        }
        if let Some(r) = &self.registration {
            s.push(format!(
                "cuFileHandleRegister({}) {r}",
                self.file.as_deref().unwrap_or("?")
            ));
        }
        if let Some(r) = self
            .read
            .as_ref()
            .filter(|_| !self.detail.contains("cuFileRead"))
        {
            s.push(r.summary());
        }
        s.push(format!("mode {:?}", self.mode));
        if let Some(l) = self.log_tail.last() {
            s.push(format!("cufile.log: {}", l.trim()));
        }
        s.join("; ")
    }
}

/// Names for cuFile's `CUfileOpError` codes (cufile.h of libcufile 1.15 .. 1.20).
pub fn error_name(code: i32) -> &'static str {
    match code {
        0 => "SUCCESS",
        5001 => "DRIVER_NOT_INITIALIZED",
        5002 => "DRIVER_INVALID_PROPS",
        5003 => "DRIVER_UNSUPPORTED_LIMIT",
        5004 => "DRIVER_VERSION_MISMATCH",
        5005 => "DRIVER_VERSION_READ_ERROR",
        5006 => "DRIVER_CLOSING",
        5007 => "PLATFORM_NOT_SUPPORTED",
        5008 => "IO_NOT_SUPPORTED",
        5009 => "DEVICE_NOT_SUPPORTED",
        5010 => "NVFS_DRIVER_ERROR",
        5011 => "CUDA_DRIVER_ERROR",
        5012 => "CUDA_POINTER_INVALID",
        5013 => "CUDA_MEMORY_TYPE_INVALID",
        5014 => "CUDA_POINTER_RANGE_ERROR",
        5015 => "CUDA_CONTEXT_MISMATCH",
        5016 => "INVALID_MAPPING_SIZE",
        5017 => "INVALID_MAPPING_RANGE",
        5018 => "INVALID_FILE_TYPE",
        5019 => "INVALID_FILE_OPEN_FLAG",
        5020 => "DIO_NOT_SET",
        5022 => "INVALID_VALUE",
        5023 => "MEMORY_ALREADY_REGISTERED",
        5024 => "MEMORY_NOT_REGISTERED",
        5025 => "PERMISSION_DENIED",
        5026 => "DRIVER_ALREADY_OPEN",
        5027 => "HANDLE_NOT_REGISTERED",
        5028 => "HANDLE_ALREADY_REGISTERED",
        5029 => "DEVICE_NOT_FOUND",
        5030 => "INTERNAL_ERROR",
        5031 => "GETNEWFD_FAILED",
        5033 => "NVFS_SETUP_ERROR",
        5034 => "IO_DISABLED",
        5035 => "BATCH_SUBMIT_FAILED",
        5036 => "GPU_MEMORY_PINNING_FAILED",
        5037 => "BATCH_FULL",
        5038 => "ASYNC_NOT_SUPPORTED",
        5039 => "INTERNAL_BATCH_SETUP_ERROR",
        5040 => "INTERNAL_BATCH_SUBMIT_ERROR",
        5041 => "INTERNAL_BATCH_GETSTATUS_ERROR",
        5042 => "INTERNAL_BATCH_CANCEL_ERROR",
        5043 => "NOMEM_ERROR",
        5044 => "IO_ERROR",
        5045 => "INTERNAL_BUF_REGISTER_ERROR",
        5046 => "HASH_OPR_ERROR",
        5047 => "INVALID_CONTEXT_ERROR",
        5048 => "NVFS_INTERNAL_DRIVER_ERROR",
        5049 => "BATCH_NOCOMPAT_ERROR",
        5050 => "IO_MAX_ERROR",
        _ => "UNKNOWN_ERROR",
    }
}

// ---------------------------------------------------------------------------------------------
// FFI layouts (cufile.h)

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawError {
    err: c_int,
    cu_err: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawNvfs {
    major_version: c_uint,
    minor_version: c_uint,
    poll_thresh_size: usize,
    max_direct_io_size: usize,
    dstatusflags: c_uint,
    dcontrolflags: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawDrvProps {
    nvfs: RawNvfs,
    fflags: c_uint,
    max_device_cache_size: c_uint,
    per_buffer_cache_size: c_uint,
    max_device_pinned_mem_size: c_uint,
    max_batch_io_size: c_uint,
    max_batch_io_timeout_msecs: c_uint,
}

/// Slack after the struct in case a newer library writes a larger one.
#[repr(C)]
struct PaddedDrvProps {
    props: RawDrvProps,
    _slack: [u64; 64],
}

#[repr(C)]
union RawHandle {
    fd: c_int,
    handle: *mut c_void,
}

#[repr(C)]
struct RawDescr {
    type_: c_int,
    handle: RawHandle,
    fs_ops: *const c_void,
}

// Layout facts measured on an H200 (fd at offset 4 gives 5018 INVALID_FILE_TYPE).
const _: () = assert!(std::mem::size_of::<RawDrvProps>() == 56);
const _: () = assert!(std::mem::offset_of!(RawDescr, handle) == 8);
const _: () = assert!(std::mem::offset_of!(RawDescr, fs_ops) == 16);

const CU_FILE_HANDLE_TYPE_OPAQUE_FD: c_int = 1;

type FnVersion = unsafe extern "C" fn(*mut c_int) -> RawError;
type FnVoid = unsafe extern "C" fn() -> RawError;
type FnProps = unsafe extern "C" fn(*mut RawDrvProps) -> RawError;
type FnRegister = unsafe extern "C" fn(*mut *mut c_void, *mut RawDescr) -> RawError;
type FnDeregister = unsafe extern "C" fn(*mut c_void);

fn stage(s: &str) {
    // stderr is unbuffered: the parent sees this even if the next call hangs.
    let _ = writeln!(std::io::stderr(), "{STAGE_PREFIX}{s}");
}

fn emit(o: &ProbeOutcome) {
    let line = serde_json::to_string(o).unwrap_or_else(|_| "{}".into());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn tail_lines(p: &Path, n: usize) -> Vec<String> {
    let Ok(t) = std::fs::read(p) else {
        return Vec::new();
    };
    let t = String::from_utf8_lossy(&t);
    let lines: Vec<&str> = t.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn unique_temp_dir() -> std::io::Result<PathBuf> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let d = std::env::temp_dir().join(format!("gds-probe-{}-{n}-{nanos}", std::process::id()));
    std::fs::create_dir(&d)?;
    Ok(d)
}

/// Private cufile.json for strict mode: the operator's config with compat mode off and the log
/// redirected, so the probe neither falls back silently nor writes into the volume.
fn write_strict_config(src: &Path, work: &Path) -> Result<PathBuf, String> {
    let mut v: Value = std::fs::read_to_string(src)
        .ok()
        .and_then(|t| strip_json_comments(&t).ok())
        .and_then(|t| serde_json::from_str(&t).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| Value::Object(Default::default()));
    let obj = |v: &mut Value, k: &str| -> Option<()> {
        let m = v.as_object_mut()?;
        let e = m
            .entry(k)
            .or_insert_with(|| Value::Object(Default::default()));
        if !e.is_object() {
            *e = Value::Object(Default::default());
        }
        Some(())
    };
    obj(&mut v, "properties");
    obj(&mut v, "logging");
    v["properties"]["allow_compat_mode"] = Value::Bool(false);
    v["logging"]["dir"] = Value::String(work.to_string_lossy().into_owned());
    let dst = work.join("cufile.json");
    std::fs::write(&dst, serde_json::to_vec_pretty(&v).unwrap_or_default())
        .map_err(|e| format!("{}: {e}", dst.display()))?;
    Ok(dst)
}

/// Fills the scratch file with [`pattern`] bytes, or leaves it sparse on a full volume.
fn write_scratch(f: &mut std::fs::File, target: &Path) -> Result<(), String> {
    let written = f
        .write_all(&pattern(READ_BYTES as usize))
        .and_then(|_| f.sync_all());
    match written {
        Ok(()) => Ok(()),
        // A full volume must not be refused for the probe's sake: a sparse file needs no
        // space, reads as zeros, and the check compares with what POSIX reads anyway.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) => f
            .set_len(0)
            .and_then(|_| f.set_len(READ_BYTES))
            .map_err(|e| format!("truncate {}: {e}", target.display())),
        Err(e) => {
            let _ = std::fs::remove_file(target);
            Err(format!("write {}: {e}", target.display()))
        }
    }
}

/// A regular file of at least one page in `dir` or one level below, for a volume the probe
/// cannot write to.
fn existing_file(dir: &Path) -> Option<PathBuf> {
    let mut dirs = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(d) = dirs.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d).ok()?.filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            seen += 1;
            if seen > 1000 {
                return None;
            }
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_file() && e.metadata().is_ok_and(|m| m.len() >= 4096) {
                return Some(e.path());
            }
            if ft.is_dir() && d == dir {
                dirs.push(e.path());
            }
        }
    }
    None
}

/// An O_DIRECT fd for registration, the scratch file to remove afterwards (if one was made), and
/// the file the fd is on.
fn open_direct(p: &Path) -> Result<(c_int, Option<PathBuf>, PathBuf), String> {
    let (mut target, mut scratch) = if p.is_dir() {
        let f = p.join(format!(".gds-probe-{}", std::process::id()));
        (f.clone(), Some(f))
    } else {
        (p.to_path_buf(), None)
    };
    if scratch.is_some() {
        // Known bytes for the read check, written (and synced) through the page cache first.
        use std::os::unix::fs::OpenOptionsExt;
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&target);
        let mut f = match created {
            Ok(f) => Some(f),
            // A read-only volume is probed on a file already there, read-only.
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => match existing_file(p) {
                Some(existing) => {
                    target = existing;
                    scratch = None;
                    None
                }
                None => {
                    return Err(format!(
                        "create {}: {e}, and no file of 4 KiB or more to probe instead",
                        target.display()
                    ))
                }
            },
            Err(e) => return Err(format!("create {}: {e}", target.display())),
        };
        if let Some(f) = f.as_mut() {
            write_scratch(f, &target)?;
        }
    }
    let c = CString::new(target.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let flags = libc::O_RDONLY | libc::O_DIRECT | libc::O_CLOEXEC;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags, 0o600 as c_uint) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("open {} with O_DIRECT: {e}", target.display()));
    }
    Ok((fd, scratch, target))
}

/// How much the read check reads: a few MiB, enough for several DMA segments.
pub const READ_BYTES: u64 = 4 << 20;

/// Non-repeating bytes (xorshift), so a shifted or partial read cannot match by chance.
fn pattern(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

// CUDA driver API, for the GPU buffer of the read check (cuda.h; CUdeviceptr is 64-bit).
type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type CuCtxSet = unsafe extern "C" fn(*mut c_void) -> c_int;
type CuMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;
type CuMemFree = unsafe extern "C" fn(u64) -> c_int;
type CuMemcpyDtoH = unsafe extern "C" fn(*mut c_void, u64, usize) -> c_int;
/// `ssize_t cuFileRead(CUfileHandle_t, void *bufPtr_base, size_t, off_t file_offset,
/// off_t bufPtr_offset)` (cufile.h).
type FnRead = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, i64, i64) -> isize;

/// A GPU buffer on device 0 in its primary context, made current on this thread.
struct GpuBuf {
    ptr: u64,
    len: usize,
    free: CuMemFree,
    dtoh: CuMemcpyDtoH,
}

impl GpuBuf {
    fn new(lib_name: &std::ffi::OsStr, len: usize) -> Result<GpuBuf, String> {
        // SAFETY: loading the CUDA driver library; kept for the process's life.
        let lib = unsafe { libloading::Library::new(lib_name) }
            .map_err(|e| format!("cannot load {}: {e}", lib_name.to_string_lossy()))?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        macro_rules! f {
            ($t:ty, $n:literal) => {
                // SAFETY: signature as in cuda.h.
                *unsafe { lib.get::<$t>(concat!($n, "\0").as_bytes()) }
                    .map_err(|e| format!("{}: {e}", $n))?
            };
        }
        let init = f!(CuInit, "cuInit");
        let dev_get = f!(CuDeviceGet, "cuDeviceGet");
        let retain = f!(CuCtxRetain, "cuDevicePrimaryCtxRetain");
        let set = f!(CuCtxSet, "cuCtxSetCurrent");
        let alloc = f!(CuMemAlloc, "cuMemAlloc_v2");
        let free = f!(CuMemFree, "cuMemFree_v2");
        let dtoh = f!(CuMemcpyDtoH, "cuMemcpyDtoH_v2");
        let ck = |what: &str, r: c_int| {
            if r == 0 {
                Ok(())
            } else {
                Err(format!("{what} returned CUDA error {r}"))
            }
        };
        let (mut dev, mut ctx, mut ptr) = (0, std::ptr::null_mut(), 0u64);
        // SAFETY: valid out pointers; the calls follow the driver API's order.
        unsafe {
            ck("cuInit", init(0))?;
            ck("cuDeviceGet", dev_get(&mut dev, 0))?;
            ck("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev))?;
            ck("cuCtxSetCurrent", set(ctx))?;
            ck("cuMemAlloc", alloc(&mut ptr, len))?;
        }
        Ok(GpuBuf {
            ptr,
            len,
            free,
            dtoh,
        })
    }

    fn to_host(&self) -> Result<Vec<u8>, String> {
        let mut v = vec![0u8; self.len];
        // SAFETY: v has len bytes; ptr is a device allocation of len bytes.
        let r = unsafe { (self.dtoh)(v.as_mut_ptr().cast(), self.ptr, self.len) };
        if r != 0 {
            return Err(format!("cuMemcpyDtoH returned CUDA error {r}"));
        }
        Ok(v)
    }
}

impl Drop for GpuBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in new().
        unsafe { (self.free)(self.ptr) };
    }
}

/// Bytes of the file the read check covers: up to READ_BYTES, whole 4 KiB pages (O_DIRECT).
fn read_len(fd: c_int) -> u64 {
    // SAFETY: `libc::stat` is plain old data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes at most one `stat` into `st`, which lives across the call; a bad
    // fd only makes it return -1.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return 0;
    }
    (st.st_size as u64).min(READ_BYTES) & !4095
}

/// cuFileRead of the first `len` bytes into `gpu`, compared with what POSIX reads.
fn read_check(
    read: FnRead,
    fh: *mut c_void,
    gpu: &GpuBuf,
    file: &Path,
    len: u64,
    strict: bool,
) -> ReadCheck {
    let mut rc = ReadCheck {
        bytes: len,
        returned: -1,
        matches: false,
        first_mismatch: None,
        error: None,
        // Compat off for this run: a successful read cannot have gone through POSIX.
        mode: if strict {
            GdsMode::TrueGds
        } else {
            GdsMode::Compat
        },
        elapsed_us: 0,
    };
    let t = Instant::now();
    // SAFETY: fh is registered; the GPU buffer holds at least len bytes.
    let n = unsafe { read(fh, gpu.ptr as *mut c_void, len as usize, 0, 0) };
    rc.elapsed_us = t.elapsed().as_micros() as u64;
    rc.returned = n as i64;
    if n as i64 != len as i64 {
        return rc;
    }
    let got = match gpu.to_host() {
        Ok(v) => v,
        Err(e) => {
            rc.error = Some(e);
            return rc;
        }
    };
    let want = match std::fs::File::open(file).and_then(|mut f| {
        let mut v = vec![0u8; len as usize];
        f.read_exact(&mut v).map(|_| v)
    }) {
        Ok(v) => v,
        Err(e) => {
            rc.error = Some(format!(
                "POSIX read of {} for comparison: {e}",
                file.display()
            ));
            return rc;
        }
    };
    rc.first_mismatch = got[..len as usize]
        .iter()
        .zip(&want)
        .position(|(a, b)| a != b)
        .map(|p| p as u64);
    rc.matches = rc.first_mismatch.is_none();
    rc
}

fn decide_mode(o: &ProbeOutcome) -> (GdsMode, String) {
    let Some(open) = &o.driver_open else {
        return (GdsMode::Unknown, "driver not opened".into());
    };
    if !open.ok() {
        return (
            GdsMode::Unavailable,
            format!("cuFileDriverOpen failed: {open}"),
        );
    }
    let path_ok = o.props.as_ref().is_some_and(|p| p.supports(o.backend));
    let compat = o.props.as_ref().is_some_and(|p| p.compat_allowed);
    let what = match o.backend {
        Backend::Nvme => "NVMe",
        Backend::NfsRdma => "NFS",
    };
    match &o.registration {
        Some(r) if !r.ok() => {
            (
                GdsMode::Unavailable,
                if o.strict {
                    format!("compat mode off: cuFileHandleRegister failed: {r}: no GDS path for this file")
                } else {
                    format!("cuFileHandleRegister failed: {r}")
                },
            )
        }
        Some(_) => match &o.read {
            Some(rd) if !rd.ok() => (
                GdsMode::Unavailable,
                format!("registered, but {}", rd.summary()),
            ),
            // Compat off for this run: cuFile had to take the GDS path for this very file
            // (troubleshooting guide, API errors: CU_FILE_IO_NOT_SUPPORTED otherwise).
            _ if o.strict => (
                GdsMode::TrueGds,
                format!(
                    "registered with compat mode off{}",
                    o.read
                        .as_ref()
                        .map_or(String::new(), |r| format!("; {}", r.summary()))
                ),
            ),
            // With compat allowed, registration succeeds on any O_DIRECT file: it proves
            // that cuFile works, not that this file gets DMA to GPU memory.
            _ => (
                GdsMode::Compat,
                format!(
                    "registered with compat mode allowed (no per-file GDS proof){}",
                    o.read
                        .as_ref()
                        .map_or(String::new(), |r| format!("; {}", r.summary()))
                ),
            ),
        },
        None if path_ok => (
            GdsMode::TrueGds,
            format!("driver has a {what} GDS path (no file registered)"),
        ),
        None if compat => (
            GdsMode::Compat,
            format!("no {what} GDS path; compat mode allowed"),
        ),
        None => (
            GdsMode::Unavailable,
            format!("no {what} GDS path and compat mode off"),
        ),
    }
}

/// Runs in the child process. Prints one JSON [`ProbeOutcome`] line; returns the exit code
/// (0 when every step ran, whatever the verdict). The caller should exit with it promptly.
pub fn probe_child_main(args: ProbeArgs) -> i32 {
    let t0 = Instant::now();
    let mut o = ProbeOutcome::new(&args, ProbeStatus::Completed, "");
    let abs = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());

    // Work dir: cufile.log and the strict config land here instead of the cwd (the volume).
    let (work, own_work) = match &args.work_dir {
        Some(d) => (abs(d), false),
        None => match unique_temp_dir() {
            Ok(d) => (d, true),
            Err(e) => {
                o.status = ProbeStatus::BadArgs;
                o.detail = format!("cannot create a work dir: {e}");
                emit(&o);
                return 2;
            }
        },
    };
    let path = args.path.as_ref().map(abs);
    let cfg_src = args
        .cufile_json
        .as_ref()
        .map(abs)
        .unwrap_or_else(crate::default_cufile_json);
    if args.strict {
        match write_strict_config(&cfg_src, &work) {
            Ok(p) => std::env::set_var("CUFILE_ENV_PATH_JSON", p),
            Err(e) => {
                o.status = ProbeStatus::BadArgs;
                o.detail = format!("cannot write strict cufile.json: {e}");
                emit(&o);
                return 2;
            }
        }
    } else if args.cufile_json.is_some() {
        std::env::set_var("CUFILE_ENV_PATH_JSON", &cfg_src);
    }
    std::env::set_var("CUFILE_LOGFILE_PATH", work.join("cufile.log"));
    let _ = std::env::set_current_dir(&work);

    let code = run_steps(&args, path.as_deref(), &mut o);
    o.elapsed_ms = t0.elapsed().as_millis() as u64;
    o.log_tail = tail_lines(&work.join("cufile.log"), 20);
    if own_work {
        let _ = std::fs::remove_dir_all(&work);
    }
    emit(&o);
    code
}

fn run_steps(args: &ProbeArgs, path: Option<&Path>, o: &mut ProbeOutcome) -> i32 {
    let lib_name = args
        .library
        .as_ref()
        .map(|p| p.as_os_str().to_owned())
        .unwrap_or_else(|| DEFAULT_LIBRARY.into());
    o.library = Some(lib_name.to_string_lossy().into_owned());
    stage("dlopen");
    o.stage = Some("dlopen".into());
    // SAFETY: loading libcufile runs its initialisers; that is why this runs in a child.
    let lib = match unsafe { libloading::Library::new(&lib_name) } {
        Ok(l) => l,
        Err(e) => {
            o.status = ProbeStatus::LibraryMissing;
            o.detail = format!("cannot load {}: {e}", lib_name.to_string_lossy());
            return 3;
        }
    };
    // Never dlclose: libcufile keeps threads; unloading under them can crash at exit.
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));

    macro_rules! sym {
        ($t:ty, $($name:literal),+) => {{
            let mut found: Option<$t> = None;
            $(
                if found.is_none() {
                    // SAFETY: the signature matches cufile.h for this symbol.
                    found = unsafe { lib.get::<$t>(concat!($name, "\0").as_bytes()) }.ok().map(|s| *s);
                }
            )+
            match found {
                Some(f) => f,
                None => {
                    o.status = ProbeStatus::SymbolMissing;
                    o.detail = format!("{} lacks {}", lib_name.to_string_lossy(), [$($name),+].join(" / "));
                    return 4;
                }
            }
        }};
    }
    let get_version = sym!(FnVersion, "cuFileGetVersion");
    let driver_open = sym!(FnVoid, "cuFileDriverOpen");
    let get_props = sym!(FnProps, "cuFileDriverGetProperties");
    let register = sym!(FnRegister, "cuFileHandleRegister");
    let deregister = sym!(FnDeregister, "cuFileHandleDeregister");
    let driver_close = sym!(FnVoid, "cuFileDriverClose_v2", "cuFileDriverClose");
    let file_read = sym!(FnRead, "cuFileRead");

    stage("cuFileGetVersion");
    o.stage = Some("cuFileGetVersion".into());
    let mut v: c_int = 0;
    // SAFETY: valid out pointer.
    let r = unsafe { get_version(&mut v) };
    if r.err == 0 {
        o.library_version = Some(v);
        // For the parent, in case a later call hangs and no JSON answer comes.
        let _ = writeln!(std::io::stderr(), "{INFO_PREFIX}library_version={v}");
    }

    // Open the file before the driver: a file problem is reported even if the driver hangs.
    let mut fd_info = None;
    if let Some(p) = path {
        o.file = Some(p.to_string_lossy().into_owned());
        match open_direct(p) {
            Ok(x) => fd_info = Some(x),
            Err(e) => {
                o.status = ProbeStatus::FileError;
                o.detail = e;
            }
        }
    }

    // The GPU buffer for the read check, before cuFile starts (it uses the current context).
    let mut gpu = None;
    if let Some((fd, _, _)) = &fd_info {
        let len = read_len(*fd);
        if len > 0 {
            stage("cuda");
            o.stage = Some("cuda".into());
            let cuda = args
                .cuda_library
                .as_ref()
                .map(|p| p.as_os_str().to_owned())
                .unwrap_or_else(|| "libcuda.so.1".into());
            gpu = Some((len, GpuBuf::new(&cuda, len as usize)));
        }
    }

    stage("cuFileDriverOpen");
    o.stage = Some("cuFileDriverOpen".into());
    // SAFETY: no arguments.
    let r = CuFileResult::from_raw(unsafe { driver_open() });
    let opened = r.ok();
    o.driver_open = Some(r);

    if opened {
        stage("cuFileDriverGetProperties");
        o.stage = Some("cuFileDriverGetProperties".into());
        let mut buf = PaddedDrvProps {
            props: RawDrvProps::default(),
            _slack: [0; 64],
        };
        // SAFETY: buffer is larger than CUfileDrvProps_t.
        let r = unsafe { get_props(&mut buf.props) };
        if r.err == 0 {
            o.props = Some(DriverProps::from_raw(&buf.props));
        }

        if let Some((fd, _, _)) = &fd_info {
            stage("cuFileHandleRegister");
            o.stage = Some("cuFileHandleRegister".into());
            let mut descr = RawDescr {
                type_: CU_FILE_HANDLE_TYPE_OPAQUE_FD,
                handle: RawHandle {
                    handle: std::ptr::null_mut(),
                },
                fs_ops: std::ptr::null(),
            };
            descr.handle.fd = *fd;
            let mut fh: *mut c_void = std::ptr::null_mut();
            // SAFETY: descr is a valid CUfileDescr_t with an open O_DIRECT fd.
            let r = CuFileResult::from_raw(unsafe { register(&mut fh, &mut descr) });
            if r.ok() {
                let file = fd_info.as_ref().map(|(_, _, f)| f.clone());
                match (&gpu, file) {
                    (Some((len, Ok(buf))), Some(f)) => {
                        stage("cuFileRead");
                        o.stage = Some("cuFileRead".into());
                        o.read = Some(read_check(file_read, fh, buf, &f, *len, args.strict));
                    }
                    (Some((len, Err(e))), _) => {
                        o.read = Some(ReadCheck {
                            bytes: *len,
                            returned: -1,
                            matches: false,
                            first_mismatch: None,
                            error: Some(e.clone()),
                            mode: GdsMode::Unknown,
                            elapsed_us: 0,
                        })
                    }
                    _ => {}
                }
                stage("cuFileHandleDeregister");
                // SAFETY: fh came from a successful registration.
                unsafe { deregister(fh) };
            }
            o.registration = Some(r);
        }
        stage("cuFileDriverClose");
        o.stage = Some("cuFileDriverClose".into());
        // SAFETY: the driver was opened above.
        unsafe { driver_close() };
    }
    drop(gpu);
    if let Some((fd, scratch, _)) = fd_info {
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        if let Some(s) = scratch {
            let _ = std::fs::remove_file(s);
        }
    }
    o.stage = Some("done".into());
    let (mode, why) = decide_mode(o);
    o.mode = mode;
    if o.status == ProbeStatus::Completed {
        o.detail = why;
    } else {
        o.detail = format!("{}; {why}", o.detail);
    }
    0
}

// ---------------------------------------------------------------------------------------------
// parent side

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        _ => "signal",
    }
}

const MAX_CAPTURE: usize = 1 << 20;

fn capture<R: Read + Send + 'static>(mut r: R) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = Arc::clone(&buf);
    // Detached: if a stray process keeps the pipe open, we read what is there and move on.
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut g = b.lock().unwrap_or_else(|e| e.into_inner());
                    if g.len() < MAX_CAPTURE {
                        g.extend_from_slice(&chunk[..n]);
                    }
                }
            }
        }
    });
    buf
}

fn snapshot(b: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&b.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

/// Spawns `exe <prefix...> <probe args>` in its own process group and waits at most `timeout`.
/// Never panics; every failure mode comes back as a [`ProbeOutcome`].
pub fn run_probe(
    exe: &Path,
    exe_args_prefix: &[String],
    args: &ProbeArgs,
    timeout: Duration,
) -> ProbeOutcome {
    let t0 = Instant::now();
    // The parent owns the work dir so it can read cufile.log even after killing the child.
    let mut child_args = args.clone();
    let own_work = if args.work_dir.is_none() {
        match unique_temp_dir() {
            Ok(d) => {
                child_args.work_dir = Some(d);
                true
            }
            Err(_) => false,
        }
    } else {
        false
    };
    let (mut o, child_pid) = spawn_and_wait(exe, exe_args_prefix, &child_args, timeout);
    if args.strict && o.status == ProbeStatus::Completed && o.mode == GdsMode::Unavailable {
        // No GDS path with compat off. Ask again with compat allowed (libcufile reads its
        // config once per process, so this is a second child) to tell compat mode from a
        // cuFile that does not work at all.
        let left = timeout.saturating_sub(t0.elapsed());
        let mut lenient = child_args.clone();
        lenient.strict = false;
        let (mut o2, pid2) = spawn_and_wait(exe, exe_args_prefix, &lenient, left);
        remove_scratch(pid2, &args.path);
        o2.strict = true;
        o2.strict_pass = Some(o.detail.clone());
        if o2.status == ProbeStatus::Completed {
            if o2.mode == GdsMode::TrueGds {
                o2.mode = GdsMode::Compat;
            }
            o2.detail = match o2.mode {
                GdsMode::Compat => format!(
                    "compat mode: with compat off, {}; with compat allowed, {}",
                    o.detail, o2.detail
                ),
                _ => format!("{}; with compat allowed too: {}", o.detail, o2.detail),
            };
            if o2.mode != GdsMode::Compat {
                o2.mode = GdsMode::Unavailable;
            }
            remove_scratch(child_pid, &args.path);
            o = o2;
        } else {
            // The second child hung or broke: the strict answer stands.
            o.detail += &format!("; the compat-allowed run: {:?}: {}", o2.status, o2.detail);
        }
    }
    remove_scratch(child_pid, &args.path);
    o.elapsed_ms = t0.elapsed().as_millis() as u64;
    if let Some(w) = &child_args.work_dir {
        if o.log_tail.is_empty() {
            o.log_tail = tail_lines(&w.join("cufile.log"), 20);
        }
        if own_work {
            let _ = std::fs::remove_dir_all(w);
        }
    }
    o
}

/// A child killed mid-probe leaves its scratch file on the volume; remove it here.
fn remove_scratch(child_pid: Option<u32>, path: &Option<PathBuf>) {
    if let (Some(pid), Some(p)) = (child_pid, path) {
        if p.is_dir() {
            let _ = std::fs::remove_file(p.join(format!(".gds-probe-{pid}")));
        }
    }
}

fn spawn_and_wait(
    exe: &Path,
    prefix: &[String],
    args: &ProbeArgs,
    timeout: Duration,
) -> (ProbeOutcome, Option<u32>) {
    let mut cmd = Command::new(exe);
    cmd.args(prefix)
        .args(args.to_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let o = ProbeOutcome::new(
                args,
                ProbeStatus::SpawnFailed,
                format!("cannot start {}: {e}", exe.display()),
            );
            return (o, None);
        }
    };
    let pgid = child.id() as i32;
    let out = capture(child.stdout.take().expect("piped"));
    let err = capture(child.stderr.take().expect("piped"));
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() >= deadline => {
                timed_out = true;
                // SAFETY: signalling our child's own process group.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => {
                // SAFETY: kill(2) takes no pointers; -pgid is our child's own process group.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                break child.wait().ok();
            }
        }
    };
    // Anything the child left behind in its group (helpers, threads' forks) goes too.
    // SAFETY: as above; ESRCH when the group is already gone is fine.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    // Let the reader threads drain the closed pipes.
    let drain_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < drain_until && Arc::strong_count(&out) + Arc::strong_count(&err) > 2 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stdout = snapshot(&out);
    let stderr = snapshot(&err);

    let last_stage = stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(STAGE_PREFIX))
        .map(str::to_string);
    let info_version: Option<i32> = stderr
        .lines()
        .filter_map(|l| {
            l.strip_prefix(INFO_PREFIX)?
                .strip_prefix("library_version=")
        })
        .find_map(|v| v.trim().parse().ok());
    let other_stderr: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with(STAGE_PREFIX) && !l.starts_with(INFO_PREFIX))
        .collect();
    let stderr_tail = (!other_stderr.is_empty()).then(|| {
        let t = other_stderr[other_stderr.len().saturating_sub(10)..].join("\n");
        t.chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect()
    });
    let answer = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<ProbeOutcome>(l.trim()).ok());

    let mut o = match answer {
        Some(a) => a,
        None => {
            let (st, detail) = if timed_out {
                (
                    ProbeStatus::TimedOut,
                    format!(
                        "no answer within {:.1} s (killed); last step: {}",
                        timeout.as_secs_f64(),
                        last_stage.as_deref().unwrap_or("none")
                    ),
                )
            } else {
                match status.and_then(|s| s.signal()) {
                    Some(sig) => (
                        ProbeStatus::Crashed,
                        format!(
                            "killed by signal {sig} ({}) during {}",
                            signal_name(sig),
                            last_stage.as_deref().unwrap_or("startup")
                        ),
                    ),
                    None => (
                        ProbeStatus::NoOutput,
                        format!(
                            "exited with {} without an answer",
                            status
                                .and_then(|s| s.code())
                                .map_or("unknown status".into(), |c| format!("code {c}"))
                        ),
                    ),
                }
            };
            let mut o = ProbeOutcome::new(args, st, detail);
            o.library = Some(
                args.library
                    .as_ref()
                    .map_or(DEFAULT_LIBRARY.to_string(), |p| {
                        p.to_string_lossy().into_owned()
                    }),
            );
            o.library_version = info_version;
            o.file = args.path.as_ref().map(|p| p.to_string_lossy().into_owned());
            o
        }
    };
    if o.stage.is_none() || o.status == ProbeStatus::TimedOut || o.status == ProbeStatus::Crashed {
        o.stage = last_stage.or(o.stage.take());
    }
    if let Some(s) = status {
        o.exit_code = s.code();
        o.signal = s.signal();
    }
    if timed_out && o.status != ProbeStatus::TimedOut {
        o.detail += "; the child answered but did not exit before the deadline (killed)";
    }
    o.stderr_tail = stderr_tail;
    (o, Some(pgid as u32))
}

// ---------------------------------------------------------------------------------------------
// checks

/// The probe as a check: Pass only for true GDS. Compat mode is a Warn here; callers that
/// require true GDS (gdsPolicy=required) use [`probe_check_required`] or look at `mode`.
pub fn probe_check(outcome: &ProbeOutcome) -> Check {
    to_check(outcome, false)
}

/// Like [`probe_check`], but compat mode is a Fail.
pub fn probe_check_required(outcome: &ProbeOutcome) -> Check {
    to_check(outcome, true)
}

fn to_check(o: &ProbeOutcome, required: bool) -> Check {
    let id = "cufile.probe";
    let title = "cuFile gives this volume true GDS";
    let ev = o.summary();
    match (o.status, o.mode) {
        (ProbeStatus::Completed, GdsMode::TrueGds) => Check::pass(id, title, ev),
        (ProbeStatus::Completed, GdsMode::Compat) => {
            let r = "fix the failing node and volume checks (nvidia_fs registration, mount \
                     options, udev); until then cuFile reads through POSIX bounce buffers";
            if required {
                Check::fail(id, title, ev, r)
            } else {
                Check::warn(id, title, ev, r)
            }
        }
        (ProbeStatus::LibraryMissing, _) | (ProbeStatus::SymbolMissing, _) => Check::fail(
            id,
            title,
            ev,
            "install libcufile (CUDA GDS packages or the nvidia-cufile wheel) or pass its path",
        ),
        (ProbeStatus::TimedOut, _) => Check::fail(
            id,
            title,
            ev,
            "cuFile hung (seen in cuFileDriverOpen without a working GPU driver): check \
             nvidia-smi, the NVIDIA driver and nvidia_fs",
        ),
        (ProbeStatus::Crashed, _) => Check::fail(
            id,
            title,
            ev,
            "libcufile crashed: check that its version matches the NVIDIA driver and nvidia_fs",
        ),
        _ => Check::fail(
            id,
            title,
            ev,
            "see the error code: 5027 usually means no udev data for the device, 5034 a \
             denylist entry, 5001 nvidia_fs missing with compat mode off",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_round_trip() {
        let mut a = ProbeArgs::new(Backend::NfsRdma);
        a.library = Some("/x/libcufile.so.0".into());
        a.path = Some("/mnt/v a".into());
        a.strict = true;
        assert_eq!(ProbeArgs::parse(a.to_args()).unwrap(), a);
        assert!(ProbeArgs::parse(["--bogus".to_string()]).is_err());
        assert!(ProbeArgs::parse(["--path".to_string()]).is_err());
    }

    #[test]
    fn names_and_modes() {
        assert_eq!(error_name(5027), "HANDLE_NOT_REGISTERED");
        assert_eq!(error_name(5034), "IO_DISABLED");
        assert_eq!(error_name(4242), "UNKNOWN_ERROR");
        let raw = RawDrvProps {
            nvfs: RawNvfs {
                dstatusflags: 1 << 4,
                dcontrolflags: 0x2,
                ..Default::default()
            },
            fflags: 0xf,
            ..Default::default()
        };
        let p = DriverProps::from_raw(&raw);
        assert_eq!(p.supported, ["nvme"]);
        assert!(p.compat_allowed && p.supports(Backend::Nvme) && !p.supports(Backend::NfsRdma));

        let mut o = ProbeOutcome::new(&ProbeArgs::new(Backend::Nvme), ProbeStatus::Completed, "");
        o.driver_open = Some(CuFileResult::from_raw(RawError::default()));
        o.props = Some(p.clone());
        o.registration = Some(CuFileResult::from_raw(RawError::default()));
        // Registered with compat off: the GDS path for this file.
        assert_eq!(decide_mode(&o).0, GdsMode::TrueGds);
        // Registered with compat allowed: no per-file proof, whatever the driver advertises.
        o.strict = false;
        assert_eq!(decide_mode(&o).0, GdsMode::Compat);
        // H200 without nvidia_fs: dstatusflags 0, compat allowed.
        o.props = Some(DriverProps::from_raw(&RawDrvProps {
            nvfs: RawNvfs {
                dcontrolflags: 2,
                ..Default::default()
            },
            fflags: 0xf,
            ..Default::default()
        }));
        let (m, _) = decide_mode(&o);
        assert_eq!(m, GdsMode::Compat);
        o.mode = m;
        assert_eq!(probe_check(&o).status, crate::Status::Warn);
        assert_eq!(probe_check_required(&o).status, crate::Status::Fail);
        o.registration = Some(CuFileResult::from_raw(RawError {
            err: 5027,
            cu_err: 0,
        }));
        let (m, why) = decide_mode(&o);
        assert_eq!(m, GdsMode::Unavailable);
        assert!(why.contains("5027 HANDLE_NOT_REGISTERED"), "{why}");
    }
}
