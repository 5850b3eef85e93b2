//! Loading a kernel module: finit_module(2) from a file, init_module(2) from an image in
//! memory, with modprobe-style parameters. Loaded already (EEXIST) is success.

use super::Errno;
use nix::kmod::{finit_module, init_module, ModuleInitFlags};
use std::ffi::CString;
use std::path::Path;

pub fn load_file(path: &Path, params: &str) -> Result<(), Errno> {
    let params = CString::new(params).map_err(|_| Errno::EINVAL)?;
    let f = std::fs::File::open(path).map_err(|e| super::errno_of(&e))?;
    ok_if_loaded(finit_module(&f, &params, ModuleInitFlags::empty()))
}

pub fn load_image(image: &[u8], params: &str) -> Result<(), Errno> {
    let params = CString::new(params).map_err(|_| Errno::EINVAL)?;
    ok_if_loaded(init_module(image, &params))
}

fn ok_if_loaded(r: Result<(), Errno>) -> Result<(), Errno> {
    match r {
        Err(Errno::EEXIST) => Ok(()),
        r => r,
    }
}
