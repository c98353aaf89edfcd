//! libcufile and CUDA driver ABI: struct layouts and function types from cufile.h and cuda.h,
//! and the names of cuFile's error codes.

use std::ffi::{c_int, c_uint, c_void};

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

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RawError {
    pub(super) err: c_int,
    pub(super) cu_err: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RawNvfs {
    pub(super) major_version: c_uint,
    pub(super) minor_version: c_uint,
    pub(super) poll_thresh_size: usize,
    pub(super) max_direct_io_size: usize,
    pub(super) dstatusflags: c_uint,
    pub(super) dcontrolflags: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RawDrvProps {
    pub(super) nvfs: RawNvfs,
    pub(super) fflags: c_uint,
    pub(super) max_device_cache_size: c_uint,
    pub(super) per_buffer_cache_size: c_uint,
    pub(super) max_device_pinned_mem_size: c_uint,
    pub(super) max_batch_io_size: c_uint,
    pub(super) max_batch_io_timeout_msecs: c_uint,
}

/// Slack after the struct in case a newer library writes a larger one.
#[repr(C)]
pub(super) struct PaddedDrvProps {
    pub(super) props: RawDrvProps,
    pub(super) _slack: [u64; 64],
}

#[repr(C)]
pub(super) union RawHandle {
    pub(super) fd: c_int,
    pub(super) handle: *mut c_void,
}

#[repr(C)]
pub(super) struct RawDescr {
    pub(super) type_: c_int,
    pub(super) handle: RawHandle,
    pub(super) fs_ops: *const c_void,
}

// Layout facts measured on an H200 (fd at offset 4 gives 5018 INVALID_FILE_TYPE).
const _: () = assert!(std::mem::size_of::<RawDrvProps>() == 56);
const _: () = assert!(std::mem::offset_of!(RawDescr, handle) == 8);
const _: () = assert!(std::mem::offset_of!(RawDescr, fs_ops) == 16);

pub(super) const CU_FILE_HANDLE_TYPE_OPAQUE_FD: c_int = 1;

pub(super) type FnVersion = unsafe extern "C" fn(*mut c_int) -> RawError;
pub(super) type FnVoid = unsafe extern "C" fn() -> RawError;
pub(super) type FnProps = unsafe extern "C" fn(*mut RawDrvProps) -> RawError;
pub(super) type FnRegister = unsafe extern "C" fn(*mut *mut c_void, *mut RawDescr) -> RawError;
pub(super) type FnDeregister = unsafe extern "C" fn(*mut c_void);

// CUDA driver API, for the GPU buffer of the read check (cuda.h; CUdeviceptr is 64-bit).
pub(super) type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
pub(super) type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
pub(super) type CuCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
pub(super) type CuCtxSet = unsafe extern "C" fn(*mut c_void) -> c_int;
pub(super) type CuMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;
pub(super) type CuMemFree = unsafe extern "C" fn(u64) -> c_int;
pub(super) type CuMemcpyDtoH = unsafe extern "C" fn(*mut c_void, u64, usize) -> c_int;
/// `ssize_t cuFileRead(CUfileHandle_t, void *bufPtr_base, size_t, off_t file_offset,
/// off_t bufPtr_offset)` (cufile.h).
pub(super) type FnRead = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, i64, i64) -> isize;
