//! The one HTTP client: plain HTTP/1.1 through ureq, never a proxy, bounded bodies, and the
//! retry classes of docs/contracts.md, "Protocol rules", inside one deadline.

mod transport;

use crate::deadline::{jitter, Backoff, Deadline};
use std::fmt;
use std::time::Duration;
use transport::MarkedConnector;
pub use transport::IMDS_FWMARK;

/// Which endpoint a request goes to; decides which statuses are worth retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// 169.254.169.254: retry 404, 410, 429, 5xx (410 means "retry for up to 70 s").
    Imds,
    /// 168.63.129.16: retry 429 and 5xx; a 410 on a health POST goes back to the caller, which
    /// fetches a fresh goal state.
    WireServer,
}

/// Why no HTTP answer came: the IMDS reasons tell a timeout from a connection error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    Timeout,
    /// Refused, unreachable, reset, or another I/O error.
    Connect,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// No HTTP answer: refused, unreachable, reset, timed out. `detail` is ureq's word.
    Transport {
        url: String,
        kind: TransportKind,
        detail: String,
    },
    /// An answer outside 2xx.
    Status { url: String, status: u16 },
    /// The body is larger than the client accepts.
    TooLarge { url: String, limit: u64 },
    /// A 2xx answer whose body does not parse (truncated, or a goal state without RoleInstance).
    Invalid { url: String, detail: String },
    /// Retries ran out of time; `last` is the last cause.
    Deadline {
        url: String,
        attempts: u32,
        last: Box<HttpError>,
    },
}

impl HttpError {
    /// The HTTP status behind this error, looking through `Deadline`.
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::Status { status, .. } => Some(*status),
            HttpError::Deadline { last, .. } => last.status(),
            _ => None,
        }
    }

    pub fn retryable(&self, class: Class) -> bool {
        match (self, class) {
            (HttpError::Transport { .. } | HttpError::Invalid { .. }, _) => true,
            (HttpError::Status { status, .. }, Class::Imds) => {
                matches!(status, 404 | 410 | 429) || (500..600).contains(status)
            }
            (HttpError::Status { status, .. }, Class::WireServer) => {
                *status == 429 || (500..600).contains(status)
            }
            (HttpError::TooLarge { .. } | HttpError::Deadline { .. }, _) => false,
        }
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Transport { url, detail, .. } => write!(f, "{url}: {detail}"),
            HttpError::Status { url, status } => write!(f, "{url}: HTTP status {status}"),
            HttpError::TooLarge { url, limit } => {
                write!(f, "{url}: response larger than {limit} bytes")
            }
            HttpError::Invalid { url, detail } => write!(f, "{url}: invalid response: {detail}"),
            HttpError::Deadline { attempts, last, .. } => {
                write!(f, "gave up after {attempts} attempts: {last}")
            }
        }
    }
}

impl std::error::Error for HttpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HttpError::Deadline { last, .. } => Some(last.as_ref()),
            _ => None,
        }
    }
}

/// How often a 2xx answer whose body does not parse is asked for again.
pub const MAX_UNPARSABLE_RETRIES: u32 = 3;

#[derive(Debug, Clone, Copy)]
pub enum Method {
    Get,
    Post,
}

/// One request, described once and sent as often as the retry policy says.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: Method,
    pub url: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

pub struct Client {
    /// IMDS's sockets carry [`IMDS_FWMARK`]; the WireServer's carry no mark.
    imds: ureq::Agent,
    wireserver: ureq::Agent,
    /// Bound for one attempt (connect + request + body); the deadline may cut it shorter.
    pub attempt_timeout: Duration,
    pub connect_timeout: Duration,
    pub backoff: Backoff,
    pub max_body: u64,
}

impl Default for Client {
    fn default() -> Self {
        Client::new()
    }
}

/// Resolves an IP literal (every Azure endpoint is one: 168.63.129.16, 169.254.169.254) on the
/// spot; anything else goes to ureq's resolver. ureq's own starts a thread per request to bound
/// a lookup when a timeout is set, which an address needs none of.
#[derive(Debug, Default)]
struct LiteralResolver(ureq::unversioned::resolver::DefaultResolver);

impl ureq::unversioned::resolver::Resolver for LiteralResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        let literal = uri.authority().and_then(|a| {
            let ip: std::net::IpAddr = a.host().trim_matches(['[', ']']).parse().ok()?;
            let port = a.port_u16().unwrap_or(match uri.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
            Some(std::net::SocketAddr::new(ip, port))
        });
        match literal {
            Some(addr) => {
                let mut out = self.empty();
                out.push(addr);
                Ok(out)
            }
            None => self.0.resolve(uri, config, timeout),
        }
    }
}

impl Client {
    pub fn new() -> Self {
        let config = ureq::Agent::config_builder()
            // IMDS and the WireServer must be reached directly; HTTP_PROXY and friends are
            // ignored (docs/contracts.md, "Protocol rules").
            .proxy(None)
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(format!("azprov/{}", crate::VERSION))
            .build();
        let agent = |mark| {
            let connector = MarkedConnector { mark };
            #[cfg(feature = "tls")]
            let connector = {
                use ureq::unversioned::transport::{Connector, RustlsConnector};
                connector.chain(RustlsConnector::default())
            };
            ureq::Agent::with_parts(config.clone(), connector, LiteralResolver::default())
        };
        Client {
            imds: agent(Some(IMDS_FWMARK)),
            wireserver: agent(None),
            attempt_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            backoff: Backoff::new(Duration::from_millis(250), Duration::from_secs(5)),
            // The IMDS document is a few KiB; userData is at most 64 KiB base64.
            max_body: 1 << 20,
        }
    }

    /// Sends `req` until it succeeds and `parse` accepts the body, a fatal error occurs, or
    /// the deadline passes. Returns the parsed value.
    pub fn fetch<T, E: fmt::Display>(
        &self,
        class: Class,
        req: &Request,
        deadline: Deadline,
        parse: impl Fn(&[u8]) -> Result<T, E>,
    ) -> Result<T, HttpError> {
        let mut attempt: u32 = 0;
        let mut unparsable: u32 = 0;
        let mut previous: Option<HttpError> = None;
        loop {
            attempt += 1;
            let err = match self.send_once(class, req, deadline) {
                Ok(body) => match parse(&body) {
                    Ok(v) => return Ok(v),
                    Err(e) => HttpError::Invalid {
                        url: req.url.to_string(),
                        detail: e.to_string(),
                    },
                },
                Err(e) => e,
            };
            // a 2xx whose body does not parse may be a cut connection; a few retries, not the
            // whole deadline (the caller has another source to fall back on)
            if matches!(err, HttpError::Invalid { .. }) {
                unparsable += 1;
            }
            if !err.retryable(class) || unparsable > MAX_UNPARSABLE_RETRIES {
                return Err(err);
            }
            let wait = self.backoff.delay(attempt - 1, jitter());
            log::debug!("{err}; retrying in {} ms", wait.as_millis());
            if deadline.remaining() <= wait || !deadline.sleep(wait) {
                // an attempt the deadline cut short says less than the answer before it (a
                // 503 rather than "timed out"), and the reason Azure gets comes from `last`
                let cut = matches!(
                    err,
                    HttpError::Transport {
                        kind: TransportKind::Timeout,
                        ..
                    }
                ) && deadline.expired();
                let (attempts, last) = match previous {
                    Some(p) if cut => (attempt - 1, p),
                    _ => (attempt, err),
                };
                return Err(HttpError::Deadline {
                    url: req.url.to_string(),
                    attempts,
                    last: Box::new(last),
                });
            }
            previous = Some(err);
        }
    }

    /// One attempt: the body of a 2xx answer, or why there is none.
    pub fn send_once(
        &self,
        class: Class,
        req: &Request,
        deadline: Deadline,
    ) -> Result<Vec<u8>, HttpError> {
        let url = req.url.to_string();
        let total = self.attempt_timeout.min(deadline.remaining());
        if total.is_zero() {
            return Err(HttpError::Transport {
                url,
                kind: TransportKind::Timeout,
                detail: "deadline passed".into(),
            });
        }
        let connect = self.connect_timeout.min(total);
        let agent = match class {
            Class::Imds => &self.imds,
            Class::WireServer => &self.wireserver,
        };
        let result = match req.method {
            Method::Get => {
                let mut b = agent.get(req.url);
                for (k, v) in req.headers {
                    b = b.header(*k, *v);
                }
                b.config()
                    .timeout_global(Some(total))
                    .timeout_connect(Some(connect))
                    .build()
                    .call()
            }
            Method::Post => {
                let mut b = agent.post(req.url);
                for (k, v) in req.headers {
                    b = b.header(*k, *v);
                }
                b.config()
                    .timeout_global(Some(total))
                    .timeout_connect(Some(connect))
                    .build()
                    .send(req.body)
            }
        };
        let mut resp = result.map_err(|e| transport(&url, e))?;
        let status = resp.status().as_u16();
        // Read (and drop) the body of an error answer too, so the connection can be reused.
        let body = resp
            .body_mut()
            .with_config()
            .limit(self.max_body)
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(limit) => HttpError::TooLarge {
                    url: url.clone(),
                    limit,
                },
                e => transport(&url, e),
            });
        if !(200..300).contains(&status) {
            return Err(HttpError::Status { url, status });
        }
        body
    }
}

fn transport(url: &str, e: ureq::Error) -> HttpError {
    let (kind, detail) = match e {
        ureq::Error::Timeout(t) => (TransportKind::Timeout, format!("timed out ({t})")),
        ureq::Error::ConnectionFailed => (TransportKind::Connect, "connection failed".to_string()),
        ureq::Error::HostNotFound => (TransportKind::Connect, "host not found".to_string()),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            (TransportKind::Timeout, io.to_string())
        }
        ureq::Error::Io(io) => (TransportKind::Connect, io.to_string()),
        other => (TransportKind::Connect, other.to_string()),
    };
    HttpError::Transport {
        url: url.to_string(),
        kind,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(s: u16) -> HttpError {
        HttpError::Status {
            url: "u".into(),
            status: s,
        }
    }

    #[test]
    fn retry_classes() {
        for s in [404, 410, 429, 500, 503] {
            assert!(status(s).retryable(Class::Imds), "{s}");
        }
        for s in [400, 401, 403] {
            assert!(!status(s).retryable(Class::Imds), "{s}");
        }
        for s in [429, 500, 502, 503] {
            assert!(status(s).retryable(Class::WireServer), "{s}");
        }
        for s in [400, 403, 404, 410] {
            assert!(!status(s).retryable(Class::WireServer), "{s}");
        }
        let t = HttpError::Transport {
            url: "u".into(),
            kind: TransportKind::Connect,
            detail: "refused".into(),
        };
        assert!(t.retryable(Class::Imds) && t.retryable(Class::WireServer));
    }
}
