//! The WireServer (168.63.129.16): goal state and health reports (docs/contracts.md,
//! "Protocol rules").
//! The goal state is fetched fresh before every POST: a stale incarnation gets 410.

use super::http::{Class, Client, HttpError, Method, Request};
use super::reason::Failure;
use super::xml;
use crate::deadline::{jitter, Deadline};
use quick_xml::events::{BytesDecl, BytesText, Event};
use quick_xml::Writer;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// The fixed address, used when DHCP gives no option 245.
pub const DEFAULT_ADDR: Ipv4Addr = Ipv4Addr::new(168, 63, 129, 16);

/// Where the WireServer is: `flag` (`--wireserver`), else the lease's option 245, else
/// [`DEFAULT_ADDR`]; port 80.
pub fn endpoint(flag: Option<SocketAddr>, lease: Option<Ipv4Addr>) -> SocketAddr {
    flag.unwrap_or_else(|| SocketAddr::from((lease.unwrap_or(DEFAULT_ADDR), 80)))
}
pub const PROTOCOL_VERSION: &str = "2012-11-30";
pub const AGENT_NAME: &str = "azprov";
/// cloud-init's `HEALTH_REPORT_DESCRIPTION_TRIM_LEN`.
pub const DESCRIPTION_MAX_CHARS: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoalState {
    pub incarnation: String,
    pub container_id: String,
    pub instance_id: String,
}

/// Why a goal state was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoalStateError {
    NotXml(xml::XmlError),
    /// The document element is not `<GoalState>`.
    Root(String),
    /// A field health reports need is missing or empty.
    Missing(&'static str),
    /// `<Incarnation>` is not a decimal number (the length of what it holds, never its text:
    /// the health report would echo it).
    BadIncarnation(usize),
}

impl std::fmt::Display for GoalStateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GoalStateError::NotXml(e) => write!(f, "goal state is not XML: {e}"),
            GoalStateError::Root(r) => write!(f, "expected <GoalState>, got <{r}>"),
            GoalStateError::Missing(name) => write!(f, "goal state has no {name}"),
            GoalStateError::BadIncarnation(len) => write!(
                f,
                "goal state Incarnation is not a number ({len} characters)"
            ),
        }
    }
}

impl std::error::Error for GoalStateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GoalStateError::NotXml(e) => Some(e),
            _ => None,
        }
    }
}

/// Parses a goal state document; every field health reports need must be there.
pub fn parse_goal_state(bytes: &[u8]) -> Result<GoalState, GoalStateError> {
    let root = xml::parse(bytes).map_err(GoalStateError::NotXml)?;
    if root.local != "GoalState" {
        return Err(GoalStateError::Root(root.local.clone()));
    }
    let field = |v: Option<&xml::Element>, name: &'static str| {
        v.map(|e| e.trimmed().to_string())
            .filter(|t| !t.is_empty())
            .ok_or(GoalStateError::Missing(name))
    };
    let container = root.child("Container");
    let instance = container
        .and_then(|c| c.child("RoleInstanceList"))
        .and_then(|l| l.child("RoleInstance"))
        .and_then(|r| r.child("InstanceId"));
    let incarnation = field(root.child("Incarnation"), "Incarnation")?;
    if incarnation.len() > 20 || !incarnation.bytes().all(|b| b.is_ascii_digit()) {
        return Err(GoalStateError::BadIncarnation(incarnation.len()));
    }
    Ok(GoalState {
        incarnation,
        container_id: field(
            container.and_then(|c| c.child("ContainerId")),
            "ContainerId",
        )?,
        instance_id: field(instance, "RoleInstance/InstanceId")?,
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ready,
    /// NotReady with SubStatus ProvisioningFailed and this description.
    Failed {
        description: String,
    },
}

/// Where Azure's own failure message sends users; cloud-init and azure-init end every NotReady
/// description with it.
pub const DOCUMENTATION_URL: &str = "https://aka.ms/linuxprovisioningerror";

/// How long an encoded report may be: the WireServer's description is counted in characters,
/// a KVP value in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Chars(usize),
    Bytes(usize),
}

impl Limit {
    /// The longest prefix of `s` within the limit, cut on a character boundary.
    pub fn cut(self, s: &str) -> &str {
        let end = match self {
            Limit::Chars(n) => s.char_indices().nth(n).map_or(s.len(), |(i, _)| i),
            Limit::Bytes(n) if n >= s.len() => s.len(),
            Limit::Bytes(n) => (0..=n).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0),
        };
        s.get(..end).unwrap_or_default()
    }

    fn len(self, s: &str) -> usize {
        match self {
            Limit::Chars(_) => s.chars().count(),
            Limit::Bytes(_) => s.len(),
        }
    }

    fn max(self) -> usize {
        match self {
            Limit::Chars(n) | Limit::Bytes(n) => n,
        }
    }

    /// The same unit, another size.
    fn with(self, n: usize) -> Limit {
        match self {
            Limit::Chars(_) => Limit::Chars(n),
            Limit::Bytes(_) => Limit::Bytes(n),
        }
    }
}

/// `result=error|reason=…|agent=azprov/VER|…|vm_id=…|timestamp=…|documentation_url=…`, at most
/// 512 characters: the failure's supporting data between `agent` and `vm_id`, in cloud-init's
/// field order, cut short when the whole would be longer, so the tail always arrives. Values
/// holding the delimiter are quoted the way cloud-init's csv writer does.
pub fn failure_description(failure: &Failure, vm_id: &str, timestamp: &str) -> String {
    encode_failure(
        failure,
        vm_id,
        timestamp,
        Limit::Chars(DESCRIPTION_MAX_CHARS),
    )
}

/// [`failure_description`] within `limit` (KVP's `PROVISIONING_REPORT` takes 1,022 bytes).
pub fn encode_failure(failure: &Failure, vm_id: &str, timestamp: &str, limit: Limit) -> String {
    let agent = agent();
    let mut head = vec![
        ("result", "error"),
        ("reason", failure.reason.as_str()),
        ("agent", agent.as_str()),
    ];
    if let Some(stage) = failure.stage {
        head.push(("stage", stage));
    }
    head.extend(failure.extra.iter().map(|(k, v)| (*k, v.as_str())));
    // the cause, as the log gives it (never a secret), for every reason
    let detail = crate::logger::errno_names(&failure.detail);
    if !detail.is_empty() && !failure.extra.iter().any(|(k, _)| *k == "detail") {
        head.push(("detail", detail.as_str()));
    }
    let tail = format!(
        "|{}",
        join(&[
            ("vm_id", vm_id),
            ("timestamp", timestamp),
            ("documentation_url", DOCUMENTATION_URL),
        ])
    );
    let room = limit.max().saturating_sub(limit.len(&tail));
    let whole = format!("{}{tail}", join_within(&head, limit.with(room)));
    limit.cut(&whole).to_string()
}

/// `join` of as many fields as fit within `limit`, the last one cut to fit: a field is cut
/// before it is quoted, so a quoted field always keeps its closing quote and a CSV reader
/// never takes the fields after it into it.
fn join_within(fields: &[(&str, &str)], limit: Limit) -> String {
    let mut out = String::new();
    for (k, v) in fields {
        let sep = if out.is_empty() { "" } else { "|" };
        let room = limit.max().saturating_sub(limit.len(&out) + limit.len(sep));
        let field = format!("{k}={v}");
        let quoted = quote(&field);
        if limit.len(&quoted) <= room {
            out.push_str(sep);
            out.push_str(&quoted);
            continue;
        }
        // the longest prefix of the field whose quoted form fits (quoting adds at most 2 and
        // doubles quotes, so shrink until it fits)
        let mut n = limit.len(&field).min(room);
        while n > 0 {
            let cut = quote(limit.with(n).cut(&field));
            if limit.len(&cut) <= room {
                out.push_str(sep);
                out.push_str(&cut);
                break;
            }
            n = n.saturating_sub((limit.len(&cut) - room).max(1));
        }
        break;
    }
    out
}

/// What cloud-init reports to KVP on success (`report_success_to_host`), fields in its order.
pub fn encode_success(vm_id: &str, timestamp: &str) -> String {
    join(&[
        ("result", "success"),
        ("agent", &agent()),
        ("timestamp", timestamp),
        ("vm_id", vm_id),
    ])
}

fn agent() -> String {
    format!("{AGENT_NAME}/{}", crate::VERSION)
}

/// `k=v` fields joined by `|`, each quoted as cloud-init's csv writer quotes it.
fn join(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| quote(&format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join("|")
}

fn quote(field: &str) -> String {
    if field.contains(['|', '\'', '\n', '\r']) {
        format!("'{}'", field.replace('\'', "''"))
    } else {
        field.to_string()
    }
}

/// The health document, built with an XML writer so every value is escaped.
pub fn emit_health(gs: &GoalState, health: &Health) -> Vec<u8> {
    let mut w = Writer::new(Vec::new());
    // Writing into a Vec cannot fail; the results are checked anyway, never unwrapped.
    let _ = build_health(&mut w, gs, health);
    w.into_inner()
}

fn build_health(
    w: &mut Writer<Vec<u8>>,
    gs: &GoalState,
    health: &Health,
) -> Result<(), quick_xml::Error> {
    w.write_event(Event::Decl(BytesDecl::new("1.0", Some("utf-8"), None)))?;
    w.create_element("Health")
        .with_attribute(("xmlns:xsi", "http://www.w3.org/2001/XMLSchema-instance"))
        .with_attribute(("xmlns:xsd", "http://www.w3.org/2001/XMLSchema"))
        .write_inner_content(|w| {
            text_el(w, "GoalStateIncarnation", &gs.incarnation)?;
            w.create_element("Container").write_inner_content(|w| {
                text_el(w, "ContainerId", &gs.container_id)?;
                w.create_element("RoleInstanceList")
                    .write_inner_content(|w| {
                        w.create_element("Role").write_inner_content(|w| {
                            text_el(w, "InstanceId", &gs.instance_id)?;
                            w.create_element("Health")
                                .write_inner_content(|w| match health {
                                    Health::Ready => text_el(w, "State", "Ready"),
                                    Health::Failed { description } => {
                                        text_el(w, "State", "NotReady")?;
                                        w.create_element("Details").write_inner_content(|w| {
                                            text_el(w, "SubStatus", "ProvisioningFailed")?;
                                            text_el(w, "Description", description)
                                        })?;
                                        Ok(())
                                    }
                                })?;
                            Ok(())
                        })?;
                        Ok(())
                    })?;
                Ok(())
            })?;
            Ok(())
        })?;
    Ok(())
}

fn text_el(w: &mut Writer<Vec<u8>>, name: &str, value: &str) -> std::io::Result<()> {
    w.create_element(name)
        .write_text_content(BytesText::new(value))?;
    Ok(())
}

/// A WireServer address that is not `IP` or `IP:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadEndpoint(pub String);

impl std::fmt::Display for BadEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid WireServer address {:?}: expected IP or IP:PORT",
            self.0
        )
    }
}

impl std::error::Error for BadEndpoint {}

/// Parses `IP` or `IP:PORT` (port 80 by default).
pub fn parse_endpoint(s: &str) -> Result<SocketAddr, BadEndpoint> {
    if let Ok(ip) = s.parse::<Ipv4Addr>() {
        return Ok(SocketAddr::V4(SocketAddrV4::new(ip, 80)));
    }
    s.parse::<SocketAddr>()
        .map_err(|_| BadEndpoint(s.to_string()))
}

/// A WireServer at one address, spoken to through the shared client.
pub struct WireServer<'a> {
    pub client: &'a Client,
    pub addr: SocketAddr,
}

/// What a health report cost, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    pub incarnation: String,
    /// Health POSTs sent, including ones answered 410.
    pub posts: u32,
}

const HEADERS: [(&str, &str); 2] = [
    ("x-ms-version", PROTOCOL_VERSION),
    ("x-ms-agent-name", AGENT_NAME),
];

impl WireServer<'_> {
    pub fn fetch_goal_state(&self, deadline: Deadline) -> Result<GoalState, HttpError> {
        let url = format!("http://{}/machine/?comp=goalstate", self.addr);
        let req = Request {
            method: Method::Get,
            url: &url,
            headers: &HEADERS,
            body: &[],
        };
        self.client
            .fetch(Class::WireServer, &req, deadline, parse_goal_state)
    }

    /// Fetches a fresh goal state and POSTs `health` with its incarnation. A 410 means the goal
    /// state moved between the two: fetch it again and post again, within the deadline.
    pub fn report(&self, health: &Health, deadline: Deadline) -> Result<Reported, HttpError> {
        let url = format!("http://{}/machine?comp=health", self.addr);
        let headers = [
            HEADERS[0],
            HEADERS[1],
            ("Content-Type", "text/xml;charset=utf-8"),
        ];
        let mut posts = 0;
        loop {
            let gs = self.fetch_goal_state(deadline)?;
            let body = emit_health(&gs, health);
            let req = Request {
                method: Method::Post,
                url: &url,
                headers: &headers,
                body: &body,
            };
            posts += 1;
            match self.client.fetch(Class::WireServer, &req, deadline, |_| {
                Ok::<(), std::convert::Infallible>(())
            }) {
                Ok(()) => {
                    return Ok(Reported {
                        incarnation: gs.incarnation,
                        posts,
                    })
                }
                Err(e) if e.status() == Some(410) => {
                    log::info!(
                        "health report for incarnation {} got 410 Gone; refetching the goal state",
                        gs.incarnation
                    );
                    let wait = self.client.backoff.delay(posts - 1, jitter());
                    if deadline.remaining() <= wait || !deadline.sleep(wait) {
                        return Err(HttpError::Deadline {
                            url,
                            attempts: posts,
                            last: Box::new(e),
                        });
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::azure::reason::Reason;

    fn gs() -> GoalState {
        GoalState {
            incarnation: "42".into(),
            container_id: "a511aa6d-29e7-4f53-8788-55655dfe848f".into(),
            instance_id: "f6cd1d7ef1644557b9059345e5ba890c.lars-test-1".into(),
        }
    }

    /// The fields of a report as a CSV reader with cloud-init's dialect reads them (`|`
    /// between fields, `'` quotes, a doubled `'` inside quotes).
    fn csv_fields(s: &str) -> Vec<String> {
        let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, quoted) {
                ('\'', true) if chars.peek() == Some(&'\'') => {
                    cur.push('\'');
                    chars.next();
                }
                ('\'', _) => quoted = !quoted,
                ('|', false) => out.push(std::mem::take(&mut cur)),
                (c, _) => cur.push(c),
            }
        }
        out.push(cur);
        out
    }

    /// A quoted field that does not fit is cut inside its quotes and closed, never cut after
    /// its opening quote: the fields after it stay fields of their own.
    #[test]
    fn a_cut_quoted_field_keeps_its_closing_quote() {
        for (limit, n) in [
            (Limit::Bytes(1022), 1500),
            (Limit::Chars(512), 600),
            (Limit::Bytes(1022), 900),
        ] {
            let mut f = Failure::new(Reason::Operator, "");
            f.extra = vec![("detail", format!("disk 'data1' | {}", "x".repeat(n)))];
            let v = encode_failure(&f, "vm-1", "2026-12-05T10:00:00Z", limit);
            assert!(limit.len(&v) <= limit.max(), "{}", v.len());
            let fields = csv_fields(&v);
            assert!(fields.iter().any(|x| x == "vm_id=vm-1"), "{fields:?}");
            assert!(
                fields.last().unwrap().starts_with("documentation_url="),
                "{fields:?}"
            );
            let detail = fields.iter().find(|x| x.starts_with("detail=")).unwrap();
            assert!(detail.starts_with("detail=disk 'data1' | xxx"), "{detail}");
        }
    }

    #[test]
    fn goal_state_sample() {
        assert_eq!(
            parse_goal_state(fixture!("goalstate", "sample.xml")).unwrap(),
            gs()
        );
    }

    #[test]
    fn goal_state_with_crlf_and_extra_elements() {
        let g = parse_goal_state(fixture!("goalstate", "crlf-extra.xml")).unwrap();
        assert_eq!(g.incarnation, "7");
        assert_eq!(g.container_id, "c0ffee00-0000-4000-8000-000000000001");
        assert_eq!(
            g.instance_id,
            "fbb84507-46cd-4f4e-bd78-a2edaa9d059b._thstringnopa2"
        );
    }

    #[test]
    fn goal_state_without_role_instance_is_refused() {
        let e = parse_goal_state(fixture!("goalstate", "no-roleinstance.xml")).unwrap_err();
        assert_eq!(e, GoalStateError::Missing("RoleInstance/InstanceId"));
        assert!(parse_goal_state(b"<Versions/>").is_err());
        assert!(parse_goal_state(b"garbage").is_err());
    }

    #[test]
    fn an_incarnation_that_is_no_number_is_refused() {
        // found by fuzz/goal_state: the health report would have carried the text
        let e = parse_goal_state(fixture!("goalstate", "fuzz-text-incarnation.xml")).unwrap_err();
        assert_eq!(e, GoalStateError::BadIncarnation(17));
        let sample = String::from_utf8(fixture!("goalstate", "sample.xml").to_vec()).unwrap();
        for bad in ["-1", "1 2", "4x", "123456789012345678901"] {
            let doc = sample.replace(
                "<Incarnation>42</Incarnation>",
                &format!("<Incarnation>{bad}</Incarnation>"),
            );
            assert!(
                matches!(
                    parse_goal_state(doc.as_bytes()),
                    Err(GoalStateError::BadIncarnation(_))
                ),
                "{bad}"
            );
        }
    }

    /// Reads a health body back with the project's XML reader, as the fabric would.
    fn read_back(body: &[u8]) -> xml::Element {
        xml::parse(body).unwrap()
    }

    fn path<'a>(root: &'a xml::Element, p: &[&str]) -> &'a str {
        let mut e = root;
        for name in p {
            e = e.child(name).unwrap_or_else(|| panic!("no {name}"));
        }
        &e.text
    }

    #[test]
    fn ready_body() {
        let body = emit_health(&gs(), &Health::Ready);
        let root = read_back(&body);
        assert_eq!(root.local, "Health");
        assert_eq!(path(&root, &["GoalStateIncarnation"]), "42");
        assert_eq!(
            path(&root, &["Container", "ContainerId"]),
            gs().container_id
        );
        let role = ["Container", "RoleInstanceList", "Role"];
        assert_eq!(
            path(&root, &[&role[..], &["InstanceId"]].concat()),
            gs().instance_id
        );
        assert_eq!(
            path(&root, &[&role[..], &["Health", "State"]].concat()),
            "Ready"
        );
        assert!(root.find("Details").is_none());
    }

    #[test]
    fn failure_body_escapes_and_trims() {
        let mut g = gs();
        g.container_id = "a&b<c>".into();
        let mut f = Failure::new(Reason::Operator, "");
        f.extra = vec![("detail", format!("bad <thing> & more {}", "x".repeat(600)))];
        let desc = failure_description(&f, "vm-1", "2026-11-30T15:19:55Z");
        assert_eq!(desc.chars().count(), DESCRIPTION_MAX_CHARS);
        assert!(desc.starts_with(&format!(
            "result=error|reason=reported by operator|agent=azprov/{}|detail=bad <thing> & more xxx",
            crate::VERSION
        )));
        // the supporting data gives way, the tail arrives whole
        assert!(
            desc.ends_with(&format!(
                "xxx|vm_id=vm-1|timestamp=2026-11-30T15:19:55Z|documentation_url={DOCUMENTATION_URL}"
            )),
            "{desc}"
        );
        let body = emit_health(
            &g,
            &Health::Failed {
                description: desc.clone(),
            },
        );
        let text = String::from_utf8(body.clone()).unwrap();
        assert!(text.contains("a&amp;b&lt;c&gt;"), "{text}");
        let root = read_back(&body);
        assert_eq!(path(&root, &["Container", "ContainerId"]), "a&b<c>");
        let h = ["Container", "RoleInstanceList", "Role", "Health"];
        assert_eq!(path(&root, &[&h[..], &["State"]].concat()), "NotReady");
        assert_eq!(
            path(&root, &[&h[..], &["Details", "SubStatus"]].concat()),
            "ProvisioningFailed"
        );
        assert_eq!(
            path(&root, &[&h[..], &["Details", "Description"]].concat()),
            desc
        );
    }

    #[test]
    fn description_fields_in_order() {
        let mut dhcp = Failure::new(Reason::DhcpLease, "eth0: no answer");
        dhcp.stage = Some("dhcp");
        let d = failure_description(&dhcp, "abc", "T");
        assert_eq!(
            d,
            format!(
                "result=error|reason=failure to obtain DHCP lease|agent=azprov/{}|stage=dhcp|detail=eth0: no answer|vm_id=abc|timestamp=T|documentation_url=https://aka.ms/linuxprovisioningerror",
                crate::VERSION
            )
        );
        let mut f = Failure::new(Reason::Operator, "");
        f.extra = vec![("detail", "a|b".into())];
        let q = failure_description(&f, "v", "T");
        assert!(q.contains("|'detail=a|b'|"), "{q}");
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("168.63.129.16").unwrap().to_string(),
            "168.63.129.16:80"
        );
        assert_eq!(parse_endpoint("127.0.0.1:8080").unwrap().port(), 8080);
        assert!(parse_endpoint("wireserver").is_err());
        assert!(parse_endpoint("1.2.3.4:x").is_err());
    }
}
