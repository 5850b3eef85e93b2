//! The module decompressor on arbitrary bytes: never a panic, never more output than the
//! limit. The input's first four bytes are replaced by the legacy magic half the time, so
//! most inputs reach the block decoder.
#![no_main]
use azprov::modules::lz4::decompress;
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let mut input = data.to_vec();
    if input.len() >= 4 && input[0] & 1 == 0 {
        input[..4].copy_from_slice(&0x184C_2102u32.to_le_bytes());
    }
    if let Ok(out) = decompress(&input, LIMIT) {
        assert!(out.len() <= LIMIT, "{} bytes out", out.len());
    }
});
