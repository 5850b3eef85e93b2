//! The host keys' steps of a run: freshly made keys put into the root with their
//! fingerprints shown, and the RSA key left to a process that outlives the handover.

use crate::provision::hostkeys;
use crate::provision::stage::ms;
use crate::provision::summary::Summary;
use crate::root::Sysroot;
use std::time::Instant;

/// Writes freshly made host keys into the root and shows their fingerprints on the console
/// and in the log file. A failure is logged: the keys are not worth a NotReady (the report is
/// out already); the state then holds none and the next boot makes them.
pub(crate) fn install_host_keys(
    root: &Sysroot,
    generated: Result<hostkeys::Generated, hostkeys::HostKeyError>,
    s: &mut Summary,
) {
    let t = Instant::now();
    let hostname = s.hostname.clone().unwrap_or_else(|| "localhost".into());
    let result = generated.and_then(|g| {
        s.host_keys_pending = g.pending.iter().map(|k| k.name()).collect();
        let took: Vec<String> = g
            .took
            .iter()
            .map(|(k, d)| format!("{} {} ms", k.name(), d.as_millis()))
            .collect();
        log::info!(
            "host keys: made ({}; CRNG wait {} ms{})",
            took.join(", "),
            g.entropy_wait.as_millis(),
            g.seeded.map_or(String::new(), |n| format!(
                ", {n} bytes of OEM0 seed mixed in"
            ))
        );
        s.timings_ms.host_keys =
            g.took.iter().map(|(_, d)| ms(*d)).sum::<u64>() + ms(g.entropy_wait);
        hostkeys::install(root, g, &hostname)
    });
    match result {
        Ok(lines) if lines.is_empty() => {}
        Ok(lines) => {
            log::info!(
                "host keys: {} written to {} ({} ms)",
                lines.len(),
                hostkeys::SSH_DIR,
                ms(t.elapsed())
            );
            crate::logger::console_lines(&hostkeys::fingerprint_block(&lines));
            s.host_keys = lines;
        }
        Err(e) => {
            s.host_keys_pending.clear();
            log::error!("host keys: {e}; the image's keys stay");
        }
    }
}

/// The host keys left for after the handover (RSA, [`hostkeys::later`]): their process
/// started, once everything else of the run is on disk (`state`: it adds to state.json).
pub(crate) fn finish_host_keys_later(root: &Sysroot, s: &Summary, state: bool) {
    if s.host_keys_pending.is_empty() {
        return;
    }
    let hostname = s.hostname.clone().unwrap_or_else(|| "localhost".into());
    match hostkeys::later::spawn(root, &hostname, &s.host_keys, state) {
        Ok(pid) => log::info!(
            "host keys: {} made after the handover (pid {pid}); nothing waits for it",
            s.host_keys_pending.join(", ")
        ),
        Err(e) => log::warn!(
            "host keys: cannot start making {} after the handover: {e}",
            s.host_keys_pending.join(", ")
        ),
    }
}
