//! What the probe answers: the status of the run, the GDS mode, and what each cuFile call
//! returned. Serialized as the one JSON line the child prints.

use super::ffi::{error_name, RawDrvProps, RawError};
use super::ProbeArgs;
use crate::Backend;
use serde::{Deserialize, Serialize};

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
    pub(super) fn from_raw(e: RawError) -> Self {
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
    pub(super) fn from_raw(p: &RawDrvProps) -> Self {
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
            // Bit 5 (NVMe-oF) says nothing about the pool's PCIe namespaces.
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
    pub(super) fn summary(&self) -> String {
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
    pub(super) fn new(args: &ProbeArgs, status: ProbeStatus, detail: impl Into<String>) -> Self {
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
