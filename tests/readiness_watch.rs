//! The readiness watcher on a fixture host tree, with a real unix socket standing where
//! node-driver-registrar's registration socket would be and inotify watching its directory
//! as the kubelet's plugin watcher does: the socket is taken out and put back (what the
//! kubelet turns into a new registration, and a NodeGetInfo call) exactly when readiness
//! changes, and never while it stays the same.
// A test or scenario panics on what it did not expect, and reads top to bottom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

use std::io::{self, Read};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gds_csi::gds::gate::{node_topology, GateConfig, GdsGate};
use gds_csi::gds::readiness::{spawn, WatchConfig};

mod common;
use common::gds_fixture::Tree;

const INTERVAL: Duration = Duration::from_millis(25);
const SOCKET: &str = "d.example-reg.sock";

/// inotify on a directory: the events the kubelet's plugin watcher would get.
struct Watch(std::fs::File);

impl Watch {
    fn new(dir: &Path) -> Watch {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: no pointers; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1: {}", io::Error::last_os_error());
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        let mask = libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_TO;
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        let wd = unsafe { libc::inotify_add_watch(fd, path.as_ptr(), mask) };
        assert!(wd >= 0, "inotify_add_watch: {}", io::Error::last_os_error());
        // SAFETY: fd is a new inotify descriptor that nothing else owns.
        Watch(unsafe { std::fs::File::from_raw_fd(fd) })
    }

    /// Events on the socket's name so far (the temporary `.`-name the kubelet ignores is
    /// left out), as "delete" / "create" / "moved_to".
    fn events(&mut self) -> Vec<&'static str> {
        let mut buf = vec![0u8; 8192];
        let n = self.0.read(&mut buf).unwrap_or(0);
        let head = std::mem::size_of::<libc::inotify_event>();
        let (mut off, mut out) = (0, Vec::new());
        while off + head <= n {
            // SAFETY: the kernel wrote a whole event at `off`; the buffer is unaligned bytes.
            let ev: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
            let name = String::from_utf8_lossy(&buf[off + head..off + head + ev.len as usize])
                .trim_end_matches('\0')
                .to_string();
            off += head + ev.len as usize;
            if name != SOCKET {
                continue;
            }
            out.push(match ev.mask {
                libc::IN_DELETE => "delete",
                libc::IN_MOVED_TO => "moved_to",
                _ => "create",
            });
        }
        out
    }

    /// Waits (bounded) until `want` events have come, then eight intervals more for extras
    /// (the watcher acts at its second look, so a relink would show within that).
    async fn wait_for(&mut self, want: usize) -> Vec<&'static str> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        while seen.len() < want && Instant::now() < deadline {
            tokio::time::sleep(INTERVAL).await;
            seen.extend(self.events());
        }
        tokio::time::sleep(INTERVAL * 8).await;
        seen.extend(self.events());
        seen
    }
}

fn gate(tree: &Tree) -> Arc<GdsGate> {
    let (exe, prefix) = tree.probe_stub("true_gds");
    Arc::new(GdsGate::new(GateConfig {
        paths: tree.paths.clone(),
        probe_exe: exe,
        probe_prefix: prefix,
        cufile_library: None,
        probe_timeout: Duration::from_secs(10),
        cache_ttl: Duration::from_secs(60),
    }))
}

fn nvme_label(g: &GdsGate) -> Option<String> {
    node_topology(Some(g), "d.example", Default::default())
        .get("d.example/gds-nvme")
        .cloned()
}

#[tokio::test]
async fn the_kubelet_is_made_to_register_again_when_readiness_changes_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let tree = Tree::new(&dir.path().join("host"));
    tree.gpu_node(); // a GPU, but nvidia_fs not loaded yet
    let registry = dir.path().join("plugins_registry");
    std::fs::create_dir(&registry).unwrap();
    let socket = registry.join(SOCKET);
    let _registrar = UnixListener::bind(&socket).unwrap();
    let g = gate(&tree);
    assert_eq!(nvme_label(&g), None, "not ready: no key, never \"false\"");
    let mut watch = Watch::new(&registry);
    spawn(
        Arc::clone(&g),
        WatchConfig {
            interval: INTERVAL,
            registration_socket: Some(socket.clone()),
        },
    );

    // Unchanged readiness: the registration is left alone.
    assert_eq!(watch.wait_for(0).await, Vec::<&str>::new());

    // nvidia_fs loaded after the driver started.
    tree.nvidia_fs("nvme: 1\n");
    assert_eq!(watch.wait_for(2).await, ["delete", "moved_to"]);
    assert_eq!(nvme_label(&g).as_deref(), Some("true"));
    assert!(std::fs::symlink_metadata(&socket).is_ok());
    // Once only.
    assert_eq!(watch.wait_for(0).await, Vec::<&str>::new());

    // Unloaded again: the CSINode's keys follow (the label itself the kubelet keeps).
    tree.remove("sys/module/nvidia_fs");
    assert_eq!(watch.wait_for(2).await, ["delete", "moved_to"]);
    assert_eq!(nvme_label(&g), None);
    assert_eq!(std::fs::read_dir(&registry).unwrap().count(), 1);
}
