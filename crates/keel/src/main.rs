//! The `keel` binary: parses arguments and hands off to [`keel_cli::cli::run`].

use clap::Parser;

/// The launcher binary installed beside `keel` (`src/bin/keel-sandbox-launcher.rs`).
const LAUNCHER: &str = "keel-sandbox-launcher";

fn main() -> std::process::ExitCode {
    // `keel __sandbox …` is the sandbox launcher keel starts for each confined shell command;
    // it must run before anything else (single-threaded, no argument parsing).
    keel_tools::sandbox::run_launcher_if_requested();
    keel_tools::sandbox::set_launcher(
        keel_tools::sandbox::Launcher::beside_this_program(LAUNCHER)
            .unwrap_or_else(keel_tools::sandbox::Launcher::this_program),
    );
    let cli = keel_cli::cli::Cli::parse();
    let verbose = cli.global.verbose;
    let telemetry = match keel_cli::logging::init(cli.global.log_format) {
        Ok(t) => t,
        Err(error) => {
            eprintln!("keel: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = match keel_cli::cli::run(cli) {
        Ok(code) => code,
        // `keel sessions events S | head -1`: the reader has what it wanted.
        Err(error) if keel_cli::report::is_broken_pipe(&error) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            if verbose {
                eprintln!("keel: {error:?}");
            } else {
                eprintln!("keel: {}", keel_cli::report::describe(&error));
            }
            if error.is::<keel_cli::exit::UsageError>() {
                std::process::ExitCode::from(keel_cli::exit::USAGE)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    };
    // The spans still queued are exported before the process ends.
    drop(telemetry);
    code
}
