//! `azprov`: thin. As PID 1 it runs the boot flow (`boot::main`, which never returns);
//! otherwise it runs a subcommand and maps its error to an exit code. A panic never escapes
//! as a backtrace, and PID 1 never exits.

use std::process::ExitCode;

fn main() -> ExitCode {
    azprov::logger::init(log::LevelFilter::Info);
    // A panic is a bug; report it as one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        log::error!("internal error: {info}");
    }));
    if azprov::sys::process::getpid() == 1 {
        // boot::main handles panics during provisioning itself; anything else ends here.
        let r = std::panic::catch_unwind(|| azprov::boot::main());
        let _ = r;
        azprov::boot::fail_forever(
            &"internal error in the boot flow",
            azprov::config::OnFail::Halt,
        );
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    match std::panic::catch_unwind(|| azprov::cli::run(&args)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("azprov: {}", azprov::logger::errno_names(&e.to_string()));
            ExitCode::from(e.exit_code() as u8)
        }
        Err(_) => ExitCode::from(1),
    }
}
