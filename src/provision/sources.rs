//! Where a run's provisioning data comes from: the media stage (the provisioning CD, or
//! `--ovf`) and the IMDS stage (beside a first goal-state probe of the WireServer), each
//! within its share of the run's deadline.

use super::options::{MediaSource, Options};
use super::{Failure, Reason};
use crate::azure::http::{Client, HttpError, TransportKind};
use crate::azure::ovf::{self, OvfEnv};
use crate::azure::wireserver::WireServer;
use crate::azure::{imds, media};
use crate::deadline::Deadline;
use std::path::PathBuf;
use std::time::Duration;

/// The share of the deadline each stage may use at most, as a divisor or fraction of what is
/// left when it starts: media 1/5 of the whole, DHCP all that remains but a reserve
/// (`network::DHCP_RESERVE`, at least half of it), IMDS 2/3 of what is left then.
pub(crate) const MEDIA_SHARE: u32 = 5;
const IMDS_SHARE: (u32, u32) = (2, 3);
/// The first goal-state fetch, beside IMDS, only checks the WireServer early.
const PROBE_BUDGET: Duration = Duration::from_secs(10);

/// The IMDS reason for the last cause behind `e`, with the whole error as detail.
fn imds_failure(e: &HttpError) -> Failure {
    fn reason(e: &HttpError) -> Reason {
        match e {
            HttpError::Deadline { last, .. } => reason(last),
            HttpError::Transport {
                kind: TransportKind::Timeout,
                ..
            } => Reason::ImdsTimeout,
            HttpError::Transport { .. } => Reason::ImdsConnection,
            HttpError::Status { .. } => Reason::ImdsHttp,
            HttpError::Invalid { .. } | HttpError::TooLarge { .. } => Reason::ImdsParse,
        }
    }
    Failure::new(reason(e), e)
}

pub(crate) fn read_media(opts: &Options, deadline: Deadline) -> Result<Option<OvfEnv>, Failure> {
    let (name, bytes) = match &opts.media {
        MediaSource::File(f) => {
            let b = std::fs::read(f)
                .map_err(|e| Failure::new(Reason::OvfRead, format!("{}: {e}", f.display())))?;
            (f.display().to_string(), b)
        }
        MediaSource::Devices(extra) => {
            // PID 1: a drive that is there while the last drivers load is read at once;
            // without one, the drivers that could bring one are waited for first
            let early = !media::cdrom_devices(&opts.dev).is_empty();
            if !early {
                opts.modules.wait();
            }
            let drives = media::wait_for_drives(&opts.dev, &opts.sys, opts.cdrom_settle);
            let mut found = media::read_ovf(&drives, extra, deadline, &opts.modules);
            if early && !matches!(found, Ok(Some(_))) {
                // nothing on the drives at hand: others may come with the last drivers
                opts.modules.wait();
                let later: Vec<PathBuf> =
                    media::wait_for_drives(&opts.dev, &opts.sys, opts.cdrom_settle)
                        .into_iter()
                        .filter(|d| !drives.contains(d))
                        .collect();
                if !later.is_empty() {
                    found = match (found, media::read_ovf(&later, &[], deadline, &opts.modules)) {
                        (_, Ok(Some(f))) => Ok(Some(f)),
                        (Err(e), _) => Err(e),
                        (_, r) => r,
                    };
                }
            }
            match found {
                Ok(Some(found)) => found,
                Ok(None) => return Ok(None),
                Err(e) => return Err(Failure::new(Reason::MediaRead, e)),
            }
        }
    };
    match ovf::parse(&bytes) {
        Ok(env) => Ok(Some(env)),
        // Some other XML document, not Azure's provisioning data: no OVF, not a broken one.
        Err(e @ ovf::OvfError::NotAzure) => {
            log::info!("{name}: {e}; ignored");
            Ok(None)
        }
        Err(e) => Err(Failure::new(e.reason(), format!("{name}: {e}"))),
    }
}

/// The media stage's line: what the OVF names, or that there was none.
pub(crate) fn describe_media(ovf: &Option<OvfEnv>) -> String {
    match ovf {
        Some(o) => format!(
            "ovf-env.xml for {} / {}",
            o.hostname,
            o.username.as_deref().unwrap_or("(from IMDS)")
        ),
        None => "no provisioning media; IMDS only".into(),
    }
}

/// IMDS at `url`, beside a first goal-state fetch that checks the WireServer early (the report
/// fetches the goal state again right before posting). The probe runs on a thread of its own
/// and is never waited for: the IMDS result is used as soon as it arrives.
pub(crate) fn metadata(
    url: &str,
    ws: &WireServer,
    deadline: Deadline,
) -> Result<imds::Imds, Failure> {
    let dl = deadline.min(deadline.remaining() * IMDS_SHARE.0 / IMDS_SHARE.1);
    let (tx, rx) = std::sync::mpsc::channel();
    let addr = ws.addr;
    let probe_dl = dl.min(PROBE_BUDGET);
    std::thread::spawn(move || {
        let client = Client::new();
        let probe = WireServer {
            client: &client,
            addr,
        };
        let _ = tx.send(probe.fetch_goal_state(probe_dl));
    });
    let m = imds::fetch(ws.client, url, dl);
    match rx.try_recv() {
        Ok(Ok(g)) => log::info!(
            "wireserver {}: goal state incarnation {}",
            ws.addr,
            g.incarnation
        ),
        Ok(Err(e)) => log::warn!("wireserver {}: first goal state fetch: {e}", ws.addr),
        Err(_) => log::debug!(
            "wireserver {}: first goal state fetch still running; not waited for",
            ws.addr
        ),
    }
    m.map_err(|e| imds_failure(&e))
}
