//! fnmatch-style matching without classes: `*` any run, `?` any one character. kmod matches
//! modules.alias patterns so (`modules::modalias`), and sshd's `Include` globs are read so
//! (`root::includes`).

/// `name` against a modules.alias pattern: `*` any run, `?` any one character, as fnmatch
/// without classes. A pattern with a class (`[`, which no PCI or virtio alias has) matches
/// everything: better a driver too many than a device without one.
pub fn matches(pattern: &str, name: &str) -> bool {
    if pattern.contains('[') {
        return true;
    }
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut i, mut j) = (0, 0);
    // where the last `*` was, and the name position it is matched up to
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        match p.get(i) {
            Some(b'*') => {
                star = Some((i, j));
                i += 1;
            }
            Some(&c) if c == b'?' || Some(&c) == n.get(j) => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((si, sj)) => {
                    i = si + 1;
                    j = sj + 1;
                    star = Some((si, sj + 1));
                }
                None => return false,
            },
        }
    }
    p.get(i..)
        .is_some_and(|rest| rest.iter().all(|&c| c == b'*'))
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns_as_kmod_matches_them() {
        let m = "pci:v00008086d00007111sv00001414sd00000000bc01sc01i80";
        assert!(matches("pci:v00008086d00007111sv*sd*bc*sc*i*", m));
        assert!(matches("pci:v00008086d00007111sv*sd*bc01sc01i*", m));
        assert!(!matches("pci:v00008086d00007010sv*sd*bc*sc*i*", m));
        assert!(!matches(
            "pci:v00008086d00007111sv000015ADsd00001976bc*sc*i*",
            m
        ));
        assert!(matches("pci:v*d*sv*sd*bc01sc01i??", m));
        assert!(!matches("pci:v*d*sv*sd*bc01sc01i?", m));
        assert!(matches("*", ""));
        assert!(!matches("a*b", "a"));
        assert!(matches("a*b*c", "aXbYbZc"));
        assert!(matches("pci:[0-9]", m), "a class matches everything");
    }
}
