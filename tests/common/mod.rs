//! A scripted HTTP server on 127.0.0.1 for the retry and CLI tests: each connection gets the
//! next scripted answer, and every request is recorded.
#![allow(dead_code)]

pub mod netns;

/// The binary under test: `AZPROV_BIN` (scripts/test sets it to the shipped static build),
/// else the one cargo built for the tests.
pub fn bin() -> String {
    std::env::var("AZPROV_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_azprov").to_string())
}

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::thread;

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

pub fn answer(status: u16, body: &str) -> Answer {
    Answer {
        status,
        body: body.as_bytes().to_vec(),
    }
}

pub struct Server {
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Vec<Recorded>>>,
}

impl Server {
    /// Answers requests in order with `script`, chosen by `pick(request, index)`; after the
    /// script runs out the last answer repeats.
    pub fn start(script: Vec<Answer>) -> Server {
        Server::start_with(move |_, i| script[i.min(script.len() - 1)].clone())
    }

    pub fn start_with(pick: impl Fn(&Recorded, usize) -> Answer + Send + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let log2 = log.clone();
        thread::spawn(move || {
            for (i, stream) in listener.incoming().enumerate() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    continue;
                }
                let mut parts = line.split_whitespace();
                let method = parts.next().unwrap_or("").to_string();
                let path = parts.next().unwrap_or("").to_string();
                let mut headers = Vec::new();
                loop {
                    let mut h = String::new();
                    reader.read_line(&mut h).unwrap();
                    let h = h.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        headers.push((k.trim().to_string(), v.trim().to_string()));
                    }
                }
                let len = headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                    .map(|(_, v)| v.parse::<usize>().unwrap())
                    .unwrap_or(0);
                let mut body = vec![0; len];
                reader.read_exact(&mut body).unwrap();
                let rec = Recorded {
                    method,
                    path,
                    headers,
                    body,
                };
                let a = pick(&rec, i);
                log2.lock().unwrap().push(rec);
                let head = format!(
                    "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    a.status,
                    a.body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&a.body);
            }
        });
        Server { addr, log }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().unwrap().clone()
    }
}

pub const GOAL_STATE: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<GoalState><Version>2012-11-30</Version><Incarnation>INC</Incarnation>
<Container><ContainerId>cid-1</ContainerId><RoleInstanceList><RoleInstance>
<InstanceId>iid-1</InstanceId></RoleInstance></RoleInstanceList></Container></GoalState>"#;

pub fn goal_state(incarnation: u32) -> Answer {
    answer(200, &GOAL_STATE.replace("INC", &incarnation.to_string()))
}

pub fn imds_doc() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/imds/full.json"
    ))
    .unwrap()
}
