//! Makes the kubelet register the driver again, so that it calls NodeGetInfo again, without
//! restarting anything: the registrar's registration socket is taken out of the kubelet's
//! plugin directory and put back under its name as a new directory entry of the same socket.
//!
//! What the kubelet (Kubernetes 1.34) does with that, in `pkg/kubelet/pluginmanager`:
//! - `pluginwatcher/plugin_watcher.go:75-82`: inotify's delete is a Remove, and the
//!   rename's IN_MOVED_TO is a Create (fsnotify 1.9 `backend_inotify.go:520`);
//!   `:166-169` ignores names starting with `.`, so the temporary link is never seen;
//! - `cache/desired_state_of_world.go:140-144`: every Create gives the socket a new UUID;
//! - `reconciler/reconciler.go:115-131`: a registered plugin whose socket is gone, or came
//!   back with another UUID, is unregistered, then registered again (`:150-163`), and
//!   registering calls GetInfo on the registrar, then NodeGetInfo on the driver
//!   (`pkg/volume/csi/csi_plugin.go:149`) and writes its topology to the Node's labels.
//!
//! The registrar keeps serving: a unix socket is found by its inode, so a new name of the
//! same inode reaches the same listener, and node-driver-registrar's /healthz (a stat and
//! a GetInfo through the path, `cmd/csi-node-driver-registrar/node_register.go` httpServer,
//! v2.17.0) passes again as soon as the name is back. If anything fails after the name was
//! removed, the registrar's /healthz fails, its liveness probe restarts it, and its new
//! socket registers: the same outcome, with a container restart.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What [`reregister`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reregistered {
    /// The socket was taken out and put back: the kubelet registers it again.
    Relinked,
    /// No registration socket: the registrar has not registered yet (or is restarting);
    /// when it does, the kubelet calls NodeGetInfo then.
    NoSocket,
    /// The socket changed under us (the registrar restarted meanwhile): its new socket is
    /// registered by the kubelet on its own.
    Replaced,
}

/// The temporary name: in the same directory (a hard link cannot leave the filesystem) and
/// starting with `.`, which the kubelet's plugin watcher ignores.
fn temporary_name(socket: &Path) -> io::Result<PathBuf> {
    let name = socket.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} has no file name", socket.display()),
        )
    })?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(".gds-csi-relink");
    Ok(socket.with_file_name(tmp))
}

/// Takes the registration `socket` out of the kubelet's plugin directory and puts the same
/// socket back under its name (see the module's comment). Refuses a path that is not a
/// socket; never touches another file.
pub fn reregister(socket: &Path) -> io::Result<Reregistered> {
    let before = match fs::symlink_metadata(socket) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Reregistered::NoSocket),
        Err(e) => return Err(e),
    };
    if !before.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a socket; not touching it", socket.display()),
        ));
    }
    let tmp = temporary_name(socket)?;
    // Left by an earlier attempt that died between its steps.
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    fs::hard_link(socket, &tmp)?;
    // The registrar may have replaced its socket between the stat and the link: then the
    // link names a dead socket, and the new one needs nothing from us.
    let same = fs::symlink_metadata(socket)
        .is_ok_and(|m| m.ino() == before.ino() && m.dev() == before.dev());
    if !same {
        fs::remove_file(&tmp)?;
        return Ok(Reregistered::Replaced);
    }
    // The kubelet sees a Remove, then a Create of the same socket.
    fs::remove_file(socket)?;
    fs::rename(&tmp, socket)?;
    Ok(Reregistered::Relinked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};

    /// inotify on `dir`, as the kubelet's plugin watcher watches its directory.
    struct Watch(std::fs::File);

    impl Watch {
        fn new(dir: &Path) -> Watch {
            use std::os::fd::FromRawFd;
            use std::os::unix::ffi::OsStrExt;
            // SAFETY: no pointers; the result is checked.
            let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
            assert!(fd >= 0, "inotify_init1: {}", io::Error::last_os_error());
            let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
            let mask = libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_TO | libc::IN_MOVED_FROM;
            // SAFETY: `path` is a NUL-terminated string that outlives the call.
            let wd = unsafe { libc::inotify_add_watch(fd, path.as_ptr(), mask) };
            assert!(wd >= 0, "inotify_add_watch: {}", io::Error::last_os_error());
            // SAFETY: fd is a new inotify descriptor that nothing else owns.
            Watch(unsafe { std::fs::File::from_raw_fd(fd) })
        }

        /// The events so far, as `(mask, name)`.
        fn events(&mut self) -> Vec<(u32, String)> {
            let mut buf = vec![0u8; 4096];
            let n = self.0.read(&mut buf).unwrap_or(0);
            let mut out = Vec::new();
            let mut off = 0;
            let head = std::mem::size_of::<libc::inotify_event>();
            while off + head <= n {
                // SAFETY: the kernel wrote a whole inotify_event at `off` (read_unaligned
                // because the buffer is a byte array).
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
                let name = &buf[off + head..off + head + ev.len as usize];
                let name = String::from_utf8_lossy(name)
                    .trim_end_matches('\0')
                    .to_string();
                out.push((ev.mask, name));
                off += head + ev.len as usize;
            }
            out
        }
    }

    fn echo_server(socket: &Path) -> std::thread::JoinHandle<()> {
        let listener = UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            for mut c in listener.incoming().flatten().take(2) {
                let mut b = [0u8; 4];
                c.read_exact(&mut b).unwrap();
                c.write_all(&b).unwrap();
            }
        })
    }

    fn round_trip(socket: &Path) {
        let mut c = UnixStream::connect(socket).unwrap();
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
    }

    #[test]
    fn the_watcher_sees_the_socket_go_and_come_back_and_the_same_listener_answers() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("gds.example-reg.sock");
        let server = echo_server(&socket);
        round_trip(&socket);
        let ino = fs::metadata(&socket).unwrap().ino();
        let mut watch = Watch::new(dir.path());

        assert_eq!(reregister(&socket).unwrap(), Reregistered::Relinked);

        let name = "gds.example-reg.sock".to_string();
        let seen: Vec<(u32, String)> = watch
            .events()
            .into_iter()
            .filter(|(_, n)| !n.starts_with('.'))
            .collect();
        // What fsnotify turns into Remove then Create for the kubelet.
        assert_eq!(
            seen,
            vec![(libc::IN_DELETE, name.clone()), (libc::IN_MOVED_TO, name)],
            "{seen:?}"
        );
        // The same socket under its name, no temporary name left, still answering.
        assert_eq!(fs::metadata(&socket).unwrap().ino(), ino);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("gds.example-reg.sock")]
        );
        round_trip(&socket);
        server.join().unwrap();
    }

    #[test]
    fn no_socket_is_nothing_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("gds.example-reg.sock");
        assert_eq!(reregister(&socket).unwrap(), Reregistered::NoSocket);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_file_that_is_not_a_socket_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gds.example-reg.sock");
        fs::write(&path, "data").unwrap();
        let e = reregister(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(fs::read_to_string(&path).unwrap(), "data");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_leftover_temporary_link_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("gds.example-reg.sock");
        let _listener = UnixListener::bind(&socket).unwrap();
        fs::write(temporary_name(&socket).unwrap(), "old").unwrap();
        assert_eq!(reregister(&socket).unwrap(), Reregistered::Relinked);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(fs::symlink_metadata(&socket)
            .unwrap()
            .file_type()
            .is_socket());
    }
}
