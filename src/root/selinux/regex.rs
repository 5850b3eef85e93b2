//! The regular expressions of SELinux file_contexts, matched as libselinux matches them (PCRE,
//! the whole path, `^` and `$` put around the expression as written): literals, `.`, bracket
//! classes with ranges, negation and POSIX names, groups with `|` (`(?:` too), the quantifiers
//! `* + ? {n} {n,} {n,m}` (a lazy `?` after one changes nothing for a whole-string match) and
//! `\d \w \s`. A backtracking matcher with a step budget: the expressions come from the image,
//! and one that would take exponential time is no match rather than a hang.

use std::cell::Cell;

/// A compiled expression.
#[derive(Debug, Clone)]
pub struct Regex(Vec<Node>);

#[derive(Debug, Clone)]
enum Node {
    Byte(u8),
    Any,
    Class {
        negated: bool,
        ranges: Vec<(u8, u8)>,
    },
    Group(Vec<Vec<Node>>),
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
    Start,
    End,
}

/// Why an expression was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegexError {
    pub at: usize,
    pub what: &'static str,
}

impl std::fmt::Display for RegexError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.what, self.at)
    }
}

impl std::error::Error for RegexError {}

/// Deeper nesting is refused (the parser recurses once per group).
const MAX_DEPTH: usize = 32;
/// Matching steps before an expression is given up as no match.
const MAX_STEPS: usize = 200_000;

impl Regex {
    /// `^(?:pattern)$` would change what a top-level `|` means; libselinux pastes `^` and `$`
    /// around the text, and so does this.
    pub fn anchored(pattern: &str) -> Result<Regex, RegexError> {
        let text = format!("^{pattern}$");
        let mut p = Parser {
            s: text.as_bytes(),
            at: 0,
            depth: 0,
        };
        let alts = p.alternatives()?;
        if p.at != p.s.len() {
            return Err(p.err("unbalanced )"));
        }
        Ok(Regex(vec![Node::Group(alts)]))
    }

    /// Whether the expression matches in `text`, searched as pcre2_match searches: the anchors
    /// around it make that the whole text (but for a top-level `|`).
    pub fn is_match(&self, text: &[u8]) -> bool {
        let m = Matcher {
            s: text,
            steps: Cell::new(0),
        };
        (0..=text.len()).any(|start| m.seq(&self.0, start, &mut |_| true))
    }
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
    depth: usize,
}

impl Parser<'_> {
    fn err(&self, what: &'static str) -> RegexError {
        RegexError { at: self.at, what }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn alternatives(&mut self) -> Result<Vec<Vec<Node>>, RegexError> {
        let mut alts = vec![self.sequence()?];
        while self.peek() == Some(b'|') {
            self.at += 1;
            alts.push(self.sequence()?);
        }
        Ok(alts)
    }

    fn sequence(&mut self) -> Result<Vec<Node>, RegexError> {
        let mut seq = Vec::new();
        while let Some(c) = self.peek() {
            let atom = match c {
                b'|' | b')' => break,
                b'(' => {
                    self.at += 1;
                    if self.s.get(self.at..self.at + 2) == Some(b"?:") {
                        self.at += 2;
                    }
                    self.depth += 1;
                    if self.depth > MAX_DEPTH {
                        return Err(self.err("groups nested too deep"));
                    }
                    let alts = self.alternatives()?;
                    self.depth -= 1;
                    if self.peek() != Some(b')') {
                        return Err(self.err("unclosed ("));
                    }
                    self.at += 1;
                    Node::Group(alts)
                }
                b'[' => self.class()?,
                b'.' => {
                    self.at += 1;
                    Node::Any
                }
                b'^' => {
                    self.at += 1;
                    Node::Start
                }
                b'$' => {
                    self.at += 1;
                    Node::End
                }
                b'\\' => {
                    self.at += 1;
                    let e = self.peek().ok_or_else(|| self.err("trailing \\"))?;
                    self.at += 1;
                    escape_class(e).unwrap_or(Node::Byte(e))
                }
                b'*' | b'+' | b'?' => return Err(self.err("quantifier without an atom")),
                b'{' if self.counts().is_some() => {
                    return Err(self.err("quantifier without an atom"))
                }
                _ => {
                    self.at += 1;
                    Node::Byte(c)
                }
            };
            seq.push(self.quantified(atom)?);
        }
        Ok(seq)
    }

    /// `{n}`, `{n,}`, `{n,m}` at the cursor, and the byte after it; None when it is not one
    /// (PCRE then takes the `{` literally).
    fn counts(&self) -> Option<(u32, Option<u32>, usize)> {
        let rest = self.s.get(self.at..)?;
        let end = rest.iter().position(|b| *b == b'}')?;
        let inner = std::str::from_utf8(rest.get(1..end)?).ok()?;
        let num = |t: &str| -> Option<u32> {
            (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                .then(|| t.parse().ok())
                .flatten()
        };
        let (min, max) = match inner.split_once(',') {
            None => (num(inner)?, Some(num(inner)?)),
            Some((a, "")) => (num(a)?, None),
            Some((a, b)) => (num(a)?, Some(num(b)?)),
        };
        if max.is_some_and(|m| m < min) || min > 1000 || max.is_some_and(|m| m > 1000) {
            return None;
        }
        Some((min, max, self.at + end + 1))
    }

    fn quantified(&mut self, atom: Node) -> Result<Node, RegexError> {
        let mut node = atom;
        loop {
            let (min, max) = match self.peek() {
                Some(b'*') => {
                    self.at += 1;
                    (0, None)
                }
                Some(b'+') => {
                    self.at += 1;
                    (1, None)
                }
                Some(b'?') => {
                    self.at += 1;
                    (0, Some(1))
                }
                Some(b'{') => match self.counts() {
                    Some((min, max, next)) => {
                        self.at = next;
                        (min, max)
                    }
                    None => return Ok(node),
                },
                _ => return Ok(node),
            };
            // PCRE's lazy and possessive forms: the same strings match as a whole
            if matches!(self.peek(), Some(b'?') | Some(b'+')) {
                self.at += 1;
            }
            node = Node::Repeat {
                node: Box::new(node),
                min,
                max,
            };
        }
    }

    fn class(&mut self) -> Result<Node, RegexError> {
        self.at += 1;
        let negated = self.peek() == Some(b'^');
        if negated {
            self.at += 1;
        }
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let c = self.peek().ok_or_else(|| self.err("unclosed ["))?;
            if c == b']' && !first {
                self.at += 1;
                break;
            }
            first = false;
            if c == b'[' && self.s.get(self.at + 1) == Some(&b':') {
                let rest = self.s.get(self.at + 2..).unwrap_or_default();
                let end = rest
                    .windows(2)
                    .position(|w| w == b":]")
                    .ok_or_else(|| self.err("unclosed [:"))?;
                let name = rest.get(..end).unwrap_or_default();
                ranges.extend(posix_class(name).ok_or_else(|| self.err("unknown [:class:]"))?);
                self.at += 2 + end + 2;
                continue;
            }
            let lo = self.class_byte(&mut ranges)?;
            let Some(lo) = lo else { continue };
            if self.peek() == Some(b'-') && self.s.get(self.at + 1).is_some_and(|b| *b != b']') {
                self.at += 1;
                let hi = self
                    .class_byte(&mut ranges)?
                    .ok_or_else(|| self.err("a class escape ends a range"))?;
                if hi < lo {
                    return Err(self.err("range out of order"));
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        Ok(Node::Class { negated, ranges })
    }

    /// One byte of a bracket class, or None when an escape such as `\d` added its ranges.
    fn class_byte(&mut self, ranges: &mut Vec<(u8, u8)>) -> Result<Option<u8>, RegexError> {
        let c = self.peek().ok_or_else(|| self.err("unclosed ["))?;
        self.at += 1;
        if c != b'\\' {
            return Ok(Some(c));
        }
        let e = self.peek().ok_or_else(|| self.err("trailing \\"))?;
        self.at += 1;
        match escape_class(e) {
            Some(Node::Class {
                negated: false,
                ranges: r,
            }) => {
                ranges.extend(r);
                Ok(None)
            }
            Some(_) => Err(self.err("a negated escape inside a class")),
            None => Ok(Some(e)),
        }
    }
}

fn escape_class(e: u8) -> Option<Node> {
    let (negated, name): (bool, &[u8]) = match e {
        b'd' => (false, b"digit"),
        b'D' => (true, b"digit"),
        b'w' => (false, b"word"),
        b'W' => (true, b"word"),
        b's' => (false, b"space"),
        b'S' => (true, b"space"),
        _ => return None,
    };
    Some(Node::Class {
        negated,
        ranges: posix_class(name)?,
    })
}

fn posix_class(name: &[u8]) -> Option<Vec<(u8, u8)>> {
    Some(match name {
        b"digit" => vec![(b'0', b'9')],
        b"alpha" => vec![(b'a', b'z'), (b'A', b'Z')],
        b"alnum" => vec![(b'0', b'9'), (b'a', b'z'), (b'A', b'Z')],
        b"word" => vec![(b'0', b'9'), (b'a', b'z'), (b'A', b'Z'), (b'_', b'_')],
        b"upper" => vec![(b'A', b'Z')],
        b"lower" => vec![(b'a', b'z')],
        b"xdigit" => vec![(b'0', b'9'), (b'a', b'f'), (b'A', b'F')],
        b"space" => vec![(b' ', b' '), (b'\t', b'\r')],
        b"blank" => vec![(b' ', b' '), (b'\t', b'\t')],
        b"punct" => vec![(b'!', b'/'), (b':', b'@'), (b'[', b'`'), (b'{', b'~')],
        b"print" => vec![(b' ', b'~')],
        b"graph" => vec![(b'!', b'~')],
        b"cntrl" => vec![(0, 31), (127, 127)],
        _ => return None,
    })
}

/// The text being matched and the steps taken so far.
struct Matcher<'a> {
    s: &'a [u8],
    steps: Cell<usize>,
}

impl Matcher<'_> {
    /// Matches `nodes` at `pos`, then hands where they ended to `k`; tries every way until `k`
    /// accepts one.
    fn seq(&self, nodes: &[Node], pos: usize, k: &mut dyn FnMut(usize) -> bool) -> bool {
        let steps = self.steps.get() + 1;
        self.steps.set(steps);
        if steps > MAX_STEPS {
            return false;
        }
        let Some((node, rest)) = nodes.split_first() else {
            return k(pos);
        };
        match node {
            Node::Byte(_) | Node::Any | Node::Class { .. } => match self.s.get(pos) {
                Some(b) if single(node, *b) => self.seq(rest, pos + 1, k),
                _ => false,
            },
            Node::Start => pos == 0 && self.seq(rest, pos, k),
            Node::End => pos == self.s.len() && self.seq(rest, pos, k),
            Node::Group(alts) => alts
                .iter()
                .any(|alt| self.seq(alt, pos, &mut |p| self.seq(rest, p, k))),
            Node::Repeat { node, min, max } => self.repeat(node, (*min, *max), 0, pos, rest, k),
        }
    }

    /// `node` repeated greedily from its `n`th time at `pos`, then `rest`.
    fn repeat(
        &self,
        node: &Node,
        (min, max): (u32, Option<u32>),
        n: u32,
        pos: usize,
        rest: &[Node],
        k: &mut dyn FnMut(usize) -> bool,
    ) -> bool {
        if max.is_none_or(|m| n < m) {
            let once = std::slice::from_ref(node);
            // an iteration that matched nothing only helps to reach the minimum
            let more = self.seq(once, pos, &mut |p| {
                (p != pos || n < min) && self.repeat(node, (min, max), n + 1, p, rest, k)
            });
            if more {
                return true;
            }
        }
        n >= min && self.seq(rest, pos, k)
    }
}

fn single(node: &Node, b: u8) -> bool {
    match node {
        Node::Byte(c) => *c == b,
        // PCRE's `.` matches every byte but a newline
        Node::Any => b != b'\n',
        Node::Class { negated, ranges } => {
            ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&b)) != *negated
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(re: &str, s: &str) -> bool {
        Regex::anchored(re).unwrap().is_match(s.as_bytes())
    }

    #[test]
    fn the_forms_file_contexts_use_match_as_pcre_does() {
        assert!(m("/var/lib(/.*)?", "/var/lib"));
        assert!(m("/var/lib(/.*)?", "/var/lib/azprov/state.json"));
        assert!(!m("/var/lib(/.*)?", "/var/library"));
        assert!(m("/home/[^/]+", "/home/azureuser"));
        assert!(!m("/home/[^/]+", "/home/azureuser/.ssh"));
        assert!(!m("/home/[^/]+", "/home/"));
        assert!(m(
            "/home/[^/]+/\\.ssh(/.*)?",
            "/home/a/.ssh/authorized_keys"
        ));
        assert!(!m("/home/[^/]+/\\.ssh(/.*)?", "/home/a/xssh"));
        assert!(m("/etc/shadow.*", "/etc/shadow-"));
        assert!(m("/var/log/gdm(3)?(/.*)?", "/var/log/gdm3/x"));
        assert!(m(
            "/opt/vmware/(workstation|player)/bin/x",
            "/opt/vmware/player/bin/x"
        ));
        assert!(m("/dev/tty[0-9]{1,2}", "/dev/tty12"));
        assert!(!m("/dev/tty[0-9]{1,2}", "/dev/tty123"));
        assert!(m("/dev/x{2,}", "/dev/xxx"));
        assert!(m("/a{", "/a{"));
        assert!(m("/x[[:digit:]]+[^/-]", "/x12a"));
        assert!(!m("/x[[:digit:]]+[^/-]", "/x12-"));
        assert!(m("/[]a]", "/]"));
        assert!(m("/(?:ab)+\\d", "/abab7"));
        // top-level | binds looser than the anchors libselinux pastes around it
        assert!(m("/a|/b", "/a-anything"));
        assert!(!m("/a|/b", "/b-anything"));
        assert!(m("/a|/b", "/x/b"));
        assert!(m("(.*)*x", "aaaaax"));
    }

    #[test]
    fn bad_expressions_are_refused_and_explosive_ones_end() {
        for bad in ["(", "/a)", "[a", "/a|*b", "[[:nope:]]", "[z-a]"] {
            assert!(Regex::anchored(bad).is_err(), "{bad}");
        }
        let deep = "(".repeat(40) + &")".repeat(40);
        assert!(Regex::anchored(&deep).is_err());
        // (a*)*b against a run of a's: exponential for a naive matcher, given up here
        let r = Regex::anchored("(a*)*b").unwrap();
        assert!(!r.is_match("a".repeat(40).as_bytes()));
    }
}
