//! The data-path proof: a GPU buffer from the CUDA driver API, and a cuFileRead into it
//! compared with what POSIX reads.

use super::ffi::{
    CuCtxRetain, CuCtxSet, CuDeviceGet, CuInit, CuMemAlloc, CuMemFree, CuMemcpyDtoH, FnRead,
};
use super::{GdsMode, ReadCheck};
use std::ffi::{c_int, c_void};
use std::io::Read;
use std::path::Path;
use std::time::Instant;

/// A GPU buffer on device 0 in its primary context, made current on this thread.
pub(super) struct GpuBuf {
    ptr: u64,
    len: usize,
    free: CuMemFree,
    dtoh: CuMemcpyDtoH,
}

impl GpuBuf {
    pub(super) fn new(lib_name: &std::ffi::OsStr, len: usize) -> Result<GpuBuf, String> {
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

/// cuFileRead of the first `len` bytes into `gpu`, compared with what POSIX reads.
pub(super) fn read_check(
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

/// The read check that could not run because the GPU buffer could not be had.
pub(super) fn read_not_run(len: u64, error: &str) -> ReadCheck {
    ReadCheck {
        bytes: len,
        returned: -1,
        matches: false,
        first_mismatch: None,
        error: Some(error.to_string()),
        mode: GdsMode::Unknown,
        elapsed_us: 0,
    }
}
