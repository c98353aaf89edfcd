//! Test-only stand-ins placed first on the driver's PATH (never shipped): `mkfs.ext4` and
//! `mkfs.xfs` that record every call, every real run and every dry run and can be held at
//! a gate, and a `wipefs` that can write a foreign filesystem right after the driver's
//! first probe, or fail.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The filesystem UUID of the "foreign" ext4 the wipefs stand-in writes.
pub const FOREIGN_UUID: &str = "0f0f0f0f-1111-2222-3333-444455556666";

#[derive(Clone)]
pub struct Tools {
    pub dir: PathBuf,
}

fn real(program: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(!path.is_empty(), "{program} is not installed");
    path
}

fn script(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

impl Tools {
    pub fn install(root: &Path) -> Tools {
        let dir = root.join("tools");
        let bin = dir.join("bin");
        fs::create_dir_all(&bin).unwrap();
        let d = dir.display();
        let mkfs = real("mkfs.ext4");
        let wipefs = real("wipefs");
        // `calls`: one line per invocation (its pid); `runs`: one per real mkfs started,
        // of either filesystem. While `gate` exists the call waits (readiness-driven tests
        // open it).
        for program in ["mkfs.ext4", "mkfs.xfs"] {
            let real_mkfs = real(program);
            script(
                &bin.join(program),
                &format!(
                    // A dry run (`-N`/`-n`: the driver sizing a filesystem's minimum) is
                    // neither a call nor a run: it goes to `dry-runs` and waits while
                    // `dry-run-gate` exists.
                    "#!/bin/sh\ncase \" $* \" in *\" -N \"*|*\" -n \"*)\n\
                     echo $$ >> {d}/mkfs.dry-runs\n\
                     while [ -e {d}/dry-run-gate ]; do sleep 0.05; done\n\
                     exec {real_mkfs} \"$@\";; esac\n\
                     echo $$ >> {d}/mkfs.calls\n\
                     while [ -e {d}/gate ]; do sleep 0.05; done\n\
                     echo $$ >> {d}/mkfs.runs\nexec {real_mkfs} \"$@\"\n"
                ),
            );
        }
        script(
            &bin.join("wipefs"),
            &format!(
                "#!/bin/sh\nfor a; do last=$a; done\n\
                 if [ -e {d}/probe-fail ] && [ \"$1\" = --no-act ] && [ \"$last\" = \"$(cat {d}/probe-fail)\" ]; then\n\
                 echo \"wipefs: $last: injected read error\" >&2; exit 1\nfi\n\
                 out=$({wipefs} \"$@\"); rc=$?\n\
                 if [ -e {d}/inject ] && [ \"$1\" = --no-act ]; then\n\
                 dev=$(cat {d}/inject); rm -f {d}/inject\n\
                 {mkfs} -q -U {FOREIGN_UUID} \"$dev\" </dev/null >/dev/null 2>&1\nfi\n\
                 printf '%s\\n' \"$out\"; exit $rc\n"
            ),
        );
        Tools { dir }
    }

    /// The PATH to start the driver with.
    pub fn path_env(&self) -> String {
        format!(
            "{}:{}",
            self.dir.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    fn lines(&self, name: &str) -> Vec<u32> {
        fs::read_to_string(self.dir.join(name))
            .unwrap_or_default()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    }

    /// Pids of every mkfs.ext4 invocation by the driver, in order.
    pub fn mkfs_calls(&self) -> Vec<u32> {
        self.lines("mkfs.calls")
    }

    /// Pids of every mkfs dry run by the driver, in order.
    pub fn mkfs_dry_runs(&self) -> Vec<u32> {
        self.lines("mkfs.dry-runs")
    }

    /// Holds every mkfs dry run before it runs until [`Tools::open_dry_run_gate`].
    pub fn close_dry_run_gate(&self) {
        fs::write(self.dir.join("dry-run-gate"), "").unwrap();
    }

    pub fn open_dry_run_gate(&self) {
        let _ = fs::remove_file(self.dir.join("dry-run-gate"));
    }

    /// How many real mkfs.ext4 runs the driver started.
    pub fn mkfs_runs(&self) -> usize {
        self.lines("mkfs.runs").len()
    }

    /// Holds every mkfs.ext4 call before it runs until [`Tools::open_gate`].
    pub fn close_gate(&self) {
        fs::write(self.dir.join("gate"), "").unwrap();
    }

    pub fn open_gate(&self) {
        let _ = fs::remove_file(self.dir.join("gate"));
    }

    /// Every `wipefs --no-act` of `dev` fails (exit 1, a read error on stderr) until
    /// [`Tools::heal_probe`]: a signature probe that errors.
    pub fn fail_probe_of(&self, dev: &Path) {
        fs::write(self.dir.join("probe-fail"), dev.to_str().unwrap()).unwrap();
    }

    pub fn heal_probe(&self) {
        let _ = fs::remove_file(self.dir.join("probe-fail"));
    }

    /// The next `wipefs --no-act` writes a foreign ext4 on `dev` after it has answered.
    pub fn inject_foreign_after_probe(&self, dev: &Path) {
        fs::write(self.dir.join("inject"), dev.to_str().unwrap()).unwrap();
    }
}

/// `blkid -p -o value -s <tag>` of a device, empty when absent.
pub fn blkid_tag(dev: &Path, tag: &str) -> String {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", tag, dev.to_str().unwrap()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Whether a process has ended (gone, or a zombie waiting for its new parent).
pub fn process_ended(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().unwrap().split_whitespace().next() == Some("Z"),
    }
}

/// Whether every byte of the device reads back as zero.
pub fn reads_back_zeros(dev: &Path) -> bool {
    use std::io::Read;
    let mut f = fs::File::open(dev).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return true;
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return false;
        }
    }
}

/// One MiB of `byte` written at byte `at` of `dev`, flushed to the device.
pub fn scribble(dev: &Path, at: u64, byte: u8) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = fs::OpenOptions::new().write(true).open(dev).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&vec![byte; 1 << 20]).unwrap();
    f.sync_all().unwrap();
}

/// Whether `len` bytes at `start` of `dev` are all zero (its page cache dropped first).
pub fn zeros_at(dev: &Path, start: u64, len: u64) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    super::run("blockdev", &["--flushbufs", dev.to_str().unwrap()]);
    let mut f = fs::File::open(dev).unwrap();
    f.seek(SeekFrom::Start(start)).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..n]).unwrap();
        if buf[..n].iter().any(|&b| b != 0) {
            return false;
        }
        left -= n as u64;
    }
    true
}

/// Runs sgdisk; a plain loop device refuses its table re-read, which sgdisk only warns of.
pub fn sgdisk(args: &[&str]) -> String {
    let out = Command::new("sgdisk").args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() || text.contains("partition table"),
        "sgdisk {args:?}: {text}"
    );
    text
}

/// The sgdisk command a refusal tells the operator to run (between backticks), run as told.
pub fn run_advice(message: &str) {
    let cmd = message
        .split('`')
        .nth(1)
        .unwrap_or_else(|| panic!("no command in {message:?}"));
    let words: Vec<&str> = cmd.split_whitespace().collect();
    assert_eq!(words[0], "sgdisk", "{cmd}");
    sgdisk(&words[1..]);
}
