//! `azprov`: thin. Installs the logger, runs the subcommand, maps errors to exit codes, and
//! never lets a panic escape as a backtrace.

use std::process::ExitCode;

fn main() -> ExitCode {
    azprov::log::init(log::LevelFilter::Info);
    // A panic is a bug; report it as one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("azprov: internal error: {info}");
    }));
    let args: Vec<String> = std::env::args().skip(1).collect();
    match std::panic::catch_unwind(|| azprov::cli::run(&args)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("azprov: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
        Err(_) => ExitCode::from(1),
    }
}
