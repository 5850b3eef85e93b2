//! Times azprov's RSA-3072 host key generation, one key per line of output (milliseconds), for
//! `scripts/bench`, which interleaves it with OpenSSL's `ssh-keygen -t rsa -b 3072`.
//!
//!   cargo run --release --example rsa_keygen -- [N]

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    for _ in 0..n {
        let t = std::time::Instant::now();
        if let Err(e) = azprov::provision::hostkeys::rsa_now() {
            eprintln!("rsa_keygen: {e}");
            std::process::exit(1);
        }
        println!("{:.1}", t.elapsed().as_secs_f64() * 1000.0);
    }
}
