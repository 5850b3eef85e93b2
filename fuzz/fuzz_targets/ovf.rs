//! ovf-env.xml: never a panic, and never a fragment of the password in the parsed value's
//! Debug output or in an error's message. The harness plants a marker as the password (in
//! every <UserPassword> element, after removing the marker from anywhere else), so a message
//! that shows it can only have copied the password.
#![no_main]
use libfuzzer_sys::fuzz_target;

const MARKER: &[u8] = b"Zq9CanaryPw7x";

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

/// Whether the `UserPassword>` at `open` ends a start tag: `<UserPassword>` or
/// `<prefix:UserPassword>`. The same text inside a key's value or a comment is no password,
/// and a marker planted there would show, rightly, in the parsed keys.
fn is_tag(data: &[u8], open: usize) -> bool {
    let name_char = |c: &u8| c.is_ascii_alphanumeric() || b"_.-".contains(c);
    let mut head = &data[..open];
    if let Some((b':', prefixed)) = head.split_last() {
        let start = prefixed
            .iter()
            .rposition(|c| !name_char(c))
            .map_or(0, |i| i + 1);
        if start == prefixed.len() {
            return false;
        }
        head = &prefixed[..start];
    }
    head.last() == Some(&b'<')
}

/// The input with the marker as the text of every UserPassword element.
fn plant(data: &[u8]) -> Vec<u8> {
    let mut clean = data.to_vec();
    while let Some(i) = find(&clean, MARKER, 0) {
        clean.drain(i..i + MARKER.len());
    }
    let mut out = Vec::with_capacity(clean.len() + MARKER.len());
    let mut at = 0;
    let mut from = 0;
    while let Some(open) = find(&clean, b"UserPassword>", from) {
        let start = open + b"UserPassword>".len();
        from = start;
        if !is_tag(&clean, open) {
            continue;
        }
        let Some(end) = find(&clean, b"</", start) else {
            break;
        };
        out.extend_from_slice(&clean[at..start]);
        out.extend_from_slice(MARKER);
        at = end;
        from = end;
    }
    out.extend_from_slice(&clean[at..]);
    out
}

/// Whether `hay` shows a 6-byte fragment of the marker that the document has nowhere but in
/// the planted passwords (an element name may legitimately hold such a fragment).
fn shows(hay: &str, doc: &[u8]) -> bool {
    let mut rest = doc.to_vec();
    while let Some(i) = find(&rest, MARKER, 0) {
        rest.drain(i..i + MARKER.len());
    }
    MARKER
        .windows(6)
        .any(|w| hay.as_bytes().windows(6).any(|h| h == w) && find(&rest, w, 0).is_none())
}

fuzz_target!(|data: &[u8]| {
    let doc = plant(data);
    match azprov::azure::ovf::parse(&doc) {
        Ok(env) => assert!(!shows(&format!("{env:?}"), &doc), "the password in Debug"),
        Err(e) => assert!(
            !shows(&e.to_string(), &doc),
            "the password in an error: {e}"
        ),
    }
});
