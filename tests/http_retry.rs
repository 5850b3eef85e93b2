//! Retry behaviour of the HTTP client against a scripted server on 127.0.0.1.

mod common;

use azprov::azure::http::{Client, HttpError};
use azprov::azure::imds;
use azprov::azure::wireserver::{Health, WireServer};
use azprov::deadline::{Backoff, Deadline};
use common::*;
use std::time::Duration;

fn client() -> Client {
    let mut c = Client::new();
    c.backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(20));
    c.attempt_timeout = Duration::from_secs(2);
    c
}

fn base(s: &Server) -> String {
    format!("http://{}", s.addr)
}

#[test]
fn imds_429_twice_then_200() {
    let s = Server::start(vec![
        answer(429, ""),
        answer(429, ""),
        answer(200, &imds_doc()),
    ]);
    let m = imds::fetch(
        &client(),
        &base(&s),
        Deadline::after(Duration::from_secs(10)),
    )
    .unwrap();
    assert_eq!(m.vm_id, "12345678-90ab-cdef-1234-567890abcdef");
    let reqs = s.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.method, "GET");
        assert_eq!(
            r.path,
            "/metadata/instance?api-version=2023-11-15&extended=true"
        );
        assert_eq!(r.header("Metadata"), Some("true"));
        assert_eq!(r.header("X-Forwarded-For"), None);
    }
}

#[test]
fn imds_retries_404_410_and_5xx_and_truncated_bodies() {
    let doc = imds_doc();
    let s = Server::start(vec![
        answer(404, ""),
        answer(410, ""),
        answer(500, ""),
        answer(503, ""),
        answer(200, &doc[..doc.len() / 2]),
        answer(200, &doc),
    ]);
    imds::fetch(
        &client(),
        &base(&s),
        Deadline::after(Duration::from_secs(10)),
    )
    .unwrap();
    assert_eq!(s.requests().len(), 6);
}

#[test]
fn imds_403_and_401_are_fatal_at_once() {
    for status in [401, 403] {
        let s = Server::start(vec![answer(status, ""), answer(200, &imds_doc())]);
        let e = imds::fetch(
            &client(),
            &base(&s),
            Deadline::after(Duration::from_secs(10)),
        )
        .unwrap_err();
        assert_eq!(e.status(), Some(status));
        assert!(matches!(e, HttpError::Status { .. }), "{e:?}");
        assert_eq!(s.requests().len(), 1, "status {status}");
    }
}

#[test]
fn imds_400_asks_once_more_with_the_older_api_version() {
    let s = Server::start(vec![answer(400, ""), answer(200, &imds_doc())]);
    imds::fetch(
        &client(),
        &base(&s),
        Deadline::after(Duration::from_secs(10)),
    )
    .unwrap();
    let paths: Vec<String> = s.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(
        paths,
        [imds::INSTANCE_PATH, imds::FALLBACK_PATH],
        "one retry, with api-version 2021-02-01"
    );
    // 400 to both: fatal after the second request
    let s = Server::start(vec![answer(400, "")]);
    let e = imds::fetch(
        &client(),
        &base(&s),
        Deadline::after(Duration::from_secs(10)),
    )
    .unwrap_err();
    assert_eq!(e.status(), Some(400));
    assert_eq!(s.requests().len(), 2);
}

#[test]
fn an_unparsable_200_is_retried_three_times_not_until_the_deadline() {
    let s = Server::start(vec![answer(200, "{\"compute\": garbage")]);
    let e = imds::fetch(
        &client(),
        &base(&s),
        Deadline::after(Duration::from_secs(60)),
    )
    .unwrap_err();
    assert!(matches!(e, HttpError::Invalid { .. }), "{e:?}");
    assert_eq!(
        s.requests().len() as u32,
        1 + azprov::azure::http::MAX_UNPARSABLE_RETRIES
    );
}

#[test]
fn imds_gives_up_at_the_deadline() {
    let s = Server::start(vec![answer(503, "")]);
    let e = imds::fetch(
        &client(),
        &base(&s),
        Deadline::after(Duration::from_millis(300)),
    )
    .unwrap_err();
    match e {
        HttpError::Deadline {
            attempts, ref last, ..
        } => {
            assert!(attempts >= 2, "{attempts}");
            assert_eq!(last.status(), Some(503));
            // an attempt the deadline cut short is not counted, and may or may not have
            // reached the server
            let seen = s.requests().len();
            assert!(
                seen == attempts as usize || seen == attempts as usize + 1,
                "{seen} {attempts}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn transport_errors_are_retried_until_the_deadline() {
    // A port that was just free: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = imds::fetch(
        &client(),
        &format!("http://127.0.0.1:{port}"),
        Deadline::after(Duration::from_millis(200)),
    )
    .unwrap_err();
    match e {
        HttpError::Deadline { attempts, last, .. } => {
            assert!(attempts >= 2);
            assert!(matches!(*last, HttpError::Transport { .. }));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bodies_are_size_capped() {
    let s = Server::start(vec![answer(200, &"x".repeat(4096))]);
    let mut c = client();
    c.max_body = 1024;
    let e = imds::fetch(&c, &base(&s), Deadline::after(Duration::from_secs(5))).unwrap_err();
    assert!(
        matches!(e, HttpError::TooLarge { limit: 1024, .. }),
        "{e:?}"
    );
    assert_eq!(s.requests().len(), 1);
}

#[test]
fn health_410_refetches_the_goal_state_and_posts_the_new_incarnation() {
    // GET gs(1), POST -> 410, GET gs(2), POST -> 200
    let s = Server::start(vec![
        goal_state(1),
        answer(410, ""),
        goal_state(2),
        answer(200, ""),
    ]);
    let c = client();
    let ws = WireServer {
        client: &c,
        addr: s.addr,
    };
    let r = ws
        .report(&Health::Ready, Deadline::after(Duration::from_secs(10)))
        .unwrap();
    assert_eq!((r.incarnation.as_str(), r.posts), ("2", 2));
    let reqs = s.requests();
    let seq: Vec<(&str, &str)> = reqs
        .iter()
        .map(|r| (r.method.as_str(), r.path.as_str()))
        .collect();
    assert_eq!(
        seq,
        [
            ("GET", "/machine/?comp=goalstate"),
            ("POST", "/machine?comp=health"),
            ("GET", "/machine/?comp=goalstate"),
            ("POST", "/machine?comp=health"),
        ]
    );
    for r in &reqs {
        assert_eq!(r.header("x-ms-version"), Some("2012-11-30"));
        assert_eq!(r.header("x-ms-agent-name"), Some("azprov"));
        assert_eq!(r.header("X-Forwarded-For"), None);
    }
    assert_eq!(
        reqs[3].header("Content-Type"),
        Some("text/xml;charset=utf-8")
    );
    let first = String::from_utf8(reqs[1].body.clone()).unwrap();
    let second = String::from_utf8(reqs[3].body.clone()).unwrap();
    assert!(
        first.contains("<GoalStateIncarnation>1</GoalStateIncarnation>"),
        "{first}"
    );
    assert!(
        second.contains("<GoalStateIncarnation>2</GoalStateIncarnation>"),
        "{second}"
    );
    assert!(second.contains("<State>Ready</State>"));
}

#[test]
fn wireserver_retries_429_and_5xx_but_not_403() {
    let s = Server::start(vec![
        goal_state(5),
        answer(429, ""),
        answer(503, ""),
        answer(200, ""),
    ]);
    let c = client();
    let ws = WireServer {
        client: &c,
        addr: s.addr,
    };
    let r = ws
        .report(&Health::Ready, Deadline::after(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(r.posts, 1);
    assert_eq!(s.requests().len(), 4);

    let s = Server::start(vec![goal_state(5), answer(403, "")]);
    let ws = WireServer {
        client: &c,
        addr: s.addr,
    };
    let e = ws
        .report(&Health::Ready, Deadline::after(Duration::from_secs(10)))
        .unwrap_err();
    assert_eq!(e.status(), Some(403));
    assert_eq!(s.requests().len(), 2);
}

#[test]
fn goal_state_without_role_instance_is_fetched_again() {
    let bad = answer(200, "<GoalState><Incarnation>1</Incarnation><Container><ContainerId>c</ContainerId></Container></GoalState>");
    let s = Server::start(vec![bad, goal_state(3), answer(200, "")]);
    let c = client();
    let ws = WireServer {
        client: &c,
        addr: s.addr,
    };
    let r = ws
        .report(&Health::Ready, Deadline::after(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(r.incarnation, "3");
    assert_eq!(s.requests().len(), 3);
}
