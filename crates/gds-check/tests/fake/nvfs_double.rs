//! A test double of the nvidia-fs kernel module (NVIDIA/gds-nvidia-fs 2.28.4) that behaves like
//! the real one where the checks depend on it:
//!
//! - `/proc/driver/nvidia-fs/modules` lists only entries marked found (src/nvfs-proc.c:41-52,
//!   `"%s: %s\n"` of name and version; a NULL version prints `(null)`). `wekafsio` is a static
//!   entry with version "1" that is always found (src/nvfs-dma.c:146-157). The storage drivers
//!   (nvme, nvme_rdma, rpcrdma, ...) are looked up and registered only when a process opens
//!   `/dev/nvidia-fsN` (src/nvfs-core.c:1072-1090 `nvfs_open` -> `nvfs_blk_register_dma_ops` ->
//!   src/nvfs-mod.c:40-129 `probe_module_list`) and unregistered at the last close
//!   (src/nvfs-core.c:1093-1101 `nvfs_close` -> `cleanup_module_list`). So an idle node shows
//!   `wekafsio: 1` only.
//! - `version` is `version: <major>.<minor>` (src/nvfs-proc.c:84-89); `stats` prints the
//!   `Reads`/`Writes` byte counters only with `rw_stats_enabled=1` (src/nvfs-stat.c:204-268).
//!
//! The open/close tracking is real: a fanotify group with FAN_OPEN_PERM on the device nodes
//! (needs CAP_SYS_ADMIN, which the root test suite has). The permission event holds the
//! opener's `open()` until the double has rewritten the listing, so there is no race, exactly
//! as `nvfs_open` registers before returning.
#![allow(dead_code)]

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// modules_list order of src/nvfs-dma.c:61-200 (mmfslinux only with kernel RDMA support).
const ORDER: &[&str] = &[
    "nvme",
    "nvme_rdma",
    "sfxvdriver",
    "nvmeib_common",
    "lnet",
    "beegfs",
    "wekafsio",
    "rpcrdma",
    "scatefs",
];

pub struct NvfsDouble {
    pub root: PathBuf,
    registrable: Vec<String>,
    open_count: Arc<AtomicUsize>,
    opens_seen: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The listing as nvfs_modules_show prints it.
pub fn listing(registered: &[String]) -> String {
    let mut out = String::new();
    for name in ORDER {
        if *name == "wekafsio" {
            out += "wekafsio: 1\n";
        } else if registered.iter().any(|r| r == name) {
            out += &format!("{name}: (null)\n");
        }
    }
    out
}

/// `stats` as nvfs_stats_show prints it on an idle node, with or without rw_stats_enabled.
pub fn stats(rw_stats_enabled: bool, active: u32) -> String {
    let mut s = String::from(
        "GDS Version: 1.15.1.6 \nNVFS statistics(ver: 4.0)\nNVFS Driver(version: 2.28.4)\n\
         Mellanox PeerDirect Supported: False\n",
    );
    s += &format!(
        "IO stats: {}, peer IO stats: Disabled\nLogging level: warn\n\n",
        if rw_stats_enabled {
            "Enabled"
        } else {
            "Disabled"
        }
    );
    s += &format!("Active Shadow-Buffer (MiB): 0\nActive Process: {active}\n");
    if rw_stats_enabled {
        s += "Batches\t\t\t\t: n=0 ok=0 err=0 Avg-Submit-Latency(usec)=0\n\
              Reads\t\t\t\t: n=0 ok=0 err=0 readMiB=0 io_state_err=0\n\
              Reads\t\t\t\t: Bandwidth(MiB/s)=0 Avg-Latency(usec)=0\n";
    } else {
        s += "Reads\t\t\t\t: err=0 io_state_err=0\n";
    }
    s += "Sparse Reads\t\t        : n=0 io=0 holes=0 pages=0 \n";
    if rw_stats_enabled {
        s += "Writes\t\t\t\t: n=0 ok=0 err=0 writeMiB=0 io_state_err=0 pg-cache=0 pg-cache-fail=0 pg-cache-eio=0\n\
              Writes\t\t\t\t: Bandwidth(MiB/s)=0 Avg-Latency(usec)=0\n";
    } else {
        s += "Writes\t\t\t\t: err=0 io_state_err=0 pg-cache=0 pg-cache-fail=0 pg-cache-eio=0\n";
    }
    s += "Mmap\t\t\t\t: n=0 ok=0 err=0 munmap=0\n\
          Bar1-map\t\t\t: n=0 ok=0 err=0 free=0 callbacks=0 active=0 delay-frees=0\n\
          Error\t\t\t\t: cpu-gpu-pages=0 sg-ext=0 dma-map=0 dma-ref=0\n\
          Ops\t\t\t\t: Read=0 Write=0 BatchIO=0\n";
    s
}

fn write_atomic(p: &Path, text: &str) {
    let tmp = p.with_extension("tmp");
    fs::write(&tmp, text).expect("double: write");
    fs::rename(&tmp, p).expect("double: rename");
}

impl NvfsDouble {
    /// Lays out a loaded nvidia-fs 2.28 under `root` (`sys/module/nvidia_fs`,
    /// `proc/driver/nvidia-fs/{version,modules,stats}`, `dev/nvidia-fs0..devices`) and starts
    /// tracking opens of the device nodes. `registrable`: the storage drivers whose
    /// registration symbols the kernel exports (what `probe_module_list` would find).
    pub fn start(
        root: &Path,
        registrable: &[&str],
        devices: usize,
        rw_stats_enabled: bool,
    ) -> io::Result<NvfsDouble> {
        let proc_dir = root.join("proc/driver/nvidia-fs");
        fs::create_dir_all(&proc_dir)?;
        fs::create_dir_all(root.join("sys/module/nvidia_fs"))?;
        fs::create_dir_all(root.join("dev"))?;
        fs::write(root.join("sys/module/nvidia_fs/version"), "2.28.4\n")?;
        fs::write(proc_dir.join("version"), "version: 2.28\n")?;
        fs::write(proc_dir.join("stats"), stats(rw_stats_enabled, 0))?;
        write_atomic(&proc_dir.join("modules"), &listing(&[]));
        let mut devs = Vec::new();
        for i in 0..devices {
            let d = root.join(format!("dev/nvidia-fs{i}"));
            fs::write(&d, "")?;
            devs.push(d);
        }
        let me = NvfsDouble {
            root: root.to_path_buf(),
            registrable: registrable.iter().map(|s| s.to_string()).collect(),
            open_count: Arc::default(),
            opens_seen: Arc::default(),
            stop: Arc::default(),
            thread: None,
        };
        me.watch(devs)
    }

    fn watch(mut self, devs: Vec<PathBuf>) -> io::Result<NvfsDouble> {
        let tracker = Tracker {
            fan: fanotify_on(&devs)?,
            modules: self.root.join("proc/driver/nvidia-fs/modules"),
            count: Arc::clone(&self.open_count),
            seen: Arc::clone(&self.opens_seen),
            stop: Arc::clone(&self.stop),
            registrable: self.registrable.clone(),
        };
        self.thread = Some(std::thread::spawn(move || tracker.run()));
        Ok(self)
    }

    /// How many times a device node was opened.
    pub fn opens_seen(&self) -> usize {
        self.opens_seen.load(Ordering::SeqCst)
    }

    /// The listing as it reads now (idle: `wekafsio: 1` only).
    pub fn modules_now(&self) -> String {
        fs::read_to_string(self.root.join("proc/driver/nvidia-fs/modules")).unwrap_or_default()
    }
}

impl Drop for NvfsDouble {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A fanotify group holding every open of `devs` until it is answered, and reporting closes.
fn fanotify_on(devs: &[PathBuf]) -> io::Result<i32> {
    // SAFETY: plain syscalls with valid arguments.
    let fan = unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
            (libc::O_RDONLY | libc::O_CLOEXEC) as u32,
        )
    };
    if fan < 0 {
        return Err(io::Error::last_os_error());
    }
    for d in devs {
        let c = std::ffi::CString::new(d.as_os_str().as_bytes()).unwrap();
        // SAFETY: `fan` is our fanotify fd and `c` a NUL-terminated path alive for the call.
        let r = unsafe {
            libc::fanotify_mark(
                fan,
                libc::FAN_MARK_ADD,
                libc::FAN_OPEN_PERM | libc::FAN_CLOSE_WRITE | libc::FAN_CLOSE_NOWRITE,
                libc::AT_FDCWD,
                c.as_ptr(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: `fan` is ours and not used after this.
            unsafe { libc::close(fan) };
            return Err(e);
        }
    }
    Ok(fan)
}

/// The thread that plays nvfs_open/nvfs_close on the listing.
struct Tracker {
    fan: i32,
    modules: PathBuf,
    count: Arc<AtomicUsize>,
    seen: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    registrable: Vec<String>,
}

impl Tracker {
    fn run(self) {
        let mut buf = vec![0u8; 64 * 1024];
        while !self.stop.load(Ordering::Relaxed) {
            let mut pfd = libc::pollfd {
                fd: self.fan,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, alive for the call.
            if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
                continue;
            }
            // SAFETY: reads at most buf.len() bytes into buf, which we own.
            let n = unsafe { libc::read(self.fan, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                continue;
            }
            let mut off = 0usize;
            let meta = std::mem::size_of::<libc::fanotify_event_metadata>();
            while off + meta <= n as usize {
                // SAFETY: the kernel wrote whole events; read_unaligned copes with the buffer.
                let ev: libc::fanotify_event_metadata =
                    unsafe { std::ptr::read_unaligned(buf.as_ptr().add(off).cast()) };
                self.event(&ev);
                off += ev.event_len as usize;
            }
        }
        // SAFETY: the thread owns `fan` and stops using it here.
        unsafe { libc::close(self.fan) };
    }

    fn event(&self, ev: &libc::fanotify_event_metadata) {
        if ev.mask & libc::FAN_OPEN_PERM != 0 {
            // nvfs_open: register what can be found, then let open() return.
            if self.count.fetch_add(1, Ordering::SeqCst) == 0 {
                write_atomic(&self.modules, &listing(&self.registrable));
            }
            self.seen.fetch_add(1, Ordering::SeqCst);
            let resp = libc::fanotify_response {
                fd: ev.fd,
                response: libc::FAN_ALLOW,
            };
            // SAFETY: writes one fanotify_response from a live local.
            unsafe {
                libc::write(
                    self.fan,
                    (&resp as *const libc::fanotify_response).cast(),
                    std::mem::size_of::<libc::fanotify_response>(),
                )
            };
        }
        if ev.mask & (libc::FAN_CLOSE_WRITE | libc::FAN_CLOSE_NOWRITE) != 0 {
            // nvfs_close: the last close unregisters.
            if self.count.fetch_sub(1, Ordering::SeqCst) == 1 {
                write_atomic(&self.modules, &listing(&[]));
            }
        }
        if ev.fd >= 0 {
            // SAFETY: the kernel handed us this event fd; we close it once.
            unsafe { libc::close(ev.fd) };
        }
    }
}
