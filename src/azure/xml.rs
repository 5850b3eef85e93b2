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
    /// All text directly inside this element, concatenated and trimmed at the ends.
    pub text: String,
    pub children: Vec<Element>,
}

impl Element {
    pub fn children_named<'a>(&'a self, local: &'a str) -> impl Iterator<Item = &'a Element> {
        self.children.iter().filter(move |c| c.local == local)
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

/// Why a byte string is not a well-formed XML document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlError(pub String);

impl std::fmt::Display for XmlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses a whole document into its root element. A UTF-8 BOM and CRLF line ends are fine.
pub fn parse(bytes: &[u8]) -> Result<Element, XmlError> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|e| XmlError(format!("not UTF-8: {e}")))?;
    let mut reader = NsReader::from_str(text);
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    loop {
        let (resolved, event) = match reader.read_resolved_event() {
            Ok(v) => v,
            Err(e) => {
                let at = reader.buffer_position();
                return Err(XmlError(format!("at byte {at}: {e}")));
            }
        };
        match event {
            Event::Start(ref e) | Event::Empty(ref e) => {
                let ns = namespace(resolved)?;
                let local = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                let el = Element {
                    ns,
                    local,
                    ..Element::default()
                };
                if matches!(event, Event::Start(_)) {
                    stack.push(el);
                } else {
                    attach(&mut stack, &mut root, el)?;
                }
            }
            Event::End(_) => {
                let mut el = stack
                    .pop()
                    .ok_or_else(|| XmlError("unbalanced end tag".into()))?;
                el.text = el.text.trim().to_string();
                attach(&mut stack, &mut root, el)?;
            }
            Event::Text(t) => {
                let s = t
                    .unescape()
                    .map_err(|e| XmlError(format!("bad text: {e}")))?;
                match stack.last_mut() {
                    Some(top) => top.text.push_str(&s),
                    None if s.trim().is_empty() => {}
                    None => return Err(XmlError("text outside the root element".into())),
                }
            }
            Event::CData(c) => {
                let raw = c.into_inner();
                let s = std::str::from_utf8(&raw).map_err(|e| XmlError(format!("CDATA: {e}")))?;
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(s);
                }
            }
            Event::Eof => break,
            Event::Decl(_) | Event::PI(_) | Event::Comment(_) | Event::DocType(_) => {}
        }
    }
    if !stack.is_empty() {
        return Err(XmlError("document ends inside an element".into()));
    }
    root.ok_or_else(|| XmlError("no root element".into()))
}

fn namespace(r: ResolveResult) -> Result<Option<String>, XmlError> {
    match r {
        ResolveResult::Bound(ns) => Ok(Some(String::from_utf8_lossy(ns.as_ref()).into_owned())),
        ResolveResult::Unbound => Ok(None),
        ResolveResult::Unknown(p) => Err(XmlError(format!(
            "undeclared namespace prefix '{}'",
            String::from_utf8_lossy(&p)
        ))),
    }
}

fn attach(stack: &mut [Element], root: &mut Option<Element>, el: Element) -> Result<(), XmlError> {
    match stack.last_mut() {
        Some(parent) => parent.children.push(el),
        None if root.is_none() => *root = Some(el),
        None => return Err(XmlError("more than one root element".into())),
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
}
