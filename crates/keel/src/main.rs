//! The `keel` binary: parses arguments and hands off to [`keel_cli::cli::run`].

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = keel_cli::cli::Cli::parse();
    let verbose = cli.global.verbose;
    match keel_cli::cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            if verbose {
                eprintln!("keel: {error:?}");
            } else {
                eprintln!("keel: {error:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
