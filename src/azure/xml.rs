//! A small element tree read with quick-xml's namespace-aware reader. The documents azprov
//! reads (ovf-env.xml, goal states) are a few KiB, so a tree is simpler than streaming and
//! lets every parser match on namespace URI + local name, never on a literal prefix.

use quick_xml::events::Event;
use quick_xml::name::ResolveResult;
use quick_xml::NsReader;

#[derive(Debug, Default)]
pub struct Element {
    /// The resolved namespace URI, or None when the name is in no namespace.
    pub ns: Option<String>,
    pub local: String,
    /// All text directly inside this element, concatenated, exactly as written (a password
    /// may begin or end with a space); see `trimmed`.
    pub text: String,
    pub children: Vec<Element>,
}

impl Element {
    pub fn children_named<'a>(&'a self, local: &'a str) -> impl Iterator<Item = &'a Element> {
        self.children.iter().filter(move |c| c.local == local)
    }

    /// The text without leading and trailing white space (line breaks around values).
    pub fn trimmed(&self) -> &str {
        self.text.trim()
    }

    pub fn child(&self, local: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.local == local)
    }

    /// Depth-first search for the first element with this local name (self included).
    #[cfg(test)]
    pub fn find(&self, local: &str) -> Option<&Element> {
        if self.local == local {
            return Some(self);
        }
        self.children.iter().find_map(|c| c.find(local))
    }

    pub fn is(&self, ns: &str, local: &str) -> bool {
        self.local == local && self.ns.as_deref() == Some(ns)
    }
}

/// How deep elements may nest. Azure's documents nest 6 levels; a deeper one is refused before
/// it is built, since a tree millions of levels deep overflows the stack when it is dropped.
pub const MAX_DEPTH: usize = 64;

/// Why a byte string is not a well-formed XML document: what, and the byte offset. It never
/// carries document text (a bad entity inside UserPassword must not echo the password), only
/// the name of the element a text error was found in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlError {
    pub at: u64,
    pub kind: XmlErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XmlErrorKind {
    NotUtf8,
    /// Not well-formed markup (quick-xml's syntax error, without its text).
    Syntax,
    /// Bad text (an unknown entity, a bad character reference) inside this element.
    Text {
        element: String,
    },
    TooDeep,
    UnbalancedEnd,
    TextOutsideRoot,
    UnclosedElement,
    NoRoot,
    MultipleRoots,
    UndeclaredPrefix,
}

impl std::fmt::Display for XmlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.kind {
            XmlErrorKind::NotUtf8 => "not UTF-8".to_string(),
            XmlErrorKind::Syntax => "not well-formed".to_string(),
            XmlErrorKind::Text { element } => format!("bad text in <{element}>"),
            XmlErrorKind::TooDeep => format!("elements nested deeper than {MAX_DEPTH}"),
            XmlErrorKind::UnbalancedEnd => "unbalanced end tag".to_string(),
            XmlErrorKind::TextOutsideRoot => "text outside the root element".to_string(),
            XmlErrorKind::UnclosedElement => "document ends inside an element".to_string(),
            XmlErrorKind::NoRoot => "no root element".to_string(),
            XmlErrorKind::MultipleRoots => "more than one root element".to_string(),
            XmlErrorKind::UndeclaredPrefix => "undeclared namespace prefix".to_string(),
        };
        write!(f, "{what} at byte {}", self.at)
    }
}

impl std::error::Error for XmlError {}

/// Parses a whole document into its root element. A UTF-8 BOM and CRLF line ends are fine.
pub fn parse(bytes: &[u8]) -> Result<Element, XmlError> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|e| XmlError {
        at: e.valid_up_to() as u64,
        kind: XmlErrorKind::NotUtf8,
    })?;
    let mut reader = NsReader::from_str(text);
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    loop {
        let at = reader.buffer_position();
        let err = |kind| XmlError { at, kind };
        let Ok((resolved, event)) = reader.read_resolved_event() else {
            return Err(err(XmlErrorKind::Syntax));
        };
        match event {
            Event::Start(ref e) | Event::Empty(ref e) => {
                let ns = match resolved {
                    ResolveResult::Bound(ns) => {
                        Some(String::from_utf8_lossy(ns.as_ref()).into_owned())
                    }
                    ResolveResult::Unbound => None,
                    ResolveResult::Unknown(_) => return Err(err(XmlErrorKind::UndeclaredPrefix)),
                };
                let local = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                let el = Element {
                    ns,
                    local,
                    ..Element::default()
                };
                if matches!(event, Event::Start(_)) {
                    if stack.len() >= MAX_DEPTH {
                        return Err(err(XmlErrorKind::TooDeep));
                    }
                    stack.push(el);
                } else {
                    attach(&mut stack, &mut root, el).map_err(err)?;
                }
            }
            Event::End(_) => {
                let el = stack.pop().ok_or(err(XmlErrorKind::UnbalancedEnd))?;
                attach(&mut stack, &mut root, el).map_err(err)?;
            }
            Event::Text(t) => {
                let element = || stack.last().map(|e| e.local.clone()).unwrap_or_default();
                let Ok(s) = t.unescape() else {
                    return Err(err(XmlErrorKind::Text { element: element() }));
                };
                match stack.last_mut() {
                    Some(top) => top.text.push_str(&s),
                    None if s.trim().is_empty() => {}
                    None => return Err(err(XmlErrorKind::TextOutsideRoot)),
                }
            }
            Event::CData(c) => {
                let raw = c.into_inner();
                let element = stack.last().map(|e| e.local.clone()).unwrap_or_default();
                let s =
                    std::str::from_utf8(&raw).map_err(|_| err(XmlErrorKind::Text { element }))?;
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(s);
                }
            }
            Event::Eof => break,
            Event::Decl(_) | Event::PI(_) | Event::Comment(_) | Event::DocType(_) => {}
        }
    }
    let at = reader.buffer_position();
    if !stack.is_empty() {
        return Err(XmlError {
            at,
            kind: XmlErrorKind::UnclosedElement,
        });
    }
    root.ok_or(XmlError {
        at,
        kind: XmlErrorKind::NoRoot,
    })
}

fn attach(
    stack: &mut [Element],
    root: &mut Option<Element>,
    el: Element,
) -> Result<(), XmlErrorKind> {
    match stack.last_mut() {
        Some(parent) => parent.children.push(el),
        None if root.is_none() => *root = Some(el),
        None => return Err(XmlErrorKind::MultipleRoots),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_prefixes_and_default_namespaces() {
        let doc = br#"<?xml version="1.0"?><a:Root xmlns:a="urn:a"><Child xmlns="urn:b">x &amp; y</Child><a:E/></a:Root>"#;
        let root = parse(doc).unwrap();
        assert!(root.is("urn:a", "Root"));
        assert!(root.children[0].is("urn:b", "Child"));
        assert_eq!(root.children[0].text, "x & y");
        assert!(root.children[1].is("urn:a", "E"));
    }

    #[test]
    fn rejects_broken_documents() {
        for bad in [
            &b"hello"[..],
            b"<a><b></a>",
            b"<a>",
            b"<a/><b/>",
            b"",
            b"<p:a/>",
            b"\xff\xfe",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let n = 200_000;
        let doc = format!("{}{}", "<a>".repeat(n), "</a>".repeat(n));
        let e = parse(doc.as_bytes()).unwrap_err();
        assert_eq!(e.kind, XmlErrorKind::TooDeep);
        let ok = format!("{}{}", "<a>".repeat(MAX_DEPTH), "</a>".repeat(MAX_DEPTH));
        assert!(parse(ok.as_bytes()).is_ok());
        let deeper = format!(
            "{}{}",
            "<a>".repeat(MAX_DEPTH + 1),
            "</a>".repeat(MAX_DEPTH + 1)
        );
        assert_eq!(
            parse(deeper.as_bytes()).unwrap_err().kind,
            XmlErrorKind::TooDeep
        );
    }

    #[test]
    fn a_bad_entity_is_reported_by_element_and_offset_only() {
        let doc = b"<Root><UserPassword>pw&SECRETMARKER;x</UserPassword></Root>";
        let e = parse(doc).unwrap_err();
        assert_eq!(
            e.kind,
            XmlErrorKind::Text {
                element: "UserPassword".into()
            }
        );
        let shown = format!("{e} {e:?}");
        assert!(
            !shown.contains("SECRETMARKER") && !shown.contains("pw"),
            "{shown}"
        );
    }
}
