//! LZ4's legacy frame format, decompression only: what `lz4 -l` writes and the kernel's own
//! initramfs unpacker reads. `scripts/mkinitramfs` stores the modules PID 1 loads only on
//! demand (the root filesystems) this way, so the kernel does not unpack megabytes on every
//! boot that most boots never load.
//!
//! A frame is the magic number, then blocks, each a little-endian u32 with its compressed
//! size and an LZ4 block that decompresses to at most 8 MiB; the stream ends at its end, and
//! another magic number may start a new frame. A block is sequences of a token (literal
//! length, match length - 4), the literals, and a match: a 2-byte back offset into the output
//! and its length; the last sequence has literals only.

/// The legacy frame's magic number, little-endian on the wire.
const MAGIC: u32 = 0x184C_2102;
/// The most a legacy block decompresses to.
const BLOCK_MAX: usize = 8 << 20;

/// What is wrong with the input, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lz4Error {
    /// Not a legacy frame (the first four bytes).
    Magic,
    /// A block's size or content runs past the input's end.
    Truncated { at: usize },
    /// A match reaches before the output's start, or a block grows past 8 MiB or the limit.
    Corrupt { at: usize },
}

impl std::fmt::Display for Lz4Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lz4Error::Magic => write!(f, "not an LZ4 legacy frame"),
            Lz4Error::Truncated { at } => write!(f, "LZ4 data truncated at byte {at}"),
            Lz4Error::Corrupt { at } => write!(f, "LZ4 data corrupt at byte {at}"),
        }
    }
}

impl std::error::Error for Lz4Error {}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    let b = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

/// Decompresses legacy frames in `data`, growing the output to at most `limit` bytes.
pub fn decompress(data: &[u8], limit: usize) -> Result<Vec<u8>, Lz4Error> {
    if u32_at(data, 0) != Some(MAGIC) {
        return Err(Lz4Error::Magic);
    }
    // kernel modules shrink to about a third: room for four times the input, so the output
    // is rarely moved while it grows
    let mut out = Vec::with_capacity(data.len().saturating_mul(4).min(limit));
    let mut at = 4;
    while at < data.len() {
        let size = u32_at(data, at).ok_or(Lz4Error::Truncated { at })?;
        at += 4;
        if size == MAGIC {
            continue; // a concatenated frame
        }
        let end = usize::try_from(size)
            .ok()
            .and_then(|s| at.checked_add(s))
            .filter(|&e| e <= data.len())
            .ok_or(Lz4Error::Truncated { at })?;
        let block = data.get(at..end).ok_or(Lz4Error::Truncated { at })?;
        let room = limit.saturating_sub(out.len()).min(BLOCK_MAX);
        block_into(block, at, &mut out, room)?;
        at = end;
    }
    Ok(out)
}

/// A length that goes on in 255-valued bytes after a nibble of 15; errors name the byte of
/// the input (`base` is the block's offset in it).
fn length(block: &[u8], base: usize, i: &mut usize, nibble: u8) -> Result<usize, Lz4Error> {
    let mut n = usize::from(nibble);
    if nibble == 15 {
        loop {
            let b = *block.get(*i).ok_or(Lz4Error::Truncated { at: base + *i })?;
            *i += 1;
            n = n
                .checked_add(usize::from(b))
                .ok_or(Lz4Error::Corrupt { at: base + *i })?;
            if b != 255 {
                break;
            }
        }
    }
    Ok(n)
}

/// Appends one block's output to `out`, at most `room` bytes; `base` is the block's offset in
/// the input, so errors name the byte of the input. Matches may reach back into earlier
/// blocks: the legacy format's blocks are independent, but nothing is lost by allowing it,
/// and offsets are checked against the whole output.
fn block_into(block: &[u8], base: usize, out: &mut Vec<u8>, room: usize) -> Result<(), Lz4Error> {
    let truncated = |i: usize| Lz4Error::Truncated { at: base + i };
    let corrupt = |i: usize| Lz4Error::Corrupt { at: base + i };
    let start = out.len();
    let mut i = 0;
    while i < block.len() {
        let token = block.get(i).copied().ok_or(truncated(i))?;
        i += 1;
        let lit = length(block, base, &mut i, token >> 4)?;
        let lit_end = i.checked_add(lit).ok_or(corrupt(i))?;
        let literals = block.get(i..lit_end).ok_or(truncated(i))?;
        if out.len() - start + lit > room {
            return Err(corrupt(i));
        }
        out.extend_from_slice(literals);
        i = lit_end;
        if i == block.len() {
            break; // the last sequence: literals only
        }
        let off: [u8; 2] = block
            .get(i..i + 2)
            .and_then(|b| b.try_into().ok())
            .ok_or(truncated(i))?;
        let offset = usize::from(u16::from_le_bytes(off));
        i += 2;
        if offset == 0 || offset > out.len() {
            return Err(corrupt(i - 2));
        }
        let len = length(block, base, &mut i, token & 15)?
            .checked_add(4)
            .ok_or(corrupt(i))?;
        if out.len() - start + len > room {
            return Err(corrupt(i));
        }
        // An overlapping match (offset < len) repeats the last `offset` bytes: the output
        // from `from` on is periodic, so copying from `from` again and again, each time all
        // that is there, doubles the copy and gives what byte-by-byte copying would.
        let from = out.len() - offset;
        let end = out.len() + len;
        while out.len() < end {
            let chunk = (end - out.len()).min(out.len() - from);
            out.extend_from_within(from..from + chunk);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(blocks: &[&[u8]]) -> Vec<u8> {
        let mut v = MAGIC.to_le_bytes().to_vec();
        for b in blocks {
            v.extend_from_slice(&(b.len() as u32).to_le_bytes());
            v.extend_from_slice(b);
        }
        v
    }

    #[test]
    fn literals_and_an_overlapping_match() {
        // "ab" then a match of 6 at offset 2: "abababab"; then the literals "c"
        let block = [0x22, b'a', b'b', 2, 0, 0x10, b'c'];
        assert_eq!(decompress(&frame(&[&block]), 100).unwrap(), b"ababababc");
    }

    #[test]
    fn long_lengths_continue_in_255s() {
        // 15 + 255 + 10 = 280 literals, then a match of 15 + 4 + 255 + 1 = 275 at offset 1
        let mut block = vec![0xFF, 255, 10];
        block.extend(std::iter::repeat_n(b'x', 280));
        block.extend_from_slice(&[1, 0, 255, 1, 0x10, b'.']);
        let out = decompress(&frame(&[&block]), 1000).unwrap();
        assert_eq!(out.len(), 280 + 275 + 1);
        assert!(out[..555].iter().all(|&b| b == b'x'));
        assert_eq!(out[555], b'.');
    }

    /// `printf 'azprov azprov azprov azprov, ok\n' | lz4 -l -9 -c | xxd -i`
    #[test]
    fn what_the_lz4_tool_writes() {
        let data = [
            0x02, 0x21, 0x4c, 0x18, 0x11, 0x00, 0x00, 0x00, 0x7f, 0x61, 0x7a, 0x70, 0x72, 0x6f,
            0x76, 0x20, 0x07, 0x00, 0x01, 0x50, 0x2c, 0x20, 0x6f, 0x6b, 0x0a,
        ];
        assert_eq!(
            decompress(&data, 1 << 20).unwrap(),
            b"azprov azprov azprov azprov, ok\n"
        );
    }

    /// What scripts/mkinitramfs runs, on 20 MiB (three 8 MiB blocks) of text and noise.
    #[test]
    fn the_lz4_tool_round_trips() {
        use std::io::Write;
        let mut input = Vec::with_capacity(20 << 20);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        while input.len() < 20 << 20 {
            input.extend_from_slice(b"azprov provisions Azure VMs from the initramfs; ");
            for _ in 0..64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                input.push((x % 251) as u8);
            }
        }
        let mut lz4 = std::process::Command::new("lz4")
            .args(["-q", "-l", "-9", "-c"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("lz4 (scripts/setup installs it)");
        let mut stdin = lz4.stdin.take().unwrap();
        let feed = input.clone();
        let writer = std::thread::spawn(move || stdin.write_all(&feed));
        let out = lz4.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        assert!(out.status.success());
        assert!(out.stdout.len() < input.len());
        let back = decompress(&out.stdout, 64 << 20).unwrap();
        assert!(back == input, "the round trip differs");
        assert!(matches!(
            decompress(&out.stdout, input.len() - 1),
            Err(Lz4Error::Corrupt { .. })
        ));
    }

    #[test]
    fn two_blocks_and_a_concatenated_frame() {
        let mut data = frame(&[&[0x30, b'o', b'n', b'e'], &[0x30, b't', b'w', b'o']]);
        data.extend(frame(&[&[0x50, b't', b'h', b'r', b'e', b'e']]));
        assert_eq!(decompress(&data, 100).unwrap(), b"onetwothree");
    }

    #[test]
    fn bad_input_is_an_error_never_a_panic() {
        assert_eq!(decompress(b"\x04\x22\x4d\x18", 100), Err(Lz4Error::Magic));
        assert_eq!(decompress(&[], 100), Err(Lz4Error::Magic));
        // a block longer than the input
        let mut cut = frame(&[&[0x30, b'o', b'n', b'e']]);
        cut.truncate(cut.len() - 1);
        assert!(matches!(
            decompress(&cut, 100),
            Err(Lz4Error::Truncated { .. })
        ));
        // a match before the output's start
        let back = frame(&[&[0x10, b'a', 5, 0, 0x00]]);
        assert!(matches!(
            decompress(&back, 100),
            Err(Lz4Error::Corrupt { .. })
        ));
        // an error names the byte of the input: the second block's offset 0 is at byte 16
        let second = frame(&[&[0x10, b'a'], &[0x10, b'b', 0, 0]]);
        assert_eq!(decompress(&second, 100), Err(Lz4Error::Corrupt { at: 16 }));
        // offset 0
        let zero = frame(&[&[0x10, b'a', 0, 0]]);
        assert!(matches!(
            decompress(&zero, 100),
            Err(Lz4Error::Corrupt { .. })
        ));
        // past the limit
        let big = frame(&[&[0x1F, b'a', 1, 0, 255, 255, 255, 0]]);
        assert!(matches!(
            decompress(&big, 100),
            Err(Lz4Error::Corrupt { .. })
        ));
        // every truncation of a valid frame fails cleanly
        let good = frame(&[&[0x22, b'a', b'b', 2, 0, 0x10, b'c']]);
        for n in 0..good.len() {
            let _ = decompress(&good[..n], 100);
        }
    }
}
