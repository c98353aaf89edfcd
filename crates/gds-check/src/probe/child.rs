//! The child side: dlopen libcufile, run each cuFile step, print one JSON answer. Runs in its
//! own process because libcufile can hang or crash (see the module doc of [`super`]).

use super::ffi::{
    FnDeregister, FnProps, FnRead, FnRegister, FnVersion, FnVoid, PaddedDrvProps, RawDescr,
    RawDrvProps, RawHandle, CU_FILE_HANDLE_TYPE_OPAQUE_FD,
};
use super::file::DirectFile;
use super::gpu::{read_check, read_not_run, GpuBuf};
use super::mode::decide_mode;
use super::strict_config::write_strict_config;
use super::workdir::{tail_lines, unique_temp_dir};
use super::{
    CuFileResult, DriverProps, ProbeArgs, ProbeOutcome, ProbeStatus, DEFAULT_LIBRARY, INFO_PREFIX,
    STAGE_PREFIX,
};
use std::ffi::{c_int, c_void, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The GPU buffer for the read check: its length, and the buffer or why there is none.
type Gpu = (u64, Result<GpuBuf, String>);

fn stage(s: &str) {
    // stderr is unbuffered: the parent sees this even if the next call hangs.
    let _ = writeln!(std::io::stderr(), "{STAGE_PREFIX}{s}");
}

/// Reports step `s` to the parent and records it in the answer.
fn step(o: &mut ProbeOutcome, s: &str) {
    stage(s);
    o.stage = Some(s.into());
}

fn emit(o: &ProbeOutcome) {
    let line = serde_json::to_string(o).unwrap_or_else(|_| "{}".into());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn abs(p: &PathBuf) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.clone())
}

/// Runs in the child process. Prints one JSON [`ProbeOutcome`] line; returns the exit code
/// (0 when every step ran, whatever the verdict). The caller should exit with it promptly.
pub fn probe_child_main(args: ProbeArgs) -> i32 {
    let t0 = Instant::now();
    let mut o = ProbeOutcome::new(&args, ProbeStatus::Completed, "");
    let path = args.path.as_ref().map(abs);
    let (work, own_work) = match prepare(&args) {
        Ok(w) => w,
        Err(detail) => {
            o.status = ProbeStatus::BadArgs;
            o.detail = detail;
            emit(&o);
            return 2;
        }
    };
    let code = run_steps(&args, path.as_deref(), &mut o);
    o.elapsed_ms = t0.elapsed().as_millis() as u64;
    o.log_tail = tail_lines(&work.join("cufile.log"), 20);
    if own_work {
        let _ = std::fs::remove_dir_all(&work);
    }
    emit(&o);
    code
}

/// The work dir (and whether it is ours to remove), the cufile.json libcufile is to read and
/// where its log goes. The cwd moves to the work dir: cufile.log and the strict config land
/// there instead of the cwd (the volume).
fn prepare(args: &ProbeArgs) -> Result<(PathBuf, bool), String> {
    let (work, own_work) = match &args.work_dir {
        Some(d) => (abs(d), false),
        None => match unique_temp_dir() {
            Ok(d) => (d, true),
            Err(e) => return Err(format!("cannot create a work dir: {e}")),
        },
    };
    let cfg_src = args
        .cufile_json
        .as_ref()
        .map(abs)
        .unwrap_or_else(crate::default_cufile_json);
    if args.strict {
        let p = write_strict_config(&cfg_src, &work)
            .map_err(|e| format!("cannot write strict cufile.json: {e}"))?;
        std::env::set_var("CUFILE_ENV_PATH_JSON", p);
    } else if args.cufile_json.is_some() {
        std::env::set_var("CUFILE_ENV_PATH_JSON", &cfg_src);
    }
    std::env::set_var("CUFILE_LOGFILE_PATH", work.join("cufile.log"));
    let _ = std::env::set_current_dir(&work);
    Ok((work, own_work))
}

/// The libcufile entry points the probe calls.
struct CuFileApi {
    get_version: FnVersion,
    driver_open: FnVoid,
    get_props: FnProps,
    register: FnRegister,
    deregister: FnDeregister,
    driver_close: FnVoid,
    read: FnRead,
}

impl CuFileApi {
    /// Every symbol, or which one `lib` lacks.
    fn load(lib: &'static libloading::Library, lib_name: &OsString) -> Result<Self, String> {
        macro_rules! sym {
            ($t:ty, $($name:literal),+) => {{
                let mut found: Option<$t> = None;
                $(
                    if found.is_none() {
                        // SAFETY: the signature matches cufile.h for this symbol.
                        found = unsafe { lib.get::<$t>(concat!($name, "\0").as_bytes()) }.ok().map(|s| *s);
                    }
                )+
                found.ok_or_else(|| {
                    format!("{} lacks {}", lib_name.to_string_lossy(), [$($name),+].join(" / "))
                })?
            }};
        }
        Ok(CuFileApi {
            get_version: sym!(FnVersion, "cuFileGetVersion"),
            driver_open: sym!(FnVoid, "cuFileDriverOpen"),
            get_props: sym!(FnProps, "cuFileDriverGetProperties"),
            register: sym!(FnRegister, "cuFileHandleRegister"),
            deregister: sym!(FnDeregister, "cuFileHandleDeregister"),
            driver_close: sym!(FnVoid, "cuFileDriverClose_v2", "cuFileDriverClose"),
            read: sym!(FnRead, "cuFileRead"),
        })
    }
}

fn run_steps(args: &ProbeArgs, path: Option<&Path>, o: &mut ProbeOutcome) -> i32 {
    let lib_name = args
        .library
        .as_ref()
        .map(|p| p.as_os_str().to_owned())
        .unwrap_or_else(|| DEFAULT_LIBRARY.into());
    o.library = Some(lib_name.to_string_lossy().into_owned());
    step(o, "dlopen");
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
    let api = match CuFileApi::load(lib, &lib_name) {
        Ok(a) => a,
        Err(e) => {
            o.status = ProbeStatus::SymbolMissing;
            o.detail = e;
            return 4;
        }
    };
    read_version(&api, o);
    // Open the file before the driver: a file problem is reported even if the driver hangs.
    let file = path.and_then(|p| open_file(p, o));
    // The GPU buffer for the read check, before cuFile starts (it uses the current context).
    let gpu = file.as_ref().and_then(|f| gpu_buffer(args, f, o));
    driver_steps(&api, args, file.as_ref(), gpu.as_ref(), o);
    drop(gpu);
    drop(file);
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

fn read_version(api: &CuFileApi, o: &mut ProbeOutcome) {
    step(o, "cuFileGetVersion");
    let mut v: c_int = 0;
    // SAFETY: valid out pointer.
    let r = unsafe { (api.get_version)(&mut v) };
    if r.err == 0 {
        o.library_version = Some(v);
        // For the parent, in case a later call hangs and no JSON answer comes.
        let _ = writeln!(std::io::stderr(), "{INFO_PREFIX}library_version={v}");
    }
}

fn open_file(p: &Path, o: &mut ProbeOutcome) -> Option<DirectFile> {
    o.file = Some(p.to_string_lossy().into_owned());
    match DirectFile::open(p) {
        Ok(f) => Some(f),
        Err(e) => {
            o.status = ProbeStatus::FileError;
            o.detail = e;
            None
        }
    }
}

fn gpu_buffer(args: &ProbeArgs, file: &DirectFile, o: &mut ProbeOutcome) -> Option<Gpu> {
    let len = file.read_len();
    if len == 0 {
        return None;
    }
    step(o, "cuda");
    let cuda = args
        .cuda_library
        .as_ref()
        .map(|p| p.as_os_str().to_owned())
        .unwrap_or_else(|| "libcuda.so.1".into());
    Some((len, GpuBuf::new(&cuda, len as usize)))
}

/// Open the driver, read its properties, register the file and read it, close the driver.
fn driver_steps(
    api: &CuFileApi,
    args: &ProbeArgs,
    file: Option<&DirectFile>,
    gpu: Option<&Gpu>,
    o: &mut ProbeOutcome,
) {
    step(o, "cuFileDriverOpen");
    // SAFETY: no arguments.
    let r = CuFileResult::from_raw(unsafe { (api.driver_open)() });
    let opened = r.ok();
    o.driver_open = Some(r);
    if !opened {
        return;
    }
    step(o, "cuFileDriverGetProperties");
    let mut buf = PaddedDrvProps {
        props: RawDrvProps::default(),
        _slack: [0; 64],
    };
    // SAFETY: buffer is larger than CUfileDrvProps_t.
    let r = unsafe { (api.get_props)(&mut buf.props) };
    if r.err == 0 {
        o.props = Some(DriverProps::from_raw(&buf.props));
    }
    if let Some(f) = file {
        register_and_read(api, args, f, gpu, o);
    }
    step(o, "cuFileDriverClose");
    // SAFETY: the driver was opened above.
    unsafe { (api.driver_close)() };
}

fn register_and_read(
    api: &CuFileApi,
    args: &ProbeArgs,
    file: &DirectFile,
    gpu: Option<&Gpu>,
    o: &mut ProbeOutcome,
) {
    step(o, "cuFileHandleRegister");
    let mut descr = RawDescr {
        type_: CU_FILE_HANDLE_TYPE_OPAQUE_FD,
        handle: RawHandle {
            handle: std::ptr::null_mut(),
        },
        fs_ops: std::ptr::null(),
    };
    descr.handle.fd = file.fd;
    let mut fh: *mut c_void = std::ptr::null_mut();
    // SAFETY: descr is a valid CUfileDescr_t with an open O_DIRECT fd.
    let r = CuFileResult::from_raw(unsafe { (api.register)(&mut fh, &mut descr) });
    if r.ok() {
        match gpu {
            Some((len, Ok(buf))) => {
                step(o, "cuFileRead");
                o.read = Some(read_check(api.read, fh, buf, &file.path, *len, args.strict));
            }
            Some((len, Err(e))) => o.read = Some(read_not_run(*len, e)),
            None => {}
        }
        stage("cuFileHandleDeregister");
        // SAFETY: fh came from a successful registration.
        unsafe { (api.deregister)(fh) };
    }
    o.registration = Some(r);
}
