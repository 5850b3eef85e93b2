//! Per-VM SSH host keys. An image carries the host keys made when it was built, so every VM
//! from it would offer the same ones. On a provisioning run (a new VM id) azprov makes new
//! ed25519, ECDSA (nistp256) and RSA (3072) keys from the kernel's CRNG, writes them in OpenSSH
//! format over the image's, and prints their fingerprints on the console as cloud-init does
//! (the block tools that scrape Azure's boot diagnostics parse). The keys are made beside the
//! other stages (RSA takes a fraction of a second natively, seconds under emulation); the
//! private halves never reach a log.

pub mod later;
mod prime;
mod steps;
pub(crate) use steps::{finish_host_keys_later, install_host_keys};

use crate::root::{Sysroot, WriteError};
use rand_core::{CryptoRng, RngCore};
use ssh_key::private::{EcdsaKeypair, Ed25519Keypair, KeypairData, RsaKeypair};
use ssh_key::{EcdsaCurve, HashAlg, LineEnding, PrivateKey};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const SSH_DIR: &str = "/etc/ssh";
pub const BEGIN: &str = "-----BEGIN SSH HOST KEY FINGERPRINTS-----";
pub const END: &str = "-----END SSH HOST KEY FINGERPRINTS-----";
/// Hyper-V's entropy seed, an ACPI table (cloud-init feeds it to the pool too).
const OEM0: &str = "firmware/acpi/tables/OEM0";
const RSA_BITS: usize = 3072;
/// Each of its two primes: half of it.
const RSA_PRIME_LIMBS: usize = crypto_bigint::U1536::LIMBS;
const _: () = assert!(2 * crypto_bigint::U1536::BITS == RSA_BITS);

/// The key types made, in the order ssh-keygen -A makes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    Rsa,
    Ecdsa,
    Ed25519,
}

impl KeyType {
    pub const ALL: [KeyType; 3] = [KeyType::Rsa, KeyType::Ecdsa, KeyType::Ed25519];

    /// The part of `ssh_host_<name>_key`.
    pub fn name(self) -> &'static str {
        match self {
            KeyType::Rsa => "rsa",
            KeyType::Ecdsa => "ecdsa",
            KeyType::Ed25519 => "ed25519",
        }
    }

    /// `rsa`, `ecdsa`, `ed25519` (the names `azprov.hostkeytypes=` takes).
    pub fn parse(name: &str) -> Option<KeyType> {
        KeyType::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Bits and label as `ssh-keygen -l` prints them.
    fn bits_label(self) -> (usize, &'static str) {
        match self {
            KeyType::Rsa => (RSA_BITS, "RSA"),
            KeyType::Ecdsa => (256, "ECDSA"),
            KeyType::Ed25519 => (256, "ED25519"),
        }
    }
}

#[derive(Debug)]
pub enum HostKeyError {
    Entropy(crate::sys::Errno),
    Generate {
        key: KeyType,
        detail: String,
    },
    Write(WriteError),
    Panicked,
    /// Given up: the run turned out not to need new keys.
    Stopped,
}

impl std::fmt::Display for HostKeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostKeyError::Entropy(e) => write!(f, "getrandom: {e}"),
            HostKeyError::Generate { key, detail } => {
                write!(f, "generating the {} key: {detail}", key.name())
            }
            HostKeyError::Write(e) => write!(f, "{e}"),
            HostKeyError::Panicked => write!(f, "the key generation thread panicked"),
            HostKeyError::Stopped => write!(f, "stopped: no new keys needed"),
        }
    }
}

impl std::error::Error for HostKeyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HostKeyError::Write(e) => Some(e),
            HostKeyError::Entropy(e) => Some(e),
            _ => None,
        }
    }
}

impl HostKeyError {
    /// ssh-key's error while making or encoding the `key` key.
    fn key(key: KeyType) -> impl Fn(ssh_key::Error) -> HostKeyError + Copy {
        move |e| HostKeyError::Generate {
            key,
            detail: e.to_string(),
        }
    }
}

/// The kernel's CRNG through a blocking getrandom(2), as the RNG the key generators draw from.
struct Crng;

impl RngCore for Crng {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill_bytes(&mut b);
        u32::from_le_bytes(b)
    }

    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill_bytes(&mut b);
        u64::from_le_bytes(b)
    }

    // The key generators call this infallible form. `generate` has drawn from the CRNG once
    // already, so it cannot fail here; if it did, no key may come from anything weaker: the
    // keygen thread's panic is reported as a failed generation and the image's keys stay.
    #[allow(clippy::panic)]
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        if let Err(e) = self.try_fill_bytes(dest) {
            panic!("getrandom: {e}");
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        crate::sys::secure_random_bytes(dest).map_err(|e| {
            rand_core::Error::from(
                std::num::NonZeroU32::new(e as u32).unwrap_or(std::num::NonZeroU32::MIN),
            )
        })
    }
}

impl CryptoRng for Crng {}

/// New keys, not yet written, with what making them cost.
pub struct Generated {
    keys: Vec<(KeyType, PrivateKey)>,
    pub took: Vec<(KeyType, Duration)>,
    /// How long the first blocking getrandom waited for the CRNG.
    pub entropy_wait: Duration,
    /// Bytes of platform seed mixed into the pool first.
    pub seeded: Option<usize>,
    /// Types still to make, after the handover ([`later`]): RSA, unless its search was done.
    pub pending: Vec<KeyType>,
}

/// Mixes Hyper-V's seed (`/sys/firmware/acpi/tables/OEM0`) into the kernel's pool by writing
/// it to /dev/urandom (mixed in, not credited), so the CRNG is not waited for on a young
/// kernel. None when the platform has no seed.
pub fn seed_from_platform(sys: &Path) -> Option<usize> {
    let seed = std::fs::read(sys.join(OEM0))
        .ok()
        .filter(|s| !s.is_empty())?;
    std::fs::write("/dev/urandom", &seed).ok()?;
    Some(seed.len())
}

/// What the run wants of a generation in progress. The RSA searches read it before each
/// candidate.
#[derive(Clone)]
struct Control(Arc<AtomicU8>);

impl Control {
    /// Nothing waits for the keys yet: idle CPU only.
    const BACKGROUND: u8 = 0;
    /// The run waits for the keys: normal priority from the next candidate on, so nothing else
    /// on the machine starves the search.
    const AWAITED: u8 = 1;
    /// Not needed after all: the search ends at its next candidate.
    const STOP: u8 = 2;

    fn new(state: u8) -> Control {
        Control(Arc::new(AtomicU8::new(state)))
    }

    fn set(&self, state: u8) {
        self.0.store(state, Ordering::Relaxed);
    }

    /// Follows the run's wish on the calling thread (`raised` remembers whether it already
    /// left idle priority); true when the work is to stop.
    fn stop_here(&self, raised: &Cell<bool>) -> bool {
        let state = self.0.load(Ordering::Relaxed);
        if state == Control::AWAITED && !raised.replace(true) {
            crate::sys::process::normal_priority();
        }
        state == Control::STOP
    }
}

/// `generate` on a thread of its own and on idle CPU only, started before a run knows whether
/// it needs new keys (PID 1 starts it before the root is even mounted). The ed25519 and ECDSA
/// keys take milliseconds; the RSA search goes on after them. `join` takes the fast keys, and
/// the RSA key only if it is made already: nothing waits for it (it is finished after the
/// handover, [`later`]). Dropped, the thread stops at its next RSA candidate.
pub struct Keygen {
    thread: Option<std::thread::JoinHandle<Result<Generated, HostKeyError>>>,
    fast: std::sync::mpsc::Receiver<Result<Generated, HostKeyError>>,
    control: Control,
    types: Vec<KeyType>,
}

impl Keygen {
    pub fn start(sys: PathBuf, types: &[KeyType]) -> Keygen {
        let control = Control::new(Control::BACKGROUND);
        let theirs = control.clone();
        let (tx, fast) = std::sync::mpsc::channel();
        let wanted = types.to_vec();
        let thread = std::thread::spawn(move || generate_with(&sys, &theirs, &wanted, Some(tx)));
        Keygen {
            thread: Some(thread),
            fast,
            control,
            types: types.to_vec(),
        }
    }

    /// The fast keys (waited for: milliseconds once the CRNG is ready), with the RSA key when
    /// its search has ended already; else RSA is in `pending` and its search stops.
    pub fn join(mut self) -> Result<Generated, HostKeyError> {
        self.control.set(Control::AWAITED);
        let mut g = self.fast.recv().unwrap_or(Err(HostKeyError::Panicked))?;
        if let Some(thread) = self.thread.take() {
            if thread.is_finished() {
                if let Ok(Ok(mut rsa)) = thread.join() {
                    // RSA first, as when it is made on the calling thread
                    rsa.keys.append(&mut g.keys);
                    g.keys = rsa.keys;
                    g.took.extend(rsa.took);
                }
            }
        }
        if self.types.contains(&KeyType::Rsa) && !g.keys.iter().any(|(k, _)| *k == KeyType::Rsa) {
            g.pending.push(KeyType::Rsa);
        }
        Ok(g)
    }
}

impl Drop for Keygen {
    fn drop(&mut self) {
        self.control.set(Control::STOP);
    }
}

/// The fast keys of `types` (ed25519, ECDSA) from the kernel's CRNG (the platform seed mixed
/// in first), on the calling thread; RSA, when wanted, is left `pending` for [`later`].
pub fn generate(sys: &Path, types: &[KeyType]) -> Result<Generated, HostKeyError> {
    let fast: Vec<KeyType> = types
        .iter()
        .copied()
        .filter(|k| *k != KeyType::Rsa)
        .collect();
    let mut g = generate_with(sys, &Control::new(Control::AWAITED), &fast, None)?;
    if types.contains(&KeyType::Rsa) {
        g.pending.push(KeyType::Rsa);
    }
    Ok(g)
}

/// Makes the keys of `types` as `control` asks: the fast ones first (sent on `fast` when
/// given, and then only RSA is returned), RSA last, on idle CPU only while in the background,
/// given up (`HostKeyError::Stopped`) once stopped.
fn generate_with(
    sys: &Path,
    control: &Control,
    types: &[KeyType],
    fast: Option<std::sync::mpsc::Sender<Result<Generated, HostKeyError>>>,
) -> Result<Generated, HostKeyError> {
    // only a generation that starts in the background lowers its priority, and only that one
    // raises it again
    let background = control.0.load(Ordering::Relaxed) == Control::BACKGROUND;
    let raised = Cell::new(!background);
    if background {
        crate::sys::process::background_priority();
    }
    let seeded = seed_from_platform(sys);
    let t = Instant::now();
    let mut probe = [0u8; 1];
    if let Err(e) = crate::sys::secure_random_bytes(&mut probe) {
        if let Some(tx) = &fast {
            let _ = tx.send(Err(HostKeyError::Entropy(e)));
        }
        return Err(HostKeyError::Entropy(e));
    }
    let mut g = Generated {
        keys: Vec::new(),
        took: Vec::new(),
        entropy_wait: t.elapsed(),
        seeded,
        pending: Vec::new(),
    };
    // the fast ones first, in the order the fingerprint block lists them
    for kind in [KeyType::Ecdsa, KeyType::Ed25519] {
        if !types.contains(&kind) {
            continue;
        }
        let t = Instant::now();
        let err = HostKeyError::key(kind);
        let key = match kind {
            KeyType::Ecdsa => {
                let pair = EcdsaKeypair::random(&mut Crng, EcdsaCurve::NistP256).map_err(err)?;
                PrivateKey::new(KeypairData::Ecdsa(pair), "").map_err(err)?
            }
            _ => {
                let pair = Ed25519Keypair::random(&mut Crng);
                PrivateKey::new(KeypairData::Ed25519(pair), "").map_err(err)?
            }
        };
        g.took.push((kind, t.elapsed()));
        g.keys.push((kind, key));
    }
    if let Some(tx) = fast {
        let _ = tx.send(Ok(g));
        g = Generated {
            keys: Vec::new(),
            took: Vec::new(),
            entropy_wait: Duration::ZERO,
            seeded: None,
            pending: Vec::new(),
        };
    }
    if types.contains(&KeyType::Rsa) {
        if control.stop_here(&raised) {
            return Err(HostKeyError::Stopped);
        }
        let t = Instant::now();
        let pair = race_rsa(control, raised.get())?;
        let key =
            PrivateKey::new(KeypairData::Rsa(pair), "").map_err(HostKeyError::key(KeyType::Rsa))?;
        g.took.push((KeyType::Rsa, t.elapsed()));
        g.keys.insert(0, (KeyType::Rsa, key));
    }
    Ok(g)
}

/// One RSA key, made now on the calling thread (and racers beside it): the process that
/// finishes it after the handover ([`later`]).
pub fn rsa_now() -> Result<PrivateKey, HostKeyError> {
    let pair = race_rsa(&Control::new(Control::AWAITED), true)?;
    PrivateKey::new(KeypairData::Rsa(pair), "").map_err(HostKeyError::key(KeyType::Rsa))
}

/// RSA key generation is a prime search (`prime`) whose time varies several-fold from run to
/// run: with more than one CPU, a few searches race; the first to find a key says so and the
/// others stop at their next candidate. Each follows `control` on its own thread, starting
/// from the priority of the thread that starts it (`raised`: not the background's).
fn race_rsa(control: &Control, raised: bool) -> Result<RsaKeypair, HostKeyError> {
    let won = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let racer = |tx: std::sync::mpsc::Sender<_>| {
        let (control, won) = (control.clone(), Arc::clone(&won));
        move || {
            let raised = Cell::new(raised);
            let stopped = || control.stop_here(&raised) || won.load(Ordering::Relaxed);
            if let Some(key) = prime::rsa_key::<{ RSA_PRIME_LIMBS }>(&mut Crng, &stopped) {
                won.store(true, Ordering::Relaxed);
                let _ = tx.send(key);
            }
        }
    };
    match crate::sys::cpus().clamp(1, 4) {
        1 => racer(tx)(),
        racers => {
            for _ in 0..racers {
                std::thread::spawn(racer(tx.clone()));
            }
            drop(tx);
        }
    }
    let err = |detail: String| HostKeyError::Generate {
        key: KeyType::Rsa,
        detail,
    };
    match rx.recv() {
        Ok(key) => RsaKeypair::try_from(key.map_err(|e| err(e.to_string()))?)
            .map_err(|e| err(e.to_string())),
        // every racer stopped before it found a key
        Err(_) => Err(HostKeyError::Stopped),
    }
}

/// Whether the root has an SSH server configured (`/etc/ssh/sshd_config`) and no host key of
/// any type: a cleaned image (`azprov clean`), where sshd would refuse to start.
pub fn none_in(root: &crate::root::Sysroot) -> bool {
    if !root.exists(&format!("{SSH_DIR}/sshd_config")) {
        return false;
    }
    let Ok(dir) = root.resolve_full(SSH_DIR) else {
        return false;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    !entries.flatten().any(|e| {
        let n = e.file_name();
        let n = n.to_string_lossy();
        n.starts_with("ssh_host_") && n.ends_with("_key")
    })
}

/// Writes the keys over the image's (`/etc/ssh/ssh_host_<type>_key`, 0600 root, and `.pub`,
/// 0644 root, each atomically), then removes the image's keys of other types, so sshd never
/// finds an old key or none. Returns the fingerprint lines. A root without /etc/ssh (no sshd)
/// gets no keys: Ok(empty).
pub fn install(
    root: &Sysroot,
    mut generated: Generated,
    hostname: &str,
) -> Result<Vec<String>, HostKeyError> {
    let dir = root.resolve_full(SSH_DIR).map_err(HostKeyError::Write)?;
    if !dir.is_dir() {
        log::info!("host keys: no {SSH_DIR} in the root; none written");
        return Ok(Vec::new());
    }
    let comment = format!("root@{hostname}");
    let mut lines = Vec::new();
    let mut written = Vec::new();
    for (kind, key) in generated.keys.iter_mut() {
        key.set_comment(&comment);
        let private = key
            .to_openssh(LineEnding::LF)
            .map_err(HostKeyError::key(*kind))?;
        let public = key
            .public_key()
            .to_openssh()
            .map_err(HostKeyError::key(*kind))?;
        let path = format!("{SSH_DIR}/ssh_host_{}_key", kind.name());
        root.write(&path, private.as_bytes(), 0o600, (0, 0))
            .map_err(HostKeyError::Write)?;
        root.write(
            &format!("{path}.pub"),
            format!("{public}\n").as_bytes(),
            0o644,
            (0, 0),
        )
        .map_err(HostKeyError::Write)?;
        written.push(format!("ssh_host_{}_key", kind.name()));
        lines.push(fingerprint_line(*kind, key, &comment));
    }
    for name in crate::sys::sorted_names(&dir) {
        let stem = name.strip_suffix(".pub").unwrap_or(&name);
        let stem = stem.strip_suffix("-cert").unwrap_or(stem);
        let ours = written.iter().any(|w| w == stem) && !name.ends_with("-cert.pub");
        if stem.starts_with("ssh_host_") && stem.ends_with("_key") && !ours {
            let p = dir.join(&name);
            if let Err(e) = std::fs::remove_file(&p) {
                log::warn!("host keys: cannot remove the image's {name}: {e}");
            }
        }
    }
    Ok(lines)
}

/// One line as `ssh-keygen -l -f KEY.pub` prints it: `256 SHA256:… root@vm (ED25519)`.
pub(crate) fn fingerprint_line(kind: KeyType, key: &PrivateKey, comment: &str) -> String {
    let (bits, label) = kind.bits_label();
    format!(
        "{bits} {} {comment} ({label})",
        key.fingerprint(HashAlg::Sha256)
    )
}

/// The same line for a key azprov did not make, from its `.pub` line (`TYPE BASE64 [COMMENT]`):
/// the SHA-256 of the key's blob, its size and type read from the blob as OpenSSH does. Read
/// here, not with ssh-key's decoder, which would cost the binary 20 KB for this one line.
pub(crate) fn public_fingerprint_line(pub_line: &str) -> Option<String> {
    use base64::Engine;
    use ssh_key::sha2::Digest;
    let mut words = pub_line.split_whitespace();
    let kind = words.next()?;
    let blob = base64::engine::general_purpose::STANDARD
        .decode(words.next()?)
        .ok()?;
    let comment = words.collect::<Vec<_>>().join(" ");
    let comment = if comment.is_empty() {
        "no comment".to_string()
    } else {
        comment
    };
    // the blob: string(type), then the key's own fields (RSA: mpint e, mpint n)
    let mut fields = SshFields(&blob);
    if fields.next()? != kind.as_bytes() {
        return None;
    }
    let (bits, label) = match kind {
        "ssh-rsa" => {
            let _e = fields.next()?;
            let n = fields.next()?;
            let n: Vec<u8> = n.iter().copied().skip_while(|b| *b == 0).collect();
            let lead = n.first().map_or(8, |b| b.leading_zeros() as usize);
            ((n.len() * 8).saturating_sub(lead), "RSA")
        }
        "ecdsa-sha2-nistp256" => (256, "ECDSA"),
        "ecdsa-sha2-nistp384" => (384, "ECDSA"),
        "ecdsa-sha2-nistp521" => (521, "ECDSA"),
        "ssh-ed25519" => (256, "ED25519"),
        _ => return None,
    };
    let digest = ssh_key::sha2::Sha256::digest(&blob);
    let fp = base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest);
    Some(format!("{bits} SHA256:{fp} {comment} ({label})"))
}

/// The length-prefixed fields of an SSH wire blob, one at a time.
struct SshFields<'a>(&'a [u8]);

impl<'a> SshFields<'a> {
    fn next(&mut self) -> Option<&'a [u8]> {
        let len = u32::from_be_bytes(self.0.get(..4)?.try_into().ok()?) as usize;
        let field = self.0.get(4..4usize.checked_add(len)?)?;
        self.0 = self.0.get(4 + len..)?;
        Some(field)
    }
}

/// The fingerprint block for the console (Azure's boot diagnostics) and the log file.
pub fn fingerprint_block(lines: &[String]) -> Vec<String> {
    let mut out = vec![BEGIN.to_string()];
    out.extend(lines.iter().cloned());
    out.push(END.to_string());
    out
}

#[cfg(test)]
mod tests;
