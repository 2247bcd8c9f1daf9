//! The `keel` binary: parses arguments and hands off to the library crates.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    match cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("keel: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
